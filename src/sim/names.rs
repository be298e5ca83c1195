//! Names as a `slim` node encodes them.
//!
//! The node identifies a name by the XxHash64 (seed 0) of each string
//! component as Rust's `Hash` for `str` feeds a hasher (the bytes, then one
//! `0xFF` byte), plus a 128-bit id (`u128::MAX` means "no id"). The simulator
//! carries its own XxHash64 on purpose: it is the test oracle for the control
//! plane's encoding, so it must not share that code.

use crate::proto::dp;

/// The id meaning "no component id" (the node's `NULL_COMPONENT`).
pub const NULL_ID: u128 = u128::MAX;

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn read_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(buf)
}

fn read_u32(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 4];
    buf.copy_from_slice(&bytes[..4]);
    u64::from(u32::from_le_bytes(buf))
}

fn round(acc: u64, lane: u64) -> u64 {
    acc.wrapping_add(lane.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(acc: u64, val: u64) -> u64 {
    (acc ^ round(0, val)).wrapping_mul(P1).wrapping_add(P4)
}

/// Hashes the 32-byte stripes and returns the accumulator and the tail.
fn stripes(input: &[u8], seed: u64) -> (u64, &[u8]) {
    if input.len() < 32 {
        return (seed.wrapping_add(P5), input);
    }
    let mut v = [
        seed.wrapping_add(P1).wrapping_add(P2),
        seed.wrapping_add(P2),
        seed,
        seed.wrapping_sub(P1),
    ];
    let mut chunks = input.chunks_exact(32);
    for stripe in &mut chunks {
        for (i, lane) in v.iter_mut().enumerate() {
            *lane = round(*lane, read_u64(&stripe[i * 8..]));
        }
    }
    let mut acc = v[0]
        .rotate_left(1)
        .wrapping_add(v[1].rotate_left(7))
        .wrapping_add(v[2].rotate_left(12))
        .wrapping_add(v[3].rotate_left(18));
    for lane in v {
        acc = merge(acc, lane);
    }
    (acc, chunks.remainder())
}

/// XxHash64 of `input` with `seed` (the reference algorithm, one shot).
pub fn xxhash64(input: &[u8], seed: u64) -> u64 {
    let (mut acc, mut tail) = stripes(input, seed);
    acc = acc.wrapping_add(input.len() as u64);
    while tail.len() >= 8 {
        acc = (acc ^ round(0, read_u64(tail)))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
        tail = &tail[8..];
    }
    if tail.len() >= 4 {
        acc = (acc ^ read_u32(tail).wrapping_mul(P1))
            .rotate_left(23)
            .wrapping_mul(P2)
            .wrapping_add(P3);
        tail = &tail[4..];
    }
    for &byte in tail {
        acc = (acc ^ u64::from(byte).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    acc ^= acc >> 33;
    acc = acc.wrapping_mul(P2);
    acc ^= acc >> 29;
    acc = acc.wrapping_mul(P3);
    acc ^ (acc >> 32)
}

/// The node's hash of one name component: XxHash64 (seed 0) over the bytes
/// that `<str as Hash>::hash` writes (the string, then `0xFF`).
pub fn encode_component(component: &str) -> u64 {
    let mut bytes = Vec::with_capacity(component.len() + 1);
    bytes.extend_from_slice(component.as_bytes());
    bytes.push(0xFF);
    xxhash64(&bytes, 0)
}

/// A wire name with both forms filled, as a node announces it.
pub fn make_name(components: [&str; 3], id: u128) -> dp::Name {
    dp::Name {
        name: Some(dp::EncodedName {
            component_0: encode_component(components[0]),
            component_1: encode_component(components[1]),
            component_2: encode_component(components[2]),
            name_id: Some(dp::NameId {
                id_0: (id >> 64) as u64,
                id_1: id as u64,
            }),
        }),
        str_name: Some(dp::StringName {
            str_component_0: components[0].to_string(),
            str_component_1: components[1].to_string(),
            str_component_2: components[2].to_string(),
        }),
    }
}

/// How a node keys a name in its tables: the encoded components and the id.
/// The string form plays no part in matching (the node ignores it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameKey {
    /// Hashes of the three components.
    pub prefix: [u64; 3],
    /// The component id (`NULL_ID` when absent).
    pub id: u128,
}

impl NameKey {
    /// The key of a wire name, or `None` when it lacks the encoded form (a
    /// real node would dereference the missing field and fail).
    pub fn of(name: &dp::Name) -> Option<NameKey> {
        let enc = name.name.as_ref()?;
        let id = enc.name_id.as_ref().map_or(NULL_ID, |nid| {
            (u128::from(nid.id_0) << 64) | u128::from(nid.id_1)
        });
        Some(NameKey {
            prefix: [enc.component_0, enc.component_1, enc.component_2],
            id,
        })
    }
}

/// The string components of a wire name (empty strings when absent).
pub fn strings_of(name: &dp::Name) -> [String; 3] {
    match &name.str_name {
        Some(s) => [
            s.str_component_0.clone(),
            s.str_component_1.clone(),
            s.str_component_2.clone(),
        ],
        None => Default::default(),
    }
}

/// Rebuilds a wire name from a key and the strings recorded for its prefix.
pub fn name_from_key(key: &NameKey, strings: &[String; 3]) -> dp::Name {
    dp::Name {
        name: Some(dp::EncodedName {
            component_0: key.prefix[0],
            component_1: key.prefix[1],
            component_2: key.prefix[2],
            name_id: Some(dp::NameId {
                id_0: (key.id >> 64) as u64,
                id_1: key.id as u64,
            }),
        }),
        str_name: Some(dp::StringName {
            str_component_0: strings[0].clone(),
            str_component_1: strings[1].clone(),
            str_component_2: strings[2].clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxhash64_reference_vectors() {
        assert_eq!(xxhash64(b"", 0), 0xef46_db37_51d8_e999);
        assert_eq!(xxhash64(b"a", 0), 0xd24e_c4f1_a98c_6e5b);
        assert_eq!(xxhash64(b"abc", 0), 0x44bc_2cf5_ad77_0999);
        let long = b"agent-with-a-longer-name-over-32-bytes-long";
        assert_eq!(xxhash64(long, 0), 0xed3d_521f_5ac4_a7f9);
    }

    /// Values computed with `twox_hash::XxHash64` fed through `str::hash`,
    /// exactly as the node's `calculate_hash` does.
    #[test]
    fn encode_component_matches_the_node() {
        assert_eq!(encode_component(""), 0x9563_4172_a60b_7544);
        assert_eq!(encode_component("a"), 0x3ff5_008a_504a_5280);
        assert_eq!(encode_component("org"), 0x873e_5803_76ea_963b);
        assert_eq!(encode_component("default"), 0x2193_03c7_c93f_9668);
        let long = "agent-with-a-longer-name-over-32-bytes-long";
        assert_eq!(encode_component(long), 0x6b3c_aa16_9404_c6e4);
    }

    #[test]
    fn name_key_round_trip() {
        let name = make_name(["org", "ns", "agent"], NULL_ID);
        let key = NameKey::of(&name).unwrap();
        assert_eq!(key.id, NULL_ID);
        assert_eq!(key.prefix[0], encode_component("org"));
        let back = name_from_key(&key, &strings_of(&name));
        assert_eq!(back, name);
        let bare = dp::Name {
            name: None,
            str_name: name.str_name.clone(),
        };
        assert!(NameKey::of(&bare).is_none());
    }
}

//! Names on the wire. A `slim` node identifies a name by the XxHash64 (seed
//! 0) of each string component as Rust's `Hash` feeds it (the bytes, then
//! one 0xFF byte), plus a 128-bit id split in two u64 halves whose all-ones
//! value means "no id". The node dereferences the encoded form without
//! checking it exists, so every name the control plane sends carries it.

use std::hash::{Hash, Hasher};

use twox_hash::XxHash64;

use crate::limits;
use crate::proto::dp;
use crate::store::model::Name;

/// The id value meaning "no component id" (NULL_COMPONENT).
pub const NULL_ID: u128 = u128::MAX;

/// The node's hash of one name component.
pub fn encode_component(component: &str) -> u64 {
    let mut hasher = XxHash64::with_seed(0);
    component.hash(&mut hasher);
    hasher.finish()
}

fn split_id(id: u128) -> dp::NameId {
    dp::NameId {
        id_0: (id >> 64) as u64,
        id_1: id as u64,
    }
}

fn join_id(id: &dp::NameId) -> u128 {
    (u128::from(id.id_0) << 64) | u128::from(id.id_1)
}

/// The wire form of a name: encoded and string parts both filled.
pub fn to_wire(name: &Name) -> dp::Name {
    let [c0, c1, c2] = &name.components;
    dp::Name {
        name: Some(dp::EncodedName {
            component_0: encode_component(c0),
            component_1: encode_component(c1),
            component_2: encode_component(c2),
            name_id: Some(split_id(name.id.unwrap_or(NULL_ID))),
        }),
        str_name: Some(dp::StringName {
            str_component_0: c0.clone(),
            str_component_1: c1.clone(),
            str_component_2: c2.clone(),
        }),
    }
}

/// Why a name from a peer was not accepted.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("name has no string components")]
    NoStrings,
    #[error("name component {0} is empty")]
    EmptyComponent(usize),
    #[error("name component {0} contains a control character")]
    ControlCharacter(usize),
    #[error("name component {0} is {1} bytes long; at most {max} are accepted", max = limits::MAX_NAME_COMPONENT_BYTES)]
    TooLong(usize, usize),
}

/// A name from the wire. The strings are required: the control plane shows
/// and matches names by them, and a hash alone cannot be shown to operators.
pub fn from_wire(name: &dp::Name) -> Result<Name, NameError> {
    let s = name.str_name.as_ref().ok_or(NameError::NoStrings)?;
    let components = [
        s.str_component_0.clone(),
        s.str_component_1.clone(),
        s.str_component_2.clone(),
    ];
    if let Some(i) = components.iter().position(String::is_empty) {
        return Err(NameError::EmptyComponent(i));
    }
    // Control characters (NUL above all, which no database text holds)
    // have no place in a name; refusing them keeps one bad name from
    // failing every later fact of the node.
    if let Some(i) = components
        .iter()
        .position(|c| c.chars().any(char::is_control))
    {
        return Err(NameError::ControlCharacter(i));
    }
    if let Some((i, c)) = components
        .iter()
        .enumerate()
        .find(|(_, c)| c.len() > limits::MAX_NAME_COMPONENT_BYTES)
    {
        return Err(NameError::TooLong(i, c.len()));
    }
    let id = name
        .name
        .as_ref()
        .and_then(|e| e.name_id.as_ref())
        .map(join_id)
        .filter(|&id| id != NULL_ID);
    Ok(Name { components, id })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_name(id: Option<u128>) -> Name {
        Name {
            components: ["org".into(), "default".into(), "app".into()],
            id,
        }
    }

    #[test]
    fn component_hash_is_xxhash64_of_bytes_and_ff() {
        let mut bytes = b"org".to_vec();
        bytes.push(0xff);
        assert_eq!(encode_component("org"), XxHash64::oneshot(0, &bytes));
        assert_ne!(encode_component("org"), encode_component("org2"));
    }

    #[test]
    fn wire_round_trip_keeps_id_and_strings() {
        for id in [None, Some(7), Some(u128::from(u64::MAX) + 5)] {
            let wire = to_wire(&mk_name(id));
            assert_eq!(from_wire(&wire), Ok(mk_name(id)));
        }
    }

    #[test]
    fn null_id_is_all_ones_on_the_wire() {
        let wire = to_wire(&mk_name(None));
        let nid = wire.name.and_then(|e| e.name_id);
        assert_eq!(
            nid,
            Some(dp::NameId {
                id_0: u64::MAX,
                id_1: u64::MAX
            })
        );
    }

    #[test]
    fn names_without_strings_or_with_empty_parts_are_refused() {
        assert_eq!(from_wire(&dp::Name::default()), Err(NameError::NoStrings));
        let mut wire = to_wire(&mk_name(None));
        if let Some(s) = wire.str_name.as_mut() {
            s.str_component_1.clear();
        }
        assert_eq!(from_wire(&wire), Err(NameError::EmptyComponent(1)));
        if let Some(s) = wire.str_name.as_mut() {
            s.str_component_1 = "a\0b".into();
        }
        assert_eq!(from_wire(&wire), Err(NameError::ControlCharacter(1)));
        if let Some(s) = wire.str_name.as_mut() {
            s.str_component_1 = "a".repeat(limits::MAX_NAME_COMPONENT_BYTES + 1);
        }
        let too_long = NameError::TooLong(1, limits::MAX_NAME_COMPONENT_BYTES + 1);
        assert_eq!(from_wire(&wire), Err(too_long));
    }
}

//! Sizes the control plane accepts from nodes and operators, checked at the
//! door so that both stores keep whatever passes: Postgres cannot index a
//! text much over 2.7 kB, and a value one store keeps and the other refuses
//! would make a node's fate depend on the backend. Well-formed nodes stay
//! far below every limit; the limits exist to refuse garbage with a message
//! instead of failing a statement later.

/// Node ids (with their group prefix), group names, segment names and link
/// ids, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// One component of a name (`org`, `namespace`, `app`), in bytes.
pub const MAX_NAME_COMPONENT_BYTES: usize = 256;
/// An endpoint or external endpoint, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 1024;
/// One connection detail's metadata, as JSON, in bytes.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;
/// A registration-auth domain's shared secret, in bytes: far above any
/// generated secret, low enough that nobody stores a file by mistake.
pub const MAX_SECRET_BYTES: usize = 1024;
/// Connection details (listeners) one node reports.
pub const MAX_CONNECTION_DETAILS: usize = 64;
/// Entries (connections or routes) in one registration or one command
/// from a node.
pub const MAX_ENTRIES: usize = 100_000;

/// One gRPC message, either way, on every listener and the relay: the
/// largest well-formed message (a registration or list reply of a node
/// with tens of thousands of routes) is a few megabytes; tonic's default
/// of 4 MiB would refuse such a node, no limit at all would let one peer
/// make the replica buffer gigabytes.
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// What a checked value broke.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("{field} is {len} bytes long; at most {max} are accepted")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{field} has {count} entries; at most {max} are accepted")]
    TooMany {
        field: &'static str,
        count: usize,
        max: usize,
    },
}

/// `value` is at most `max` bytes.
pub fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), LimitError> {
    match value.len() {
        len if len > max => Err(LimitError::TooLong { field, len, max }),
        _ => Ok(()),
    }
}

/// `count` entries are at most `max`.
pub fn check_count(field: &'static str, count: usize, max: usize) -> Result<(), LimitError> {
    match count {
        count if count > max => Err(LimitError::TooMany { field, count, max }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_inclusive_and_name_the_field() {
        assert_eq!(
            check_len("node_id", &"a".repeat(MAX_ID_BYTES), MAX_ID_BYTES),
            Ok(())
        );
        let long = "é".repeat(MAX_ID_BYTES / 2 + 1);
        let err = check_len("node_id", &long, MAX_ID_BYTES);
        assert_eq!(
            err,
            Err(LimitError::TooLong {
                field: "node_id",
                len: MAX_ID_BYTES + 2,
                max: MAX_ID_BYTES
            })
        );
        let shown = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(shown.starts_with("node_id is 258 bytes"), "{shown}");
        assert_eq!(check_count("routes", 3, 3), Ok(()));
        assert!(check_count("routes", 4, 3).is_err());
    }
}

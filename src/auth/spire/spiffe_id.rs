//! SPIFFE ids as the SPIFFE ID specification writes them:
//! `spiffe://<trust domain>/<path>`, the trust domain in lowercase letters,
//! digits, `.`, `-` and `_`, each path segment non-empty and neither `.`
//! nor `..`, in letters, digits, `.`, `-` and `_`.

use std::fmt;

const SCHEME: &str = "spiffe://";
/// The specification's limit on a whole SPIFFE id (a URI), in bytes.
const MAX_LEN: usize = 2048;

/// A parsed SPIFFE id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeId {
    id: String,
    /// Where the trust domain ends in `id`.
    td_end: usize,
}

impl SpiffeId {
    /// Parses `id`; `Err` says what is wrong, for a refusal.
    pub fn parse(id: &str) -> Result<Self, &'static str> {
        if id.len() > MAX_LEN {
            return Err("the SPIFFE id is longer than 2048 bytes");
        }
        let rest = id
            .strip_prefix(SCHEME)
            .ok_or("the SPIFFE id does not start with `spiffe://`")?;
        let (td, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if !is_trust_domain_name(td) {
            return Err("the SPIFFE id's trust domain is empty or not in [a-z0-9._-]");
        }
        if !path.is_empty() && !path[1..].split('/').all(is_path_segment) {
            return Err("the SPIFFE id's path has an empty, `.`, `..` or invalid segment");
        }
        Ok(SpiffeId {
            id: id.to_string(),
            td_end: SCHEME.len() + td.len(),
        })
    }

    /// The trust domain's name (`example.org`).
    pub fn trust_domain(&self) -> &str {
        &self.id[SCHEME.len()..self.td_end]
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// A trust domain's name as the specification allows it.
pub fn is_trust_domain_name(td: &str) -> bool {
    !td.is_empty()
        && td
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// A trust domain as bundle sources name it: `example.org` or its id
/// `spiffe://example.org` (the Workload API may send either).
pub fn trust_domain_of(name_or_id: &str) -> Option<&str> {
    let td = name_or_id.strip_prefix(SCHEME).unwrap_or(name_or_id);
    is_trust_domain_name(td).then_some(td)
}

fn is_path_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment != "."
        && segment != ".."
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_follow_the_specification() {
        let id = SpiffeId::parse("spiffe://cluster-a.example/ns/slim/node_1").unwrap();
        assert_eq!(id.trust_domain(), "cluster-a.example");
        assert_eq!(id.to_string(), "spiffe://cluster-a.example/ns/slim/node_1");
        assert_eq!(SpiffeId::parse("spiffe://a").unwrap().trust_domain(), "a");
        for bad in [
            "",
            "http://a/b",
            "spiffe://",
            "spiffe:///path",
            "spiffe://Upper/x",
            "spiffe://a:443/x",
            "spiffe://a/",
            "spiffe://a//x",
            "spiffe://a/./x",
            "spiffe://a/../x",
            "spiffe://a/x?q",
            "spiffe://user@a/x",
        ] {
            assert!(SpiffeId::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long = format!("spiffe://a/{}", "x".repeat(MAX_LEN));
        assert!(SpiffeId::parse(&long).is_err());
    }

    #[test]
    fn bundle_keys_may_name_the_trust_domain_or_its_id() {
        assert_eq!(trust_domain_of("example.org"), Some("example.org"));
        assert_eq!(trust_domain_of("spiffe://example.org"), Some("example.org"));
        assert_eq!(trust_domain_of("spiffe://example.org/x"), None);
        assert_eq!(trust_domain_of(""), None);
    }
}

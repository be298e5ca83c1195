//! The `topology:` section, in the reference's shape:
//!
//! ```yaml
//! topology:
//!   links:                      # or `segments:` (which then win)
//!     - group: cloud
//!       neighbors: ["*"]
//!   registration_auth:          # optional
//!     type: shared_secret
//!     secrets: {cluster-a: "<at least 32 bytes>"}
//! ```
//!
//! Absent, `{}`, or with empty `links`/`segments`, the topology is managed
//! through the API. With both `links` and `segments`, the segments rule and
//! the links are ignored, as the architecture document says (the reference's
//! parser refuses such a file); the binary warns that they are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};

use super::ConfigError;
use super::secret::SharedSecret;

/// Topology mode plus optional registration authentication.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopologySettings {
    /// Where the topology comes from.
    pub mode: TopologyConfig,
    /// How nodes prove membership of their group; `None` accepts all.
    pub registration_auth: Option<RegistrationAuthConfig>,
}

/// Where the group topology comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum TopologyConfig {
    /// Managed at runtime through the API and kept in the database.
    #[default]
    Api,
    /// One routing domain with this adjacency list (config mode).
    Links(Vec<AdjacencyEntry>),
    /// Independent routing domains (config mode); names and links may use
    /// the `$group` template.
    Segments(Vec<SegmentConfig>),
}

/// Nodes of `group` link to nodes of each of `neighbors` (both ways).
/// `"*"` matches every group, `$group` is a segment template variable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdjacencyEntry {
    /// Source group.
    #[serde(deserialize_with = "group_name")]
    pub group: String,
    /// Groups it links to.
    #[serde(deserialize_with = "group_names")]
    pub neighbors: Vec<String>,
}

/// An independent routing domain with its own link graph.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentConfig {
    /// Segment name; may contain `$group`.
    #[serde(deserialize_with = "group_name")]
    pub name: String,
    /// Links inside the segment.
    pub links: Vec<AdjacencyEntry>,
}

/// Registration authentication (`topology.registration_auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationAuthConfig {
    /// Per-group HMAC secrets. May be empty in API mode, where secrets are
    /// managed through the API.
    SharedSecret {
        /// Group name to secret.
        secrets: BTreeMap<String, SharedSecret>,
    },
    /// JWT-SVIDs checked against SPIFFE trust bundles; the SPIFFE id's
    /// trust domain must equal the group name.
    Spire {
        /// Where the trust bundles come from.
        bundles: SpireBundleSource,
        /// Audience the JWT-SVIDs must carry (the reference's is `slim`).
        audience: String,
    },
}

/// Where `type: spire` gets its JWT trust bundles: exactly one of
/// `socket_path` and `bundle_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpireBundleSource {
    /// The SPIFFE Workload API of the local SPIRE agent (`socket_path`),
    /// followed as the agent streams updates.
    WorkloadApi {
        /// The agent's unix socket (`/path`, `unix:/path` or `unix:///path`).
        socket_path: String,
    },
    /// A JSON file (`bundle_path`), reloaded when it changes: one JWKS or
    /// SPIFFE bundle for `trust_domain`, or, without `trust_domain`, an
    /// object mapping each trust domain to its JWKS.
    File {
        /// The file.
        path: String,
        /// The trust domain of a single-bundle file.
        trust_domain: Option<String>,
    },
}

impl TopologyConfig {
    /// True when the topology is managed through the API.
    pub fn is_api_mode(&self) -> bool {
        matches!(self, TopologyConfig::Api)
    }
}

impl TopologySettings {
    /// True when the topology is managed through the API.
    pub fn is_api_mode(&self) -> bool {
        self.mode.is_api_mode()
    }

    /// Re-checks everything, for configurations built in code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.mode {
            TopologyConfig::Api => {}
            TopologyConfig::Links(links) => check_links(links, "topology.links")?,
            TopologyConfig::Segments(segments) => check_segments(segments)?,
        }
        match &self.registration_auth {
            Some(auth) => auth.validate(self.is_api_mode()),
            None => Ok(()),
        }
    }
}

impl RegistrationAuthConfig {
    fn validate(&self, api_mode: bool) -> Result<(), ConfigError> {
        let key = "topology.registration_auth";
        match self {
            RegistrationAuthConfig::SharedSecret { secrets } => {
                if secrets.is_empty() && !api_mode {
                    return Err(ConfigError::invalid(
                        format!("{key}.secrets"),
                        "at least one group secret is required when the topology is set \
                         in the file (in API mode secrets are managed through the API)",
                    ));
                }
                // Secret lengths are enforced by `SharedSecret` itself.
                for group in secrets.keys() {
                    non_empty(group)
                        .map_err(|m| ConfigError::invalid(format!("{key}.secrets.{group}"), m))?;
                }
                Ok(())
            }
            RegistrationAuthConfig::Spire { bundles, audience } => {
                bundles.validate(key)?;
                non_empty(audience).map_err(|m| ConfigError::invalid(format!("{key}.audience"), m))
            }
        }
    }
}

impl SpireBundleSource {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match self {
            SpireBundleSource::WorkloadApi { socket_path } => non_empty(socket_path)
                .map_err(|m| ConfigError::invalid(format!("{key}.socket_path"), m)),
            SpireBundleSource::File { path, trust_domain } => {
                non_empty(path)
                    .map_err(|m| ConfigError::invalid(format!("{key}.bundle_path"), m))?;
                match trust_domain {
                    Some(td) => trust_domain_name(td)
                        .map_err(|m| ConfigError::invalid(format!("{key}.trust_domain"), m)),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A SPIFFE trust domain name: lowercase letters, digits, `.`, `-`, `_`
/// (the SPIFFE ID specification). The `spiffe://` form is a common slip.
fn trust_domain_name(td: &str) -> Result<(), String> {
    if td.starts_with("spiffe://") {
        return Err(format!(
            "{td:?}: write the trust domain's name without `spiffe://`"
        ));
    }
    let valid = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
    if td.is_empty() || !td.bytes().all(valid) {
        return Err(format!(
            "{td:?} is not a SPIFFE trust domain name (lowercase letters, digits, `.`, `-`, `_`)"
        ));
    }
    Ok(())
}

fn check_links(links: &[AdjacencyEntry], key: &str) -> Result<(), ConfigError> {
    for (i, entry) in links.iter().enumerate() {
        let at = format!("{key}[{i}]");
        non_empty(&entry.group).map_err(|m| ConfigError::invalid(format!("{at}.group"), m))?;
        for neighbor in &entry.neighbors {
            non_empty(neighbor).map_err(|m| ConfigError::invalid(format!("{at}.neighbors"), m))?;
        }
    }
    Ok(())
}

/// Names must be unique: two segments with one name would silently merge
/// or shadow each other at runtime.
fn check_segments(segments: &[SegmentConfig]) -> Result<(), ConfigError> {
    let mut seen = BTreeSet::new();
    for (i, segment) in segments.iter().enumerate() {
        let at = format!("topology.segments[{i}]");
        non_empty(&segment.name).map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
        if !seen.insert(segment.name.as_str()) {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!("segment {:?} is defined twice", segment.name),
            ));
        }
        check_links(&segment.links, &format!("{at}.links"))?;
    }
    Ok(())
}

/// The section as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawTopology {
    links: Option<Vec<AdjacencyEntry>>,
    segments: Option<Vec<SegmentConfig>>,
    registration_auth: Option<RawAuth>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum AuthKind {
    SharedSecret,
    Spire,
}

/// `registration_auth` as written. The reference reads `secrets` for
/// `shared_secret` and `socket_path` for `spire`; `audience`,
/// `bundle_path` and `trust_domain` are slim-cp's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    #[serde(rename = "type")]
    kind: AuthKind,
    secrets: Option<BTreeMap<String, SharedSecret>>,
    socket_path: Option<String>,
    bundle_path: Option<String>,
    trust_domain: Option<String>,
    audience: Option<String>,
}

impl RawTopology {
    pub(super) fn into_config(
        self,
        ignored: &mut Vec<String>,
    ) -> Result<TopologySettings, ConfigError> {
        let links = self.links.filter(|l| !l.is_empty());
        let segments = self.segments.filter(|s| !s.is_empty());
        let mode = match (links, segments) {
            (links, Some(segments)) => {
                // The spec: with segments, top-level links are ignored.
                if links.is_some() {
                    ignored.push("topology.links (segments are defined)".to_string());
                }
                TopologyConfig::Segments(segments)
            }
            (Some(links), None) => TopologyConfig::Links(links),
            (None, None) => TopologyConfig::Api,
        };
        let registration_auth = match self.registration_auth {
            Some(raw) => Some(raw.into_config(ignored)?),
            None => None,
        };
        Ok(TopologySettings {
            mode,
            registration_auth,
        })
    }
}

impl RawAuth {
    fn into_config(self, ignored: &mut Vec<String>) -> Result<RegistrationAuthConfig, ConfigError> {
        let key = "topology.registration_auth";
        let mut ignore = |present: bool, name: &str| {
            if present {
                ignored.push(format!("{key}.{name}"));
            }
        };
        match self.kind {
            AuthKind::SharedSecret => {
                ignore(self.socket_path.is_some(), "socket_path");
                ignore(self.bundle_path.is_some(), "bundle_path");
                ignore(self.trust_domain.is_some(), "trust_domain");
                ignore(self.audience.is_some(), "audience");
                Ok(RegistrationAuthConfig::SharedSecret {
                    secrets: self.secrets.unwrap_or_default(),
                })
            }
            AuthKind::Spire => {
                ignore(self.secrets.is_some(), "secrets");
                let bundles = spire_source(self.socket_path, self.bundle_path, self.trust_domain)?;
                Ok(RegistrationAuthConfig::Spire {
                    bundles,
                    audience: self.audience.unwrap_or_else(|| "slim".to_string()),
                })
            }
        }
    }
}

/// Exactly one bundle source; `trust_domain` only names a file's bundle.
fn spire_source(
    socket_path: Option<String>,
    bundle_path: Option<String>,
    trust_domain: Option<String>,
) -> Result<SpireBundleSource, ConfigError> {
    let key = "topology.registration_auth";
    match (socket_path, bundle_path) {
        (Some(socket_path), None) => {
            if trust_domain.is_some() {
                return Err(ConfigError::invalid(
                    format!("{key}.trust_domain"),
                    "only with `bundle_path`: the Workload API names each bundle's trust domain",
                ));
            }
            Ok(SpireBundleSource::WorkloadApi { socket_path })
        }
        (None, Some(path)) => Ok(SpireBundleSource::File { path, trust_domain }),
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            format!("{key}.bundle_path"),
            "set either `socket_path` (the SPIRE agent's Workload API) or `bundle_path` \
             (a trust bundle file), not both",
        )),
        (None, None) => Err(ConfigError::invalid(
            format!("{key}.socket_path"),
            "missing key (with `type: spire`, set `socket_path` to the SPIRE agent's \
             Workload API socket, or `bundle_path` to a trust bundle file)",
        )),
    }
}

/// Names, groups and paths must say something: an empty one is a typo.
fn non_empty(value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(())
}

/// Checked inside the visitor so that the error points at the value.
fn group_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    deserializer.deserialize_str(NameVisitor)
}

fn group_names<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<Name>::deserialize(deserializer)?;
    Ok(names.into_iter().map(|Name(name)| name).collect())
}

/// A list element, checked like a single name (its index is in the path).
struct Name(String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(NameVisitor).map(Name)
    }
}

struct NameVisitor;

impl Visitor<'_> for NameVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-empty name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        non_empty(v).map_err(E::custom)?;
        Ok(v.to_string())
    }

    // A group named `2024` or `true` reads the same whether or not the file
    // uses `${...}` references (which re-type every value as YAML nodes).
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<TopologySettings, String> {
        let raw: RawTopology = yaml_serde::from_str(yaml).map_err(|e| e.to_string())?;
        let settings = raw
            .into_config(&mut Vec::new())
            .map_err(|e| e.to_string())?;
        settings.validate().map_err(|e| e.to_string())?;
        Ok(settings)
    }

    fn entry(group: &str, neighbors: &[&str]) -> AdjacencyEntry {
        AdjacencyEntry {
            group: group.into(),
            neighbors: neighbors.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn modes() {
        assert!(parse("{}").unwrap().is_api_mode());
        assert!(parse("links: []").unwrap().is_api_mode());
        let links = parse("links: [{group: hub, neighbors: ['*']}]").unwrap();
        assert_eq!(
            links.mode,
            TopologyConfig::Links(vec![entry("hub", &["*"])])
        );
        let segments =
            parse("segments: [{name: s-$group, links: [{group: hub, neighbors: [$group]}]}]");
        assert!(matches!(
            segments.unwrap().mode,
            TopologyConfig::Segments(_)
        ));
        let both = crate::config::Config::from_yaml_str(
            "topology:\n  links: [{group: a, neighbors: [b]}]\n  segments: [{name: s, links: [{group: c, neighbors: [d]}]}]\n",
        )
        .unwrap();
        assert!(matches!(both.topology.mode, TopologyConfig::Segments(_)));
        assert!(
            both.ignored_keys()
                .iter()
                .any(|k| k.starts_with("topology.links"))
        );
    }

    #[test]
    fn code_built_settings_are_checked_too() {
        let segment = SegmentConfig {
            name: "s".into(),
            links: vec![entry("a", &["b"])],
        };
        let twice = TopologySettings {
            mode: TopologyConfig::Segments(vec![segment.clone(), segment]),
            registration_auth: None,
        };
        let err = twice.validate().unwrap_err();
        assert_eq!(err.key(), Some("topology.segments[1].name"));
        let blank = TopologySettings {
            mode: TopologyConfig::Links(vec![entry("a", &[" "])]),
            registration_auth: None,
        };
        assert_eq!(
            blank.validate().unwrap_err().key(),
            Some("topology.links[0].neighbors")
        );
    }

    #[test]
    fn auth_keys_of_the_other_kind_are_reported() {
        let raw: RawTopology =
            yaml_serde::from_str("registration_auth: {type: shared_secret, socket_path: /s}")
                .unwrap();
        let mut ignored = Vec::new();
        raw.into_config(&mut ignored).unwrap();
        assert_eq!(ignored, vec!["topology.registration_auth.socket_path"]);
        let spire =
            parse("registration_auth: {type: spire, socket_path: /s, audience: cp}").unwrap();
        assert_eq!(
            spire.registration_auth,
            Some(RegistrationAuthConfig::Spire {
                bundles: SpireBundleSource::WorkloadApi {
                    socket_path: "/s".into()
                },
                audience: "cp".into()
            })
        );
    }

    #[test]
    fn spire_takes_exactly_one_bundle_source() {
        let file = parse("registration_auth: {type: spire, bundle_path: /b.json, trust_domain: a}")
            .unwrap();
        assert_eq!(
            file.registration_auth,
            Some(RegistrationAuthConfig::Spire {
                bundles: SpireBundleSource::File {
                    path: "/b.json".into(),
                    trust_domain: Some("a".into())
                },
                audience: "slim".into()
            })
        );
        let map = parse("registration_auth: {type: spire, bundle_path: /b.json}").unwrap();
        assert!(matches!(
            map.registration_auth,
            Some(RegistrationAuthConfig::Spire {
                bundles: SpireBundleSource::File {
                    trust_domain: None,
                    ..
                },
                ..
            })
        ));
        let refused = |yaml: &str, key: &str| {
            let err = parse(yaml).unwrap_err();
            assert!(err.starts_with(key), "{err}");
            err
        };
        let key = "topology.registration_auth";
        let both = refused(
            "registration_auth: {type: spire, socket_path: /s, bundle_path: /b}",
            &format!("{key}.bundle_path"),
        );
        assert!(both.contains("not both"), "{both}");
        let neither = refused(
            "registration_auth: {type: spire}",
            &format!("{key}.socket_path"),
        );
        assert!(neither.contains("bundle_path"), "{neither}");
        refused(
            "registration_auth: {type: spire, socket_path: /s, trust_domain: a}",
            &format!("{key}.trust_domain"),
        );
        refused(
            "registration_auth: {type: spire, bundle_path: /b, trust_domain: A.org}",
            &format!("{key}.trust_domain"),
        );
        let uri = refused(
            "registration_auth: {type: spire, bundle_path: /b, trust_domain: 'spiffe://a'}",
            &format!("{key}.trust_domain"),
        );
        assert!(uri.contains("without `spiffe://`"), "{uri}");
        refused(
            "registration_auth: {type: spire, bundle_path: ' '}",
            &format!("{key}.bundle_path"),
        );
    }
}

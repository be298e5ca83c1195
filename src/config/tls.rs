//! The `tls:` key of a listener, in the reference's shape
//! (agntcy-slim-config 0.12 `TlsServerConfig`, with its `Config` flattened in):
//!
//! ```yaml
//! tls:
//!   insecure: false
//!   source: {type: file, cert: /certs/tls.crt, key: /certs/tls.key}
//!   client_ca: {type: file, path: /certs/ca.crt}   # mTLS
//! ```
//!
//! slim-cp loads certificates from files. `pem` and `spire` sources are
//! accepted when they have no effect (`insecure: true`) and refused
//! otherwise, because dropping them would serve without the TLS or client
//! verification the operator asked for.

use std::path::PathBuf;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::ConfigError;

/// TLS settings of one listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsServerConfig {
    /// Serve plaintext. The reference defaults this to `false` inside a
    /// `tls` key; an absent server section is plaintext.
    pub insecure: bool,
    /// PEM certificate chain (`tls.source.cert` with `type: file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key (`tls.source.key` with `type: file`).
    pub key_file: Option<PathBuf>,
    /// CA bundle that client certificates must chain to; setting it turns on
    /// mutual TLS (`tls.client_ca.path` with `type: file`).
    pub client_ca_file: Option<PathBuf>,
}

impl TlsServerConfig {
    /// Plaintext, as for a listener whose section is absent.
    pub fn insecure() -> Self {
        Self {
            insecure: true,
            cert_file: None,
            key_file: None,
            client_ca_file: None,
        }
    }

    /// Refuses TLS without a certificate, which the reference only finds
    /// when it starts listening.
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        let key = format!("{section}.tls");
        if self.insecure {
            if self.client_ca_file.is_some() {
                return Err(ConfigError::invalid(
                    key,
                    "client_ca needs TLS, but `insecure: true` turns TLS off",
                ));
            }
            return Ok(());
        }
        if self.cert_file.is_none() || self.key_file.is_none() {
            return Err(ConfigError::invalid(
                key,
                format!(
                    "TLS is on but no certificate is configured (as in the reference, \
                     `insecure` defaults to false once a `{section}` section is written): \
                     set `tls.source: {{type: file, cert: <path>, key: <path>}}`, \
                     or `tls.insecure: true` to serve plaintext"
                ),
            ));
        }
        Ok(())
    }
}

impl Default for TlsServerConfig {
    fn default() -> Self {
        Self::insecure()
    }
}

/// The key as written. Besides `insecure`, `source` and `client_ca`, the
/// reference accepts these, which have no effect on a slim-cp listener
/// (several have none on the reference's either).
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawTls {
    insecure: Option<bool>,
    source: Option<RawSource>,
    client_ca: Option<RawCaSource>,
    ca_source: Option<IgnoredAny>,
    include_system_ca_certs_pool: Option<IgnoredAny>,
    tls_version: Option<IgnoredAny>,
    reload_interval: Option<IgnoredAny>,
    reload_client_ca_file: Option<IgnoredAny>,
}

/// `type` of a certificate or CA source, as in the reference.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum SourceKind {
    File,
    Pem,
    Spire,
    None,
}

/// `tls.source`: the reference's `TlsSource`.
#[derive(Deserialize)]
#[allow(dead_code, reason = "the SPIRE keys are accepted, never used")]
#[serde(deny_unknown_fields)]
struct RawSource {
    #[serde(rename = "type")]
    kind: SourceKind,
    cert: Option<String>,
    key: Option<String>,
    socket_path: Option<IgnoredAny>,
    target_spiffe_id: Option<IgnoredAny>,
    jwt_audiences: Option<IgnoredAny>,
    trust_domains: Option<IgnoredAny>,
}

/// `tls.client_ca`: the reference's `CaSource`.
#[derive(Deserialize)]
#[allow(dead_code, reason = "the pem and SPIRE keys are accepted, never used")]
#[serde(deny_unknown_fields)]
struct RawCaSource {
    #[serde(rename = "type")]
    kind: SourceKind,
    path: Option<String>,
    data: Option<IgnoredAny>,
    socket_path: Option<IgnoredAny>,
    target_spiffe_id: Option<IgnoredAny>,
    jwt_audiences: Option<IgnoredAny>,
    trust_domains: Option<IgnoredAny>,
}

impl RawTls {
    pub(super) fn into_config(
        self,
        section: &str,
        ignored: &mut Vec<String>,
    ) -> Result<TlsServerConfig, ConfigError> {
        let prefix = format!("{section}.tls");
        ignored.extend(self.ignored_keys().map(|k| format!("{prefix}.{k}")));
        let insecure = self.insecure.unwrap_or(false);
        let mut tls = TlsServerConfig {
            insecure,
            ..TlsServerConfig::insecure()
        };
        if let Some(source) = self.source {
            let key = format!("{prefix}.source");
            if let Some((cert, key_file)) = source.files(&key, insecure, ignored)? {
                tls.cert_file = Some(PathBuf::from(cert));
                tls.key_file = Some(PathBuf::from(key_file));
            }
        }
        if let Some(ca) = self.client_ca {
            let key = format!("{prefix}.client_ca");
            tls.client_ca_file = ca.file(&key, insecure, ignored)?.map(PathBuf::from);
        }
        Ok(tls)
    }

    fn ignored_keys(&self) -> impl Iterator<Item = &'static str> {
        [
            ("ca_source", self.ca_source.is_some()),
            (
                "include_system_ca_certs_pool",
                self.include_system_ca_certs_pool.is_some(),
            ),
            ("tls_version", self.tls_version.is_some()),
            ("reload_interval", self.reload_interval.is_some()),
            (
                "reload_client_ca_file",
                self.reload_client_ca_file.is_some(),
            ),
        ]
        .into_iter()
        .filter(|(_, present)| *present)
        .map(|(key, _)| key)
    }
}

/// Decides whether a source with `kind` is used: `None` means it has no
/// effect (recorded as ignored when it was written), an error that slim-cp
/// cannot honour it.
fn usable(
    kind: SourceKind,
    key: &str,
    insecure: bool,
    ignored: &mut Vec<String>,
) -> Result<bool, ConfigError> {
    match kind {
        SourceKind::None => Ok(false),
        _ if insecure => {
            ignored.push(key.to_string());
            Ok(false)
        }
        SourceKind::File => Ok(true),
        SourceKind::Pem | SourceKind::Spire => Err(ConfigError::invalid(
            format!("{key}.type"),
            format!(
                "`{}` is not supported by slim-cp, which reads PEM files: use `type: file`",
                if kind == SourceKind::Pem {
                    "pem"
                } else {
                    "spire"
                }
            ),
        )),
    }
}

fn required(value: Option<String>, key: String) -> Result<String, ConfigError> {
    value.ok_or_else(|| ConfigError::invalid(key, "missing key (required with `type: file`)"))
}

impl RawSource {
    fn files(
        self,
        key: &str,
        insecure: bool,
        ignored: &mut Vec<String>,
    ) -> Result<Option<(String, String)>, ConfigError> {
        if !usable(self.kind, key, insecure, ignored)? {
            return Ok(None);
        }
        let cert = required(self.cert, format!("{key}.cert"))?;
        let private_key = required(self.key, format!("{key}.key"))?;
        Ok(Some((cert, private_key)))
    }
}

impl RawCaSource {
    fn file(
        self,
        key: &str,
        insecure: bool,
        ignored: &mut Vec<String>,
    ) -> Result<Option<String>, ConfigError> {
        if !usable(self.kind, key, insecure, ignored)? {
            return Ok(None);
        }
        required(self.path, format!("{key}.path")).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<(TlsServerConfig, Vec<String>), ConfigError> {
        let raw: RawTls = yaml_serde::from_str(yaml).unwrap();
        let mut ignored = Vec::new();
        let tls = raw.into_config("southbound", &mut ignored)?;
        tls.validate("southbound")?;
        Ok((tls, ignored))
    }

    #[test]
    fn file_source_and_client_ca() {
        let yaml = "source: {type: file, cert: /c.pem, key: /k.pem}\n\
                    client_ca: {type: file, path: /ca.pem}\ntls_version: tls1.3\n";
        let (tls, ignored) = parse(yaml).unwrap();
        assert!(!tls.insecure);
        assert_eq!(tls.cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(tls.key_file, Some(PathBuf::from("/k.pem")));
        assert_eq!(tls.client_ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(ignored, vec!["southbound.tls.tls_version"]);
    }

    #[test]
    fn tls_without_certificate_is_refused() {
        let err = parse("{}").unwrap_err().to_string();
        assert!(err.starts_with("southbound.tls: TLS is on"), "{err}");
        let err = parse("source: {type: file, cert: /c.pem}").unwrap_err();
        assert_eq!(err.key(), Some("southbound.tls.source.key"));
    }

    #[test]
    fn pem_and_spire_refused_unless_insecure() {
        let err = parse("source: {type: pem, cert: x, key: y}").unwrap_err();
        assert_eq!(err.key(), Some("southbound.tls.source.type"));
        let err = parse("client_ca: {type: spire, socket_path: /s}").unwrap_err();
        assert_eq!(err.key(), Some("southbound.tls.client_ca.type"));
        let (tls, ignored) =
            parse("insecure: true\nsource: {type: spire, socket_path: /s}").unwrap();
        assert!(tls.insecure && tls.cert_file.is_none());
        assert_eq!(ignored, vec!["southbound.tls.source"]);
    }
}

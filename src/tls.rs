//! TLS for the northbound and southbound listeners, from PEM files.
//!
//! Everything is read and checked when the configuration is turned into
//! options, so a missing file or a key that does not match its certificate
//! stops the replica at startup with the configuration key and path in the
//! message, instead of surfacing as a listener failure later.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::config::TlsServerConfig;

/// A client that opens TCP and never finishes the handshake holds a
/// connection slot; this bounds how long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a listener's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// TLS is on but a file it needs is not configured.
    #[error("{key}: TLS is on but no {what} file is configured")]
    Missing {
        /// Configuration key, e.g. `southbound.tls.source.cert`.
        key: String,
        /// What is missing, in words.
        what: &'static str,
    },
    /// A configured file cannot be read.
    #[error("{key}: cannot read {}: {error}", path.display())]
    Read {
        key: String,
        path: PathBuf,
        error: io::Error,
    },
    /// A configured file holds no PEM block of the expected kind.
    #[error("{key}: {} holds no PEM {label} block", path.display())]
    NotPem {
        key: String,
        path: PathBuf,
        label: &'static str,
    },
    /// The files read, but do not make a TLS server (a key that does not
    /// match the certificate, an unparsable certificate, ...).
    #[error("{key}: the certificate, key and client CA do not make a usable TLS setup: {reason}")]
    Unusable { key: String, reason: String },
}

/// TLS for the listener of `section` (`northbound` or `southbound`):
/// `None` when it serves plaintext. A `client_ca_file` turns on mutual TLS
/// with client certificates required.
pub fn server_tls(
    cfg: &TlsServerConfig,
    section: &str,
) -> Result<Option<ServerTlsConfig>, TlsError> {
    if cfg.insecure {
        return Ok(None);
    }
    let key = format!("{section}.tls");
    let cert = read_pem(
        &format!("{key}.source.cert"),
        cfg.cert_file.as_deref(),
        Pem::Certificate,
    )?;
    let private_key = read_pem(
        &format!("{key}.source.key"),
        cfg.key_file.as_deref(),
        Pem::PrivateKey,
    )?;
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, private_key))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(path) = cfg.client_ca_file.as_deref() {
        let ca = read_pem(
            &format!("{key}.client_ca.path"),
            Some(path),
            Pem::Certificate,
        )?;
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    // Building a server parses everything, as `start` will.
    Server::builder()
        .tls_config(tls.clone())
        .map_err(|e| TlsError::Unusable {
            key,
            reason: causes(&e),
        })?;
    Ok(Some(tls))
}

/// Applies `tls` to a server builder; `None` leaves it plaintext.
pub fn apply<L>(server: Server<L>, tls: Option<ServerTlsConfig>) -> io::Result<Server<L>> {
    match tls {
        None => Ok(server),
        Some(tls) => server
            .tls_config(tls)
            .map_err(|e| io::Error::other(format!("TLS setup: {}", causes(&e)))),
    }
}

#[derive(Clone, Copy)]
enum Pem {
    Certificate,
    PrivateKey,
}

impl Pem {
    fn label(self) -> &'static str {
        match self {
            Pem::Certificate => "CERTIFICATE",
            Pem::PrivateKey => "PRIVATE KEY",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Pem::Certificate => "certificate",
            Pem::PrivateKey => "private key",
        }
    }

    /// A cheap shape check with a clear message; rustls judges the rest.
    /// Keys may be `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`.
    fn found_in(self, text: &[u8]) -> bool {
        let text = String::from_utf8_lossy(text);
        match self {
            Pem::Certificate => text.contains("-----BEGIN CERTIFICATE-----"),
            Pem::PrivateKey => text.split("-----BEGIN ").skip(1).any(|block| {
                block.starts_with("PRIVATE KEY-----") || block.contains(" PRIVATE KEY-----")
            }),
        }
    }
}

fn read_pem(key: &str, path: Option<&Path>, kind: Pem) -> Result<Vec<u8>, TlsError> {
    let path = path.ok_or_else(|| TlsError::Missing {
        key: key.to_string(),
        what: kind.what(),
    })?;
    let text = std::fs::read(path).map_err(|error| TlsError::Read {
        key: key.to_string(),
        path: path.to_path_buf(),
        error,
    })?;
    if !kind.found_in(&text) {
        return Err(TlsError::NotPem {
            key: key.to_string(),
            path: path.to_path_buf(),
            label: kind.label(),
        });
    }
    Ok(text)
}

/// tonic's transport error says only "transport error"; the reason is in
/// its sources.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Files {
        dir: PathBuf,
    }

    impl Files {
        fn new(name: &str) -> Files {
            let dir =
                std::env::temp_dir().join(format!("slim-cp-tls-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Files { dir }
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn tls(cert: PathBuf, key: PathBuf, ca: Option<PathBuf>) -> TlsServerConfig {
        TlsServerConfig {
            insecure: false,
            cert_file: Some(cert),
            key_file: Some(key),
            client_ca_file: ca,
        }
    }

    fn self_signed() -> (String, String) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        (cert.cert.pem(), cert.signing_key.serialize_pem())
    }

    #[test]
    fn insecure_is_plaintext() {
        assert!(
            server_tls(&TlsServerConfig::insecure(), "northbound")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn certificate_key_and_client_ca_load() {
        let files = Files::new("ok");
        let (cert, key) = self_signed();
        let cfg = tls(
            files.write("c.pem", &cert),
            files.write("k.pem", &key),
            Some(files.write("ca.pem", &cert)),
        );
        assert!(server_tls(&cfg, "southbound").unwrap().is_some());
    }

    #[test]
    fn a_missing_file_names_the_key_the_path_and_the_os_error() {
        let files = Files::new("missing");
        let (_, key) = self_signed();
        let cfg = tls(files.dir.join("nope.pem"), files.write("k.pem", &key), None);
        let err = server_tls(&cfg, "northbound").unwrap_err().to_string();
        assert!(
            err.starts_with("northbound.tls.source.cert: cannot read "),
            "{err}"
        );
        assert!(
            err.contains("nope.pem") && err.contains("os error 2"),
            "{err}"
        );
    }

    #[test]
    fn files_of_the_wrong_kind_are_refused() {
        let files = Files::new("kind");
        let (cert, key) = self_signed();
        let (c, k) = (files.write("c.pem", &cert), files.write("k.pem", &key));
        let swapped = server_tls(&tls(k.clone(), c.clone(), None), "southbound").unwrap_err();
        assert!(
            swapped
                .to_string()
                .starts_with("southbound.tls.source.cert: ")
                && swapped.to_string().contains("no PEM CERTIFICATE block"),
            "{swapped}"
        );
        let ca = server_tls(&tls(c.clone(), k.clone(), Some(k.clone())), "southbound");
        let ca = ca.unwrap_err().to_string();
        assert!(ca.starts_with("southbound.tls.client_ca.path: "), "{ca}");
    }

    #[test]
    fn a_key_of_another_certificate_is_unusable() {
        let files = Files::new("mismatch");
        let (cert, _) = self_signed();
        let (_, other_key) = self_signed();
        let cfg = tls(
            files.write("c.pem", &cert),
            files.write("k.pem", &other_key),
            None,
        );
        let err = server_tls(&cfg, "northbound").unwrap_err().to_string();
        assert!(
            err.starts_with("northbound.tls: the certificate, key"),
            "{err}"
        );
    }

    #[test]
    fn no_certificate_configured() {
        let cfg = TlsServerConfig {
            insecure: false,
            ..TlsServerConfig::insecure()
        };
        let err = server_tls(&cfg, "northbound").unwrap_err().to_string();
        assert_eq!(
            err,
            "northbound.tls.source.cert: TLS is on but no certificate file is configured"
        );
    }
}

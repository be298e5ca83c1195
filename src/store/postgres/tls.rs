//! TLS to Postgres, with libpq's `sslmode` meanings (see [`SslMode`]) and
//! rustls on the `ring` provider, the one the listeners already use.
//!
//! The settings are read from the connection string and the root
//! certificate loaded once, at startup: a wrong mode or an unreadable file
//! stops the replica there rather than at its first reconnection.
//! [`connector`] builds the one connector every connection uses (pool,
//! migrator, election, heartbeats, LISTEN).

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::SetupError;

/// The connection string's `sslmode`, as libpq reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it, else plaintext (libpq's default);
    /// the certificate is checked as by `Require`.
    #[default]
    Prefer,
    /// TLS or nothing; the certificate is not checked unless `sslrootcert`
    /// is given (then as `verify-ca`).
    Require,
    /// TLS, the chain checked against `sslrootcert`, any host name.
    VerifyCa,
    /// TLS, the chain checked and the host name in the certificate.
    VerifyFull,
}

impl SslMode {
    /// Every mode under its name in the connection string.
    const NAMES: [(&str, SslMode); 5] = [
        ("disable", SslMode::Disable),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    fn parse(value: &str) -> Result<SslMode, SetupError> {
        let found = Self::NAMES.iter().find(|(name, _)| *name == value);
        found.map(|(_, mode)| *mode).ok_or_else(|| {
            let allowed: Vec<&str> = Self::NAMES.iter().map(|(name, _)| *name).collect();
            SetupError::InvalidUrl(format!(
                "sslmode={value} is not supported; sslmode must be one of {}",
                allowed.join(", ")
            ))
        })
    }

    fn name(self) -> &'static str {
        let found = Self::NAMES.iter().find(|(_, mode)| *mode == self);
        found.map_or("?", |(name, _)| *name)
    }

    /// What tokio-postgres itself is told: whether to ask for TLS and
    /// whether a server without it is acceptable.
    pub(super) fn negotiation(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Pg;
        match self {
            SslMode::Disable => Pg::Disable,
            SslMode::Prefer => Pg::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Pg::Require,
        }
    }
}

/// The TLS part of a connection string (`prefer`, no root, by default).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
}

impl TlsSettings {
    /// From the values of the `sslmode` and `sslrootcert` keys (the last
    /// one wins when a key repeats, as in libpq).
    pub(super) fn from_params(params: &[(String, String)]) -> Result<TlsSettings, SetupError> {
        let mut settings = TlsSettings::default();
        for (key, value) in params {
            match key.as_str() {
                "sslmode" => settings.mode = SslMode::parse(value)?,
                "sslrootcert" => settings.root_cert = Some(PathBuf::from(value)),
                _ => {}
            }
        }
        let verifying = matches!(settings.mode, SslMode::VerifyCa | SslMode::VerifyFull);
        if verifying && settings.root_cert.is_none() {
            // libpq would look in ~/.postgresql/root.crt; a replica's home
            // is no place for its trust anchors, so say it outright.
            return Err(SetupError::InvalidUrl(format!(
                "sslmode={} needs sslrootcert=PATH (a PEM file of the CA certificates to trust)",
                settings.mode.name()
            )));
        }
        Ok(settings)
    }

    /// How much of the server's certificate is checked.
    fn check(&self) -> Check {
        match (self.mode, &self.root_cert) {
            (SslMode::VerifyFull, _) => Check::ChainAndName,
            (SslMode::VerifyCa, _) | (_, Some(_)) => Check::Chain,
            _ => Check::Nothing,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

/// The connector for `settings`: the one place that decides how a
/// server's certificate is judged.
pub(super) fn connector(settings: &TlsSettings) -> Result<MakeRustls, SetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| SetupError::Tls(e.to_string()))?;
    let roots = match &settings.root_cert {
        Some(path) => Some(Arc::new(load_roots(path)?)),
        None => None,
    };
    let algorithms = provider.signature_verification_algorithms;
    let name_blind = |chain| {
        let verifier = Arc::new(NameBlind { chain, algorithms });
        builder
            .clone()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
    };
    let config = match (settings.check(), roots) {
        (Check::ChainAndName, Some(roots)) => builder.clone().with_root_certificates(roots),
        (Check::Chain, Some(roots)) => {
            let chain = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| SetupError::Tls(e.to_string()))?;
            name_blind(Some(chain))
        }
        (Check::Nothing, _) => name_blind(None),
        // from_params refuses these; never fall back to trusting anything.
        (Check::Chain | Check::ChainAndName, None) => {
            return Err(SetupError::Tls(
                "a verifying sslmode without sslrootcert".into(),
            ));
        }
    }
    .with_no_client_auth();
    Ok(MakeRustls(Arc::new(config)))
}

fn load_roots(path: &Path) -> Result<RootCertStore, SetupError> {
    let at = |why: String| SetupError::Tls(format!("sslrootcert {}: {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| at(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| at(e.to_string()))?;
        roots.add(cert).map_err(|e| at(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(at("no PEM CERTIFICATE block".into()));
    }
    Ok(roots)
}

/// The verifier of the modes that do not check the host name. With a
/// chain verifier (`verify-ca`, or `require` with a root certificate) the
/// chain must lead to a trusted root, whatever names the certificate
/// carries: webpki checks the chain before the name, so a name error means
/// the chain already passed. Without one (`require`, `prefer`), any
/// certificate will do: encryption against passive listeners only, as in
/// libpq. Either way the handshake's signatures are checked, so the peer
/// holds the key of the certificate it shows.
#[derive(Debug)]
struct NameBlind {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NameBlind {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        let verdict =
            chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match verdict {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// tokio-postgres' side of the connector: one per connection string,
/// cheap to clone (the pool clones it per connection).
#[derive(Clone)]
pub struct MakeRustls(Arc<ClientConfig>);

impl fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Self::Error> {
        // tokio-postgres passes "" for a Unix socket, where servers never
        // offer TLS: fail only if one ever did.
        let name = match domain {
            "" => None,
            host => Some(ServerName::try_from(host.to_string())?),
        };
        Ok(RustlsConnect {
            config: self.0.clone(),
            name,
        })
    }
}

/// One connection's handshake.
pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: Option<ServerName<'static>>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            let name = self.name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "TLS over a Unix socket has no host name to check",
                )
            })?;
            connector.connect(name, stream).await.map(RustlsStream)
        })
    }
}

/// A TLS session to the server.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// SCRAM's channel binding (`-PLUS`) is not offered: tokio-postgres'
    /// default (`channel_binding=prefer`) then authenticates without it.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn prefer_is_the_default() {
        let settings = TlsSettings::from_params(&[]).unwrap();
        assert_eq!(settings, TlsSettings::default());
        assert_eq!(settings.mode, SslMode::Prefer);
        assert_eq!(settings.check(), Check::Nothing);
    }

    #[test]
    fn unknown_modes_are_refused_naming_the_key_and_the_choices() {
        for bad in ["allow", "VERIFY-FULL", ""] {
            let err = TlsSettings::from_params(&params(&[("sslmode", bad)])).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("sslmode"), "{text}");
            assert!(
                text.contains("disable, prefer, require, verify-ca, verify-full"),
                "{text}"
            );
        }
    }

    #[test]
    fn verifying_modes_need_a_root_certificate() {
        for mode in ["verify-ca", "verify-full"] {
            let err = TlsSettings::from_params(&params(&[("sslmode", mode)])).unwrap_err();
            assert!(err.to_string().contains("sslrootcert"), "{err}");
        }
    }

    #[test]
    fn a_root_certificate_makes_require_check_the_chain() {
        let with_root = |mode| {
            TlsSettings::from_params(&params(&[("sslmode", mode), ("sslrootcert", "/ca.pem")]))
                .unwrap()
                .check()
        };
        assert_eq!(with_root("require"), Check::Chain);
        assert_eq!(with_root("verify-ca"), Check::Chain);
        assert_eq!(with_root("verify-full"), Check::ChainAndName);
        let bare = TlsSettings::from_params(&params(&[("sslmode", "require")])).unwrap();
        assert_eq!(bare.check(), Check::Nothing);
    }

    #[test]
    fn an_unreadable_root_certificate_is_named() {
        let settings = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some(PathBuf::from("/nonexistent/ca.pem")),
        };
        let err = connector(&settings).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}

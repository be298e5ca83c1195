//! TLS on the northbound and southbound listeners, with certificates made
//! at test time: plaintext clients are refused, clients trusting the CA get
//! through, mTLS demands a client certificate, nodes register over TLS, and
//! the upstream `slimctl` lists nodes through a TLS northbound.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::pki::{ca, leaf};
use common::{RawNode, mk_register, start_replica};
use rcgen::ExtendedKeyUsagePurpose;
use slim_cp::config::TlsServerConfig;
use slim_cp::proto::nb;
use slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient;
use slim_cp::proto::sb::controller_service_client::ControllerServiceClient;
use slim_cp::server::{Options, Running};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A CA, a server certificate for `localhost` and `127.0.0.1`, and a client
/// certificate, as PEM files in a directory removed on drop.
struct Pki {
    dir: PathBuf,
    ca: String,
    client_cert: String,
    client_key: String,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    fn new(test: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("slim-cp-tls-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, issuer) = ca("slim-cp test CA");
        let server_names = ["localhost", "127.0.0.1"];
        let (cert, key) = leaf(&issuer, &server_names, ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) =
            leaf(&issuer, &["operator"], ExtendedKeyUsagePurpose::ClientAuth);
        for (file, text) in [("ca.pem", &ca), ("server.pem", &cert), ("server.key", &key)] {
            std::fs::write(dir.join(file), text).unwrap();
        }
        Pki {
            dir,
            ca,
            client_cert,
            client_key,
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The listener settings, with client certificates required if `mtls`.
    fn server(&self, mtls: bool) -> TlsServerConfig {
        TlsServerConfig {
            insecure: false,
            cert_file: Some(self.path("server.pem")),
            key_file: Some(self.path("server.key")),
            client_ca_file: mtls.then(|| self.path("ca.pem")),
        }
    }

    fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca))
    }

    fn client_with_cert(&self) -> ClientTlsConfig {
        self.client()
            .identity(Identity::from_pem(&self.client_cert, &self.client_key))
    }
}

/// A replica with TLS on both listeners.
async fn tls_replica(pki: &Pki, mtls: bool) -> Running {
    let cfg = pki.server(mtls);
    start_replica(Options {
        northbound_tls: slim_cp::tls::server_tls(&cfg, "northbound").unwrap(),
        southbound_tls: slim_cp::tls::server_tls(&cfg, "southbound").unwrap(),
        ..Options::loopback()
    })
    .await
}

async fn channel(url: String, tls: Option<ClientTlsConfig>) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(url)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    endpoint.connect().await.map_err(|e| format!("{e:?}"))
}

/// `ListNodes` through `url`; the ids, or why the call failed.
async fn list_nodes(url: String, tls: Option<ClientTlsConfig>) -> Result<Vec<String>, String> {
    let mut client = ControlPlaneServiceClient::new(channel(url, tls).await?);
    let mut stream = client
        .list_nodes(nb::NodeListRequest {})
        .await
        .map_err(|s| s.to_string())?
        .into_inner();
    let mut ids = Vec::new();
    while let Some(node) = stream.message().await.map_err(|s| s.to_string())? {
        ids.push(node.id);
    }
    Ok(ids)
}

fn https(host: &str, running_addr: std::net::SocketAddr) -> String {
    format!("https://{host}:{}", running_addr.port())
}

#[tokio::test]
async fn a_tls_northbound_refuses_plaintext_and_serves_clients_trusting_the_ca() {
    let pki = Pki::new("nb");
    let cp = tls_replica(&pki, false).await;
    let plain = list_nodes(format!("http://{}", cp.northbound_addr), None).await;
    assert!(plain.is_err(), "plaintext call went through: {plain:?}");
    // No CA: the server's certificate is not trusted.
    let untrusted = list_nodes(
        https("localhost", cp.northbound_addr),
        Some(ClientTlsConfig::new()),
    );
    assert!(untrusted.await.is_err());
    // The listener survives the failed handshakes; by name and by IP SAN.
    for host in ["localhost", "127.0.0.1"] {
        let ids = list_nodes(https(host, cp.northbound_addr), Some(pki.client())).await;
        assert_eq!(ids, Ok(vec![]), "{host}");
    }
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let pki = Pki::new("mtls");
    let cp = tls_replica(&pki, true).await;
    let url = https("localhost", cp.northbound_addr);
    let anonymous = list_nodes(url.clone(), Some(pki.client())).await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let (_, stranger) = ca("another CA");
    let (cert, key) = leaf(
        &stranger,
        &["intruder"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let foreign = pki.client().identity(Identity::from_pem(cert, key));
    assert!(list_nodes(url.clone(), Some(foreign)).await.is_err());
    assert_eq!(
        list_nodes(url, Some(pki.client_with_cert())).await,
        Ok(vec![])
    );
}

/// Opens a node stream over TLS, as a node configured with the CA does.
async fn open_tls_node(cp: &Running, tls: ClientTlsConfig) -> RawNode {
    let url = https("localhost", cp.southbound_addr);
    let mut client = ControllerServiceClient::new(channel(url, Some(tls)).await.unwrap());
    let (tx, out) = mpsc::channel(64);
    let rx = client
        .open_control_channel(ReceiverStream::new(out))
        .await
        .expect("stream opens")
        .into_inner();
    RawNode { tx, rx }
}

#[tokio::test]
async fn nodes_register_over_a_tls_southbound() {
    let pki = Pki::new("sb");
    let cp = tls_replica(&pki, true).await;
    let mut node = open_tls_node(&cp, pki.client_with_cert()).await;
    assert!(node.register(mk_register("g", "n1")).await.success);
    let record = cp.store.get_node("g/n1").await.unwrap().expect("recorded");
    // The peer address is known under TLS too: the wildcard host is filled.
    assert_eq!(record.connection_details[0].endpoint, "127.0.0.1:46357");
    let ids = list_nodes(
        https("localhost", cp.northbound_addr),
        Some(pki.client_with_cert()),
    );
    assert_eq!(ids.await, Ok(vec!["g/n1".to_string()]));
}

/// The upstream `slimctl`, if installed (scripts/install-upstream.sh).
fn slimctl() -> Option<PathBuf> {
    let root = match std::env::var_os("SLIM_UPSTREAM_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/slim-cp/upstream"),
    };
    let bin = root.join("bin/slimctl");
    bin.is_file().then_some(bin)
}

/// Runs `slimctl controller ... node list` in a scratch home and working
/// directory, so no operator configuration file is picked up.
async fn slimctl_node_list(
    bin: &Path,
    server: String,
    pki: &Pki,
    tls: bool,
) -> std::process::Output {
    let scratch = pki.path("slimctl-home");
    std::fs::create_dir_all(&scratch).unwrap();
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["controller", "--server", &server, "--timeout", "10s"]);
    if tls {
        cmd.arg("--tls.ca_file").arg(pki.path("ca.pem"));
    }
    cmd.args(["node", "list"])
        .current_dir(&scratch)
        .env("HOME", &scratch);
    for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("SLIMCTL_")) {
        cmd.env_remove(var);
    }
    // Blocking pool: the replica keeps serving on the test's runtime.
    let run = tokio::task::spawn_blocking(move || cmd.output());
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("slimctl finishes")
        .unwrap()
        .expect("slimctl runs")
}

#[tokio::test]
async fn upstream_slimctl_lists_nodes_over_tls() {
    let Some(bin) = slimctl() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("upstream slimctl is missing; run scripts/install-upstream.sh slimctl");
        }
        println!(
            "skipped: upstream slimctl binary is missing (scripts/install-upstream.sh slimctl)"
        );
        return;
    };
    let pki = Pki::new("slimctl");
    let cp = tls_replica(&pki, false).await;
    let mut node = open_tls_node(&cp, pki.client()).await;
    assert!(node.register(mk_register("g", "n1")).await.success);
    // No scheme: slimctl picks https because a CA file is given.
    let server = format!("127.0.0.1:{}", cp.northbound_addr.port());
    let plain = slimctl_node_list(&bin, server.clone(), &pki, false).await;
    assert!(!plain.status.success(), "slimctl over plaintext must fail");
    let out = slimctl_node_list(&bin, server, &pki, true).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "slimctl failed: {stdout}\n{stderr}");
    assert!(stdout.contains("1 node(s) registered"), "{stdout}");
    assert!(stdout.contains("g/n1"), "{stdout}");
}

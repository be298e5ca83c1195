//! Configuration loading: reference configs load unchanged, bad ones are
//! refused with the key and line, secrets never leak into messages.

use std::path::{Path, PathBuf};
use std::time::Duration;

use slim_cp::config::{
    AdjacencyEntry, Config, ConfigError, DatabaseConfig, RegistrationAuthConfig, SpireBundleSource,
    TopologyConfig,
};

fn load(yaml: &str) -> Config {
    match Config::from_yaml_str(yaml) {
        Ok(config) => config,
        Err(e) => panic!("config refused: {e}\n---\n{yaml}"),
    }
}

fn refuse(yaml: &str) -> String {
    match Config::from_yaml_str(yaml) {
        Ok(config) => panic!("config accepted: {config:?}\n---\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// The "Configuration Reference" block of the spec, verbatim.
const SPEC_REFERENCE: &str = r#"
tracing:
  log_level: info  # trace, debug, info, warn, error

northbound:
  endpoint: "0.0.0.0:50051"
  tls:
    insecure: true  # or configure mTLS

southbound:
  endpoint: "0.0.0.0:50052"
  tls:
    insecure: true

database:
  type: in_memory  # or: type: sqlite, path: "/var/lib/slim/cp.db"

# Topology section controls how groups are connected.
# Present = config mode (config is source of truth, mutation APIs disabled).
# Absent or empty = API mode (DB is source of truth, use slimctl to manage).

# Config mode example (star topology):
topology:
  links:
    - group: cloud
      neighbors: ["*"]  # cloud connects to all groups
  # Optional: segments for route isolation (see Topology section above)
  # segments:
  #   - name: segment-$group
  #     links:
  #       - group: cloud
  #         neighbors: [$group]
  # Registration authentication (optional).
  # When configured, nodes must prove group membership to register.
  # Omit entirely to accept all nodes (default).
  #
  # Shared secret example (one secret per group):
  # registration_auth:
  #   type: shared_secret
  #   secrets:
  #     cluster-a: "secret-for-cluster-a-min-32-bytes-long"
  #     cluster-b: "secret-for-cluster-b-min-32-bytes-long"
  #
  # SPIRE example (trust domain = group name):
  # registration_auth:
  #   type: spire
  #   socket_path: "/run/spire/agent-sockets/api.sock"

# API mode example:
# topology: {}

reconciler:
  # Max retry attempts per item before dropping (re-enqueued on next sweep).
  max_requeues: 15

  # Base delay for first retry. Exponential backoff: base * 2^(attempt-1), cap 30s.
  base_retry_delay: "200ms"

  # Interval for full reconciliation sweep. "0s" disables.
  reconcile_period: "60s"

  # Delete DP connections not tracked by the CP.
  # Only enable in greenfield deployments where CP is sole source of truth.
  enable_orphan_detection: false

  # Parallel reconciler workers per queue (link and route).
  workers: 4
"#;

/// Every key the reference's ServerConfig / TlsServerConfig accept.
const EVERY_UPSTREAM_SERVER_KEY: &str = r#"
northbound:
  endpoint: "127.0.0.1:7051"
  tls:
    insecure: false
    source: {type: file, cert: /certs/tls.crt, key: /certs/tls.key}
    ca_source: {type: file, path: /certs/ca.crt}
    include_system_ca_certs_pool: true
    tls_version: tls1.3
    reload_interval: {secs: 60, nanos: 0}
    client_ca: {type: file, path: /certs/client-ca.crt}
    reload_client_ca_file: false
  http2_only: true
  max_frame_size: 4
  max_concurrent_streams: 100
  max_header_list_size: 16384
  read_buffer_size: 1048576
  write_buffer_size: 1048576
  keepalive:
    max_connection_idle: 1h
    max_connection_age: 2h
    max_connection_age_grace: 5m
    time: 2m
    timeout: 20s
  auth: {type: none}
  metadata: {team: platform}
  require_header_mac: true
  negotiation_timeout_secs: 5
  link_hmac_poll_interval_ms: 5
southbound:
  endpoint: "127.0.0.1:7052"
  link_hmac_timeout_secs: 5
  tls:
    insecure: true
    source: {type: spire, socket_path: /run/spire.sock, jwt_audiences: [slim]}
    client_ca: {type: pem, data: "-----BEGIN CERTIFICATE-----"}
tracing:
  log_level: DEBUG
  display_thread_names: true
  display_thread_ids: false
  filters: [slim_control_plane]
  opentelemetry: {enabled: false, service_name: cp}
"#;

#[test]
fn defaults_are_a_single_plaintext_replica_in_api_mode() {
    let config = Config::default();
    assert_eq!(config.tracing.log_level, "info");
    assert_eq!(config.northbound.endpoint, "0.0.0.0:50051");
    assert_eq!(config.southbound.endpoint, "0.0.0.0:50052");
    assert!(config.northbound.tls.insecure && config.southbound.tls.insecure);
    assert_eq!(config.database, DatabaseConfig::Memory);
    assert!(config.topology.is_api_mode());
    assert!(config.topology.registration_auth.is_none());
    assert_eq!(config.reconciler.max_requeues, 15);
    assert_eq!(
        config.reconciler.base_retry_delay,
        Duration::from_millis(200)
    );
    assert_eq!(config.reconciler.reconcile_period, Duration::from_secs(60));
    assert!(!config.reconciler.enable_orphan_detection);
    assert_eq!(config.reconciler.workers, 4);
    assert!(config.ignored_keys().is_empty());
    assert!(config.validate().is_ok());
    assert_eq!(config.northbound.socket_addr().unwrap().port(), 50051);
}

#[test]
fn empty_file_is_the_default() {
    assert_eq!(load(""), Config::default());
    assert_eq!(load("# only a comment\n"), Config::default());
}

#[test]
fn spec_reference_example_loads() {
    let config = load(SPEC_REFERENCE);
    assert_eq!(config.database, DatabaseConfig::Memory);
    assert_eq!(
        config.topology.mode,
        TopologyConfig::Links(vec![AdjacencyEntry {
            group: "cloud".into(),
            neighbors: vec!["*".into()],
        }])
    );
    let defaults = Config::default();
    assert_eq!(config.reconciler, defaults.reconciler);
    assert_eq!(config.northbound, defaults.northbound);
    assert!(config.ignored_keys().is_empty());
}

#[test]
fn every_upstream_server_key_loads_and_unused_ones_are_listed() {
    let config = load(EVERY_UPSTREAM_SERVER_KEY);
    let tls = &config.northbound.tls;
    assert!(!tls.insecure);
    assert_eq!(tls.cert_file.as_deref(), Some(Path::new("/certs/tls.crt")));
    assert_eq!(tls.key_file.as_deref(), Some(Path::new("/certs/tls.key")));
    assert_eq!(
        tls.client_ca_file.as_deref(),
        Some(Path::new("/certs/client-ca.crt"))
    );
    assert!(config.southbound.tls.insecure);
    assert_eq!(config.tracing.log_level, "debug");
    let ignored = config.ignored_keys();
    for key in [
        "northbound.http2_only",
        "northbound.max_frame_size",
        "northbound.max_concurrent_streams",
        "northbound.max_header_list_size",
        "northbound.read_buffer_size",
        "northbound.write_buffer_size",
        "northbound.keepalive",
        "northbound.auth",
        "northbound.metadata",
        "northbound.require_header_mac",
        "northbound.negotiation_timeout_secs",
        "northbound.link_hmac_poll_interval_ms",
        "northbound.tls.ca_source",
        "northbound.tls.include_system_ca_certs_pool",
        "northbound.tls.tls_version",
        "northbound.tls.reload_interval",
        "northbound.tls.reload_client_ca_file",
        "southbound.link_hmac_timeout_secs",
        "southbound.tls.source",
        "southbound.tls.client_ca",
        "tracing.display_thread_names",
        "tracing.display_thread_ids",
        "tracing.filters",
        "tracing.opentelemetry",
    ] {
        assert!(ignored.iter().any(|k| k == key), "{key} not in {ignored:?}");
    }
    assert!(
        !ignored
            .iter()
            .any(|k| k.ends_with(".endpoint") || k.ends_with("tls.insecure"))
    );
}

#[test]
fn server_auth_is_refused_rather_than_dropped() {
    let err = refuse(
        "northbound:\n  endpoint: '0.0.0.0:1'\n  auth:\n    type: basic\n    password: hunter2\n",
    );
    assert!(err.starts_with("northbound.auth (line 4"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn both_memory_names_and_sqlite_refused() {
    for name in ["in_memory", "memory"] {
        let config = load(&format!("database:\n  type: {name}\n"));
        assert_eq!(config.database, DatabaseConfig::Memory);
    }
    let err = refuse("database:\n  type: sqlite\n  path: /var/lib/slim/cp.db\n");
    assert!(err.starts_with("database.type (line 2"), "{err}");
    assert!(err.contains("no SQLite backend"), "{err}");
    assert!(
        err.contains("type: memory") && err.contains("type: postgres"),
        "{err}"
    );
    let err = refuse("database:\n  type: mongodb\n");
    assert!(err.contains("accepted: memory, in_memory"), "{err}");
}

#[test]
fn bad_duration_names_key_and_examples() {
    let err = refuse("reconciler:\n  base_retry_delay: fast\n");
    assert_eq!(
        err,
        "reconciler.base_retry_delay (line 2, column 21): \"fast\" is not a duration \
         (examples: 200ms, 60s, 5m)"
    );
}

#[test]
fn bad_type_reports_key_and_line() {
    let yaml = "tracing:\n  log_level: info\nreconciler:\n  max_requeues: 3\n  workers: four\n";
    let err = Config::from_yaml_str(yaml).unwrap_err();
    assert_eq!(err.key(), Some("reconciler.workers"));
    assert_eq!(err.line(), Some(5));
    assert_eq!(
        err.to_string(),
        "reconciler.workers (line 5, column 12): invalid type: string \"four\", \
         expected a whole number, at least 1"
    );
}

#[test]
fn unknown_keys_are_named_with_their_line() {
    let err = refuse("tracing:\n  log_level: info\nreconcilers:\n  workers: 2\n");
    assert!(
        err.starts_with("reconcilers (line 3, column 1): unknown key `reconcilers`"),
        "{err}"
    );
    assert!(err.contains("`reconciler`"), "valid keys listed: {err}");
    let err = refuse("reconciler:\n  wrkers: 2\n");
    assert!(
        err.starts_with("reconciler.wrkers (line 2, column 3): unknown key"),
        "{err}"
    );
    let err = refuse("northbound:\n  endpoint: '0.0.0.0:1'\n  keepalve: {}\n");
    assert!(err.starts_with("northbound.keepalve (line 3"), "{err}");
    let err = refuse("topology:\n  linkz: []\n");
    assert!(err.starts_with("topology.linkz (line 2"), "{err}");
}

#[test]
fn short_secret_refused_without_printing_it() {
    let secret = "too-short-but-very-private";
    let yaml = format!(
        "topology:\n  links: [{{group: a, neighbors: [b]}}]\n  registration_auth:\n    \
         type: shared_secret\n    secrets:\n      cluster-a: \"{secret}\"\n"
    );
    let err = refuse(&yaml);
    assert!(
        err.starts_with("topology.registration_auth.secrets.cluster-a (line 6"),
        "{err}"
    );
    assert!(!err.contains(secret), "{err}");
    let debug = format!("{:?}", load(&yaml.replace(secret, &"s".repeat(40))));
    assert!(!debug.contains(&"s".repeat(40)), "{debug}");
}

#[test]
fn shared_secrets_and_spire_load() {
    let yaml = "topology:\n  links: [{group: '*', neighbors: ['*']}]\n  registration_auth:\n    \
                type: shared_secret\n    secrets:\n      \
                cluster-a: secret-for-cluster-a-min-32-bytes-long\n";
    let config = load(yaml);
    match config.topology.registration_auth {
        Some(RegistrationAuthConfig::SharedSecret { secrets }) => {
            assert_eq!(
                secrets["cluster-a"].expose(),
                "secret-for-cluster-a-min-32-bytes-long"
            );
        }
        other => panic!("{other:?}"),
    }
    // Config mode needs at least one secret; API mode manages them itself.
    let err = refuse(
        "topology:\n  links: [{group: a, neighbors: [b]}]\n  registration_auth: {type: shared_secret}\n",
    );
    assert!(
        err.starts_with("topology.registration_auth.secrets"),
        "{err}"
    );
    load("topology:\n  registration_auth: {type: shared_secret}\n");
    let config = load(
        "topology:\n  registration_auth:\n    type: spire\n    socket_path: /run/spire/api.sock\n",
    );
    assert!(config.topology.is_api_mode());
    assert_eq!(
        config.topology.registration_auth,
        Some(RegistrationAuthConfig::Spire {
            bundles: SpireBundleSource::WorkloadApi {
                socket_path: "/run/spire/api.sock".into()
            },
            audience: "slim".into(),
        })
    );
    let err = refuse("topology:\n  registration_auth: {type: spire}\n");
    assert!(
        err.starts_with("topology.registration_auth.socket_path"),
        "{err}"
    );
    let config = load(
        "topology:\n  registration_auth:\n    type: spire\n    bundle_path: /etc/b.json\n    \
         trust_domain: cluster-a\n    audience: cp\n",
    );
    assert_eq!(
        config.topology.registration_auth,
        Some(RegistrationAuthConfig::Spire {
            bundles: SpireBundleSource::File {
                path: "/etc/b.json".into(),
                trust_domain: Some("cluster-a".into()),
            },
            audience: "cp".into(),
        })
    );
    let err =
        refuse("topology:\n  registration_auth: {type: spire, socket_path: /s, bundle_path: /b}\n");
    assert!(
        err.starts_with("topology.registration_auth.bundle_path") && err.contains("not both"),
        "{err}"
    );
}

#[test]
fn links_segments_and_api_modes() {
    let links = load(
        "topology:\n  links:\n    - group: cloud\n      neighbors: [customer-a, customer-b]\n",
    );
    assert!(
        matches!(links.topology.mode, TopologyConfig::Links(ref l) if l[0].neighbors.len() == 2)
    );
    let yaml = "topology:\n  segments:\n    - name: segment-$group\n      links:\n        \
                - group: cloud\n          neighbors: [$group]\n";
    let segments = load(yaml);
    match &segments.topology.mode {
        TopologyConfig::Segments(s) => {
            assert_eq!(s[0].name, "segment-$group");
            assert_eq!(s[0].links[0].neighbors, vec!["$group"]);
        }
        other => panic!("{other:?}"),
    }
    let both = load(
        "topology:\n  links: [{group: a, neighbors: [b]}]\n  segments: [{name: s, links: [{group: c, neighbors: [d]}]}]\n",
    );
    assert!(
        matches!(both.topology.mode, TopologyConfig::Segments(_)),
        "segments win"
    );
    assert!(
        both.ignored_keys()
            .iter()
            .any(|k| k.starts_with("topology.links"))
    );
    for api in [
        "topology: {}\n",
        "topology:\n",
        "topology:\n  links: []\n",
        "topology:\n  segments: []\n",
    ] {
        assert!(load(api).topology.is_api_mode(), "{api}");
    }
    let err = refuse("topology:\n  links:\n    - group: ''\n      neighbors: [b]\n");
    assert!(err.starts_with("topology.links[0].group (line 3"), "{err}");
}

#[test]
fn reconcile_period_zero_and_workers_zero() {
    let config = load("reconciler:\n  reconcile_period: \"0s\"\n");
    assert_eq!(config.reconciler.reconcile_period, Duration::ZERO);
    let err = refuse("reconciler:\n  workers: 0\n");
    assert!(err.starts_with("reconciler.workers (line 2"), "{err}");
    assert!(err.contains("at least 1"), "{err}");
}

#[test]
fn listeners_need_host_port_and_a_certificate_when_tls_is_on() {
    let err = refuse("northbound:\n  endpoint: foo\n  tls: {insecure: true}\n");
    assert_eq!(err, "northbound.endpoint: \"foo\" is not host:port");
    // As in the reference, a written section without `tls` means TLS.
    let err = refuse("southbound:\n  endpoint: '0.0.0.0:6000'\n");
    assert!(err.starts_with("southbound.tls: TLS is on"), "{err}");
    let config = load("southbound:\n  tls: {insecure: true}\n");
    assert_eq!(config.southbound.endpoint, "0.0.0.0:50052");
}

#[test]
fn file_references_expand_like_the_reference() {
    let dir = std::env::temp_dir().join(format!("slim-cp-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("cluster-a");
    std::fs::write(&secret_file, "0123456789abcdef0123456789abcdef").unwrap();
    let yaml = format!(
        "topology:\n  registration_auth:\n    type: shared_secret\n    secrets:\n      \
         cluster-a: \"${{file:{}}}\"\n",
        secret_file.display()
    );
    let config = load(&yaml);
    let Some(RegistrationAuthConfig::SharedSecret { secrets }) = config.topology.registration_auth
    else {
        panic!("no shared secrets");
    };
    assert_eq!(
        secrets["cluster-a"].expose(),
        "0123456789abcdef0123456789abcdef"
    );
    let err = refuse("tracing:\n  log_level: \"${env:SLIM_CP_TEST_SURELY_UNSET}\"\n");
    assert!(
        err.starts_with("tracing.log_level: environment variable"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("slim-cp-config-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(&path, "reconciler:\n  workers: many\n").unwrap();
    let err = Config::load(&path).unwrap_err();
    assert!(matches!(err, ConfigError::InFile { .. }));
    assert_eq!(err.line(), Some(2));
    assert!(
        err.to_string()
            .starts_with(&format!("{}: reconciler.workers (line 2", path.display()))
    );
    let missing = Config::load(&dir.join("missing.yaml")).unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("cannot read configuration file"),
        "{missing}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shipped_examples_load() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/config");
    let memory = Config::load(&dir.join("memory.yaml")).unwrap();
    assert_eq!(memory, Config::default());
    let star = Config::load(&dir.join("star.yaml")).unwrap();
    assert!(!star.topology.is_api_mode());
    assert!(star.ignored_keys().is_empty());
    let cluster = Config::load(&dir.join("cluster.yaml")).unwrap();
    assert!(matches!(cluster.database, DatabaseConfig::Postgres { .. }));
    assert_eq!(cluster.cluster.relay_endpoint, "0.0.0.0:50053");
    assert!(
        cluster.ignored_keys().is_empty(),
        "{:?}",
        cluster.ignored_keys()
    );
}

#[test]
fn postgres_database_loads_with_a_default_pool() {
    let config = load(
        "database:\n  type: postgres\n  url: \"postgres://cp@db.example:5432/slim\"\n  \
         direct_url: \"postgres://cp@db-direct.example:5432/slim\"\n",
    );
    assert_eq!(
        config.database,
        DatabaseConfig::Postgres {
            url: "postgres://cp@db.example:5432/slim".into(),
            direct_url: Some("postgres://cp@db-direct.example:5432/slim".into()),
            pool_size: 16,
        }
    );
    let config = load("database:\n  type: postgres\n  url: host=db user=cp\n  pool_size: 4\n");
    assert!(
        matches!(
            config.database,
            DatabaseConfig::Postgres {
                pool_size: 4,
                direct_url: None,
                ..
            }
        ),
        "{:?}",
        config.database
    );
}

#[test]
fn postgres_settings_are_checked_and_name_their_key() {
    let err = refuse("database:\n  type: postgres\n  url: postgres://db/x\n  pool_size: 0\n");
    assert!(err.starts_with("database.pool_size"), "{err}");
    let err = refuse("database:\n  type: postgres\n  url: postgres://db/x\n  pool_size: many\n");
    assert!(err.starts_with("database.pool_size"), "{err}");
    let err = refuse("database:\n  type: postgres\n  url: \"postgres://u:hunter2@db:port/x\"\n");
    assert!(err.starts_with("database.url"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    // Without a URL in the file, the environment's is taken; with neither,
    // the error says where to put one.
    match std::env::var("SLIM_CP_DATABASE_URL") {
        Ok(url) => match load("database:\n  type: postgres\n").database {
            DatabaseConfig::Postgres { url: got, .. } => assert!(got.starts_with(&url)),
            other => panic!("expected postgres, got {other:?}"),
        },
        Err(_) => {
            let err = refuse("database:\n  type: postgres\n");
            assert!(err.starts_with("database.url"), "{err}");
            assert!(err.contains("SLIM_CP_DATABASE_URL"), "{err}");
        }
    }
}

#[test]
fn postgres_urls_never_print_their_password() {
    let config = load(
        "database:\n  type: postgres\n  url: \"postgres://cp:hunter2@db/slim\"\n  \
         direct_url: \"host=db user=cp password='hunter2'\"\n",
    );
    let text = format!("{config:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("postgres://cp:***@db/slim"), "{text}");
    let err = refuse("database:\n  type: mongodb\n");
    assert!(err.contains("memory, in_memory, postgres"), "{err}");
}

#[test]
fn a_cluster_section_is_ignored_on_the_memory_store_and_checked_on_postgres() {
    let memory = load("cluster:\n  replica_id: cp-0\n");
    assert_eq!(memory.ignored_keys(), ["cluster"]);
    let err = Config::from_yaml_str(
        "database: {type: postgres, url: \"host=db\"}\ncluster:\n  lease: 1s\n  renew: 1s\n",
    )
    .unwrap_err();
    assert_eq!(err.key(), Some("cluster.renew"), "{err}");
    let ok = load(
        "database: {type: postgres, url: \"host=db\"}\n\
         cluster: {replica_id: cp-1, relay: {endpoint: \"127.0.0.1:7000\"}, replica_ttl: 4s}\n",
    );
    assert_eq!(ok.cluster.replica_id.as_deref(), Some("cp-1"));
    assert_eq!(ok.cluster.replica_ttl, std::time::Duration::from_secs(4));
    assert!(ok.ignored_keys().is_empty());
}

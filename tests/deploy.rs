//! The files under `deploy/` agree with slim-cp: every YAML and JSON file
//! parses; every slim-cp configuration in them loads with the real loader
//! and the environment its container gets; ports, probe paths, replica
//! counts and config keys line up between the Kubernetes manifests, the
//! compose file, the HAProxy configurations and the configuration; the
//! Grafana dashboard queries only metrics a running replica exports, and
//! every one of them.
//!
//! Nothing here needs a cluster or a Docker daemon; the dashboard check
//! runs `slim-cp serve` with the compose configuration on Postgres, and
//! the HAProxy configurations go through `haproxy -c` (skipped without
//! haproxy, failed with CI=true).

mod common;
mod haproxy_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use haproxy_support::{Section, section, sections};
use serde::Deserialize as _;
use slim_cp::config::{Config, DatabaseConfig};
use yaml_serde::Value;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");

/// Sessions per replica the Kubernetes grace period must cover.
const DRAIN_SESSIONS: u64 = 10_000;

fn deploy(rel: &str) -> PathBuf {
    Path::new(DEPLOY).join(rel)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir` whose name ends in one of `exts`.
fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("deploy/ readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files(&path, exts));
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| exts.contains(&e))
        {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The documents of a YAML file.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = read(path);
    yaml_serde::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn s<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {v:?}"))
}

fn u(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v:?}"))
}

fn seq<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_sequence()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("{what}: not a list: {v:?}"))
}

fn port_of(endpoint: &str) -> u16 {
    endpoint
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {endpoint:?}"))
}

/// The ports a configuration listens on.
#[derive(Debug)]
struct Ports {
    northbound: u16,
    southbound: u16,
    relay: u16,
    http: u16,
}

fn ports(config: &Config) -> Ports {
    Ports {
        northbound: port_of(&config.northbound.endpoint),
        southbound: port_of(&config.southbound.endpoint),
        relay: port_of(&config.cluster.relay_endpoint),
        http: port_of(&config.http.endpoint),
    }
}

/// Loads `text` with the real loader and exactly `env` as environment.
fn load(text: &str, env: &BTreeMap<String, String>, what: &str) -> Config {
    Config::from_yaml_str_with_env(text, &|k| env.get(k).cloned())
        .unwrap_or_else(|e| panic!("{what} does not load: {e}"))
}

/// A clustered replica with its HTTP endpoint on.
fn assert_clustered(config: &Config, what: &str) {
    assert!(
        matches!(config.database, DatabaseConfig::Postgres { .. }),
        "{what}: not on Postgres"
    );
    assert_ne!(config.http.enabled, Some(false), "{what}: no /readyz");
}

#[test]
fn every_yaml_and_json_file_parses() {
    let yaml = files(Path::new(DEPLOY), &["yaml", "yml"]);
    let json = files(Path::new(DEPLOY), &["json"]);
    assert!(yaml.len() >= 10 && !json.is_empty(), "{yaml:?} {json:?}");
    for f in &yaml {
        assert!(!yaml_docs(f).is_empty(), "{}: empty", f.display());
    }
    for f in &json {
        let _: serde_json::Value =
            serde_json::from_str(&read(f)).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

/// The example configurations load on their own (no environment).
#[test]
fn example_configs_load() {
    let none = BTreeMap::new();
    for f in files(&deploy("config"), &["yaml"]) {
        let config = load(&read(&f), &none, &f.display().to_string());
        let p = ports(&config);
        assert_eq!((p.northbound, p.southbound), (50051, 50052), "{f:?}");
    }
}

// ---------------------------------------------------------------- Kubernetes

struct K8s {
    docs: Vec<Value>,
}

impl K8s {
    fn load() -> K8s {
        let docs = files(&deploy("k8s"), &["yaml"])
            .iter()
            .flat_map(|f| yaml_docs(f))
            .collect();
        K8s { docs }
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| {
                d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
            })
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/k8s"))
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some(kind))
            .collect()
    }

    fn statefulset(&self) -> &Value {
        match self.all("StatefulSet").as_slice() {
            [one] => one,
            other => panic!("want one StatefulSet, found {}", other.len()),
        }
    }

    /// The environment the first pod's slim-cp container gets: literal
    /// values with `$(VAR)` expanded, the downward API's pod name and IP,
    /// and the example Secret's values.
    fn pod_env(&self, container: &Value, pod: &str) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for e in seq(&container["env"], "env") {
            let name = s(&e["name"], "env name").to_string();
            let value = if let Some(v) = e["value"].as_str() {
                env.iter()
                    .fold(v.to_string(), |acc, (k, val): (&String, &String)| {
                        acc.replace(&format!("$({k})"), val)
                    })
            } else if let Some(f) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match f {
                    "metadata.name" => pod.to_string(),
                    "status.podIP" => "10.1.2.3".to_string(),
                    other => panic!("{name}: unexpected fieldRef {other}"),
                }
            } else {
                let r = &e["valueFrom"]["secretKeyRef"];
                let secret = self.get("Secret", s(&r["name"], "secret name"));
                let key = s(&r["key"], "secret key");
                s(&secret["stringData"][key], key).to_string()
            };
            env.insert(name, value);
        }
        env
    }
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    seq(
        &workload["spec"]["template"]["spec"]["containers"],
        "containers",
    )
    .iter()
    .find(|c| c["name"].as_str() == Some(name))
    .unwrap_or_else(|| panic!("no container {name}"))
}

/// The container's named ports.
fn container_ports(c: &Value) -> BTreeMap<String, u16> {
    seq(&c["ports"], "ports")
        .iter()
        .map(|p| {
            let port = u16::try_from(u(&p["containerPort"], "containerPort")).expect("port");
            (s(&p["name"], "port name").to_string(), port)
        })
        .collect()
}

/// The slim-cp configuration file the container is started with, from the
/// ConfigMap mounted where `--config` points.
fn mounted_config(k8s: &K8s, sts: &Value, c: &Value) -> String {
    let args: Vec<&str> = seq(&c["args"], "args")
        .iter()
        .map(|a| s(a, "arg"))
        .collect();
    let i = args
        .iter()
        .position(|a| *a == "--config")
        .expect("--config");
    let path = Path::new(args[i + 1]);
    let mount = seq(&c["volumeMounts"], "volumeMounts")
        .iter()
        .find(|m| path.starts_with(s(&m["mountPath"], "mountPath")))
        .expect("the config file is mounted");
    let volume = seq(&sts["spec"]["template"]["spec"]["volumes"], "volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let map = k8s.get("ConfigMap", s(&volume["configMap"]["name"], "configMap"));
    let key = path
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name");
    s(&map["data"][key], "config in the ConfigMap").to_string()
}

fn probe(c: &Value, kind: &str, named: &BTreeMap<String, u16>) -> (String, u16) {
    let get = &c[kind]["httpGet"];
    let port = match &get["port"] {
        Value::String(name) => named[name.as_str()],
        other => u16::try_from(u(other, "probe port")).expect("port"),
    };
    (s(&get["path"], "probe path").to_string(), port)
}

#[test]
fn kubernetes_manifests_agree_with_the_config() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    let replicas = u(&sts["spec"]["replicas"], "replicas");
    assert_eq!(replicas, 3);
    let c = container(sts, "slim-cp");
    let pod = format!("{}-0", s(&sts["metadata"]["name"], "name"));
    let env = k8s.pod_env(c, &pod);
    let config = load(
        &mounted_config(&k8s, sts, c),
        &env,
        "the ConfigMap's config",
    );
    assert_clustered(&config, "Kubernetes");
    // The per-pod keys and the secrets come from the environment.
    assert_eq!(config.cluster.replica_id.as_deref(), Some(pod.as_str()));
    let p = ports(&config);
    let advertised = format!("10.1.2.3:{}", p.relay);
    assert_eq!(
        config.cluster.relay_advertise.as_deref(),
        Some(advertised.as_str())
    );
    assert!(
        config.cluster.secret.is_some(),
        "relay secret from the Secret"
    );
    let DatabaseConfig::Postgres { url, .. } = &config.database else {
        unreachable!("checked above")
    };
    assert!(
        url.starts_with("postgres://"),
        "the URL comes from the Secret"
    );

    let named = container_ports(c);
    let want = [
        ("northbound", p.northbound),
        ("southbound", p.southbound),
        ("relay", p.relay),
        ("http", p.http),
    ];
    for (name, port) in want {
        assert_eq!(named.get(name), Some(&port), "container port {name}");
    }
    assert_eq!(
        probe(c, "readinessProbe", &named),
        ("/readyz".into(), p.http)
    );
    assert_eq!(
        probe(c, "livenessProbe", &named),
        ("/healthz".into(), p.http)
    );
    assert_eq!(
        probe(c, "startupProbe", &named),
        ("/healthz".into(), p.http)
    );

    // Long enough for a drain of DRAIN_SESSIONS streams.
    let d = &config.drain;
    let batches = DRAIN_SESSIONS.div_ceil(d.batch as u64);
    let drain = d.lb_grace + d.interval * u32::try_from(batches).expect("batches");
    let grace = u(
        &sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        "grace",
    );
    assert!(
        Duration::from_secs(grace) > drain,
        "terminationGracePeriodSeconds {grace} < a drain of {DRAIN_SESSIONS} sessions ({drain:?})"
    );

    services_agree(&k8s, sts, &p);
    let pdb = k8s.get("PodDisruptionBudget", "slim-cp");
    assert_eq!(pdb["spec"]["selector"], sts["spec"]["selector"]);
    assert_eq!(
        u(&pdb["spec"]["minAvailable"], "minAvailable"),
        replicas - 1
    );
}

/// The pods a Service selects: the StatefulSet's or HAProxy's.
fn selected<'a>(k8s: &'a K8s, svc: &Value) -> &'a Value {
    let sel = &svc["spec"]["selector"];
    k8s.all("StatefulSet")
        .into_iter()
        .chain(k8s.all("Deployment"))
        .find(|w| &w["spec"]["selector"]["matchLabels"] == sel)
        .unwrap_or_else(|| panic!("nothing selected by {sel:?}"))
}

fn services_agree(k8s: &K8s, sts: &Value, p: &Ports) {
    for svc in k8s.all("Service") {
        let name = s(&svc["metadata"]["name"], "name");
        let workload = selected(k8s, svc);
        let c = &seq(
            &workload["spec"]["template"]["spec"]["containers"],
            "containers",
        )[0];
        let named = container_ports(c);
        for port in seq(&svc["spec"]["ports"], "ports") {
            let target = s(&port["targetPort"], "targetPort");
            let number = named
                .get(target)
                .unwrap_or_else(|| panic!("{name}: no container port {target}"));
            assert_eq!(
                u64::from(*number),
                u(&port["port"], "port"),
                "{name}/{target}"
            );
        }
    }
    let headless = k8s.get("Service", s(&sts["spec"]["serviceName"], "serviceName"));
    assert_eq!(headless["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(
        headless["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true)
    );
    let has = |svc: &Value, port: u16| {
        seq(&svc["spec"]["ports"], "ports")
            .iter()
            .any(|x| x["port"].as_u64() == Some(u64::from(port)))
    };
    assert!(has(headless, p.relay), "the relay on the headless Service");
    let nodes = k8s.get("Service", "slim-cp-nodes");
    assert!(has(nodes, p.southbound));
    let lb = selected(k8s, nodes);
    assert_eq!(
        s(&container(lb, "haproxy")["image"], "image")
            .split(':')
            .next(),
        Some("haproxy")
    );
    let operators = k8s.get("Service", "slim-cp-operators");
    assert!(has(operators, p.northbound));
    assert_eq!(selected(k8s, operators), sts);
}

/// Kubernetes' HAProxy: the shipped file's settings, the StatefulSet's
/// pods as servers, checked on their HTTP port; `haproxy -c` accepts it.
#[test]
fn kubernetes_haproxy_matches_the_shipped_settings() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    let c = container(sts, "slim-cp");
    let env = k8s.pod_env(c, "slim-cp-0");
    let p = ports(&load(&mounted_config(&k8s, sts, c), &env, "config"));
    let cfg = s(
        &k8s.get("ConfigMap", "slim-cp-haproxy")["data"]["haproxy.cfg"],
        "cfg",
    )
    .to_string();
    let ours = sections(&cfg);
    let shipped = sections(&read(&deploy("haproxy/haproxy.cfg")));
    assert_eq!(
        section(&ours, "defaults", "").lines,
        section(&shipped, "defaults", "").lines
    );
    let backend = section(&ours, "backend", "slim_cp_southbound");
    let same = section(&shipped, "backend", "slim_cp_southbound");
    let settings = |b: &Section| -> Vec<String> {
        b.lines
            .iter()
            .filter(|l| !l.starts_with("server "))
            .cloned()
            .collect()
    };
    assert_eq!(settings(backend), settings(same));
    assert_eq!(backend.check_port(), Some(p.http));
    assert_eq!(
        section(&ours, "frontend", "southbound").bind_port(),
        Some(p.southbound)
    );
    let service = s(&sts["spec"]["serviceName"], "serviceName");
    let hosts: Vec<String> = backend.primaries().iter().map(|x| x.host.clone()).collect();
    let replicas = u(&sts["spec"]["replicas"], "replicas");
    let want: Vec<String> = (0..replicas)
        .map(|i| format!("slim-cp-{i}.{service}.default.svc.cluster.local"))
        .collect();
    assert_eq!(hosts, want);
    assert!(backend.servers().iter().all(|x| x.port == p.southbound));
    assert_backups_mirror_primaries(backend);
    if let Some(haproxy) = haproxy_support::haproxy() {
        let dir = tempdir("k8s-haproxy");
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, &cfg).expect("written");
        haproxy_support::check(&haproxy, &file).unwrap_or_else(|e| panic!("{e}"));
    }
}

fn tempdir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("deploy-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

// ------------------------------------------------------- compose and HAProxy

struct Replica {
    service: String,
    config: Config,
    http_published: String,
}

/// The compose file's slim-cp replicas, their configs loaded with their
/// environment from the file they mount where `--config` points.
fn compose_replicas(compose: &Value) -> Vec<Replica> {
    let dir = deploy("compose");
    let services = compose["services"].as_mapping().expect("services");
    let mut out = Vec::new();
    for (name, svc) in services {
        let service = s(name, "service").to_string();
        if !service.starts_with("slim-cp-") {
            continue;
        }
        let cmd: Vec<&str> = seq(&svc["command"], "command")
            .iter()
            .map(|a| s(a, "arg"))
            .collect();
        let i = cmd.iter().position(|a| *a == "--config").expect("--config");
        let mount = seq(&svc["volumes"], "volumes")
            .iter()
            .map(|v| s(v, "volume"))
            .find_map(|v| {
                let mut parts = v.split(':');
                let (src, dst) = (parts.next()?, parts.next()?);
                (dst == cmd[i + 1]).then(|| dir.join(src))
            })
            .unwrap_or_else(|| panic!("{service}: the config is not mounted"));
        let env: BTreeMap<String, String> = svc["environment"]
            .as_mapping()
            .expect("environment")
            .iter()
            .map(|(k, v)| (s(k, "key").to_string(), s(v, "value").to_string()))
            .collect();
        let config = load(&read(&mount), &env, &service);
        let http_published = seq(&svc["ports"], "ports")
            .iter()
            .map(|x| s(x, "port").to_string())
            .find(|x| x.ends_with(&format!(":{}", port_of(&config.http.endpoint))))
            .unwrap_or_else(|| panic!("{service}: the HTTP port is not published"));
        out.push(Replica {
            service,
            config,
            http_published,
        });
    }
    out
}

#[test]
fn compose_cluster_agrees_with_haproxy_and_the_config() {
    let compose = &yaml_docs(&deploy("compose/compose.yaml"))[0];
    let replicas = compose_replicas(compose);
    assert_eq!(replicas.len(), 3);
    let published: BTreeSet<&str> = replicas.iter().map(|r| r.http_published.as_str()).collect();
    assert_eq!(
        published.len(),
        3,
        "each replica's /metrics on its own host port"
    );
    for r in &replicas {
        assert_clustered(&r.config, &r.service);
        assert_eq!(
            r.config.cluster.replica_id.as_deref(),
            Some(r.service.as_str())
        );
        let relay = format!(
            "{}:{}",
            r.service,
            port_of(&r.config.cluster.relay_endpoint)
        );
        assert_eq!(
            r.config.cluster.relay_advertise.as_deref(),
            Some(relay.as_str())
        );
    }
    let p = ports(&replicas[0].config);
    let lb = &compose["services"]["haproxy"];
    let mounted = seq(&lb["volumes"], "volumes")
        .iter()
        .map(|v| s(v, "volume"))
        .find_map(|v| v.split(':').next().map(|src| deploy("compose").join(src)))
        .expect("haproxy.cfg mounted");
    let shipped = deploy("haproxy/haproxy.cfg");
    assert_eq!(
        mounted.canonicalize().expect("mounted file exists"),
        shipped.canonicalize().expect("shipped file exists")
    );
    let cfg = sections(&read(&shipped));
    let hosts: BTreeSet<String> = replicas.iter().map(|r| r.service.clone()).collect();
    for (frontend, backend, port) in [
        ("southbound", "slim_cp_southbound", p.southbound),
        ("northbound", "slim_cp_northbound", p.northbound),
    ] {
        let b = section(&cfg, "backend", backend);
        let servers = b.servers();
        let got: BTreeSet<String> = b.primaries().iter().map(|x| x.host.clone()).collect();
        assert_eq!(got, hosts, "{backend}: the compose replicas");
        assert!(
            servers.iter().all(|x| x.port == port),
            "{backend}: {servers:?}"
        );
        assert_eq!(
            b.check_port(),
            Some(p.http),
            "{backend}: checks on the HTTP port"
        );
        let bind = section(&cfg, "frontend", frontend).bind_port();
        assert_eq!(bind, Some(port));
        let exposed = seq(&lb["ports"], "ports")
            .iter()
            .any(|x| x.as_str() == Some(format!("{port}:{port}").as_str()));
        assert!(exposed, "HAProxy's {frontend} port published");
    }
}

/// Every checked server has an unchecked `backup` twin at its address and
/// all of them are used (`option allbackups`): with every replica marked
/// down, a reconnect still gets HAProxy's retries instead of `<NOSRV>`.
fn assert_backups_mirror_primaries(b: &Section) {
    let at = |x: &haproxy_support::Server| (x.host.clone(), x.port);
    let primaries: Vec<_> = b.primaries().iter().map(at).collect();
    let backups: Vec<_> = b.servers().into_iter().filter(|x| x.backup).collect();
    assert_eq!(
        backups.iter().map(at).collect::<Vec<_>>(),
        primaries,
        "{}: one backup per primary, in order",
        b.name
    );
    assert!(
        backups.iter().all(|x| x.unchecked),
        "{}: backups are never checked (a checked one would be down too)",
        b.name
    );
    assert!(b.has("option allbackups"), "{}: option allbackups", b.name);
}

#[test]
fn the_shipped_haproxy_cfg_checks_readiness_and_redispatches() {
    let path = deploy("haproxy/haproxy.cfg");
    let cfg = sections(&read(&path));
    let defaults = section(&cfg, "defaults", "");
    assert!(defaults.has("mode tcp"));
    let redispatch = defaults
        .lines
        .iter()
        .any(|l| l.starts_with("option redispatch"));
    assert!(redispatch, "option redispatch");
    let retries = defaults.value("retries").expect("retries");
    assert!(
        retries[0].parse::<u32>().is_ok_and(|r| r >= 1),
        "{retries:?}"
    );
    for b in cfg.iter().filter(|x| x.kind == "backend") {
        assert!(b.has("option httpchk GET /readyz"), "{}", b.name);
        assert!(b.has("http-check expect status 200"), "{}", b.name);
        assert!(!b.primaries().is_empty());
        assert_backups_mirror_primaries(b);
    }
    if let Some(haproxy) = haproxy_support::haproxy() {
        haproxy_support::check(&haproxy, &path).unwrap_or_else(|e| panic!("{e}"));
    }
}

// ------------------------------------------------------------------ Grafana

#[path = "deploy/dashboard.rs"]
mod dashboard;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_queries_exactly_what_a_running_replica_exports() {
    let text = read(&deploy("grafana/slim-cp.json"));
    let json: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let queried = dashboard::queried_metrics(&json);
    let page = dashboard::scrape_running_replica(&deploy("compose/slim-cp.yaml"), &queried).await;
    let exported = dashboard::exported(&page);
    let samples: BTreeSet<String> = exported.values().flatten().cloned().collect();
    let unknown: Vec<&String> = queried.iter().filter(|m| !samples.contains(*m)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics nobody exports: {unknown:?}\n{page}"
    );
    let missing: Vec<&String> = exported
        .iter()
        .filter(|(_, names)| !names.iter().any(|n| queried.contains(n)))
        .map(|(family, _)| family)
        .collect();
    assert!(
        missing.is_empty(),
        "exported but not on the dashboard: {missing:?}"
    );
}

//! HAProxy configurations as the deploy tests read them: sections and
//! their lines, the servers of a backend, and the shipped file rewritten
//! onto loopback so that the real HAProxy runs it in a test. Also finds
//! the `haproxy` binary, failing in CI when it is missing.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// One section: `global`, `defaults`, `resolvers NAME`, `frontend NAME`,
/// `backend NAME`, with its lines (trimmed, comments dropped).
#[derive(Clone, Debug)]
pub struct Section {
    pub kind: String,
    pub name: String,
    pub lines: Vec<String>,
}

/// A `server NAME HOST:PORT ...` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// `backup`: used only when every primary server is down.
    pub backup: bool,
    /// `no-check`: never checked, so always counted up.
    pub unchecked: bool,
}

/// The sections of a configuration, in order.
pub fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for raw in text.lines() {
        let line = raw.split('#').next().unwrap_or("").trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if !raw.starts_with([' ', '\t']) {
            let mut words = line.split_whitespace();
            let kind = words.next().unwrap_or_default().to_string();
            let name = words.next().unwrap_or_default().to_string();
            out.push(Section {
                kind,
                name,
                lines: Vec::new(),
            });
        } else if let Some(s) = out.last_mut() {
            s.lines.push(line.trim().to_string());
        }
    }
    out
}

impl Section {
    /// Whether a line equals `line` (words compared, spacing ignored).
    pub fn has(&self, line: &str) -> bool {
        let want: Vec<&str> = line.split_whitespace().collect();
        self.lines
            .iter()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == want)
    }

    /// The words after `keyword` on its first line.
    pub fn value(&self, keyword: &str) -> Option<Vec<String>> {
        self.lines.iter().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(keyword)).then(|| w.map(str::to_string).collect())
        })
    }

    /// Every `server` line, primaries and backups.
    pub fn servers(&self) -> Vec<Server> {
        self.lines
            .iter()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.first() != Some(&"server") || w.len() < 3 {
                    return None;
                }
                let (host, port) = w[2].rsplit_once(':')?;
                Some(Server {
                    name: w[1].to_string(),
                    host: host.to_string(),
                    port: port.parse().ok()?,
                    backup: w[3..].contains(&"backup"),
                    unchecked: w[3..].contains(&"no-check"),
                })
            })
            .collect()
    }

    /// The servers that are not `backup`.
    pub fn primaries(&self) -> Vec<Server> {
        self.servers().into_iter().filter(|s| !s.backup).collect()
    }

    /// The port of `port N` on the `default-server` line: where the
    /// health check goes.
    pub fn check_port(&self) -> Option<u16> {
        let words = self.value("default-server")?;
        let i = words.iter().position(|w| w == "port")?;
        words.get(i + 1)?.parse().ok()
    }

    /// The port of the frontend's `bind`.
    pub fn bind_port(&self) -> Option<u16> {
        let words = self.value("bind")?;
        words.first()?.rsplit_once(':')?.1.parse().ok()
    }
}

pub fn section<'a>(all: &'a [Section], kind: &str, name: &str) -> &'a Section {
    all.iter()
        .find(|s| s.kind == kind && s.name == name)
        .unwrap_or_else(|| panic!("no `{kind} {name}` section"))
}

/// Where one backend's traffic and checks go in a test.
pub struct Target {
    pub addr: String,
    pub check_port: u16,
}

/// The shipped configuration with every frontend bound on loopback at
/// `binds[frontend]` and each backend's servers moved onto `targets`
/// (traffic address and check port each): the shipped servers of one
/// address, primary and backup alike, go to one target, in the order the
/// addresses first appear, each keeping its own settings. Everything else
/// (retries, redispatch, checks, timeouts) is kept as shipped but
/// `maxconn`, and `inter`, shortened only if `fast_checks`.
pub fn on_loopback(
    shipped: &str,
    binds: &[(&str, u16)],
    targets: &[(&str, Vec<Target>)],
    fast_checks: bool,
) -> String {
    let mut out = String::new();
    let mut current: Option<(String, String)> = None;
    // The shipped server addresses of the current backend, in order.
    let mut seen: Vec<String> = Vec::new();
    for raw in shipped.lines() {
        let line = raw.split('#').next().unwrap_or("");
        let indented = raw.starts_with([' ', '\t']);
        if !indented && !line.trim().is_empty() {
            let mut w = line.split_whitespace();
            let kind = w.next().unwrap_or_default().to_string();
            let name = w.next().unwrap_or_default().to_string();
            current = Some((kind, name));
            seen.clear();
        }
        let first = line.split_whitespace().next();
        let Some((kind, name)) = &current else {
            out.push_str(raw);
            out.push('\n');
            continue;
        };
        match (kind.as_str(), first) {
            // HAProxy needs two descriptors per connection and refuses to
            // start when the process limit is lower (a test machine's may
            // be 20,000); a test needs a handful.
            ("global", Some("maxconn")) => out.push_str("    maxconn 1000\n"),
            ("frontend", Some("bind")) => {
                let port = binds
                    .iter()
                    .find(|(f, _)| f == name)
                    .unwrap_or_else(|| panic!("no port for frontend {name}"))
                    .1;
                out.push_str(&format!("    bind 127.0.0.1:{port}\n"));
            }
            ("backend", Some("server")) => {
                let servers = targets
                    .iter()
                    .find(|(b, _)| b == name)
                    .unwrap_or_else(|| panic!("no servers for backend {name}"));
                if let Some(s) = moved_server(line, &mut seen, &servers.1) {
                    out.push_str(&s);
                }
            }
            ("backend", Some("default-server")) => {
                out.push_str(&format!("    {}\n", loopback_defaults(line, fast_checks)));
            }
            _ => {
                out.push_str(raw);
                out.push('\n');
            }
        }
    }
    out
}

/// A `default-server` line without DNS (loopback addresses need none),
/// its check settings kept.
fn loopback_defaults(line: &str, fast_checks: bool) -> String {
    let mut words: Vec<String> = Vec::new();
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        match w {
            "resolvers" | "init-addr" => {
                it.next();
            }
            "inter" if fast_checks => {
                it.next();
                words.push("inter 200ms".into());
            }
            _ => words.push(w.to_string()),
        }
    }
    words.join(" ")
}

/// One shipped `server NAME ADDR SETTINGS...` line on the target its
/// address maps to (`seen` holds the addresses met so far), or nothing
/// when the test has fewer targets than the file has addresses.
fn moved_server(line: &str, seen: &mut Vec<String>, targets: &[Target]) -> Option<String> {
    let mut w = line.split_whitespace().skip(1);
    let (name, addr) = (w.next()?, w.next()?);
    let settings: Vec<&str> = w.collect();
    let i = match seen.iter().position(|a| a == addr) {
        Some(i) => i,
        None => {
            seen.push(addr.to_string());
            seen.len() - 1
        }
    };
    let t = targets.get(i)?;
    let mut words = vec![format!("server {name} {} port {}", t.addr, t.check_port)];
    words.extend(settings.iter().map(|s| s.to_string()));
    Some(format!("    {}\n", words.join(" ")))
}

/// The `haproxy` binary on PATH. Missing: `None` with one skip line, or a
/// panic with CI=true, where a missing binary must fail the run.
pub fn haproxy() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin")])
            .map(|d| d.join("haproxy"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "haproxy not installed (apt-get install -y haproxy); with CI=true that fails the test"
        );
        println!("skipped: haproxy not installed (apt-get install -y haproxy)");
    }
    found
}

/// `haproxy -c -f FILE`: `Err` with its output when the file is refused.
pub fn check(haproxy: &std::path::Path, file: &std::path::Path) -> Result<(), String> {
    let out = Command::new(haproxy)
        .arg("-c")
        .arg("-f")
        .arg(file)
        .output()
        .map_err(|e| format!("running haproxy: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "haproxy -c -f {} refused it:\n{}{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

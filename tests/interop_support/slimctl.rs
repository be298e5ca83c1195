//! Running `slimctl` and reading the tables it prints.
//!
//! slimctl 2.0.0-alpha.2 prints, for every list command, one or two summary
//! lines, a blank line, then (unless the list is empty) a table:
//!
//! ```text
//! 1 node(s) registered
//!
//!   NODE_ID  GROUP  STATUS     ENDPOINT         PUBLIC_ENDPOINT
//!   -------------------------------------------------------------
//!   g1/n1    g1     Connected  127.0.0.1:41100  127.0.0.1:41100
//! ```
//!
//! Cells are left-aligned and padded to the column width (in characters)
//! and columns are joined by two spaces, so a column starts where its
//! header word starts. Failures exit 1 with
//! `Error: code: '<description>', message: "<message>"` on stderr.

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Proc, upstream, upstream_bin_v3};

/// A command's whole result, printable for failure reports.
#[derive(Clone, Debug)]
pub struct CtlOutput {
    pub args: Vec<String>,
    /// Exit code; `None` when it was killed (timeout).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CtlOutput {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The `message: "..."` part of slimctl's error line (or all of
    /// stderr when it has no such part).
    pub fn error_message(&self) -> String {
        let s = self.stderr.trim();
        match s.find("message: \"") {
            Some(i) => {
                let rest = &s[i + "message: \"".len()..];
                let end = rest
                    .find("\"\n")
                    .unwrap_or(rest.trim_end().len().saturating_sub(1));
                rest[..end].to_string()
            }
            None => s.to_string(),
        }
    }

    /// The count from the summary line (`1 node(s) registered`,
    /// `Links: 2 (all statuses)`, `3 route(s)`...).
    pub fn count(&self) -> Option<usize> {
        self.stdout.lines().find_map(summary_count)
    }

    pub fn table(&self) -> Table {
        Table::parse(&self.stdout)
    }
}

impl fmt::Display for CtlOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "$ slimctl {}", self.args.join(" "))?;
        writeln!(f, "exit: {:?}", self.code)?;
        writeln!(f, "stdout:\n{}", self.stdout)?;
        write!(f, "stderr:\n{}", self.stderr)
    }
}

fn summary_count(line: &str) -> Option<usize> {
    let line = line.trim();
    let rest = ["Links: ", "Routes: "]
        .iter()
        .find_map(|p| line.strip_prefix(p))
        .unwrap_or(line);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    let is_summary = after.starts_with(' ') && (after.contains("(s)") || rest.len() < line.len());
    if digits.is_empty() || !is_summary {
        return None;
    }
    digits.parse().ok()
}

/// A parsed table: header names and rows of trimmed cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Finds the header (the line above the dashes) and cuts every row at
    /// the header words' character offsets. Empty when there is no table.
    pub fn parse(stdout: &str) -> Table {
        let lines: Vec<&str> = stdout.lines().collect();
        let Some(dash) = lines.iter().position(|l| {
            let t = l.trim();
            !t.is_empty() && t.chars().all(|c| c == '-')
        }) else {
            return Table::default();
        };
        let Some(header) = dash.checked_sub(1).map(|i| lines[i]) else {
            return Table::default();
        };
        let hchars: Vec<char> = header.chars().collect();
        let mut starts = Vec::new();
        let mut headers = Vec::new();
        for (i, c) in hchars.iter().enumerate() {
            if !c.is_whitespace() && (i == 0 || hchars[i - 1].is_whitespace()) {
                starts.push(i);
                let word: String = hchars[i..]
                    .iter()
                    .take_while(|c| !c.is_whitespace())
                    .collect();
                headers.push(word);
            }
        }
        let rows = lines[dash + 1..]
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let chars: Vec<char> = l.chars().collect();
                (0..starts.len())
                    .map(|k| {
                        let from = starts[k].min(chars.len());
                        let to = starts
                            .get(k + 1)
                            .map_or(chars.len(), |&e| e.min(chars.len()));
                        chars[from..to]
                            .iter()
                            .collect::<String>()
                            .trim()
                            .to_string()
                    })
                    .collect()
            })
            .collect();
        Table { headers, rows }
    }

    /// The index of column `name`. slimctl prints no table at all for an
    /// empty list, so no headers means no rows (`None`); a table without
    /// the column is a typo in the test and panics.
    fn col(&self, name: &str) -> Option<usize> {
        if self.headers.is_empty() {
            return None;
        }
        let c = self.headers.iter().position(|h| h == name);
        Some(c.unwrap_or_else(|| panic!("no column {name} in {:?}", self.headers)))
    }

    /// The cell of `row` under column `name`.
    pub fn cell<'a>(&self, row: &'a [String], name: &str) -> &'a str {
        self.col(name)
            .and_then(|c| row.get(c))
            .map_or("", String::as_str)
    }

    /// Every value in column `name`.
    pub fn column(&self, name: &str) -> Vec<&str> {
        self.rows.iter().map(|r| self.cell(r, name)).collect()
    }

    /// The first row whose column `name` equals `value`.
    pub fn find(&self, name: &str, value: &str) -> Option<&Vec<String>> {
        self.rows.iter().find(|r| self.cell(r, name) == value)
    }

    /// The rows whose column `name` equals `value`.
    pub fn rows_where(&self, name: &str, value: &str) -> Vec<&Vec<String>> {
        self.rows
            .iter()
            .filter(|r| self.cell(r, name) == value)
            .collect()
    }
}

/// slimctl's own request timeout; the process gets a little longer.
const CTL_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `slimctl <args>` with `dir` as HOME and working directory, so no
/// `~/.slimctl/config.yaml` or `./config.yaml` of the machine leaks in.
/// Killed if it outlives its own timeout.
pub fn slimctl(dir: &Path, args: &[&str]) -> CtlOutput {
    run(base_command(&upstream("slimctl"), dir), dir, args)
}

fn run(mut command: Command, dir: &Path, args: &[&str]) -> CtlOutput {
    let n = {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
    // Output goes to files rather than pipes: polling a child for a
    // deadline while draining two pipes needs threads; files do not.
    let out_path = dir.join(format!("slimctl-{n}.out"));
    let err_path = dir.join(format!("slimctl-{n}.err"));
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create slimctl stdout"))
        .stderr(File::create(&err_path).expect("create slimctl stderr"))
        .spawn()
        .expect("spawn slimctl");
    let deadline = Instant::now() + CTL_TIMEOUT + Duration::from_secs(5);
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.code(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let read = |p: &Path| {
        let s = std::fs::read(p)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let _ = std::fs::remove_file(p);
        s
    };
    CtlOutput {
        args: args.iter().map(|a| a.to_string()).collect(),
        code,
        stdout: read(&out_path),
        stderr: read(&err_path),
    }
}

/// `slimctl controller --server <northbound> <args>`.
pub fn slimctl_controller(dir: &Path, northbound: &str, args: &[&str]) -> CtlOutput {
    let all = controller_args(northbound, args);
    slimctl(dir, &all.iter().map(String::as_str).collect::<Vec<_>>())
}

/// [`slimctl_controller`] with the SLIM 3.x slimctl (its `--server` and
/// `--timeout` are global flags, accepted after `controller` too).
pub fn slimctl_controller_v3(dir: &Path, northbound: &str, args: &[&str]) -> CtlOutput {
    let bin = upstream_bin_v3("slimctl").expect("the test required slimctl 3.x");
    let all = controller_args(northbound, args);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    run(base_command(&bin, dir), dir, &all)
}

fn controller_args(northbound: &str, args: &[&str]) -> Vec<String> {
    let timeout = format!("{}s", CTL_TIMEOUT.as_secs());
    let head = ["controller", "--server", northbound, "--timeout", &timeout];
    head.iter().chain(args).map(|a| a.to_string()).collect()
}

/// A long-running slimctl (e.g. `bench sub`), logging to `<dir>/<name>.log`.
pub fn spawn_slimctl(dir: &Path, name: &str, args: &[&str]) -> Proc {
    spawn_slimctl_of(false, dir, name, args)
}

/// [`spawn_slimctl`] of the 3.x release when `v3`.
pub fn spawn_slimctl_of(v3: bool, dir: &Path, name: &str, args: &[&str]) -> Proc {
    let bin = match v3 {
        true => upstream_bin_v3("slimctl").expect("the test required slimctl 3.x"),
        false => upstream("slimctl"),
    };
    let mut cmd = base_command(&bin, dir);
    cmd.args(args);
    Proc::spawn(name, cmd, &dir.join(format!("{name}.log")))
}

fn base_command(bin: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir)
        .env("HOME", dir)
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SLIMCTL_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[test]
fn parses_tables_and_counts() {
    let out = "Links: 2 (all statuses)\n\n  LINK_ID  SOURCE  DEST_NODE  DEST_ENDPOINT  STATUS \n  \
               ----------------------------------------------------\n  \
               -        g1      g2         -              PENDING\n  \
               -        ga      gb         -              PENDING\n";
    let t = Table::parse(out);
    assert_eq!(
        t.headers,
        ["LINK_ID", "SOURCE", "DEST_NODE", "DEST_ENDPOINT", "STATUS"]
    );
    assert_eq!(t.rows[1], ["-", "ga", "gb", "-", "PENDING"]);
    assert_eq!(summary_count("Links: 2 (all statuses)"), Some(2));
    assert_eq!(summary_count("1 node(s) registered"), Some(1));
    assert_eq!(summary_count("Connections for node: g1/n1"), None);
    let seg =
        "1 segment(s)\n\n  SEGMENT  GROUPS  LINKS  \n  ----------\n  default  g1, g2  g1↔g2  \n";
    let t = Table::parse(seg);
    assert_eq!(t.find("SEGMENT", "default").unwrap()[2], "g1↔g2");
    assert_eq!(t.cell(&t.rows[0], "GROUPS"), "g1, g2");
    let groups = "1 group(s)\n\n  GROUP  NODES\n  ----\n  g1     g1/n1, g1/n2\n";
    assert_eq!(Table::parse(groups).column("NODES"), ["g1/n1, g1/n2"]);
    let empty = Table::parse("0 node(s) registered\n\n");
    assert!(empty.find("NODE_ID", "g1/n1").is_none());
}

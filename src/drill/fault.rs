//! The operator's fault commands: a template (`kill -9 {pid}`,
//! `docker compose kill -s KILL {replica}`, `ssh {host} kill -STOP {pid}`)
//! filled in with the target replica's particulars and run by `sh -c`.
//!
//! Placeholders: `{replica}` (its id), `{pid}` and `{host}` (its process
//! and host, as the replica reports them), `{incarnation}`, `{relay}` (its
//! relay address). `{{` and `}}` are literal braces. Every value is
//! shell-quoted: a replica id comes from the database, and is never
//! trusted to be a word.

use std::process::Stdio;
use std::time::Duration;

use super::DrillError;

/// A fault command does its work at once; one that hangs is a mistake.
const COMMAND_WAIT: Duration = Duration::from_secs(60);

const KNOWN: [&str; 5] = ["replica", "pid", "host", "incarnation", "relay"];

/// What a template may name about the target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    pub replica: String,
    pub incarnation: u64,
    pub relay: String,
    /// `None` when the replica did not report it (not answering, or an
    /// older version).
    pub pid: Option<u32>,
    pub host: Option<String>,
}

/// A checked template: every placeholder known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    flag: &'static str,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(&'static str),
}

impl Template {
    /// Parses `text`, given as `flag` (for error messages).
    pub fn parse(flag: &'static str, text: &str) -> Result<Template, DrillError> {
        let bad = |why: String| DrillError::Input(format!("{flag} {text:?}: {why}"));
        if text.trim().is_empty() {
            return Err(bad("empty".into()));
        }
        let (mut parts, mut lit) = (Vec::new(), String::new());
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
                    let field = KNOWN.into_iter().find(|k| *k == name).ok_or_else(|| {
                        bad(format!(
                            "unknown placeholder {{{name}}} (known: {{{}}})",
                            KNOWN.join("}, {")
                        ))
                    })?;
                    parts.push(Part::Text(std::mem::take(&mut lit)));
                    parts.push(Part::Field(field));
                }
                '}' => return Err(bad("a lone '}' (write '}}' for a brace)".into())),
                c => lit.push(c),
            }
        }
        parts.push(Part::Text(lit));
        Ok(Template { flag, parts })
    }

    /// Whether the template names `field`.
    pub fn uses(&self, field: &str) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Field(f) if *f == field))
    }

    /// The command line for `target`; an error names a particular the
    /// target did not report.
    pub fn render(&self, target: &Target) -> Result<String, DrillError> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field(f) => out.push_str(&quote(&self.value(f, target)?)),
            }
        }
        Ok(out)
    }

    fn value(&self, field: &str, t: &Target) -> Result<String, DrillError> {
        let missing = || {
            DrillError::Input(format!(
                "{} names {{{field}}}, but replica {} did not report it (not answering, \
                 or an older version): use {{replica}} with a command that knows it",
                self.flag, t.replica
            ))
        };
        Ok(match field {
            "replica" => t.replica.clone(),
            "incarnation" => t.incarnation.to_string(),
            "relay" => t.relay.clone(),
            "pid" => t.pid.ok_or_else(missing)?.to_string(),
            _ => t.host.clone().ok_or_else(missing)?,
        })
    }
}

/// `s` as one shell word.
fn quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `command` with `sh -c`; an error carries its exit status and what
/// it wrote to stderr.
pub async fn run(command: &str) -> Result<(), DrillError> {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| DrillError::Fault(format!("`{command}` did not start: {e}")))?;
    let out = tokio::time::timeout(COMMAND_WAIT, child.wait_with_output())
        .await
        .map_err(|_| {
            DrillError::Fault(format!("`{command}` still running after {COMMAND_WAIT:?}"))
        })?
        .map_err(|e| DrillError::Fault(format!("`{command}`: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(DrillError::Fault(format!(
        "`{command}` failed ({}): {}",
        out.status,
        stderr.trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_target() -> Target {
        Target {
            replica: "cp-0".into(),
            incarnation: 7,
            relay: "10.0.0.1:50053".into(),
            pid: Some(4242),
            host: Some("box-1".into()),
        }
    }

    fn render(text: &str, t: &Target) -> Result<String, DrillError> {
        Template::parse("--fault-cmd", text)?.render(t)
    }

    #[test]
    fn placeholders_are_filled_in() {
        let t = mk_target();
        assert_eq!(
            render("kill -9 {pid}", &t).ok(),
            Some("kill -9 4242".into())
        );
        assert_eq!(
            render(
                "ssh {host} kill {pid} # {replica}/{incarnation} {relay}",
                &t
            )
            .ok(),
            Some("ssh box-1 kill 4242 # cp-0/7 10.0.0.1:50053".into())
        );
        assert_eq!(
            render("echo {{}} {{pid}}", &t).ok(),
            Some("echo {} {pid}".into())
        );
    }

    #[test]
    fn a_replica_id_is_one_shell_word_whatever_it_holds() {
        let t = Target {
            replica: "x; rm -rf / 'y'".into(),
            ..mk_target()
        };
        assert_eq!(
            render("docker kill {replica}", &t).ok(),
            Some(r"docker kill 'x; rm -rf / '\''y'\'''".into())
        );
    }

    #[test]
    fn an_unknown_placeholder_or_a_lone_brace_is_refused() {
        let t = mk_target();
        let err = render("kill {pdi}", &t).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("unknown placeholder {pdi}")));
        assert!(render("kill }", &t).is_err());
        assert!(render("  ", &t).is_err());
    }

    #[test]
    fn a_pid_the_replica_did_not_report_is_an_error_naming_it() {
        let t = Target {
            pid: None,
            ..mk_target()
        };
        let err = render("kill -9 {pid}", &t).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("{pid}") && e.contains("cp-0")));
        assert!(Template::parse("--fault-cmd", "kill {pid}").is_ok_and(|t| t.uses("pid")));
    }

    #[tokio::test]
    async fn a_failing_command_reports_its_status_and_stderr() {
        let err = run("echo nope >&2; exit 3")
            .await
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("nope") && e.contains('3')));
        assert!(run("true").await.is_ok());
    }
}

//! Configuration errors, phrased for the operator who has to fix the file:
//! each names the key as a dotted path (`reconciler.workers`) and, when the
//! parser knows it, the line and column.

use std::fmt;
use std::path::PathBuf;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {}: {message}", path.display())]
    Io {
        /// The file that was asked for.
        path: PathBuf,
        /// The operating system's reason.
        message: String,
    },
    /// The text is not well-formed YAML.
    #[error("invalid YAML{}: {message}", Position(*line, *column))]
    Syntax {
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// The parser's description.
        message: String,
    },
    /// A key is unknown, or its value is refused.
    #[error("{key}{}: {message}", Position(*line, *column))]
    Invalid {
        /// Dotted path of the key, e.g. `northbound.tls.insecure`.
        key: String,
        /// 1-based line, when known (it is not after `${env:..}` expansion
        /// or for checks that span several keys).
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// What is wrong and, where possible, what would be right.
        message: String,
    },
    /// Any of the above, found in a named file.
    #[error("{}: {error}", path.display())]
    InFile {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong in it.
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// An error about `key` found after parsing (so without a position).
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            line: None,
            column: None,
            message: message.into(),
        }
    }

    /// The dotted key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::InFile { error, .. } => error.key(),
            ConfigError::Io { .. } | ConfigError::Syntax { .. } => None,
        }
    }

    /// The 1-based line the error is on, if known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Invalid { line, .. } | ConfigError::Syntax { line, .. } => *line,
            ConfigError::InFile { error, .. } => error.line(),
            ConfigError::Io { .. } => None,
        }
    }

    /// Attaches the file name, so the operator knows which file to open.
    pub(crate) fn in_file(self, path: PathBuf) -> Self {
        ConfigError::InFile {
            path,
            error: Box::new(self),
        }
    }

    /// YAML that does not parse at all.
    pub(crate) fn from_syntax(err: &yaml_serde::Error) -> Self {
        let (line, column) = location(err);
        ConfigError::Syntax {
            line,
            column,
            message: bare_message(err, &[]),
        }
    }

    /// A value refused while reading the typed configuration.
    pub(crate) fn from_typed(err: serde_path_to_error::Error<yaml_serde::Error>) -> Self {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let (line, column) = location(&inner);
        let key = if path == "." {
            "(top level)".to_string()
        } else {
            path
        };
        let message = operator_wording(&bare_message(&inner, &ancestors(&key)));
        ConfigError::Invalid {
            key,
            line,
            column,
            message,
        }
    }
}

/// Renders " (line L, column C)" when the position is known.
struct Position(Option<usize>, Option<usize>);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (Some(line), Some(column)) => write!(f, " (line {line}, column {column})"),
            (Some(line), None) => write!(f, " (line {line})"),
            _ => Ok(()),
        }
    }
}

fn location(err: &yaml_serde::Error) -> (Option<usize>, Option<usize>) {
    match err.location() {
        Some(loc) => (Some(loc.line()), Some(loc.column())),
        None => (None, None),
    }
}

/// `a.b[0].c` -> [`a.b[0].c`, `a.b[0]`, `a.b`, `a`], longest first.
fn ancestors(path: &str) -> Vec<String> {
    let mut out = vec![path.to_string()];
    let mut current = path;
    while let Some(cut) = current.rfind(['.', '[']) {
        current = &current[..cut];
        if !current.is_empty() {
            out.push(current.to_string());
        }
    }
    out
}

/// yaml_serde renders "<its path>: <message> at line L column C"; we print
/// our own key and position, so strip both to keep the message once.
fn bare_message(err: &yaml_serde::Error, prefixes: &[String]) -> String {
    let mut text = err.to_string();
    if let Some(loc) = err.location() {
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if let Some(stripped) = text.strip_suffix(&suffix) {
            text = stripped.to_string();
        }
    }
    for prefix in prefixes {
        if let Some(stripped) = text.strip_prefix(&format!("{prefix}: ")) {
            return stripped.to_string();
        }
    }
    text
}

/// serde speaks of fields, variants and Rust types; operators edit keys
/// and values.
fn operator_wording(message: &str) -> String {
    let message = match message.find(", expected struct ") {
        Some(cut) => format!("{}, expected a mapping of keys", &message[..cut]),
        None => message.to_string(),
    };
    message
        .replacen("unknown field", "unknown key", 1)
        .replacen("unknown variant", "unknown value", 1)
        .replacen("missing field", "missing key", 1)
        .replacen("duplicate field", "duplicate key", 1)
        .replace(", expected one of ", "; valid: ")
        .replace(", there are no fields", "; no keys are valid here")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_longest_first() {
        assert_eq!(
            ancestors("topology.links[0].group"),
            vec![
                "topology.links[0].group",
                "topology.links[0]",
                "topology.links",
                "topology"
            ]
        );
        assert_eq!(ancestors("reconciler"), vec!["reconciler"]);
    }

    #[test]
    fn display_with_and_without_position() {
        let err = ConfigError::Invalid {
            key: "reconciler.workers".into(),
            line: Some(12),
            column: Some(12),
            message: "must be at least 1".into(),
        };
        assert_eq!(
            err.to_string(),
            "reconciler.workers (line 12, column 12): must be at least 1"
        );
        let err = ConfigError::invalid("northbound.endpoint", "\"foo\" is not host:port");
        assert_eq!(
            err.to_string(),
            "northbound.endpoint: \"foo\" is not host:port"
        );
        let err = err.in_file(PathBuf::from("/etc/slim-cp.yaml"));
        assert_eq!(
            err.to_string(),
            "/etc/slim-cp.yaml: northbound.endpoint: \"foo\" is not host:port"
        );
        assert_eq!(err.key(), Some("northbound.endpoint"));
    }

    #[test]
    fn wording() {
        assert_eq!(
            operator_wording("unknown field `wrkers`, expected one of `a`, `b`"),
            "unknown key `wrkers`; valid: `a`, `b`"
        );
        assert_eq!(
            operator_wording("invalid type: sequence, expected struct ReconcilerConfig"),
            "invalid type: sequence, expected a mapping of keys"
        );
    }
}

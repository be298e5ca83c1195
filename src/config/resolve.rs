//! `${env:NAME}` and `${file:PATH}` references, expanded before parsing as
//! the reference control plane does (slim-config's `ConfigResolver`): a
//! string value that is exactly one reference is replaced by the variable
//! or the whole file content (not trimmed, so secrets match the nodes').
//! Anything else, including text around a reference, is left alone.

use yaml_serde::Value;

use super::ConfigError;

/// The environment as the loader reads it: the process's, or (for checks
/// of a deployment's files) the one a container would get.
pub(super) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Expands references in place, reading `${env:NAME}` through `env`;
/// returns whether any was found.
pub(super) fn expand_references(value: &mut Value, env: Env<'_>) -> Result<bool, ConfigError> {
    walk(value, "", env)
}

fn walk(value: &mut Value, path: &str, env: Env<'_>) -> Result<bool, ConfigError> {
    let mut expanded = false;
    match value {
        Value::String(text) => expanded = expand(text, path, env)?,
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expanded |= walk(item, &format!("{path}[{i}]"), env)?;
            }
        }
        Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let name = match key {
                    Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                let child = if path.is_empty() {
                    name
                } else {
                    format!("{path}.{name}")
                };
                expanded |= walk(item, &child, env)?;
            }
        }
        Value::Tagged(tagged) => expanded = walk(&mut tagged.value, path, env)?,
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(expanded)
}

fn expand(text: &mut String, path: &str, env: Env<'_>) -> Result<bool, ConfigError> {
    let Some(reference) = text.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
        return Ok(false);
    };
    let fail = |message: String| ConfigError::invalid(path, message);
    let Some((provider, name)) = reference.split_once(':') else {
        return Err(fail(format!(
            "{text:?} is not a reference (use ${{env:NAME}} or ${{file:PATH}})"
        )));
    };
    let value = match provider {
        // A variable that is not valid UTF-8 reads as unset, as it does
        // for the other environment overrides.
        "env" => {
            env(name).ok_or_else(|| fail(format!("environment variable {name:?} is not set")))?
        }
        "file" => std::fs::read_to_string(name)
            .map_err(|e| fail(format!("cannot read file {name:?}: {e}")))?,
        other => {
            return Err(fail(format!(
                "unknown reference provider {other:?} in {text:?} (accepted: env, file)"
            )));
        }
    };
    *text = value;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_yaml(yaml: &str) -> Result<(Value, bool), ConfigError> {
        let mut value: Value = yaml_serde::from_str(yaml).unwrap();
        let expanded = expand_references(&mut value, &|n| std::env::var(n).ok())?;
        Ok((value, expanded))
    }

    #[test]
    fn plain_values_untouched() {
        let (value, expanded) = expand_yaml("a: {b: [x, 1, 'pre-${env:PATH}']}").unwrap();
        assert!(!expanded);
        assert_eq!(value["a"]["b"][2].as_str(), Some("pre-${env:PATH}"));
    }

    #[test]
    fn env_and_file_expand() {
        // PATH is set in any test environment; no need to modify the env.
        let path = std::env::var("PATH").unwrap();
        let (value, expanded) = expand_yaml("a: {b: '${env:PATH}'}").unwrap();
        assert!(expanded);
        assert_eq!(value["a"]["b"].as_str(), Some(path.as_str()));
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let (value, _) = expand_yaml(&format!("k: '${{file:{file}}}'")).unwrap();
        assert!(value["k"].as_str().unwrap().contains("[package]"));
    }

    #[test]
    fn failures_name_the_key() {
        let err = expand_yaml("s:\n  x: ['${env:SLIM_CP_SURELY_UNSET_VAR}']").unwrap_err();
        assert_eq!(err.key(), Some("s.x[0]"));
        assert!(err.to_string().contains("is not set"), "{err}");
        let err = expand_yaml("k: '${vault:x}'").unwrap_err();
        assert!(err.to_string().contains("accepted: env, file"), "{err}");
        assert!(expand_yaml("k: '${novar}'").is_err());
    }
}

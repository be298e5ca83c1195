//! Connection strings, in both forms tokio-postgres reads (a
//! `postgres://` URL or `key=value` pairs): adding a password kept apart
//! from the rest, taking out the keys slim-cp reads itself (tokio-postgres
//! refuses keys and values it does not know), and hiding passwords
//! wherever a string is shown.

/// Whether `url` is in URL form (else `key=value` form).
pub fn is_url_form(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` with a password parameter appended, in the string's own form.
pub fn with_password(url: &str, password: &str) -> String {
    if is_url_form(url) {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}password={}", percent_encode(password))
    } else {
        let quoted = password.replace('\\', "\\\\").replace('\'', "\\'");
        format!("{url} password='{quoted}'")
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `url` without the parameters named in `keys`, and their values (decoded)
/// in the order they appear. What cannot be parsed is left in place for
/// tokio-postgres to report.
pub fn take_params(url: &str, keys: &[&str]) -> (String, Vec<(String, String)>) {
    if is_url_form(url) {
        take_query_params(url, keys)
    } else {
        take_pair_params(url, keys)
    }
}

fn take_query_params(url: &str, keys: &[&str]) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), Vec::new());
    };
    let mut taken = Vec::new();
    let mut kept = Vec::new();
    for param in query.split('&') {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match percent_decode(value) {
            Some(value) if keys.contains(&key) => taken.push((key.to_string(), value)),
            _ => kept.push(param),
        }
    }
    if kept.is_empty() {
        (base.to_string(), taken)
    } else {
        (format!("{base}?{}", kept.join("&")), taken)
    }
}

/// `%XX` escapes decoded; `None` if malformed or not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The `key=value` form: values may be quoted (`'a b'`) and hold
/// backslash escapes.
fn take_pair_params(text: &str, keys: &[&str]) -> (String, Vec<(String, String)>) {
    let mut taken = Vec::new();
    let mut kept = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let Some((key, value, after)) = next_pair(rest) else {
            kept.push(rest);
            break;
        };
        let whole = &rest[..rest.len() - after.len()];
        if keys.contains(&key) {
            taken.push((key.to_string(), value));
        } else {
            kept.push(whole);
        }
        rest = after.trim_start();
    }
    (kept.join(" "), taken)
}

/// The first `key=value` of `text`: key, unescaped value, what follows.
fn next_pair(text: &str) -> Option<(&str, String, &str)> {
    let key_end = text.find(|c: char| c == '=' || c.is_whitespace())?;
    let key = &text[..key_end];
    let value = text[key_end..].trim_start().strip_prefix('=')?.trim_start();
    let (raw, after) = match value.strip_prefix('\'') {
        Some(quoted) => {
            let end = closing_quote(quoted)?;
            (&quoted[..end], &quoted[end + 1..])
        }
        None => {
            let end = value.find(char::is_whitespace).unwrap_or(value.len());
            (&value[..end], &value[end..])
        }
    };
    Some((key, unescape(raw), after))
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// The connection string with every password replaced by `***`.
pub fn redact_url(url: &str) -> String {
    if !is_url_form(url) {
        return redact_password_param(url, ' ');
    }
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let mut out = match base.rfind('@').filter(|at| *at > scheme_end) {
        Some(at) => match base[scheme_end..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &base[..scheme_end], &base[at..]),
            None => base.to_string(),
        },
        None => base.to_string(),
    };
    if let Some(q) = query {
        out = format!("{out}?{}", redact_password_param(q, '&'));
    }
    out
}

/// Replaces the value of every `password` key in a `sep`-separated list
/// (`&` in a URL's query, spaces in `key=value` form, where a quoted value
/// may contain spaces).
fn redact_password_param(params: &str, sep: char) -> String {
    let mut out = String::new();
    let mut rest = params;
    while let Some(found) = rest.find("password") {
        let at_key = rest[..found]
            .chars()
            .next_back()
            .is_none_or(|c| c == sep || c == ' ');
        let after = &rest[found + "password".len()..];
        let value = after.trim_start().strip_prefix('=').map(str::trim_start);
        out.push_str(&rest[..found + "password".len()]);
        rest = after;
        if let (true, Some(value)) = (at_key, value) {
            out.push_str("=***");
            rest = value_end(value, sep);
        }
    }
    out.push_str(rest);
    out
}

/// What follows a parameter's value.
fn value_end(value: &str, sep: char) -> &str {
    match value.strip_prefix('\'') {
        Some(quoted) => closing_quote(quoted).map_or("", |end| &quoted[end + 1..]),
        None => value.find([sep, ' ']).map_or("", |end| &value[end..]),
    }
}

/// The index of the first unescaped `'`.
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '\'') => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_added_in_the_strings_own_form() {
        let url = with_password("postgres://cp@db/x?sslmode=disable", "p@ss w'rd");
        assert_eq!(
            url,
            "postgres://cp@db/x?sslmode=disable&password=p%40ss%20w%27rd"
        );
        let kv = with_password("host=db user=cp", "p@ss w'rd");
        for s in [url, kv] {
            let parsed: tokio_postgres::Config = s.parse().unwrap();
            assert_eq!(parsed.get_password(), Some("p@ss w'rd".as_bytes()));
        }
    }

    #[test]
    fn taken_params_leave_the_rest_intact_in_either_form() {
        let keys = ["sslmode", "sslrootcert"];
        let (rest, taken) = take_params(
            "postgres://cp@db/x?sslmode=verify-full&application_name=a&sslrootcert=%2Fetc%2Fca%20x.pem",
            &keys,
        );
        assert_eq!(rest, "postgres://cp@db/x?application_name=a");
        assert_eq!(
            taken,
            [
                ("sslmode".to_string(), "verify-full".to_string()),
                ("sslrootcert".to_string(), "/etc/ca x.pem".to_string())
            ]
        );
        let (rest, _) = take_params("postgres://db/x?sslmode=require", &keys);
        assert_eq!(rest, "postgres://db/x");
        let (rest, taken) = take_params(
            "host=db sslrootcert = '/etc/ca \\'x\\'.pem' user=cp sslmode=verify-ca",
            &keys,
        );
        assert_eq!(rest, "host=db user=cp");
        assert_eq!(taken[0].1, "/etc/ca 'x'.pem");
        assert_eq!(taken[1].1, "verify-ca");
        rest.parse::<tokio_postgres::Config>().unwrap();
    }

    #[test]
    fn every_password_is_redacted_and_nothing_else() {
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
        assert_eq!(
            redact_url("postgres://cp:s3cret@db/x?password=s3cret&sslmode=disable"),
            "postgres://cp:***@db/x?password=***&sslmode=disable"
        );
        assert_eq!(
            redact_url("user=password_admin password=x password = 'a \\'b' dbname=d"),
            "user=password_admin password=*** password=*** dbname=d"
        );
    }
}

//! Connection strings, in both forms tokio-postgres reads (a
//! `postgres://` URL or `key=value` pairs): adding a password kept apart
//! from the rest, and hiding passwords wherever a string is shown.

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

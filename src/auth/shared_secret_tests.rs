//! Unit tests of shared-secret tokens, on a fixed clock.

use proptest::prelude::*;

use super::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef";
const OTHER: &str = "fedcba9876543210fedcba9876543210";
const NOW: u64 = 1_750_000_000;

fn auth() -> SharedSecretAuth {
    let secrets = [("g", SECRET), ("h", OTHER), ("same", SECRET)]
        .into_iter()
        .map(|(g, s)| (g.to_string(), SharedSecret::new(s).unwrap()))
        .collect();
    SharedSecretAuth::new(secrets)
}

fn check(group: &str, node: &str, token: &str) -> Result<(), Rejection> {
    auth().check(Some(group), node, token, NOW)
}

/// A correctly signed token with arbitrary fields, for negative paths.
fn forge(secret: &str, id: &str, ts: &str, claims: &str) -> String {
    let signed = format!("{id}:{ts}:AAAAAAAAAAAAAAAA:{claims}");
    let mut mac = keyed(secret.as_bytes());
    mac.update(signed.as_bytes());
    format!(
        "{signed}:{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

#[test]
fn a_node_token_is_accepted() {
    let token = mint_token("g", "n1", SECRET, NOW);
    let fields: Vec<&str> = token.split(':').collect();
    assert_eq!(fields.len(), 5, "{token}");
    let suffix = fields[0].strip_prefix("g/n1_").unwrap();
    assert!(suffix.len() == 8 && suffix.chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(fields[1], NOW.to_string());
    assert_eq!(URL_SAFE_NO_PAD.decode(fields[2]).unwrap().len(), 12);
    assert_eq!(check("g", "n1", &token), Ok(()));
    // An id without the random suffix names the node exactly.
    assert_eq!(
        check("g", "n1", &forge(SECRET, "g/n1", "1750000000", "")),
        Ok(())
    );
}

#[test]
fn the_validity_window_is_inclusive() {
    for minted in [NOW + CLOCK_SKEW_SECS, NOW - TOKEN_VALIDITY_SECS] {
        assert_eq!(
            check("g", "n1", &mint_token("g", "n1", SECRET, minted)),
            Ok(())
        );
    }
}

#[test]
fn wrong_secret() {
    let token = mint_token("g", "n1", OTHER, NOW);
    assert_eq!(
        check("g", "n1", &token),
        Err(Rejection::BadSignature("g".into()))
    );
}

#[test]
fn no_credentials_or_no_group() {
    assert_eq!(
        check("g", "n1", ""),
        Err(Rejection::NoCredentials("g".into()))
    );
    let token = mint_token("g", "n1", SECRET, NOW);
    for group in [None, Some("")] {
        assert_eq!(
            auth().check(group, "n1", &token, NOW),
            Err(Rejection::NoGroup)
        );
    }
}

#[test]
fn unknown_group() {
    let token = mint_token("x", "n1", SECRET, NOW);
    assert_eq!(
        check("x", "n1", &token),
        Err(Rejection::UnknownGroup("x".into()))
    );
}

/// A group with a configured and a stored secret takes tokens under
/// either; a stored domain alone is a group like any other.
#[test]
fn stored_domain_secrets_are_accepted_beside_configured_ones() {
    let domains = Arc::new(Domains::new(Default::default(), None));
    let stored = |s: &str| SharedSecret::new(s).unwrap();
    domains.learn("g", &stored(OTHER));
    domains.learn("x", &stored(OTHER));
    let auth = auth().with_domains(domains.clone());
    for (group, secret) in [("g", SECRET), ("g", OTHER), ("x", OTHER)] {
        let token = mint_token(group, "n1", secret, NOW);
        assert_eq!(
            auth.check(Some(group), "n1", &token, NOW),
            Ok(()),
            "{group}"
        );
    }
    let wrong = mint_token("x", "n1", SECRET, NOW);
    assert_eq!(
        auth.check(Some("x"), "n1", &wrong, NOW),
        Err(Rejection::BadSignature("x".into()))
    );
    domains.forget("x");
    let token = mint_token("x", "n1", OTHER, NOW);
    assert_eq!(
        auth.check(Some("x"), "n1", &token, NOW),
        Err(Rejection::UnknownGroup("x".into()))
    );
}

#[test]
fn token_for_another_group() {
    // Minted with group h's secret, presented in group g.
    let token = mint_token("h", "n1", OTHER, NOW);
    assert_eq!(
        check("g", "n1", &token),
        Err(Rejection::BadSignature("g".into()))
    );
    // Groups sharing a secret are still told apart by the token's id.
    let token = mint_token("same", "n1", SECRET, NOW);
    assert!(matches!(
        check("g", "n1", &token),
        Err(Rejection::IdentityMismatch { expected, .. }) if expected == "g/n1"
    ));
}

#[test]
fn node_id_mismatch() {
    let token = mint_token("g", "n2", SECRET, NOW);
    assert!(matches!(
        check("g", "n1", &token),
        Err(Rejection::IdentityMismatch { .. })
    ));
    // `node-10`'s token starts with `g/node-1` but is not node-1's.
    let token = mint_token("g", "node-10", SECRET, NOW);
    assert!(matches!(
        check("g", "node-1", &token),
        Err(Rejection::IdentityMismatch { .. })
    ));
    assert_eq!(check("g", "node-10", &token), Ok(()));
}

#[test]
fn expired_and_future_tokens() {
    let old = mint_token("g", "n1", SECRET, NOW - TOKEN_VALIDITY_SECS - 1);
    assert_eq!(
        check("g", "n1", &old),
        Err(Rejection::Expired(TOKEN_VALIDITY_SECS + 1))
    );
    let ahead = mint_token("g", "n1", SECRET, NOW + CLOCK_SKEW_SECS + 1);
    assert_eq!(
        check("g", "n1", &ahead),
        Err(Rejection::FromTheFuture(CLOCK_SKEW_SECS + 1))
    );
    let far = mint_token("g", "n1", SECRET, u64::MAX);
    assert!(matches!(
        check("g", "n1", &far),
        Err(Rejection::FromTheFuture(_))
    ));
    assert!(matches!(
        check("g", "n1", &mint_token("g", "n1", SECRET, 0)),
        Err(Rejection::Expired(_))
    ));
}

#[test]
fn malformed_tokens_are_rejected() {
    let good = mint_token("g", "n1", SECRET, NOW);
    let (signed, mac) = good.rsplit_once(':').unwrap();
    let cases = [
        "no-colons-at-all".to_string(),
        "a:b".to_string(),
        "g/n1:1750000000:nonce:mac".to_string(),
        format!("{signed}:extra:{mac}"),
        format!("{signed}:{}", mac.replace(|_| true, "*")),
        format!("{signed}:{}=", &mac[..42]),
        format!("{signed}:"),
        format!("{signed}:{}", &mac[..20]),
        good.replacen(&NOW.to_string(), "soon", 1),
        good.replacen(&NOW.to_string(), "", 1),
        good.replacen(&NOW.to_string(), "+1750000000", 1),
        good.replacen(&NOW.to_string(), "99999999999999999999999", 1),
    ];
    for token in &cases {
        let got = check("g", "n1", token);
        assert!(
            matches!(got, Err(Rejection::Malformed(_))),
            "{token}: {got:?}"
        );
    }
    // Signed, but the claims are not base64url JSON.
    for claims in ["not*base64", "bm90IGpzb24"] {
        let token = forge(SECRET, "g/n1_ABCDEFGH", "1750000000", claims);
        assert!(
            matches!(check("g", "n1", &token), Err(Rejection::Malformed(_))),
            "{claims}"
        );
    }
}

#[test]
fn reasons_are_distinct_and_never_quote_secrets_or_tokens() {
    let good = mint_token("g", "n1", SECRET, NOW);
    let mac = good.rsplit_once(':').unwrap().1;
    let reasons = [
        auth().check(None, "n1", &good, NOW),
        check("g", "n1", ""),
        check("x", "n1", &good),
        check("g", "n1", "a:b"),
        check("g", "n1", &mint_token("g", "n1", OTHER, NOW)),
        check("g", "n1", &mint_token("g", "n1", SECRET, NOW + 60)),
        check("g", "n1", &mint_token("g", "n1", SECRET, NOW - 7200)),
        check("g", "n2", &good),
    ]
    .map(|r| r.unwrap_err().to_string());
    for (i, reason) in reasons.iter().enumerate() {
        assert!(
            !reason.contains(SECRET) && !reason.contains(OTHER),
            "{reason}"
        );
        assert!(!reason.contains(&good) && !reason.contains(mac), "{reason}");
        assert!(
            reasons[..i].iter().all(|r| r != reason),
            "duplicate: {reason}"
        );
    }
}

#[test]
fn quoted_text_is_bounded() {
    let long_group = "g".repeat(10_000);
    let err = auth().check(Some(&long_group), "n1", "t", NOW).unwrap_err();
    assert!(err.to_string().len() < 300, "{err}");
    let id = format!("g/{}", "é".repeat(500));
    let token = forge(SECRET, &id, "1750000000", "");
    let err = check("g", "n1", &token).unwrap_err().to_string();
    assert!(
        err.len() < 500 && err.contains("...\" is not node"),
        "{err}"
    );
}

#[test]
fn debug_shows_groups_only() {
    let shown = format!("{:?}", auth());
    assert!(
        shown.contains("\"g\"") && !shown.contains(SECRET),
        "{shown}"
    );
}

proptest! {
    #[test]
    fn arbitrary_credentials_never_panic(token in ".{0,200}", node in "[a-z0-9:/_-]{0,12}") {
        let _ = auth().check(Some("g"), &node, &token, NOW);
    }

    #[test]
    fn colon_heavy_credentials_never_panic(token in "[0-9A-Za-z_:/+=-]{0,120}") {
        prop_assert!(check("g", "n1", &token).is_err());
    }
}

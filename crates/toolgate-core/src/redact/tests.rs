use std::borrow::Cow;

use serde_json::json;

use super::*;

// Vendor prefixes are split with `concat!` so that secret scanners (GitHub push protection and
// the like) do not mistake these fixtures for leaked credentials; the compiled strings are whole.

/// Input → expected output, for text that holds secrets.
const REDACTED_CASES: &[(&str, &str)] = &[
    // Assignments: the key name stays, the value goes.
    ("api_key=Zx81kQ", "api_key=[REDACTED]"),
    ("apikey: abc123xyz", "apikey: [REDACTED]"),
    ("token=abc", "token=[REDACTED]"),
    ("password=hunter2 user=bob", "password=[REDACTED] user=bob"),
    ("PASSWORD := hunter2", "PASSWORD := [REDACTED]"),
    ("passwd=x9", "passwd=[REDACTED]"),
    (
        r#"{"password": "correct horse battery staple", "user": "bob"}"#,
        r#"{"password": "[REDACTED]", "user": "bob"}"#,
    ),
    (
        r#"{\"password\":\"hunter2\",\"user\":\"bob\"}"#,
        r#"{\"password\":\"[REDACTED]\",\"user\":\"bob\"}"#,
    ),
    (
        "export GITHUB_TOKEN='s3cr3t-value'",
        "export GITHUB_TOKEN='[REDACTED]'",
    ),
    (
        "GET /v1/items?access_token=abc123&page=2",
        "GET /v1/items?access_token=[REDACTED]&page=2",
    ),
    ("X-Api-Key: 9f8e7d6c", "X-Api-Key: [REDACTED]"),
    ("clientSecret=Zm9vYmFy", "clientSecret=[REDACTED]"),
    ("secret_key: 'abc def'", "secret_key: '[REDACTED]'"),
    ("db_credentials=admin/pw1", "db_credentials=[REDACTED]"),
    ("Secret: Hunter2", "Secret: [REDACTED]"),
    // AWS secret access keys (AWS documentation's example key).
    (
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "aws_secret_access_key = [REDACTED]",
    ),
    (
        "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nAWS_REGION=eu-west-1",
        "AWS_SECRET_ACCESS_KEY=[REDACTED]\nAWS_REGION=eu-west-1",
    ),
    // Authorization headers: the scheme stays.
    (
        "Authorization: Bearer abc.def-123",
        "Authorization: Bearer [REDACTED]",
    ),
    (
        "authorization: Basic dXNlcjpwYXNz",
        "authorization: Basic [REDACTED]",
    ),
    (
        r#"{"Authorization": "token 0123abcd"}"#,
        r#"{"Authorization": "token [REDACTED]"}"#,
    ),
    (
        "Proxy-Authorization: s3cr3tvalue",
        "Proxy-Authorization: [REDACTED]",
    ),
    // Bare bearer tokens.
    (
        "curl -H 'Bearer abc123def456' https://api.example.com",
        "curl -H 'Bearer [REDACTED]' https://api.example.com",
    ),
    (
        "retrying with bearer 0a1b2c3d4e5f.",
        "retrying with bearer [REDACTED].",
    ),
    // JWTs, signed and unsigned.
    (
        "session eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLWJ5dGVzLTAx expired",
        "session [REDACTED] expired",
    ),
    ("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.", "[REDACTED]"),
    // PEM private keys: BEGIN/END lines stay, the body goes, a truncated block to the end.
    (
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nq8Zt3vXn0L\n-----END RSA PRIVATE KEY-----\nnext line",
        "key:\n-----BEGIN RSA PRIVATE KEY-----[REDACTED]-----END RSA PRIVATE KEY-----\nnext line",
    ),
    (
        "-----BEGIN PRIVATE KEY-----\\nMC4CAQAwBQYDK2VwBCIEI\\n-----END PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----[REDACTED]-----END PRIVATE KEY-----",
    ),
    (
        "upstream said: -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAABG5vbmUAAAAEbm9u",
        "upstream said: -----BEGIN OPENSSH PRIVATE KEY-----[REDACTED]",
    ),
    (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----[REDACTED]-----END PGP PRIVATE KEY BLOCK-----",
    ),
    // GitHub.
    (
        concat!(
            "token ",
            "gh",
            "p_",
            "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
            " rejected"
        ),
        "token [REDACTED] rejected",
    ),
    (
        concat!("gh", "o_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
        "[REDACTED]",
    ),
    (
        concat!("gh", "u_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
        "[REDACTED]",
    ),
    (
        concat!("gh", "s_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
        "[REDACTED]",
    ),
    (
        concat!("gh", "r_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
        "[REDACTED]",
    ),
    (
        concat!(
            "(",
            "github",
            "_pat_",
            "11ABCDEFG0123456789abc_defghijklmnopqrstuvwxyz0123",
            ")"
        ),
        "([REDACTED])",
    ),
    // Slack tokens and webhooks.
    (
        concat!(
            "xox",
            "b-",
            "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
        ),
        "[REDACTED]",
    ),
    (concat!("xox", "p-", "1234567890-abcdefghij"), "[REDACTED]"),
    (concat!("xox", "a-", "2-1234567890-abcdef"), "[REDACTED]"),
    (concat!("xox", "r-", "1234567890-abcdef"), "[REDACTED]"),
    (concat!("xox", "s-", "1234567890-abcdef"), "[REDACTED]"),
    (
        concat!(
            "posting to https://hooks.slack.com/services/",
            "T0000000",
            "0/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now"
        ),
        "posting to https://hooks.slack.com/services/[REDACTED] now",
    ),
    // AWS access key ids (AWS documentation's examples).
    (
        "key id AKIAIOSFODNN7EXAMPLE in use",
        "key id [REDACTED] in use",
    ),
    ("ASIAIOSFODNN7EXAMPLE", "[REDACTED]"),
    // Stripe-style keys.
    (concat!("s", "k_live_", "51HxYzAbCdEfGh12"), "[REDACTED]"),
    (concat!("s", "k_test_", "51HxYzAbCdEfGh12"), "[REDACTED]"),
    (concat!("r", "k_live_", "51HxYzAbCdEfGh12"), "[REDACTED]"),
    (concat!("p", "k_live_", "51HxYzAbCdEfGh12"), "[REDACTED]"),
    (
        concat!("wh", "sec_", "AbCdEfGh1234567890IjKl"),
        "[REDACTED]",
    ),
    // Passwords in URLs: user and host stay.
    (
        "connecting to postgres://admin:s3cr3t@db.internal:5432/app",
        "connecting to postgres://admin:[REDACTED]@db.internal:5432/app",
    ),
    (
        "https://user:p@ss@host.example/x",
        "https://user:[REDACTED]@host.example/x",
    ),
    (
        "redis://:topsecret@cache:6379",
        "redis://:[REDACTED]@cache:6379",
    ),
    // Long random strings without a known prefix.
    (
        "value wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY end",
        "value [REDACTED] end",
    ),
    (
        "id q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1uNi4OxTl6WzA.",
        "id [REDACTED].",
    ),
    ("Q29ycmVjdEhvcnNlQmF0dGVyeVN0YXBsZTIwMjQh==", "[REDACTED]"),
    // A random hex key is caught by its name, not by its entropy.
    (
        "api_key=9c4f1e7a2b8d3f6058e1c2a94b7d0e3f",
        "api_key=[REDACTED]",
    ),
    // Base64url with separators, pieces mixing all three classes.
    ("sess Zx9-Lq2Wm8Rt4Yp6Kd_3Nf7Hj1Vb5Cs0Ge", "sess [REDACTED]"),
    // Several secrets in one line.
    (
        concat!(
            "password=hunter2 then ",
            "gh",
            "p_",
            "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
            " and AKIAIOSFODNN7EXAMPLE!"
        ),
        "password=[REDACTED] then [REDACTED] and [REDACTED]!",
    ),
    // Unicode around secrets.
    (
        concat!(
            "Пароль: password=hunter2 — ключ ",
            "gh",
            "p_",
            "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
            ", 秘密AKIAIOSFODNN7EXAMPLEです 🔑"
        ),
        "Пароль: password=[REDACTED] — ключ [REDACTED], 秘密[REDACTED]です 🔑",
    ),
    ("🔒 token=żółć-ß-42 ✓", "🔒 token=[REDACTED] ✓"),
];

/// Text that must come back unchanged (and borrowed).
const CLEAN_CASES: &[&str] = &[
    // Digests toolgate prints on purpose: SHA-256 and SHA-1 hex, in either case, alone or keyed.
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
    "prev_sha256=ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    r#"{"sha256":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","prev_sha256":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
    "audit: chain broken at record 12 (expected ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad)",
    "commit a9993e364706816aba3e25717850c26c9cd0d89d",
    "toolgate-audit-ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad.jsonl",
    "deadbeefdeadbeefdeadbeefdeadbeefdeadbeef00",
    // Other hex digests and ids: MD5, 48 digits, SHA-512.
    "3f9a1c7e5b2d8046a1e9c3b7d5f20864",
    "hex 9c4f1e7a2b8d3f6058e1c2a94b7d0e3f5a6c8b1d2e4f7a90",
    "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e",
    // Request ids made of plain pieces.
    "request_id=req-journal-fdatasync-EIO-10-000",
    "req-journal-fdatasync-EIO-10-000",
    // UUIDs.
    "request 550e8400-e29b-41d4-a716-446655440000 done",
    "550E8400-E29B-41D4-A716-446655440000",
    // Paths and URLs without credentials.
    "/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
    "/var/lib/toolgate/audit/2026-05-01/records.jsonl",
    "/Users/Alice/Projects/Toolgate2/crates/core/src/lib.rs",
    "C:/Users/JohnSmith/AppData/Local/Programs/Python311/python.exe",
    "src/Components/Button2/ButtonStyles.tsx",
    "https://github.com/toolgate/toolgate/blob/main/crates/toolgate-core/src/redact/mod.rs",
    "https://example.com:8443/path?q=1&page=2#frag",
    "ssh://git@github.com/toolgate/toolgate.git",
    "http://[::1]:8080/mcp",
    "write to alice@example.com",
    // Identifiers.
    "AbstractSingletonProxyFactoryBean2",
    "HTTPServerRequestHandlerV2ForJSONRPC2Messages",
    "test_redactor_leaves_sha256_digests_of_the_audit_log_alone",
    // Prose, including the words the shapes key on.
    "The quick brown fox jumps over the lazy dog while the gateway writes its audit log.",
    "error: invalid token: expired",
    "Password: must be at least 8 characters",
    "authorization failed for alice",
    "authorization: denied",
    "the bearer of bad news",
    "Bearer tokens are short-lived",
    "bearer abc1",
    "Please reset your password before Monday; the secret is patience.",
    "Tokens: 1234 used",
    "The tokenizer splits text.",
    "eyJ is how base64 of a JSON object starts",
    "heyJude.mp3.bak",
    // Keys that end past the keyword, comparisons, empty values.
    "max_tokens=4096",
    "token_count: 12",
    "secret_name=db-creds",
    "client_secret_expires_at=0",
    "if token == None:",
    "password=",
    "password: [REDACTED]",
    "Authorization: Bearer [REDACTED]",
    // Keywords are ASCII: a Cyrillic "token" is a word like any other.
    "токен=значение42",
    // Near misses of vendor shapes.
    concat!("gh", "p_short"),
    "laughs_abcdefghijklmnopqrstuvwxyz",
    concat!("xox", "b-12"),
    "xoxo-hugs-and-kisses",
    "https://hooks.slack.com/",
    "AKIA1234",
    "AKIAIOSFODNN7EXAMPLEX",
    "task_live_updates",
    concat!("s", "k_live_abc"),
    // Public keys and certificates are not secrets.
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYI\n-----END PUBLIC KEY-----",
];

fn redactor() -> Redactor {
    Redactor::default()
}

#[test]
fn every_shape_is_redacted_exactly() {
    let r = redactor();
    for (input, expected) in REDACTED_CASES {
        assert_eq!(r.redact(input), *expected, "input: {input:?}");
    }
}

#[test]
fn clean_text_is_untouched_and_borrowed() {
    let r = redactor();
    for input in CLEAN_CASES {
        let out = r.redact(input);
        assert!(
            matches!(out, Cow::Borrowed(s) if s == *input),
            "input: {input:?} became {out:?}"
        );
    }
}

/// Redacted text passes through again unchanged: a line redacted once (by a handler, then by the
/// logger) does not grow markers or lose its remaining words.
#[test]
fn redacted_text_is_a_fixed_point() {
    let r = redactor();
    for (input, expected) in REDACTED_CASES {
        let again = r.redact(expected);
        assert!(
            matches!(again, Cow::Borrowed(_)),
            "input: {input:?}: {expected:?} became {again:?}"
        );
    }
}

#[test]
fn a_clean_10_kb_string_is_borrowed() {
    let line = "The gateway allowed tools/call read_file for local:alice at 2026-05-01T12:00:00Z; \
                /var/lib/toolgate/audit.jsonl record 42, request 550e8400-e29b-41d4-a716-446655440000.\n";
    let prose = line.repeat(10 * 1024 / line.len() + 1);
    assert!(prose.len() >= 10 * 1024);
    assert!(matches!(redactor().redact(&prose), Cow::Borrowed(_)));

    // With digests in it the prefilter fires and the slow path runs, and still nothing is copied.
    let digest = "sha256 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n";
    let mixed = format!("{line}{digest}").repeat(10 * 1024 / (line.len() + digest.len()) + 1);
    assert!(matches!(redactor().redact(&mixed), Cow::Borrowed(_)));
}

fn registered() -> Redactor {
    Redactor::new(vec![
        Secret::new("hunter2secret"),
        Secret::new("tiny"),
        Secret::new(""),
        Secret::new("  padded-secret\n"),
        Secret::new("p@ss.w*rd(1)"),
        Secret::new("abcdefgh12"),
        Secret::new("gh12ijklmn"),
        Secret::new("пароль-секрет"),
    ])
}

const REGISTERED_CASES: &[(&str, &str)] = &[
    // Inside a longer word.
    ("xxhunter2secretxx", "xx[REDACTED]xx"),
    (
        "a hunter2secret b hunter2secret",
        "a [REDACTED] b [REDACTED]",
    ),
    // Trimmed when registered.
    ("value padded-secret here", "value [REDACTED] here"),
    // Regex metacharacters are literal.
    ("login p@ss.w*rd(1) failed", "login [REDACTED] failed"),
    ("login p@ssXw*rd(1) failed", "login p@ssXw*rd(1) failed"),
    // Overlapping values are both covered.
    ("zzabcdefgh12ijklmnzz", "zz[REDACTED]zz"),
    // Unicode values and text.
    ("ключ: «пароль-секрет» — ok", "ключ: «[REDACTED]» — ok"),
    // Too short to register: left alone.
    ("tiny things", "tiny things"),
    // Shapes still apply.
    (
        "api_key=Zx81kQ and hunter2secret",
        "api_key=[REDACTED] and [REDACTED]",
    ),
];

#[test]
fn registered_secrets_are_redacted_wherever_they_occur() {
    let r = registered();
    for (input, expected) in REGISTERED_CASES {
        assert_eq!(r.redact(input), *expected, "input: {input:?}");
    }
}

#[test]
fn registered_secrets_fall_back_to_one_search_each_with_the_same_result() {
    let values = [
        "hunter2secret",
        "padded-secret",
        "p@ss.w*rd(1)",
        "abcdefgh12",
        "gh12ijklmn",
        "пароль-секрет",
    ];
    let each = Redactor::build(values.iter().map(|v| (*v).to_owned()).collect(), false);
    assert!(matches!(each.registered, Registered::Each(_)));
    for (input, expected) in REGISTERED_CASES {
        assert_eq!(each.redact(input), *expected, "input: {input:?}");
    }
}

/// A key file: kilobytes long, several lines, non-ASCII at the prefix cut.
fn long_secret() -> String {
    let mut value = String::from("ключ-🔑-");
    while value.len() < 4096 {
        value.push_str("q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1uNi4OxTl6WzA\n");
    }
    value
}

#[test]
fn long_secrets_are_redacted_whole_and_when_cut_off() {
    let value = long_secret();
    for combine in [true, false] {
        let r = Redactor::build(vec![value.clone()], combine);
        assert_eq!(
            r.redact(&format!("error: {value} (end)")),
            "error: [REDACTED] (end)"
        );
        // A message truncated inside the value still hides all of it that is there.
        let cut = &value[..value.char_indices().nth(300).unwrap().0];
        assert_eq!(
            r.redact(&format!("error: {cut}… (truncated)")),
            "error: [REDACTED]… (truncated)"
        );
        // Text that leaves the value right after its prefix: the agreeing part is secret material.
        let prefix_end = (0..=PREFIX_LEN)
            .rev()
            .find(|&i| value.is_char_boundary(i))
            .unwrap();
        let diverging = format!("{}!", &value[..prefix_end]);
        assert_eq!(r.redact(&diverging), "[REDACTED]!");
        // Less than the prefix is not a hit.
        let short = &value[..value.char_indices().nth(20).unwrap().0];
        assert!(matches!(r.redact(short), Cow::Borrowed(_)));
    }
}

#[test]
fn short_and_empty_secrets_are_not_registered() {
    let r = Redactor::new(vec![
        Secret::new(""),
        Secret::new("12345"),
        Secret::new(" \n"),
    ]);
    assert_eq!(format!("{r:?}"), "Redactor { registered_secrets: 0, .. }");
    assert!(matches!(r.redact("12345 items"), Cow::Borrowed(_)));
    let r = Redactor::new(vec![Secret::new("123456")]);
    assert_eq!(r.redact("123456 items"), "[REDACTED] items");
}

#[test]
fn debug_of_a_redactor_never_shows_its_secrets() {
    let shown = format!("{:?} {:#?}", registered(), registered());
    assert!(!shown.contains("hunter2secret"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("registered_secrets: 6"), "{shown}");
}

#[test]
fn secret_never_prints_or_serialises_its_value() {
    let secret = Secret::new("hunter2-very-secret");
    assert_eq!(format!("{secret:?}"), "<redacted>");
    assert_eq!(format!("{secret:#?}"), "<redacted>");
    assert_eq!(format!("{secret}"), "<redacted>");
    assert_eq!(serde_json::to_string(&secret).unwrap(), r#""<redacted>""#);
    assert_eq!(secret.expose(), "hunter2-very-secret");

    #[derive(Debug, serde::Serialize)]
    struct Config {
        name: &'static str,
        client_secret: Secret,
    }
    let config = Config {
        name: "billing",
        client_secret: secret.clone(),
    };
    for shown in [
        format!("{config:?}"),
        format!("{config:#?}"),
        serde_json::to_string(&config).unwrap(),
        serde_json::to_string_pretty(&config).unwrap(),
    ] {
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}

#[test]
fn secret_is_read_from_configuration() {
    let secret: Secret = serde_json::from_str(r#""from-a-file""#).unwrap();
    assert_eq!(secret.expose(), "from-a-file");
    assert_eq!(Secret::from("x").expose(), "x");
    assert_eq!(Secret::from(String::from("y")).expose(), "y");
}

#[test]
fn json_values_are_redacted_without_changing_a_type() {
    let r = redactor();
    let input = json!({
        "user": "alice",
        "password": "hunter2",
        "nested": {
            "GITHUB_TOKEN": {"value": "anything", "n": 1},
            "note": "Bearer abc123def456",
            "max_tokens": 4096,
            "token_count": 3,
            "list": ["ok", "api_key=zzz123", 7, true, null],
        },
        "clientSecret": 42,
        "refresh_token": {"value": "r-1", "expires_in": 3600, "rotating": true},
        "x-api-key": null,
        "Private-Key": ["a", "b"],
        "db_credentials": "admin",
        "Authorization": "Basic dXNlcjpwYXNz",
        "key AKIAIOSFODNN7EXAMPLE": "a key is text: a secret in it is redacted",
        "digest": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    });
    let expected = json!({
        "user": "alice",
        "password": "[REDACTED]",
        "nested": {
            "GITHUB_TOKEN": {"value": "[REDACTED]", "n": 1},
            "note": "Bearer [REDACTED]",
            "max_tokens": 4096,
            "token_count": 3,
            "list": ["ok", "api_key=[REDACTED]", 7, true, null],
        },
        "clientSecret": 42,
        "refresh_token": {"value": "[REDACTED]", "expires_in": 3600, "rotating": true},
        "x-api-key": null,
        "Private-Key": ["[REDACTED]", "[REDACTED]"],
        "db_credentials": "[REDACTED]",
        "Authorization": "[REDACTED]",
        "key [REDACTED]": "a key is text: a secret in it is redacted",
        "digest": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    });
    assert_eq!(r.redact_value(&input), expected);
}

#[test]
fn sensitive_key_names() {
    for key in [
        "password",
        "Password",
        "PASSWD",
        "db_password",
        "passphrase",
        "secret",
        "client_secret",
        "clientSecret",
        "client-secret",
        "token",
        "access_token",
        "refreshToken",
        "GITHUB_TOKEN",
        "api_key",
        "apiKey",
        "API-KEY",
        "x-api-key",
        "apikey",
        "authorization",
        "Proxy-Authorization",
        "private_key",
        "privateKey",
        "secret_key",
        "aws_secret_access_key",
        "credential",
        "Credentials",
        "service.credentials",
    ] {
        assert!(is_sensitive_key(key), "{key}");
    }
    for key in [
        "user",
        "max_tokens",
        "tokens",
        "token_count",
        "tokenizer",
        "secret_name",
        "password_hint",
        "api_key_id",
        "key",
        "sha256",
        "args_digest",
        "credential_type",
    ] {
        assert!(!is_sensitive_key(key), "{key}");
    }
}

#[test]
fn entropy_thresholds_separate_random_from_structured() {
    // Random 32-character base64 and hex sit above their thresholds; words and repeats below.
    assert!(entropy(b"q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1u") > MIN_BASE64_ENTROPY);
    assert!(entropy(b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") < 0.001);
    assert!(!word_share_below(
        b"AbstractSingletonProxyFactoryBean2",
        WORD_SHARE
    ));
    assert!(word_share_below(
        b"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        WORD_SHARE
    ));
    // Hex of any length is never judged by entropy.
    let digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    for len in [32, 40, 41, 48, 56, 64] {
        assert!(!looks_random(&digest[..len]), "{len}");
    }
    assert!(!looks_random(&format!("{digest}{digest}")));
    // Plain pieces are an identifier; one random piece is not.
    assert!(is_identifier(b"req-journal-fdatasync-EIO-10-000"));
    assert!(is_identifier(b"build_2026_x86_64-Linux"));
    assert!(!is_identifier(b"req-q8Zt3vXn0LwPj7Ka2RmYc"));
    assert!(!is_identifier(b"q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1u"));
}

#[test]
fn the_callers_own_ids_come_back_and_known_secrets_do_not() {
    let r = registered();
    let id = "q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1u";
    let aws = "AKIAIOSFODNN7EXAMPLE";
    let args = json!({"request_id": id, "note": format!("key {aws}"), "n": 3});
    let echoes = Echoes::of(&args);
    let text = format!("saved {id} at notes/{id}.md ({aws})");
    // Without the arguments the id looks random; with them it is the caller's.
    assert_eq!(
        r.redact(&text),
        "saved [REDACTED] at [REDACTED].md ([REDACTED])"
    );
    assert_eq!(
        r.redact_echoing(&text, &echoes),
        format!("saved {id} at notes/{id}.md ([REDACTED])")
    );
    // A random run the caller did not send is still judged, even next to one it did.
    let other = "Zx9Lq2Wm8Rt4Yp6Kd3Nf7Hj1Vb5Cs0GeTu";
    assert_eq!(
        r.redact_echoing(&format!("{id}/{other}"), &echoes),
        "[REDACTED]"
    );
    // Registered secrets and credential shapes are redacted even when the caller sent them.
    let args = json!({
        "a": "my hunter2secret please",
        "b": concat!("gh", "p_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
    });
    let echoes = Echoes::of(&args);
    let text = format!(
        "{} {}",
        args["a"].as_str().unwrap(),
        args["b"].as_str().unwrap()
    );
    assert_eq!(
        r.redact_echoing(&text, &echoes),
        "my [REDACTED] please [REDACTED]"
    );
    // Short strings do not count: single characters cannot switch the rule off.
    let letters: Vec<String> = id.chars().map(String::from).collect();
    let args = json!(letters);
    assert_eq!(r.redact_echoing(id, &Echoes::of(&args)), "[REDACTED]");
    // The arguments never print.
    assert_eq!(format!("{echoes:?}"), "Echoes { count: 2 }");
}

/// Deterministic bytes for the corpora: SHA-256 of a label and a counter.
fn bytes(label: &str, i: usize) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(format!("{label}-{i}")).into()
}

fn base64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0_u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(alphabet[(n >> (18 - 6 * i) & 63) as usize]));
        }
        if pad {
            out.push_str(&"=="[..3 - chunk.len()]);
        }
    }
    out
}

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// `len` characters drawn from `alphabet`.
fn draw(label: &str, i: usize, alphabet: &[u8], len: usize) -> String {
    (0..len)
        .map(|j| {
            let b = bytes(label, i * 1000 + j / 32)[j % 32];
            char::from(alphabet[usize::from(b) % alphabet.len()])
        })
        .collect()
}

/// A small valid-looking PNG: signature, IHDR, an IDAT of `size` pseudo-random bytes, IEND.
fn png(i: usize, size: usize) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10\0\0\0\x10\x08\x06\0\0\0".to_vec();
    out.extend_from_slice(&bytes("crc", i)[..4]);
    out.extend_from_slice(&u32::try_from(size).unwrap().to_be_bytes());
    out.extend_from_slice(b"IDAT");
    for k in 0..size.div_ceil(32) {
        out.extend_from_slice(&bytes(&format!("png{i}"), k));
    }
    out.truncate(8 + 25 + 8 + size);
    out.extend_from_slice(b"\0\0\0\0IEND\xaeB`\x82");
    out
}

/// Ordinary identifiers a tool returns and a caller must be able to read back.
fn harmless_corpus() -> Vec<String> {
    let words = [
        "journal",
        "fdatasync",
        "ledger",
        "write",
        "note",
        "retry",
        "commit",
        "upload",
        "index",
    ];
    let errors = ["EIO", "ENOSPC", "EAGAIN", "ETIMEDOUT", "OK"];
    let mut corpus = Vec::new();
    for i in 0..200 {
        let hex = hex::encode(bytes("hex", i));
        let big = format!("{hex}{}", hex::encode(bytes("hex2", i)));
        // Hex digests and ids of every common length, both cases.
        for len in [8, 12, 16, 24, 32, 40, 48, 56, 64, 96, 128] {
            corpus.push(big[..len].to_owned());
        }
        corpus.push(big[..32].to_uppercase());
        // UUIDs, lower and upper case.
        let uuid = format!(
            "{}-{}-4{}-a{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[13..16],
            &hex[17..20],
            &hex[20..32]
        );
        corpus.push(uuid.to_uppercase());
        corpus.push(uuid);
        // Request ids made of plain pieces, like the kit's.
        let (w1, w2, e) = (words[i % 9], words[(i / 9) % 9], errors[i % 5]);
        corpus.push(format!("req-{w1}-{w2}-{e}-{}-{:03}", i % 20, i));
        corpus.push(format!("{w1}_{w2}_{e}_{i:06}_attempt_{}", i % 7));
        corpus.push(format!("{}-{w1}-{}", &hex[..12], &hex[12..24]));
        // Paths and versions.
        corpus.push(format!(
            "/var/lib/toolgate/{w1}/2026-05-{:02}/{e}-{i}.jsonl",
            i % 28 + 1
        ));
        corpus.push(format!(
            "/Users/Alice/Projects/Toolgate{}/crates/{w1}/src/{w2}.rs",
            i % 4
        ));
        corpus.push(format!(
            "v{}.{}.{}-rc.{}+build.{}",
            i % 3,
            i % 11,
            i,
            i % 5,
            hex
        ));
        // Images as base64, alone and as data URIs.
        let image = base64(&png(i, 40 + i * 3), STD, true);
        corpus.push(format!("data:image/png;base64,{image}"));
        corpus.push(image);
    }
    corpus
}

/// Fake secrets of real shapes, each of which must be redacted.
fn secret_corpus() -> Vec<String> {
    let mut corpus = Vec::new();
    for i in 0..100 {
        let alnum = |n| draw("alnum", i, ALNUM, n);
        corpus.push(format!(
            "AKIA{}",
            draw("aws", i, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
        ));
        corpus.push(format!(
            "aws_secret_access_key = {}",
            draw("awss", i, STD, 40)
        ));
        corpus.push(format!("{}{}", concat!("gh", "p_"), alnum(36)));
        corpus.push(format!("github_pat_{}_{}", alnum(22), alnum(59)));
        corpus.push(format!(
            "{}{}-{}-{}",
            concat!("xox", "b-"),
            i,
            alnum(12),
            alnum(24)
        ));
        corpus.push(format!("{}{}", concat!("s", "k_live_"), alnum(24)));
        corpus.push(format!("{}{}", concat!("wh", "sec_"), alnum(32)));
        let header = base64(br#"{"alg":"HS256","typ":"JWT"}"#, URL, false);
        let claims = base64(
            format!(r#"{{"sub":"user{i}","iat":1700000000}}"#).as_bytes(),
            URL,
            false,
        );
        let sig = base64(&bytes("jwt", i), URL, false);
        corpus.push(format!("{header}.{claims}.{sig}"));
        corpus.push(format!(
            "Authorization: Bearer {}",
            base64(&bytes("bearer", i), URL, false)
        ));
        corpus.push(format!("token={}", alnum(20)));
        corpus.push(format!("postgres://app:{}@db:5432/app", alnum(16)));
        corpus.push(format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----",
            base64(&bytes("pem", i), STD, true)
        ));
        // Unknown shapes: long random base64, with no known prefix and no name around it.
        corpus.push(base64(
            &[bytes("rand", i), bytes("rand2", i)].concat()[..30],
            STD,
            true,
        ));
    }
    corpus
}

#[test]
fn no_false_positives_on_ids_hashes_uuids_paths_versions_and_images() {
    let r = redactor();
    let corpus = harmless_corpus();
    assert!(corpus.len() >= 3000, "{}", corpus.len());
    let flagged: Vec<&String> = corpus
        .iter()
        .filter(|s| matches!(r.redact(s), Cow::Owned(_)))
        .collect();
    assert!(
        flagged.is_empty(),
        "false positives: {} of {}: {:?}",
        flagged.len(),
        corpus.len(),
        &flagged[..flagged.len().min(10)]
    );
}

#[test]
fn every_secret_of_a_known_shape_is_caught() {
    let r = redactor();
    let corpus = secret_corpus();
    let missed: Vec<&String> = corpus
        .iter()
        .filter(|s| !r.redact(s).contains(REDACTED))
        .collect();
    assert!(
        missed.is_empty(),
        "missed: {} of {}: {:?}",
        missed.len(),
        corpus.len(),
        &missed[..missed.len().min(10)]
    );
}

/// `changes_value` is the shortcut the result redaction takes when it says no: it must say yes
/// exactly when `redact_value_echoing` would change something.
#[test]
fn changes_value_agrees_with_redact_value() {
    let redactor = registered();
    let arguments = json!({"request_id": "k3Jx9QpL2vWz8RtY5mNb7HcD4fGa6SeU"});
    let echoes = Echoes::of(&arguments);
    let values = [
        json!({"request_id": "r-0000001", "status": "committed"}),
        json!({"note": "AKIAIOSFODNN7EXAMPLE is a key"}),
        json!({"password": 1234, "nested": [{"ok": true}, null, 2.5]}),
        json!({"password": "hunter2"}),
        json!({"headers": {"authorization": ["Bearer abc"]}}),
        json!({"AKIAIOSFODNN7EXAMPLE": "a key as a key"}),
        json!(["k3Jx9QpL2vWz8RtY5mNb7HcD4fGa6SeU", "plain words"]),
        json!({"id": "zQ8vN3kL5pR7tW2xY4bM6cF9gH1jD0sA"}),
        json!({"text": long_secret()}),
        json!("plain"),
        json!(42),
    ];
    for value in values {
        let changed = redactor.redact_value_echoing(&value, &echoes) != value;
        assert_eq!(redactor.changes_value(&value, &echoes), changed, "{value}");
    }
}

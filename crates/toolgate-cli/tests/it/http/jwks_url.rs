//! Keys from a JWKS URL (`--jwks-url`), served by a listener in the test that counts fetches.
//!
//! Anyone can mint a token with a `kid` the server has never seen, so an unknown `kid` may cause
//! a fetch (a key was rotated in), but a burst of them causes at most one: the refresh is rate
//! limited. What the token's own header names (`jku`) is never fetched. Only the algorithms given
//! with `--algorithm` are accepted, even with a key of another type in the set.

use std::time::Duration;

use serde_json::json;

use super::{
    Canary, HttpServer, JwksServer, Keys, Scratch, Signer, assert_audit_verifies, claims,
    helpdesk_policy, jwks, text_of,
};

#[test]
fn unknown_kids_cause_at_most_one_jwks_fetch_and_rotated_keys_arrive() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let ec = Signer::p256("ec-1");
    let ed = Signer::ed25519("ed-1");
    let issuer = JwksServer::start(&jwks(&[&rsa, &ec, &ed]));
    let server = HttpServer::start(
        &scratch,
        Keys::Url(issuer.url()),
        &["--algorithm", "RS256", "--algorithm", "ES256"],
    );
    assert_eq!(issuer.fetches(), 1, "the JWKS is fetched once at start");
    let resource = server.resource();
    let good = claims(&resource, "user-alice", "tickets:read");
    let ask = |token: &str| server.call(token, "get_ticket", json!({"id": "T-1001"}));

    let ok = ask(&rsa.sign(&good));
    let result = ok.result("RS256 token, keys from the URL");
    assert!(text_of(&result).contains("Login loop"), "{result}");
    assert_eq!(issuer.fetches(), 1, "a known kid fetches nothing");

    // EdDSA is not among the pinned algorithms, though its key is in the set.
    let eddsa = ask(&ed.sign(&good));
    eprintln!("EdDSA, not pinned            -> {}", eddsa.summary());
    assert_eq!(eddsa.status, 401, "{}", eddsa.summary());
    assert_eq!(issuer.fetches(), 1);

    // The issuer rotates a key in: ec-2 is published before any token uses it.
    let rotated = Signer::p256("ec-2");
    issuer.set(&jwks(&[&rsa, &ec, &rotated]));

    // A burst of tokens with kids nobody published, sent at once.
    let attacker = Signer::p256("attacker");
    let tokens: Vec<String> = (0..20)
        .map(|i| {
            attacker.sign_with_header(
                &json!({"alg": "ES256", "kid": format!("unknown-{i}")}),
                &good,
            )
        })
        .collect();
    let url = server.url("/mcp");
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = tokens
            .iter()
            .map(|token| {
                let url = url.clone();
                scope.spawn(move || {
                    let http = super::Http::new();
                    let body = super::modern_request("tools/list", json!({}));
                    let auth = format!("Bearer {token}");
                    http.send(
                        "POST",
                        &url,
                        &[
                            ("MCP-Protocol-Version", super::MODERN),
                            ("Mcp-Method", "tools/list"),
                            ("Accept", "application/json, text/event-stream"),
                            ("Content-Type", "application/json"),
                            ("Authorization", &auth),
                        ],
                        body.to_string().into_bytes(),
                    )
                    .expect("unknown-kid request")
                    .status
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    });
    assert!(statuses.iter().all(|&s| s == 401), "{statuses:?}");
    eprintln!(
        "20 unknown kids at once      -> all 401, JWKS fetches {} (1 at start)",
        issuer.fetches()
    );
    assert_eq!(
        issuer.fetches(),
        2,
        "a burst of unknown kids causes exactly one extra fetch"
    );

    // That one fetch brought the rotated key.
    let rotated_ok = ask(&rotated.sign(&good));
    eprintln!("rotated kid ec-2             -> {}", rotated_ok.summary());
    rotated_ok.result("token under the rotated key");
    assert_eq!(issuer.fetches(), 2);

    // A key published after that refresh is not fetched until the interval has passed.
    let later = Signer::p256("ec-3");
    issuer.set(&jwks(&[&rsa, &ec, &rotated, &later]));
    let too_soon = ask(&later.sign(&good));
    eprintln!("kid ec-3 right after refresh -> {}", too_soon.summary());
    assert_eq!(too_soon.status, 401, "{}", too_soon.summary());
    assert_eq!(issuer.fetches(), 2, "the forced refresh is rate limited");

    // The token's own key location is never fetched; the configured URL stays the only source.
    let canary = Canary::start();
    let jku = attacker.sign_with_header(
        &json!({"alg": "ES256", "kid": "attacker", "jku": format!("http://127.0.0.1:{}/jwks.json", canary.port)}),
        &good,
    );
    let refused = ask(&jku);
    eprintln!("jku at a local listener      -> {}", refused.summary());
    assert_eq!(refused.status, 401, "{}", refused.summary());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        canary.connections(),
        0,
        "the server fetched the token's jku"
    );
    assert_eq!(issuer.fetches(), 2);

    server.stop();
    assert_audit_verifies(&scratch);
}

//! The bearer token checks, case by case, against one server whose keys (RS256, ES256 and EdDSA)
//! are in a JWKS file: the seed's "no token" and "wrong aud" rows and every other way a token can
//! be wrong, forged or smuggled, including signed tokens whose JSON has more than one reading. Every refused token gets the same 401, byte for byte: error
//! bodies say nothing that helps an attacker tell which check failed.

use rsa::pkcs1::EncodeRsaPublicKey as _;
use rsa::pkcs8::{EncodePublicKey as _, LineEnding};
use serde_json::{Value, json};

use super::{
    Canary, HttpServer, ISSUER, Keys, Reply, Scratch, Signer, assert_audit_verifies, b64, claims,
    helpdesk_policy, is_error, records_of, rsa_key, text_of, unix_now,
};

/// A token that must be accepted.
struct Case {
    name: &'static str,
    token: String,
}

/// A token that must be refused, and the reason the server must log for it (clients are told
/// nothing of it): proof that the row tests the check it is named after.
struct Refused {
    name: &'static str,
    why: &'static str,
    token: String,
}

/// The reasons of every "bearer token refused" line of the server's log, in order.
fn logged_refusals(server: &HttpServer) -> Vec<String> {
    std::fs::read_to_string(&server.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["message"] == "bearer token refused")
        .map(|line| {
            line["fields"]["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Each of `refused` gets 401 `invalid_token`, the same challenge and body as every other, and
/// the server logs the reason the row names (so the row tests the check it is named after).
fn assert_refused_alike(
    server: &HttpServer,
    ask: &dyn Fn(Option<&str>) -> Reply,
    refused: &[Refused],
) {
    let mut first: Option<Reply> = None;
    for case in refused {
        let before = logged_refusals(server).len();
        let reply = ask(Some(&case.token));
        eprintln!("{:<40} -> {}", case.name, reply.summary());
        assert_eq!(reply.status, 401, "{}: {}", case.name, reply.summary());
        let logged = logged_refusals(server);
        assert_eq!(
            logged[before..],
            [case.why.to_owned()],
            "{}: the server's log gives another reason\n{}",
            case.name,
            server.log_text()
        );
        assert!(
            reply
                .challenge()
                .starts_with("Bearer error=\"invalid_token\", resource_metadata=\""),
            "{}: {}",
            case.name,
            reply.summary()
        );
        assert_eq!(
            reply.json(),
            json!({"error": "invalid_token"}),
            "{}",
            case.name
        );
        match &first {
            None => first = Some(reply),
            Some(first) => {
                // Which check failed is for the server's log only.
                assert_eq!(
                    (reply.challenge(), reply.body.as_str()),
                    (first.challenge(), first.body.as_str()),
                    "{}: the 401 differs from the first refused token's",
                    case.name
                );
            }
        }
    }
}

/// A token with `header` and `claims` signed by HMAC-SHA256 under `secret`.
fn hs256(secret: &[u8], header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let key = jsonwebtoken::EncodingKey::from_secret(secret).expect("HMAC key");
    let signature =
        jsonwebtoken::crypto::sign(input.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
            .expect("HMAC");
    format!("{input}.{signature}")
}

/// An unsigned token (`alg` as given, empty signature).
fn unsigned(alg: &str, claims: &Value) -> String {
    let header = json!({"alg": alg, "typ": "JWT"});
    format!(
        "{}.{}.",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn without(mut claims: Value, key: &str) -> Value {
    claims.as_object_mut().expect("claims object").remove(key);
    claims
}

#[test]
fn every_bad_token_gets_the_same_401_and_good_ones_of_each_algorithm_work() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let ec = Signer::p256("ec-1");
    let ed = Signer::ed25519("ed-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa, &ec, &ed]), &[]);
    let resource = server.resource();
    let metadata_url = server.url("/.well-known/oauth-protected-resource/mcp");
    let good = claims(&resource, "user-alice", "tickets:read");
    let ask = |token: Option<&str>| server.call_opt(token, "get_ticket", json!({"id": "T-1001"}));

    // --- no token (seed: "No Authorization header") -------------------------------------------
    let none = ask(None);
    eprintln!("no token            -> {}", none.summary());
    assert_eq!(none.status, 401, "{}", none.summary());
    assert_eq!(
        none.challenge(),
        format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"tickets:read\""),
        "no token: the challenge names the metadata and the scope this call needs"
    );
    // A listing needs no particular scope: the hint is every scope the policy names.
    let list = server.rpc(None, "tools/list", json!({}));
    assert_eq!(list.status, 401, "{}", list.summary());
    assert!(
        list.challenge()
            .ends_with("scope=\"tickets:read tickets:write\""),
        "{}",
        list.summary()
    );
    // Other schemes are no bearer token.
    let basic = server.rpc_with(
        None,
        "tools/list",
        json!({}),
        &[("Authorization", "Basic dXNlcjpwdw==")],
    );
    assert_eq!((basic.status, basic.challenge()), (401, list.challenge()));

    // --- the metadata document the challenge points at (RFC 9728) -------------------------------
    let doc = server.request(
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        &[],
        Vec::new(),
    );
    assert_eq!(doc.status, 200, "{}", doc.summary());
    let meta = doc.json();
    assert_eq!(meta["resource"], resource.as_str(), "{meta}");
    assert_eq!(meta["authorization_servers"], json!([ISSUER]), "{meta}");
    assert_eq!(
        meta["scopes_supported"],
        json!(["tickets:read", "tickets:write"]),
        "{meta}"
    );
    assert_eq!(
        meta["bearer_methods_supported"],
        json!(["header"]),
        "{meta}"
    );
    let root = server.request(
        "GET",
        "/.well-known/oauth-protected-resource",
        &[],
        Vec::new(),
    );
    assert_eq!(root.status, 200, "{}", root.summary());
    assert_eq!(
        root.json(),
        meta,
        "the root well-known URI serves the same document"
    );

    // --- accepted: one per algorithm, and the leeway ------------------------------------------
    let now = unix_now();
    let accepted = [
        Case {
            name: "RS256",
            token: rsa.sign(&good),
        },
        Case {
            name: "ES256",
            token: ec.sign(&good),
        },
        Case {
            name: "EdDSA",
            token: ed.sign(&good),
        },
        Case {
            name: "no kid (every key of the type is tried)",
            token: rsa.sign_with_header(&json!({"alg": "RS256", "typ": "at+jwt"}), &good),
        },
        Case {
            name: "expired 10 s ago (inside the 30 s leeway)",
            token: rsa.sign(&with(good.clone(), "exp", json!(now - 10))),
        },
        Case {
            name: "aud is a list naming this resource",
            token: rsa.sign(&with(
                good.clone(),
                "aud",
                json!(["https://other-api.example.com", resource]),
            )),
        },
    ];
    for case in &accepted {
        let reply = ask(Some(&case.token));
        eprintln!("{:<40} -> {}", case.name, reply.summary());
        let result = reply.result(case.name);
        assert!(!is_error(&result), "{}: {result}", case.name);
        assert!(
            text_of(&result).contains("Login loop"),
            "{}: {result}",
            case.name
        );
    }

    // --- refused ---------------------------------------------------------------------------------
    let attacker = Signer::p256("attacker");
    let canary = Canary::start();
    let canary_url = format!("http://127.0.0.1:{}/jwks.json", canary.port);
    let public = rsa_key().to_public_key();
    let spki_pem = public.to_public_key_pem(LineEnding::LF).expect("SPKI PEM");
    let pkcs1_pem = public.to_pkcs1_pem(LineEnding::LF).expect("PKCS#1 PEM");
    let spki_der = public.to_public_key_der().expect("SPKI DER");
    let pkcs1_der = public.to_pkcs1_der().expect("PKCS#1 DER");
    let hs_header = json!({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"});
    let mut tampered: Vec<String> = rsa.sign(&good).split('.').map(str::to_owned).collect();
    tampered[1] = b64(with(good.clone(), "sub", json!("user-bob"))
        .to_string()
        .as_bytes());
    let refused = [
        Refused {
            name: "an ID token (typ id_token+jwt), not an access token",
            why: "not an access token (typ)",
            token: rsa.sign_with_header(
                &json!({"alg": "RS256", "typ": "id_token+jwt", "kid": "rsa-1"}),
                &good,
            ),
        },
        Refused {
            name: "wrong audience (seed: another API's token)",
            why: "wrong audience",
            token: rsa.sign(&with(
                good.clone(),
                "aud",
                json!("https://other-api.example.com"),
            )),
        },
        Refused {
            name: "audience is the origin only",
            why: "wrong audience",
            token: rsa.sign(&with(good.clone(), "aud", json!(server.url("")))),
        },
        Refused {
            name: "no audience",
            why: "missing or malformed claims",
            token: rsa.sign(&without(good.clone(), "aud")),
        },
        Refused {
            name: "expired 60 s ago (beyond the leeway)",
            why: "expired",
            token: rsa.sign(&with(good.clone(), "exp", json!(now - 60))),
        },
        Refused {
            name: "nbf 120 s in the future",
            why: "not yet valid",
            token: rsa.sign(&with(good.clone(), "nbf", json!(now + 120))),
        },
        Refused {
            name: "no exp",
            why: "missing or malformed claims",
            token: rsa.sign(&without(good.clone(), "exp")),
        },
        Refused {
            name: "wrong issuer",
            why: "wrong issuer",
            token: rsa.sign(&with(
                good.clone(),
                "iss",
                json!("https://evil.example.test/"),
            )),
        },
        Refused {
            name: "issuer without its trailing slash",
            why: "wrong issuer",
            token: rsa.sign(&with(
                good.clone(),
                "iss",
                json!(ISSUER.trim_end_matches('/')),
            )),
        },
        Refused {
            name: "no sub",
            why: "missing or malformed claims",
            token: rsa.sign(&without(good.clone(), "sub")),
        },
        Refused {
            name: "empty sub",
            why: "missing or malformed claims",
            token: rsa.sign(&with(good.clone(), "sub", json!(""))),
        },
        Refused {
            name: "alg none",
            why: "malformed",
            token: unsigned("none", &good),
        },
        Refused {
            name: "alg NONE",
            why: "malformed",
            token: unsigned("NONE", &good),
        },
        Refused {
            name: "HS256 keyed with the public key (SPKI PEM)",
            why: "algorithm not accepted",
            token: hs256(spki_pem.as_bytes(), &hs_header, &good),
        },
        Refused {
            name: "HS256 keyed with the public key (PKCS#1 PEM)",
            why: "algorithm not accepted",
            token: hs256(pkcs1_pem.as_bytes(), &hs_header, &good),
        },
        Refused {
            name: "HS256 keyed with the public key (SPKI DER)",
            why: "algorithm not accepted",
            token: hs256(spki_der.as_bytes(), &hs_header, &good),
        },
        Refused {
            name: "HS256 keyed with the public key (PKCS#1 DER)",
            why: "algorithm not accepted",
            token: hs256(pkcs1_der.as_bytes(), &hs_header, &good),
        },
        Refused {
            name: "HS256 keyed with the public key, no kid",
            why: "algorithm not accepted",
            token: hs256(pkcs1_der.as_bytes(), &json!({"alg": "HS256"}), &good),
        },
        Refused {
            name: "PS256 with the right key (algorithm not pinned)",
            why: "algorithm not accepted",
            token: {
                let header = json!({"alg": "PS256", "kid": "rsa-1"});
                let mut ps = rsa.clone();
                ps.alg = jsonwebtoken::Algorithm::PS256;
                ps.sign_with_header(&header, &good)
            },
        },
        Refused {
            name: "unknown kid",
            why: "no configured key fits",
            token: rsa.sign_with_header(&json!({"alg": "RS256", "kid": "rsa-9"}), &good),
        },
        Refused {
            name: "RS256 under the EC key's kid",
            why: "no configured key fits",
            token: rsa.sign_with_header(&json!({"alg": "RS256", "kid": "ec-1"}), &good),
        },
        Refused {
            name: "attacker's key under the real kid",
            why: "bad signature",
            token: attacker.sign_with_header(&json!({"alg": "ES256", "kid": "ec-1"}), &good),
        },
        Refused {
            name: "payload changed after signing (sub)",
            why: "bad signature",
            token: tampered.join("."),
        },
        Refused {
            name: "jku at a local listener (attacker's key)",
            why: "no configured key fits",
            token: attacker.sign_with_header(
                &json!({"alg": "ES256", "kid": "attacker", "jku": canary_url}),
                &good,
            ),
        },
        Refused {
            name: "x5u at a local listener (attacker's key)",
            why: "bad signature",
            token: attacker.sign_with_header(&json!({"alg": "ES256", "x5u": canary_url}), &good),
        },
        Refused {
            name: "embedded jwk (attacker's key)",
            why: "bad signature",
            token: attacker.sign_with_header(&json!({"alg": "ES256", "jwk": attacker.jwk}), &good),
        },
        Refused {
            name: "embedded jwk under the real kid",
            why: "bad signature",
            token: attacker.sign_with_header(
                &json!({"alg": "ES256", "kid": "ec-1", "jwk": attacker.jwk}),
                &good,
            ),
        },
        Refused {
            name: "not a JWT",
            why: "malformed",
            token: "abc.def.ghi".to_owned(),
        },
    ];
    assert_refused_alike(&server, &ask, &refused);
    assert_eq!(
        canary.connections(),
        0,
        "a jku/x5u header made the server connect to the URL it names"
    );

    // --- the token in the query string (OAuth 2.1 §5.1.1) ---------------------------------------
    let token = rsa.sign(&good);
    let body = super::modern_request(
        "tools/call",
        json!({"name": "get_ticket", "arguments": {"id": "T-1001"}}),
    );
    let query = server.request(
        "POST",
        &format!("/mcp?access_token={token}"),
        &[
            ("MCP-Protocol-Version", super::MODERN),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "get_ticket"),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
        ],
        body.to_string().into_bytes(),
    );
    eprintln!("token in the query          -> {}", query.summary());
    assert_eq!(query.status, 400, "{}", query.summary());
    assert!(
        query.challenge().contains("invalid_request"),
        "{}",
        query.summary()
    );
    // Not even together with a good header: the URL has already leaked it.
    let both = server.request(
        "POST",
        &format!("/mcp?x=1&access_token={token}"),
        &[
            ("MCP-Protocol-Version", super::MODERN),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "get_ticket"),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
            ("Authorization", &format!("Bearer {token}")),
        ],
        body.to_string().into_bytes(),
    );
    assert_eq!(both.status, 400, "{}", both.summary());

    // Only the accepted tokens reached the gate: one record each, nothing for the refusals.
    let records = records_of(&scratch, "get_ticket");
    assert_eq!(records.len(), accepted.len(), "{records:#?}");
    for record in &records {
        assert_eq!(record["principal"], "user-alice", "{record}");
        assert_eq!(record["client_id"], "test-client", "{record}");
    }
    server.stop();
    assert_audit_verifies(&scratch);
}

/// Signed tokens that are still no credential: too long, minted in the future, or with a JOSE
/// header or claims that JSON parsers could read in more than one way (a member twice, bytes that
/// are not UTF-8, bytes after the object), also in members toolgate never reads. Each gets the
/// same 401 as every other bad token.
#[test]
fn tokens_that_are_too_long_from_the_future_or_of_more_than_one_reading_get_the_same_401() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let good = claims(&server.resource(), "user-alice", "tickets:read");
    let ask = |token: Option<&str>| server.call_opt(token, "get_ticket", json!({"id": "T-1001"}));
    let now = unix_now();

    let soon = rsa.sign(&with(good.clone(), "iat", json!(now + 10)));
    let reply = ask(Some(&soon));
    eprintln!(
        "{:<40} -> {}",
        "issued 10 s from now (leeway)",
        reply.summary()
    );
    assert!(!is_error(&reply.result("iat inside the leeway")));

    // Header and claims as raw JSON text, for the cases no JSON serializer would write.
    let header_text = rsa.header().to_string();
    let claims_text = good.to_string();
    let claims_plus = |more: &[u8]| {
        let mut raw = claims_text.as_bytes()[..claims_text.len() - 1].to_vec();
        raw.push(b',');
        raw.extend_from_slice(more);
        raw.push(b'}');
        raw
    };
    let refused = [
        Refused {
            name: "longer than 8 KiB (a claim padded)",
            why: "longer than 8 KiB",
            token: rsa.sign(&with(good.clone(), "pad", json!("x".repeat(8 * 1024)))),
        },
        Refused {
            name: "issued 120 s from now (beyond the leeway)",
            why: "issued in the future",
            token: rsa.sign(&with(good.clone(), "iat", json!(now + 120))),
        },
        Refused {
            name: "a member twice in the JOSE header",
            why: "malformed",
            token: rsa.sign_raw(
                br#"{"alg":"RS256","typ":"at+jwt","kid":"rsa-1","x-note":"a","x-note":"b"}"#,
                claims_text.as_bytes(),
            ),
        },
        Refused {
            name: "a member twice in the claims (jti, never read)",
            why: "malformed",
            token: rsa.sign_raw(header_text.as_bytes(), &claims_plus(br#""jti":"again""#)),
        },
        Refused {
            name: "sub twice in the claims",
            why: "malformed",
            token: rsa.sign_raw(header_text.as_bytes(), &claims_plus(br#""sub":"user-bob""#)),
        },
        Refused {
            name: "claims not UTF-8 (in a member never read)",
            why: "malformed",
            token: rsa.sign_raw(header_text.as_bytes(), &claims_plus(b"\"note\":\"\xff\"")),
        },
        Refused {
            name: "bytes after the claims",
            why: "malformed",
            token: rsa.sign_raw(header_text.as_bytes(), format!("{claims_text}x").as_bytes()),
        },
    ];
    assert_refused_alike(&server, &ask, &refused);
    // The same 401 as a token that is merely expired.
    let expired = ask(Some(&rsa.sign(&with(good.clone(), "exp", json!(now - 60)))));
    let first = ask(Some(&refused[0].token));
    assert_eq!(
        (expired.challenge(), expired.body.as_str()),
        (first.challenge(), first.body.as_str())
    );
    let records = records_of(&scratch, "get_ticket");
    assert_eq!(
        records.len(),
        1,
        "only the good token reached the gate: {records:#?}"
    );
    server.stop();
    assert_audit_verifies(&scratch);
}

/// `--resource` names the canonical URI a front proxy serves (another host and path): tokens must
/// name it, not the address toolgate listens on, and the metadata and challenges point at it.
#[test]
fn a_resource_behind_a_front_proxy_is_the_audience_and_the_metadata() {
    const RESOURCE: &str = "https://mcp.example.test/tools/mcp";
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &["--resource", RESOURCE]);
    let metadata_url = "https://mcp.example.test/.well-known/oauth-protected-resource/tools/mcp";
    let get = json!({"id": "T-1001"});

    let proxied = rsa.sign(&claims(RESOURCE, "user-alice", "tickets:read"));
    let reply = server.rpc_with(
        Some(&proxied),
        "tools/call",
        json!({"name": "get_ticket", "arguments": get}),
        &[("Host", "mcp.example.test")],
    );
    eprintln!(
        "{:<40} -> {}",
        "aud = --resource, Host of the proxy",
        reply.summary()
    );
    assert!(!is_error(&reply.result("token for --resource")));

    // A token for the address toolgate happens to listen on is for another resource.
    let local = rsa.sign(&claims(&server.resource(), "user-alice", "tickets:read"));
    let reply = server.call(&local, "get_ticket", get.clone());
    eprintln!(
        "{:<40} -> {}",
        "aud = the listening address",
        reply.summary()
    );
    assert_eq!(reply.status, 401, "{}", reply.summary());
    assert!(
        reply
            .challenge()
            .contains(&format!("resource_metadata=\"{metadata_url}\"")),
        "{}",
        reply.summary()
    );

    let doc = server.request(
        "GET",
        "/.well-known/oauth-protected-resource/tools/mcp",
        &[],
        Vec::new(),
    );
    assert_eq!(doc.status, 200, "{}", doc.summary());
    assert_eq!(doc.json()["resource"], RESOURCE);
    let root = server.request(
        "GET",
        "/.well-known/oauth-protected-resource",
        &[],
        Vec::new(),
    );
    assert_eq!(root.json(), doc.json());
    server.stop();
    assert_audit_verifies(&scratch);
}

//! `fetch_doc` over HTTP: SSRF attempts through a token-holding caller. Loopback, the cloud
//! metadata address and friends are put on the allow-list on purpose (`--docs-host`, on port 443
//! and on the listener's port), so that what refuses them is the address check, not the list; a TCP listener on 127.0.0.1:PORT (and [::1]:PORT
//! where the machine has IPv6) must see no connection at all.

use std::net::{Ipv6Addr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use super::{
    Canary, HttpServer, Keys, Scratch, Signer, assert_audit_verifies, claims, is_error, records_of,
    text_of,
};

/// `fetch_doc` at tier low, scope `docs:read`, its text untrusted; nothing else exists.
const DOCS_POLICY: &str = r#"version = 2
name = "docs-http-test"

[defaults]
tier = "blocked"

[tools.fetch_doc]
tier = "low"
scope = "docs:read"
output = "untrusted"
"#;

/// Counts connections to [::1]:`port`, if this machine can listen there.
fn ipv6_canary(port: u16) -> Option<Arc<AtomicUsize>> {
    let listener = TcpListener::bind((Ipv6Addr::LOCALHOST, port)).ok()?;
    listener.set_nonblocking(true).ok()?;
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    std::thread::spawn(move || {
        // Lives as long as the test binary; it only ever counts.
        loop {
            if listener.accept().is_ok() {
                count.fetch_add(1, Ordering::SeqCst);
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    Some(seen)
}

#[test]
fn fetch_doc_refuses_every_ssrf_target_without_connecting() {
    let scratch = Scratch::with_policy_text("docs", DOCS_POLICY);
    let rsa = Signer::rsa("rsa-1");
    let canary = Canary::start();
    let v6 = ipv6_canary(canary.port);
    // On the canary's port too: fetch_doc reaches port 443 only, unless an entry names another.
    let port = canary.port;
    let mut flags = Vec::new();
    for host in [
        "127.0.0.1",
        "localhost",
        "::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "169.254.169.254",
    ] {
        let on_port = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        flags.extend(["--docs-host".to_owned(), host.to_owned()]);
        flags.extend(["--docs-host".to_owned(), on_port]);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &flags);
    let resource = server.resource();
    let token = rsa.sign(&claims(&resource, "user-alice", "docs:read"));

    // Without the scope the tool is not even listed, and a call gets the step-up challenge.
    let other = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let reply = server.call(
        &other,
        "fetch_doc",
        json!({"url": "https://docs.python.org/3/"}),
    );
    assert_eq!(reply.status, 403, "{}", reply.summary());
    assert!(
        reply.challenge().contains("scope=\"docs:read\""),
        "{}",
        reply.summary()
    );

    let targets = [
        ("loopback literal", format!("https://127.0.0.1:{port}/")),
        ("localhost", format!("https://localhost:{port}/")),
        ("plain http", format!("http://127.0.0.1:{port}/")),
        ("user info", format!("https://user:pw@127.0.0.1:{port}/")),
        (
            "user info that looks like a host",
            format!("https://docs.python.org@127.0.0.1:{port}/"),
        ),
        ("decimal IPv4", format!("https://2130706433:{port}/")),
        ("hex IPv4", format!("https://0x7f000001:{port}/")),
        ("octal IPv4", format!("https://0177.0.0.1:{port}/")),
        ("short IPv4", format!("https://127.1:{port}/")),
        (
            "IPv4-mapped IPv6",
            format!("https://[::ffff:127.0.0.1]:{port}/"),
        ),
        ("IPv6 loopback", format!("https://[::1]:{port}/")),
        ("unspecified 0.0.0.0", format!("https://0.0.0.0:{port}/")),
        (
            "cloud metadata",
            "https://169.254.169.254/latest/meta-data".to_owned(),
        ),
        ("file scheme", "file:///etc/passwd".to_owned()),
        ("host not on the list", format!("https://127.0.0.2:{port}/")),
    ];
    for (name, url) in &targets {
        let reply = server.call(&token, "fetch_doc", json!({"url": url, "max_chars": 500}));
        let result = reply.result(name);
        let text = text_of(&result);
        let reason = text
            .lines()
            .find(|l| l.contains("refused"))
            .unwrap_or(&text)
            .to_owned();
        eprintln!(
            "{name:<34} {url:<46} -> isError {} {reason}",
            result["isError"]
        );
        assert!(is_error(&result), "{name}: {url} was not refused: {result}");
        assert!(text.contains("refused"), "{name}: {text}");
        assert!(
            !text.contains("is not allow-listed for"),
            "{name}: refused for its port, not by the check this row is about: {text}"
        );
    }
    assert_eq!(
        canary.connections(),
        0,
        "fetch_doc connected to 127.0.0.1:{port}"
    );
    if let Some(v6) = &v6 {
        assert_eq!(
            v6.load(Ordering::SeqCst),
            0,
            "fetch_doc connected to [::1]:{port}"
        );
    }

    // Each attempt is on the record under the caller's name, and nothing counted as done.
    let records = records_of(&scratch, "fetch_doc");
    assert_eq!(records.len(), targets.len() + 1, "{records:#?}");
    for record in &records {
        assert_eq!(record["principal"], "user-alice", "{record}");
        assert_ne!(record["outcome"], "committed", "{record}");
    }

    server.stop();
    assert_audit_verifies(&scratch);
}

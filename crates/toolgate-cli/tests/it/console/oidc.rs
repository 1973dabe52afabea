//! Signing in to the console with a real OpenID provider: `tests/oidc/provider.mjs` (the certified
//! `oidc-provider` package, pinned, on 127.0.0.1) with one client per defect the console must
//! refuse. The browser here is an HTTP client that keeps cookies and follows redirects one hop
//! at a time, so each hop (the callback URL above all) can be replayed.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::json;

use super::super::approvals::pending_id;
use super::super::http::{Http, Reply};
use super::super::{Scratch, policy_with};
use super::Console;

/// `node tests/oidc/provider.mjs` on a free port; killed when dropped.
struct Provider {
    child: Child,
    issuer: String,
}

impl Provider {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/oidc/provider.mjs");
        let mut child = Command::new("node")
            .arg(script)
            .env("PORT", port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node (scripts/install-peers installs the provider's packages)");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = lines
            .next()
            .expect("the provider exited before listening")
            .expect("read the provider");
        assert!(line.contains("listening"), "{line}");
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            issuer: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cookies as a browser keeps them for 127.0.0.1 (ports do not separate cookies): by name, with
/// their path.
#[derive(Default)]
struct Jar(HashMap<String, (String, String)>);

impl Jar {
    fn take(&mut self, reply: &Reply) {
        for value in reply.headers_named("set-cookie") {
            let mut parts = value.split(';');
            let Some((key, val)) = parts.next().and_then(|kv| kv.trim().split_once('=')) else {
                continue;
            };
            let mut path = "/".to_owned();
            let mut gone = val.is_empty();
            for attribute in parts {
                let attribute = attribute.trim();
                if let Some(p) = attribute
                    .strip_prefix("Path=")
                    .or(attribute.strip_prefix("path="))
                {
                    path = p.to_owned();
                }
                if attribute.eq_ignore_ascii_case("max-age=0") {
                    gone = true;
                }
            }
            if gone {
                self.0.remove(key);
            } else {
                self.0.insert(key.to_owned(), (val.to_owned(), path));
            }
        }
    }

    fn header(&self, url: &str) -> String {
        let path = url::Url::parse(url)
            .map(|u| u.path().to_owned())
            .unwrap_or_default();
        self.0
            .iter()
            .filter(|(_, (_, p))| path.starts_with(p.as_str()))
            .map(|(k, (v, _))| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// A browser made of an HTTP client and a cookie jar.
struct Agent {
    http: Http,
    jar: Jar,
}

impl Agent {
    fn new() -> Self {
        Self {
            http: Http::without_redirects(),
            jar: Jar::default(),
        }
    }

    fn get(&mut self, url: &str) -> Reply {
        let cookie = self.jar.header(url);
        let headers: Vec<(&str, &str)> = if cookie.is_empty() {
            Vec::new()
        } else {
            vec![("cookie", cookie.as_str())]
        };
        let reply = self
            .http
            .send("GET", url, &headers, Vec::new())
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        self.jar.take(&reply);
        reply
    }

    /// Follows redirects from `url` until a page; returns it with the console callback URL the
    /// provider sent the browser to, if it did.
    fn follow(&mut self, url: &str) -> (Reply, Option<String>) {
        let mut url = url.to_owned();
        let mut callback = None;
        for _ in 0..20 {
            let reply = self.get(&url);
            if !(300..400).contains(&reply.status) {
                return (reply, callback);
            }
            let location = reply.header("location").expect("a redirect's Location");
            url = url::Url::parse(&url)
                .and_then(|base| base.join(location))
                .expect("a Location URL")
                .into();
            if url.contains("/oidc/callback") {
                callback = Some(url.clone());
            }
        }
        panic!("more than 20 redirects from {url}");
    }

    /// Signs in at the console on `base` as `user` (the provider's `login_hint`).
    fn sign_in(&mut self, base: &str, user: &str) -> (Reply, Option<String>) {
        self.follow(&format!("{base}/oidc/start?login_hint={user}"))
    }
}

fn console(scratch: &Scratch, provider: &Provider, client: &str, extra: &[&str]) -> Console {
    let secret = scratch.path("client-secret");
    std::fs::write(&secret, "toolgate-secret\n").expect("secret file");
    let mut args = vec![
        "--oidc-issuer",
        &provider.issuer,
        "--oidc-client-id",
        client,
    ];
    let secret = secret.to_string_lossy().into_owned();
    if client != "toolgate-public" {
        args.extend(["--oidc-client-secret-file", &secret]);
    }
    args.extend_from_slice(extra);
    Console::start(scratch, &args)
}

#[test]
fn an_approver_signs_in_with_the_provider_and_defective_or_replayed_sign_ins_are_refused() {
    // refund may be approved by the provider's group `approvers` only.
    let mut text = policy_with(
        "orders.toml",
        &[("approval_wait", "\"1s\""), ("approval_ttl", "\"5m\"")],
    );
    text = text.replace(
        "[tools.refund]\n",
        "[tools.refund]\napprovers = [\"group:approvers\"]\n",
    );
    let scratch = Scratch::with_policy_text("orders", &text);
    let mut server = scratch.serve(&[]);
    let held = server.call("refund", json!({"order_id": "ord_1001", "amount": 49}));
    let approval = pending_id(&held);
    let provider = Provider::start();

    // Anyone the provider vouches for may sign in here; the policy decides who may decide.
    let open = console(&scratch, &provider, "toolgate", &[]);
    let mut alice = Agent::new();
    let (page, callback) = alice.sign_in(open.base(), "alice");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains("Signed in as <strong>user:alice</strong>"),
        "{}",
        page.body
    );
    assert!(page.body.contains(&approval));
    let callback = callback.expect("the provider sent the browser back");

    // The same callback again (with the state cookie it came with) is refused: a state works once.
    let mut replay = Agent::new();
    let state = url::Url::parse(&callback)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    replay
        .jar
        .0
        .insert("toolgate_console_oidc".to_owned(), (state, "/".to_owned()));
    let replayed = replay.get(&callback);
    assert_eq!(replayed.status, 401, "{}", replayed.body);
    assert!(replayed.body.contains("used already"), "{}", replayed.body);
    assert!(!replay.jar.has("toolgate_console"));
    // Without the cookie of the browser that started it: refused before the state is looked up.
    let mut stranger = Agent::new();
    let foreign = stranger.get(&callback);
    assert_eq!(foreign.status, 401);
    assert!(
        foreign.body.contains("not started in this browser"),
        "{}",
        foreign.body
    );

    // bob is signed in, but is not among the refund's approvers: the queue refuses his vote.
    let mut bob = Agent::new();
    let (page, _) = bob.sign_in(open.base(), "bob");
    assert!(page.body.contains("user:bob"), "{}", page.body);
    let refused = decide(&mut bob, open.base(), &approval);
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("may not decide"), "{}", refused.body);
    let approved = decide(&mut alice, open.base(), &approval);
    assert_eq!(approved.status, 200, "{}", approved.body);
    assert!(approved.body.contains("Approved"), "{}", approved.body);
    let row = scratch.cli(&["approvals", "show", &approval, "--json"]);
    let row: serde_json::Value = serde_json::from_slice(&row.stdout).unwrap();
    assert_eq!(
        (&row["status"], &row["decided_by"]),
        (&json!("approved"), &json!("user:alice"))
    );
    open.stop();

    // With --oidc-group, someone outside the group does not get in at all.
    let closed = console(
        &scratch,
        &provider,
        "toolgate",
        &["--oidc-group", "approvers"],
    );
    let mut bob = Agent::new();
    let (page, _) = bob.sign_in(closed.base(), "bob");
    assert_eq!(page.status, 403, "{}", page.body);
    assert!(
        page.body.contains("user:bob is not in a group allowed"),
        "{}",
        page.body
    );
    assert!(!bob.jar.has("toolgate_console"));
    let mut alice = Agent::new();
    assert_eq!(alice.sign_in(closed.base(), "alice").0.status, 200);
    closed.stop();

    // A public client (PKCE, no secret) signs in the same way.
    let public = console(&scratch, &provider, "toolgate-public", &[]);
    let mut alice = Agent::new();
    let (page, _) = alice.sign_in(public.base(), "alice");
    assert_eq!(page.status, 200, "{}", page.body);
    public.stop();

    // An ID token with exactly one defect each: refused, and no session.
    for (client, says) in [
        ("toolgate-wrong-aud", "wrong audience"),
        ("toolgate-expired", "expired"),
        ("toolgate-wrong-iss", "wrong issuer"),
        ("toolgate-wrong-nonce", "nonce"),
        ("toolgate-bad-sig", "bad signature"),
    ] {
        let defective = console(&scratch, &provider, client, &[]);
        let mut alice = Agent::new();
        let (page, _) = alice.sign_in(defective.base(), "alice");
        assert_eq!(page.status, 401, "{client}: {}", page.body);
        assert!(page.body.contains(says), "{client}: {}", page.body);
        assert!(!alice.jar.has("toolgate_console"), "{client}");
        let home = alice.get(&format!("{}/", defective.base()));
        assert_eq!(home.status, 303, "{client}: signed out");
        defective.stop();
    }
    server.close();
}

/// Approves `approval` as the signed-in agent, from the console's own page.
fn decide(agent: &mut Agent, base: &str, approval: &str) -> Reply {
    let url = format!("{base}/approvals/{approval}");
    let page = agent.get(&url);
    let csrf = Scratch::csrf_of(&page.body);
    let cookie = agent.jar.header(&url);
    agent
        .http
        .send(
            "POST",
            &url,
            &[
                ("cookie", &cookie),
                ("origin", base),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            format!("verdict=approve&reason=checked&csrf={csrf}").into_bytes(),
        )
        .expect("post the decision")
}

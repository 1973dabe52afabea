//! A fleet (issue 15): three `toolgate serve --http` replicas of the orders toolset on one
//! PostgreSQL store (`--store`), each with its own data directory, as three machines behind a load
//! balancer would run. What a caller relies on must hold whichever replica a call lands on:
//! keyed calls have one effect, one of several approvers wins, the kill switch stops every replica,
//! the medium budget is one budget, and a replica killed mid-call leaves its call in doubt, never
//! run again.
//!
//! The store is a fresh schema of the suite's PostgreSQL server (`TOOLGATE_TEST_POSTGRES`, by
//! default the local one that `scripts/start-postgres` starts).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Http, HttpServer, MODERN, Scratch, Signer, claims, is_error, modern_request, next_id};
use crate::{policy_with, repo_policy, toolgate};

const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The orders policy with `line` added to the rule of `tool` (a low-tier tool in orders.toml).
fn orders_with(tool: &str, line: &str) -> String {
    let text = repo_policy("orders.toml");
    let rule = format!("[tools.{tool}]\ntier = \"low\"");
    let changed = text.replacen(&rule, &format!("{rule}\n{line}"), 1);
    assert_ne!(
        changed, text,
        "orders.toml no longer has {tool} as the test expects"
    );
    changed
}

/// The orders policy with `add_note` keyed by its whole arguments: the same note twice is one
/// effect.
fn keyed_notes_policy() -> String {
    orders_with("add_note", "idempotency_key = \"*\"")
}

/// A URL of the suite's PostgreSQL server whose connections see only a new, empty schema.
fn fresh_store() -> String {
    // A test binary is its own program: where its database is comes from its environment.
    #[allow(clippy::disallowed_methods)]
    let base =
        std::env::var("TOOLGATE_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_POSTGRES.to_owned());
    let schema = format!("tg_fleet_{}_{}", std::process::id(), next_id());
    let out = Command::new("psql")
        .arg(&base)
        .args(["-qAtc", &format!("CREATE SCHEMA {schema}")])
        .output()
        .expect("psql (scripts/start-postgres installs PostgreSQL)");
    assert!(
        out.status.success(),
        "the fleet tests need PostgreSQL at {base}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let separator = if base.contains('?') { '&' } else { '?' };
    format!("{base}{separator}options=-c%20search_path%3D{schema}")
}

struct Fleet {
    store: String,
    scratches: Vec<Scratch>,
    servers: Vec<HttpServer>,
    signer: Signer,
}

impl Fleet {
    /// `n` replicas serving `policy` on one fresh store; `env(i)` is replica `i`'s extra
    /// environment.
    fn start(n: usize, policy: &str, env: impl Fn(usize) -> Vec<(&'static str, String)>) -> Self {
        Self::start_with(n, policy, env, &[])
    }

    /// [`Fleet::start`] with `args` added to every replica's command line.
    fn start_with(
        n: usize,
        policy: &str,
        env: impl Fn(usize) -> Vec<(&'static str, String)>,
        args: &[String],
    ) -> Self {
        let store = fresh_store();
        let signer = Signer::rsa("rsa-fleet");
        let scratches: Vec<Scratch> = (0..n)
            .map(|_| Scratch::with_policy_text("orders", policy))
            .collect();
        let servers = scratches
            .iter()
            .enumerate()
            .map(|(i, scratch)| {
                let file = scratch.path("jwks.json");
                std::fs::write(&file, super::jwks(&[&signer]).to_string()).expect("JWKS");
                let mut command = scratch.serve_command();
                command
                    .args(["--http", "127.0.0.1:0", "--issuer", super::ISSUER])
                    .arg("--jwks-file")
                    .arg(&file)
                    .args(["--store", &store])
                    .args(args);
                for (name, value) in env(i) {
                    command.env(name, value);
                }
                HttpServer::spawn(command, &scratch.path("server.log"))
            })
            .collect();
        Self {
            store,
            scratches,
            servers,
            signer,
        }
    }

    /// A token of `sub` for replica `i` (each replica is its own resource, by its own port).
    fn token(&self, i: usize, sub: &str) -> String {
        self.signer
            .sign(&claims(&self.servers[i].resource(), sub, "payments:write"))
    }

    /// A `tools/call` on replica `i` through the calling thread's own client.
    fn call(&self, http: &Http, i: usize, sub: &str, tool: &str, arguments: Value) -> Value {
        let reply = self.servers[i].rpc_via(
            http,
            Some(&self.token(i, sub)),
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
            &[],
        );
        serde_json::from_str(&reply.body)
            .unwrap_or_else(|_| panic!("replica {i}: not JSON: {}", reply.body))
    }

    /// `toolgate ARGS --store URL --data DIR` (a person's command at a terminal on any machine:
    /// the data directory is replica `i`'s, and only the store matters).
    fn cli(&self, i: usize, args: &[&str]) -> Output {
        toolgate()
            .args(args)
            .args(["--store", &self.store])
            .arg("--data")
            .arg(self.scratches[i].data())
            .output()
            .expect("run toolgate")
    }

    /// `toolgate ARGS --store URL`, for commands about the store alone (the audit ledger's).
    fn store_cli(&self, args: &[&str]) -> Output {
        toolgate()
            .args(args)
            .args(["--store", &self.store])
            .output()
            .expect("run toolgate")
    }

    /// Every record of the fleet's central audit ledger, in chain order.
    fn ledger_records(&self) -> Vec<Value> {
        let out = self.store_cli(&["audit", "export"]);
        assert!(out.status.success(), "audit export: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a record"))
            .collect()
    }

    /// The effects of `kind` every replica made, together.
    fn effects(&self, kind: &str) -> Vec<Value> {
        self.scratches
            .iter()
            .flat_map(Scratch::effects)
            .filter(|e| e["kind"] == kind)
            .collect()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn sixty_four_identical_keyed_calls_spread_over_three_replicas_have_one_effect() {
    let fleet = Fleet::start(3, &keyed_notes_policy(), |_| Vec::new());
    let note = json!({"order_id": "ord_1001", "note": "call the customer back"});
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..64)
            .map(|i| {
                let (fleet, note) = (&fleet, note.clone());
                scope.spawn(move || {
                    let http = Http::new();
                    fleet.call(&http, i % 3, "user-alice", "add_note", note)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("caller"))
            .collect()
    });
    for answer in &answers {
        assert!(
            answer.get("result").is_some() && !is_error(&answer["result"]),
            "every copy is answered with the one result: {answer}"
        );
    }
    let notes = fleet.effects("note");
    assert_eq!(notes.len(), 1, "one effect across the fleet: {notes:?}");
    let ids: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|a| a["result"]["structuredContent"]["note_id"].to_string())
        .collect();
    assert_eq!(ids.len(), 1, "every copy names the one note: {ids:?}");
}

#[test]
fn of_eight_approvers_on_the_shared_queue_one_wins_and_the_call_runs_once_on_any_replica() {
    let policy = policy_with(
        "orders.toml",
        &[("approval_wait", "\"1s\""), ("approval_ttl", "\"60s\"")],
    );
    let fleet = Fleet::start(3, &policy, |_| Vec::new());
    let http = Http::new();
    let large = json!({"order_id": "ord_1001", "amount": 30});
    let held = fleet.call(&http, 0, "user-alice", "refund", large.clone());
    let content = &held["result"]["structuredContent"];
    assert_eq!(content["status"], "pending_approval", "{held}");
    let id = content["approval_id"]
        .as_str()
        .expect("approval id")
        .to_owned();

    // Eight people, each at a terminal beside a different replica, approve at once.
    let outcomes: Vec<Output> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (fleet, id) = (&fleet, id.clone());
                scope.spawn(move || {
                    fleet.cli(
                        i % 3,
                        &["approvals", "approve", &id, "--as", &format!("human:p{i}")],
                    )
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("approver"))
            .collect()
    });
    let winners = outcomes.iter().filter(|o| o.status.success()).count();
    assert_eq!(
        winners,
        1,
        "{:?}",
        outcomes.iter().map(stderr).collect::<Vec<_>>()
    );
    for lost in outcomes.iter().filter(|o| !o.status.success()) {
        assert_eq!(lost.status.code(), Some(1), "{}", stderr(lost));
        assert!(
            stderr(lost).contains("already approved"),
            "a loser is told who won: {}",
            stderr(lost)
        );
    }

    // Alice calls again on another replica: it runs, once; a third replica replays it.
    let ran = fleet.call(&http, 2, "user-alice", "refund", large.clone());
    assert_eq!(
        ran["result"]["structuredContent"]["status"], "refunded",
        "{ran}"
    );
    let again = fleet.call(&http, 1, "user-alice", "refund", large);
    assert_eq!(
        again["result"]["structuredContent"]["refund_id"],
        ran["result"]["structuredContent"]["refund_id"],
        "{again}"
    );
    assert_eq!(fleet.effects("refund").len(), 1);
}

#[test]
fn the_kill_switch_set_through_one_command_stops_every_replica_within_a_second() {
    let fleet = Fleet::start(3, &repo_policy("orders.toml"), |_| Vec::new());
    let http = Http::new();
    let lookup = json!({"order_id": "ord_1001"});
    for i in 0..3 {
        let answer = fleet.call(&http, i, "user-alice", "lookup_order", lookup.clone());
        assert!(!is_error(&answer["result"]), "replica {i}: {answer}");
    }
    let out = fleet.cli(0, &["killswitch", "on", "--as", "human:sre"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let set = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..3 {
        let answer = fleet.call(&http, i, "user-alice", "lookup_order", lookup.clone());
        assert!(
            answer.get("error").is_some() || is_error(&answer["result"]),
            "replica {i} still runs calls {:?} after the switch: {answer}",
            set.elapsed()
        );
    }
    // Into the one ledger: each replica's refusal, and each replica's record of the switch it saw.
    let records = fleet.ledger_records();
    let count = |decision: &str, outcome: &str| {
        records
            .iter()
            .filter(|r| {
                r["rule"] == "killswitch" && r["decision"] == decision && r["outcome"] == outcome
            })
            .count()
    };
    assert_eq!(
        (count("control", "switch_on"), count("deny", "not_executed")),
        (3, 3),
        "{records:#?}"
    );
    let out = fleet.cli(2, &["killswitch", "off", "--as", "human:sre"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::thread::sleep(Duration::from_secs(1));
    let answer = fleet.call(&http, 1, "user-alice", "lookup_order", lookup);
    assert!(!is_error(&answer["result"]), "{answer}");
}

#[test]
fn the_medium_budget_is_one_budget_across_replicas() {
    // Five unattended medium refunds per principal per hour; the rest need a person.
    let policy = policy_with(
        "orders.toml",
        &[("approval_wait", "\"1s\""), ("approval_ttl", "\"60s\"")],
    );
    let fleet = Fleet::start(3, &policy, |_| Vec::new());
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..9)
            .map(|i| {
                let fleet = &fleet;
                scope.spawn(move || {
                    let http = Http::new();
                    let refund = json!({"order_id": "ord_1001", "amount": 1 + i});
                    fleet.call(&http, i % 3, "user-alice", "refund", refund)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("caller"))
            .collect()
    });
    let statuses: Vec<&Value> = answers
        .iter()
        .map(|a| &a["result"]["structuredContent"]["status"])
        .collect();
    let refunded = statuses.iter().filter(|s| **s == "refunded").count();
    assert_eq!(refunded, 5, "{statuses:?}");
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == "pending_approval")
            .count(),
        4,
        "{statuses:?}"
    );
    assert_eq!(fleet.effects("refund").len(), 5);
}

#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the crash points: --features toolgate-cli/failpoints"
)]
fn a_replica_killed_mid_call_leaves_the_call_in_doubt_and_no_replica_runs_it_again() {
    let marker_dir = tempfile::tempdir().expect("temp dir");
    let marker = marker_dir.path().join("settle");
    let arm = format!("corridor.before_settle=return({})", marker.display());
    let mut fleet = Fleet::start(2, &keyed_notes_policy(), |i| {
        if i == 0 {
            vec![("FAILPOINTS", arm.clone())]
        } else {
            Vec::new()
        }
    });
    let note = json!({"order_id": "ord_1001", "note": "refund approved by phone"});
    // Replica 0 makes the effect and stops before it records the outcome; its caller waits on
    // a connection that the kill will break.
    let (url, token) = (fleet.servers[0].url("/mcp"), fleet.token(0, "user-alice"));
    let body = modern_request(
        "tools/call",
        json!({"name": "add_note", "arguments": note.clone()}),
    );
    let caller = std::thread::spawn(move || {
        let auth = format!("Bearer {token}");
        let headers = [
            ("MCP-Protocol-Version", MODERN),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "add_note"),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
            ("Authorization", auth.as_str()),
        ];
        Http::new()
            .send("POST", &url, &headers, body.to_string().into_bytes())
            .map(|reply| reply.status)
    });
    wait_for_file(&marker);
    fleet.servers[0].kill();
    assert!(
        caller.join().expect("caller").is_err(),
        "the killed replica answered"
    );
    assert_eq!(fleet.effects("note").len(), 1, "the effect was made");

    // The retry lands on replica 1: the key is in flight under a replica whose lease runs out,
    // so the call is answered in doubt, and not run again.
    let http = Http::new();
    let retried = fleet.call(&http, 1, "user-alice", "add_note", note.clone());
    assert!(is_error(&retried["result"]), "{retried}");
    let text = retried["result"].to_string();
    assert!(
        text.contains("never reported back") && text.contains("not sent again"),
        "the caller is told it is in doubt: {retried}"
    );
    assert_eq!(fleet.effects("note").len(), 1, "never run again");
    let out = fleet.cli(1, &["keys", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let keys: Value = serde_json::from_slice(&out.stdout).expect("keys list --json");
    assert_eq!(keys.as_array().map(Vec::len), Some(1), "{keys}");
    assert_eq!(keys[0]["tool"], "add_note", "{keys}");
}

fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "the crash point {} was not reached",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_rate_limit_is_one_bucket_across_replicas() {
    // Three lookups an hour per caller, whichever replica serves them.
    let limited = orders_with("lookup_order", "rate_limit = { burst = 3, every = \"1h\" }");
    let fleet = Fleet::start(3, &limited, |_| Vec::new());
    let http = Http::new();
    let lookup = json!({"order_id": "ord_1001"});
    let answers: Vec<Value> = (0..6)
        .map(|i| fleet.call(&http, i % 3, "user-alice", "lookup_order", lookup.clone()))
        .collect();
    let limited: Vec<bool> = answers.iter().map(|a| is_error(&a["result"])).collect();
    assert_eq!(
        limited,
        [false, false, false, true, true, true],
        "{answers:#?}"
    );
    assert_eq!(
        answers[3]["result"]["structuredContent"]["status"], "rate_limited",
        "{}",
        answers[3]
    );
    // Another caller has a bucket of its own.
    let bob = fleet.call(&http, 0, "user-bob", "lookup_order", lookup);
    assert!(!is_error(&bob["result"]), "{bob}");
}

/// An Ed25519 key pair as PEM files (`key.pem`, PKCS#8; `pub.pem`, SPKI) in `dir`, as `openssl
/// genpkey -algorithm ed25519` would write them.
fn ed25519_pem(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use base64::Engine as _;
    use ring::signature::KeyPair as _;
    let pem = |label: &str, der: &[u8]| {
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            base64::engine::general_purpose::STANDARD.encode(der)
        )
    };
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("a key");
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("the key");
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(pair.public_key().as_ref());
    let (key, public) = (dir.join("key.pem"), dir.join("pub.pem"));
    std::fs::write(&key, pem("PRIVATE KEY", pkcs8.as_ref())).expect("key.pem");
    std::fs::write(&public, pem("PUBLIC KEY", &spki)).expect("pub.pem");
    (key, public)
}

/// `toolgate audit verify FILE --json ARGS…`: its exit code and report.
fn verify(file: &Path, args: &[&str]) -> (Option<i32>, Value) {
    let out = toolgate()
        .args(["audit", "verify", "--json"])
        .arg(file)
        .args(args)
        .output()
        .expect("run toolgate audit verify");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("verify --json: {}", stderr(&out)));
    (out.status.code(), report)
}

#[test]
fn the_fleet_writes_one_signed_ledger_that_verifies_and_catches_truncation_and_rewrites() {
    let keys = tempfile::tempdir().expect("temp dir");
    let (key, public) = ed25519_pem(keys.path());
    let sink = keys.path().join("checkpoints.jsonl");
    let args: Vec<String> = [
        "--checkpoint-key",
        &key.display().to_string(),
        "--checkpoint-sink",
        &sink.display().to_string(),
        "--checkpoint-every",
        "5",
        "--checkpoint-interval",
        "1s",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let fleet = Fleet::start_with(3, &repo_policy("orders.toml"), |_| Vec::new(), &args);
    let http = Http::new();
    for i in 0..20 {
        let lookup = json!({"order_id": "ord_1001"});
        let answer = fleet.call(&http, i % 3, "user-alice", "lookup_order", lookup);
        assert!(!is_error(&answer["result"]), "{answer}");
    }
    // No replica's local file has the calls: they are in the one ledger.
    for scratch in &fleet.scratches {
        assert!(
            scratch
                .records()
                .iter()
                .all(|r| r["name"] != "lookup_order"),
            "a replica recorded locally"
        );
    }
    let ledger = keys.path().join("ledger.jsonl");
    let export = |file: &Path| {
        let out = fleet.store_cli(&["audit", "export", "--out", &file.display().to_string()]);
        assert!(out.status.success(), "export: {}", stderr(&out));
        std::fs::read_to_string(file).expect("the export")
    };
    // Wait for the checkpoint of the last record (signed within a second or two).
    let deadline = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let lines = export(&ledger).lines().count() as u64;
        let signed = std::fs::read_to_string(&sink)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|c| c["count"].as_u64())
            .max();
        if signed == Some(lines) {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint of the last record: {signed:?} of {lines}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(lines >= 20, "{lines}");
    let checkpoints = std::fs::read_to_string(&sink)
        .expect("sink")
        .lines()
        .count();
    assert!(checkpoints >= 2, "every 5 records or 1 s: {checkpoints}");
    let with_keys = [
        "--checkpoints",
        &sink.display().to_string(),
        "--key",
        &public.display().to_string(),
    ];

    let (code, report) = verify(&ledger, &with_keys);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["records"].as_u64(), Some(lines), "{report}");

    // The log cut short: still a chain, but the last checkpoint is not in it.
    let text = std::fs::read_to_string(&ledger).expect("export");
    let cut = keys.path().join("cut.jsonl");
    let kept: Vec<&str> = text
        .lines()
        .take(usize::try_from(lines).unwrap() - 3)
        .collect();
    std::fs::write(&cut, format!("{}\n", kept.join("\n"))).expect("cut");
    assert_eq!(verify(&cut, &[]).0, Some(0), "a prefix is a chain");
    let (code, report) = verify(&cut, &with_keys);
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report["broken"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("truncated"),
        "{report}"
    );

    // Retention: prune to the newest checkpoint (the last record's); the archive holds the
    // whole chain so far, and what is appended after verifies from that checkpoint.
    let archive = keys.path().join("archive.jsonl");
    let out = fleet.store_cli(&[
        "audit",
        "prune",
        "--before",
        "1ms",
        "--archive",
        &archive.display().to_string(),
    ]);
    assert!(out.status.success(), "prune: {}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&archive).expect("archive"), text);
    for i in 0..2 {
        let answer = fleet.call(
            &http,
            i,
            "user-alice",
            "lookup_order",
            json!({"order_id": "ord_1003"}),
        );
        assert!(!is_error(&answer["result"]), "{answer}");
    }
    let rest = keys.path().join("rest.jsonl");
    assert_eq!(export(&rest).lines().count(), 2);
    let (code, report) = verify(&rest, &with_keys);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(
        verify(&rest, &[]).0,
        Some(1),
        "without the checkpoints it does not start anywhere"
    );

    // A record rewritten in the database (an allow made a deny): found at its place.
    let more = fleet.call(
        &http,
        2,
        "user-alice",
        "lookup_order",
        json!({"order_id": "ord_1002"}),
    );
    assert!(!is_error(&more["result"]), "{more}");
    let schema_url = &fleet.store;
    let out = Command::new("psql")
        .arg(schema_url.split('?').next().unwrap_or(schema_url))
        .args(["-qAtc", &format!(
            "SET search_path TO {}; UPDATE audit_ledger SET line = replace(line, '\"decision\":\"allow\"', '\"decision\":\"deny\"') \
             WHERE seq = (SELECT max(seq) FROM audit_ledger)",
            schema_of(schema_url)
        )])
        .output()
        .expect("psql");
    assert!(out.status.success(), "{}", stderr(&out));
    let tampered = keys.path().join("tampered.jsonl");
    let rows = export(&tampered).lines().count() as u64;
    let (code, report) = verify(&tampered, &with_keys);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["broken"]["line"].as_u64(), Some(rows), "{report}");
}

/// The schema a [`fresh_store`] URL's connections use.
fn schema_of(url: &str) -> &str {
    url.rsplit("search_path%3D").next().unwrap_or_default()
}

//! An upstream reached over Streamable HTTP: `@modelcontextprotocol/server-everything` in its
//! `streamableHttp` mode on a free port of 127.0.0.1, behind `toolgate proxy --upstream NAME=URL`
//! or `--config FILE`. The gateway governs, audits and relays it as it does a child process:
//! tools are listed and refused by the policy, progress comes back under the caller's token, the
//! audit names the upstream, and prompts and resources pass only when the policy names them.
//!
//! The everything server listens on every interface (`*:PORT`, it has no host setting); the
//! gateway is only ever pointed at 127.0.0.1, and each test kills the server it started.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    Bench, Era, Proxy, assert_everything_progress, assert_ran, calls, error_code, gateway_policy,
    peer, testbed_bin, text, upstreams_of,
};

/// `mcp-server-everything streamableHttp` as a child process on its own port.
pub(super) struct Everything {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Everything {
    /// Started on a free port of 127.0.0.1 and accepting connections; its output goes to `log`.
    pub(super) fn start(log: &Path) -> Self {
        let port = free_port();
        let mut server = Self {
            child: Self::spawn(port, log),
            port,
            log: log.to_owned(),
        };
        server.wait_until_listening(Duration::from_secs(15));
        server
    }

    fn spawn(port: u16, log: &Path) -> Child {
        let bin = peer("node/node_modules/.bin/mcp-server-everything");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("everything log");
        let err = out.try_clone().expect("everything log");
        Command::new(bin)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn mcp-server-everything streamableHttp")
    }

    /// Killed and started again on the same port: a server that knows none of its sessions.
    fn restart(&mut self) {
        self.child.kill().expect("kill mcp-server-everything");
        let _ = self.child.wait();
        self.child = Self::spawn(self.port, &self.log);
        self.wait_until_listening(Duration::from_secs(15));
    }

    /// Polls the port until it accepts a connection; fails at once if the server exited (a port
    /// taken between our release and its bind, say).
    fn wait_until_listening(&mut self, limit: Duration) {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "mcp-server-everything exited before listening ({status})\n{}",
                    self.log_text()
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "mcp-server-everything did not listen on {addr} within {limit:?}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn log_text(&self) -> String {
        format!(
            "--- everything server output ({}) ---\n{}",
            self.log.display(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        )
    }

    /// Kills the server by its pid, after checking it was still serving (it did not crash
    /// somewhere in the test).
    pub(super) fn stop(mut self) {
        let status = self.child.try_wait().expect("try_wait");
        assert!(
            status.is_none(),
            "mcp-server-everything exited during the test ({status:?})\n{}",
            self.log_text()
        );
        self.child.kill().expect("kill mcp-server-everything");
        let _ = self.child.wait();
    }
}

impl Drop for Everything {
    /// A failed test does not leave the server listening.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port of 127.0.0.1 that was free a moment ago: bound to port 0, read back, released.
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// `toolgate proxy` with `flags` (the upstreams) and a client of `era`.
fn proxy(bench: &Bench, flags: &[String], era: Era) -> Proxy {
    Proxy::start(bench.proxy_command(flags, &[]), era, &bench.log_path())
}

/// The everything server on its own port and, in front of it as upstream `ev`, `toolgate proxy`
/// on `bench`'s policy with a client of `era`.
fn everything_behind_proxy(bench: &Bench, era: Era) -> (Everything, Proxy) {
    let server = Everything::start(&bench.path("everything.log"));
    let flags = ["--upstream".to_owned(), format!("ev={}", server.url())];
    let proxy = proxy(bench, &flags, era);
    (server, proxy)
}

/// `tests/gateway/everything.toml` with one prompt and the static resources passed through.
fn everything_with_passthrough() -> Bench {
    let policy = format!(
        "{}\n[passthrough]\nprompts = [\"simple-prompt\"]\nresources = [\"demo://resource/static/*\"]\n",
        gateway_policy("everything.toml")
    );
    Bench::with_policy_text("everything.toml", &policy)
}

/// A request in the proxy's era; its whole answer.
fn ask(proxy: &mut Proxy, method: &str, params: Value) -> Value {
    let id = proxy.request(method, params);
    proxy.answer(id).0
}

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
}

#[test]
fn an_http_upstream_is_listed_called_refused_relayed_and_audited_by_name() {
    let bench = Bench::new("everything.toml");
    let (server, mut proxy) = everything_behind_proxy(&bench, Era::Modern);

    assert_eq!(
        sorted(proxy.tool_names()),
        ["echo", "trigger-long-running-operation"],
        "only what the policy names, of the everything server's dozen and more\n{}",
        proxy.log_tail()
    );

    let echo = proxy.call("echo", json!({"message": "over streamable http"}));
    assert_ran(&echo, "echo over HTTP");
    assert_eq!(text(&echo), "Echo: over streamable http", "{echo}");

    // Offered by the upstream, not named by the policy.
    proxy.assert_refused(&["get-env", "get-sum"], &json!({"a": 1, "b": 2}));

    // Progress arrives as SSE events on the upstream's POST response; the caller gets them under
    // the token it chose, not the one the gateway used upstream.
    assert_everything_progress(&mut proxy, &json!("http-caller-token-9"), "over HTTP");
    proxy.close();
    server.stop();

    let records = bench.records();
    let calls: Vec<(String, String, String, Value)> = records
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_owned(),
                r["decision"].as_str().unwrap_or_default().to_owned(),
                r["outcome"].as_str().unwrap_or_default().to_owned(),
                r["upstream"].clone(),
            )
        })
        .collect();
    let ev = json!("ev");
    let expect = |name: &str, decision: &str, outcome: &str| {
        (
            name.to_owned(),
            decision.to_owned(),
            outcome.to_owned(),
            ev.clone(),
        )
    };
    assert_eq!(
        calls,
        [
            expect("echo", "allow", "committed"),
            expect("get-env", "deny", "not_executed"),
            expect("get-sum", "deny", "not_executed"),
            expect("trigger-long-running-operation", "allow", "committed"),
        ],
        "{records:#?}"
    );
    bench.assert_audit_verifies();
}

/// Calls to an HTTP upstream share the gateway's connections to it: twenty calls in a row open
/// far fewer than twenty connections (a few may open when an idle one was closed, or when two
/// requests were in flight at once; each POST on a connection of its own, as before, cost the
/// gateway and the upstream a TCP handshake and an accept on every call). The sockets are counted in the kernel's table:
/// every socket of this machine connected to the upstream's port, open or in TIME_WAIT, is one
/// of the gateway's (the upstream's own sockets have its port as their local one) but for the
/// connection that found it listening.
#[cfg(target_os = "linux")]
#[test]
fn calls_to_an_http_upstream_reuse_its_connections() {
    let bench = Bench::new("everything.toml");
    let (server, mut proxy) = everything_behind_proxy(&bench, Era::Modern);
    let before = sockets_connected_to(server.port);
    for n in 0..20 {
        let echo = proxy.call("echo", json!({"message": format!("call {n}")}));
        assert_ran(&echo, "echo over HTTP");
    }
    let opened = sockets_connected_to(server.port).saturating_sub(before);
    proxy.close();
    server.stop();
    assert!(
        opened < 10,
        "twenty calls opened {opened} more connections to the upstream"
    );
}

/// An upstream that restarted knows the gateway's session no more: the call that finds out is
/// answered "not run" at once (the upstream refused the session before reading the call), not
/// left waiting, and the gateway opens a new session, in which the next calls run.
#[test]
fn a_restarted_http_upstream_gets_a_new_session_and_the_call_between_is_not_run() {
    let bench = Bench::new("everything.toml");
    let (mut server, mut proxy) = everything_behind_proxy(&bench, Era::Legacy("2025-11-25"));
    assert_ran(&proxy.call("echo", json!({"message": "before"})), "echo");

    server.restart();
    let started = Instant::now();
    let between = proxy.call("echo", json!({"message": "between"}));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the call waited {:?} on a session the upstream no longer has",
        started.elapsed()
    );
    assert_eq!(
        between["result"]["structuredContent"]["executed"], false,
        "{between}"
    );
    assert!(text(&between).contains("nothing ran"), "{between}");

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let after = proxy.call("echo", json!({"message": "after"}));
        if after["result"]["isError"] != true {
            assert_eq!(text(&after), "Echo: after", "{after}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new session within 15 s: {after}\n{}",
            proxy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    proxy.close();
    server.stop();
    let outcomes: Vec<Value> = bench
        .records_of("echo")
        .iter()
        .map(|r| r["outcome"].clone())
        .collect();
    assert_eq!(outcomes.first(), Some(&json!("committed")), "{outcomes:?}");
    assert_eq!(
        outcomes.get(1),
        Some(&json!("not_executed")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes.last(), Some(&json!("committed")), "{outcomes:?}");
    bench.assert_audit_verifies();
}

/// Sockets of this machine, in any state, whose remote end is 127.0.0.1:`port`.
#[cfg(target_os = "linux")]
fn sockets_connected_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| line.split_whitespace().nth(2) == Some(remote.as_str()))
        .count()
}

#[test]
fn a_config_file_mixes_an_http_and_a_stdio_upstream_each_prefixed() {
    let bench = Bench::with_policy_text(
        "mixed.toml",
        r#"version = 2
name = "mixed"

[defaults]
tier = "blocked"
timeout = "20s"

[tools.ev__echo]
tier = "low"

[tools.tb__echo]
tier = "low"
"#,
    );
    let server = Everything::start(&bench.path("everything.log"));
    let up = bench.mkdir("up");
    let config = bench.path("upstreams.toml");
    let config_text = format!(
        "[upstreams.ev]\nurl = {url:?}\n\n[upstreams.tb]\ncommand = {cmd:?}\nargs = [\"--dir\", {dir:?}]\n",
        url = server.url(),
        cmd = testbed_bin().display().to_string(),
        dir = up.display().to_string(),
    );
    std::fs::write(&config, config_text).expect("upstream config");
    let flags = ["--config".to_owned(), config.display().to_string()];
    let mut proxy = proxy(&bench, &flags, Era::Legacy("2025-11-25"));

    assert_eq!(
        sorted(proxy.tool_names()),
        ["ev__echo", "tb__echo"],
        "{}",
        proxy.log_tail()
    );
    let ev = proxy.call("ev__echo", json!({"message": "to ev"}));
    assert_ran(&ev, "ev__echo");
    assert_eq!(text(&ev), "Echo: to ev", "{ev}");
    let tb = proxy.call("tb__echo", json!({"text": "to tb"}));
    assert_ran(&tb, "tb__echo");
    assert_eq!(text(&tb), "echo: to tb", "{tb}");
    // Unprefixed names and tools the policy does not name are refused.
    let refused = ["echo", "ev__get-env", "tb__write_record"];
    proxy.assert_refused(&refused, &json!({"message": "x", "text": "x"}));
    proxy.close();
    server.stop();

    assert_eq!(calls(&up), ["echo"], "the testbed received only tb__echo");
    let records = bench.records();
    let upstream_of = |name: &str| upstreams_of(&records, name);
    assert_eq!(upstream_of("ev__echo"), [json!("ev")], "{records:#?}");
    assert_eq!(upstream_of("tb__echo"), [json!("tb")], "{records:#?}");
    assert_eq!(upstream_of("ev__get-env"), [json!("ev")], "{records:#?}");
    assert_eq!(
        upstream_of("tb__write_record"),
        [json!("tb")],
        "{records:#?}"
    );
    bench.assert_audit_verifies();
}

#[test]
fn prompts_and_resources_of_an_http_upstream_pass_only_when_the_policy_names_them() {
    let bench = everything_with_passthrough();
    let (server, mut proxy) = everything_behind_proxy(&bench, Era::Modern);

    // The everything server offers four prompts (simple, args, completable, resource).
    let listed = ask(&mut proxy, "prompts/list", json!({}));
    let prompts: Vec<&str> = listed["result"]["prompts"]
        .as_array()
        .unwrap_or_else(|| panic!("prompts/list: {listed}\n{}", proxy.log_tail()))
        .iter()
        .map(|p| p["name"].as_str().expect("prompt name"))
        .collect();
    assert_eq!(prompts, ["simple-prompt"], "{listed}");

    let got = ask(
        &mut proxy,
        "prompts/get",
        json!({"name": "simple-prompt", "arguments": {}}),
    );
    let first = &got["result"]["messages"][0]["content"]["text"];
    assert!(
        first.as_str().is_some_and(|t| !t.is_empty()),
        "prompts/get simple-prompt: {got}"
    );
    // Exists upstream (args-prompt needs `city`), not named by the policy.
    let refused = ask(
        &mut proxy,
        "prompts/get",
        json!({"name": "args-prompt", "arguments": {"city": "Lyon"}}),
    );
    assert_eq!(error_code(&refused), Some(-32602), "{refused}");

    let listed = ask(&mut proxy, "resources/list", json!({}));
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("resources/list: {listed}\n{}", proxy.log_tail()))
        .iter()
        .map(|r| r["uri"].as_str().expect("resource uri"))
        .collect();
    assert!(!uris.is_empty(), "{listed}");
    assert!(
        uris.iter()
            .all(|u| u.starts_with("demo://resource/static/")),
        "resources/list: {uris:?}"
    );
    let uri = "demo://resource/static/document/features.md";
    assert!(uris.contains(&uri), "{uris:?}");
    let read = ask(&mut proxy, "resources/read", json!({"uri": uri}));
    let contents = &read["result"]["contents"][0];
    assert_eq!(contents["uri"], uri, "{read}");
    assert!(
        contents["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("# Everything Server")),
        "resources/read {uri}: {read}"
    );
    // A resource the upstream serves from a template, outside the policy's prefix.
    let refused = ask(
        &mut proxy,
        "resources/read",
        json!({"uri": "demo://resource/dynamic/text/1"}),
    );
    assert_eq!(error_code(&refused), Some(-32602), "{refused}");
    proxy.close();
    server.stop();

    let records = bench.records();
    let passes: Vec<(&str, &str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default(),
                r["decision"].as_str().unwrap_or_default(),
                r["rule"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        passes,
        [
            ("simple-prompt", "allow", "passthrough.prompts"),
            ("args-prompt", "deny", "passthrough.prompts"),
            (
                "demo://resource/static/document/features.md",
                "allow",
                "passthrough.resources"
            ),
            (
                "demo://resource/dynamic/text/1",
                "deny",
                "passthrough.resources"
            ),
        ],
        "{records:#?}"
    );
    bench.assert_audit_verifies();
}

/// Pass-through records name their own method (`prompts/get`, `resources/read`), the prompt or
/// resource as `name`, and the upstream, like the gateway's tool-call records.
#[test]
fn pass_through_audit_records_name_their_own_method_and_upstream() {
    let bench = everything_with_passthrough();
    let (server, mut proxy) = everything_behind_proxy(&bench, Era::Modern);
    let got = ask(&mut proxy, "prompts/get", json!({"name": "simple-prompt"}));
    assert!(got.get("result").is_some(), "{got}");
    let uri = "demo://resource/static/document/features.md";
    let read = ask(&mut proxy, "resources/read", json!({"uri": uri}));
    assert!(read.get("result").is_some(), "{read}");
    proxy.close();
    server.stop();

    let records = bench.records();
    let seen: Vec<(Value, Value)> = records
        .iter()
        .map(|r| (r["method"].clone(), r["upstream"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (json!("prompts/get"), json!("ev")),
            (json!("resources/read"), json!("ev")),
        ],
        "{records:#?}"
    );
}

//! The approvals console in a real browser: `toolgate serve --toolset orders` holds a refund that
//! needs a person, `toolgate console` runs beside it on the same data directory, and headless
//! Chromium (Debian's, driven over WebDriver by chromedriver; `scripts/install-browser`) signs in
//! with the printed one-time link, sees the request appear without a reload, and decides it. What
//! a user relies on is checked where they would see it: the shop's effects log (one refund), the
//! caller's answer, the page's own words, and the audit chain.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::approvals::{is_error, structured};
use super::http::Http;
use super::{Scratch, policy_with, send_signal, toolgate, verify_json, wait_for};

mod oidc;

/// Long enough for a browser to sign in and click while the call is held; short enough that a
/// broken test does not hang for minutes.
const WAIT: &str = "60s";

/// How long the page may take to show a change (the live stream polls every half second).
const SHOWN_WITHIN: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// chromedriver and the browser

/// `chromedriver` on a port of its choosing, ended when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        let mut child = Command::new("chromedriver")
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/install-browser installs it)");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        // "ChromeDriver was started successfully on port 41231."
        let port = loop {
            let line = lines
                .next()
                .expect("chromedriver said nothing")
                .expect("read chromedriver");
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').trim().to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser (a WebDriver session: its own profile, so its own cookies); closed when dropped.
struct Browser<'d> {
    driver: &'d Driver,
    http: Http,
    session: String,
    /// The browser's profile; removed after the session is deleted.
    _profile: tempfile::TempDir,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl<'d> Browser<'d> {
    fn open(driver: &'d Driver, width: u32, height: u32) -> Self {
        let http = Http::new();
        let profile = tempfile::tempdir().expect("profile dir");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-quic",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let reply = http
            .send(
                "POST",
                &format!("{}/session", driver.url),
                &[("content-type", "application/json")],
                capabilities.to_string().into_bytes(),
            )
            .expect("new WebDriver session");
        let value: Value = serde_json::from_str(&reply.body).expect("WebDriver JSON");
        let session = value["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {}", reply.body))
            .to_owned();
        Self {
            driver,
            http,
            session,
            _profile: profile,
        }
    }

    /// A WebDriver command: its `value`, or the driver's error.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let url = format!("{}/session/{}{path}", self.driver.url, self.session);
        let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let reply = self
            .http
            .send(method, &url, &[("content-type", "application/json")], body)
            .expect("WebDriver request");
        let value: Value = serde_json::from_str(&reply.body).expect("WebDriver JSON");
        if reply.status == 200 {
            Ok(value["value"].clone())
        } else {
            Err(value["value"].clone())
        }
    }

    fn must(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.command(method, path, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    fn goto(&self, url: &str) {
        self.must("POST", "/url", Some(json!({"url": url})));
    }

    fn url(&self) -> String {
        self.must("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn find(&self, css: &str) -> Option<String> {
        self.command(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        )
        .ok()
        .and_then(|v| v[ELEMENT].as_str().map(str::to_owned))
    }

    /// Waits for an element the page must come to show by itself.
    fn wait_for(&self, css: &str) -> String {
        let deadline = Instant::now() + SHOWN_WITHIN;
        loop {
            if let Some(element) = self.find(css) {
                return element;
            }
            assert!(
                Instant::now() < deadline,
                "{css} not on the page within {SHOWN_WITHIN:?}: {}",
                self.text("body")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&self, css: &str) -> String {
        let Some(element) = self.find(css) else {
            return format!("(no {css})");
        };
        self.must("GET", &format!("/element/{element}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn click(&self, css: &str) {
        let element = self.wait_for(css);
        self.must(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        );
    }

    fn type_into(&self, css: &str, text: &str) {
        let element = self.wait_for(css);
        self.must(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({"text": text})),
        );
    }

    /// The value of a cookie of the page's site, HttpOnly included (WebDriver sees them all).
    fn cookie(&self, name: &str) -> String {
        self.must("GET", &format!("/cookie/{name}"), None)["value"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn screenshot(&self, path: &Path) {
        let data = self.must("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or_default())
            .expect("base64 PNG");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        // Without this the browser's processes outlive the test.
        let _ = self.command("DELETE", "", None);
    }
}

// ---------------------------------------------------------------------------------------------
// toolgate console

/// `toolgate console` on the scratch directory, with the login link it printed.
struct Console {
    child: Child,
    link: String,
}

impl Console {
    /// `toolgate console` on `scratch`'s data directory with `extra` flags, once it has printed
    /// its login link.
    fn start(scratch: &Scratch, extra: &[&str]) -> Self {
        let mut child = toolgate()
            .args(["console", "--http", "127.0.0.1:0", "--data"])
            .arg(scratch.data())
            .args(extra)
            .env("USER", "approver")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn toolgate console");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let link = loop {
            let line = lines
                .next()
                .expect("the console exited before printing a link")
                .expect("read stderr");
            if let Some(link) = line.trim().strip_prefix("http://") {
                break format!("http://{link}");
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self { child, link }
    }

    /// `http://127.0.0.1:PORT`.
    fn base(&self) -> &str {
        self.link.split("/login").next().unwrap_or_default()
    }

    fn stop(mut self) {
        send_signal(&self.child, "TERM");
        let status = wait_for(&mut self.child, Duration::from_secs(10));
        assert!(status.success(), "console exited with {status}");
    }
}

/// Where screenshots go: `TOOLGATE_SCREENSHOTS` (to refresh the ones under docs/), else the
/// test's scratch space.
fn screenshot_dir() -> PathBuf {
    // A test's own knob, set by a person refreshing the pictures, never by toolgate.
    #[allow(clippy::disallowed_methods)]
    std::env::var_os("TOOLGATE_SCREENSHOTS")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from)
}

#[test]
fn a_person_approves_in_the_browser_and_the_held_call_runs_once_and_a_racing_browser_loses() {
    let text = policy_with(
        "orders.toml",
        &[
            ("approval_wait", &format!("{WAIT:?}")),
            ("approval_ttl", "\"5m\""),
        ],
    );
    let scratch = Scratch::with_policy_text("orders", &text);
    let mut server = scratch.serve(&[]);
    let console = Console::start(&scratch, &[]);
    let driver = Driver::start();
    let shots = screenshot_dir();

    // Sign in with the printed link: it lands on the front page, and cannot be used again.
    let alice = Browser::open(&driver, 1100, 1000);
    alice.goto(&console.link);
    alice.wait_for("#live");
    assert_eq!(alice.url(), format!("{}/", console.base()));
    assert!(
        alice.text(".signout").contains("human:approver"),
        "{}",
        alice.text("body")
    );
    assert!(alice.text("#live").contains("Nothing is waiting"));
    let again = Browser::open(&driver, 800, 800);
    again.goto(&console.link);
    assert!(
        again.text("body").contains("used already"),
        "{}",
        again.text("body")
    );
    drop(again);

    // A call that needs a person appears on the open page by itself.
    let call = server.send_call("refund", json!({"order_id": "ord_1001", "amount": 49}));
    let card = alice.wait_for("article.request");
    let shown = alice.text("article.request");
    for fact in [
        "refund",
        "high",
        "local:",
        "tools.refund.escalate[0]",
        "ord_1001",
        "49",
    ] {
        assert!(shown.contains(fact), "{fact} not shown: {shown}");
    }
    assert!(!card.is_empty());
    alice.screenshot(&shots.join("console-pending.png"));

    // A second person, in a second browser, opens the same request.
    let out = toolgate()
        .args(["console", "link", "--as", "human:bob", "--data"])
        .arg(scratch.data())
        .output()
        .expect("console link");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bob_link = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bob = Browser::open(&driver, 412, 915);
    bob.goto(&bob_link);
    bob.click("article.request h3 a");
    bob.wait_for("form.decide");

    // Alice decides: the held call runs, once.
    alice.click("article.request a.button");
    alice.type_into("#reason", "customer called, box arrived damaged");
    alice.click("#approve");
    alice.wait_for("#notice");
    assert!(
        alice.text("#notice").starts_with("Approved"),
        "{}",
        alice.text("#notice")
    );
    let (reply, _) = server.answer(call);
    assert!(!is_error(&reply), "{reply}");
    assert_eq!(structured(&reply)["status"], "refunded", "{reply}");
    assert_eq!(scratch.refunds().len(), 1);

    // Bob's page was loaded before the decision; his click loses, and says so.
    bob.type_into("#reason", "looks fine");
    bob.click("#approve");
    bob.wait_for("#notice");
    let notice = bob.text("#notice");
    assert!(
        notice.contains("already approved by human:approver"),
        "{notice}"
    );
    assert_eq!(bob.text("#status"), "approved");
    assert_eq!(scratch.refunds().len(), 1, "the losing click ran nothing");
    bob.screenshot(&shots.join("console-decided-phone.png"));

    // Another origin, or no token, with alice's own session cookie over a real socket: refused.
    let cookie = format!("toolgate_console={}", alice.cookie("toolgate_console"));
    let http = Http::new();
    let second = server.send_call("refund", json!({"order_id": "ord_1005", "amount": 30}));
    alice.goto(&format!("{}/", console.base()));
    alice.click("article.request a.button");
    alice.wait_for("form.decide");
    let detail = alice.url();
    let page = http
        .send("GET", &detail, &[("cookie", &cookie)], Vec::new())
        .expect("detail page");
    let csrf = Scratch::csrf_of(&page.body);
    for (origin, form) in [
        (
            "http://evil.example",
            format!("verdict=approve&csrf={csrf}"),
        ),
        (console.base(), "verdict=approve".to_owned()),
    ] {
        let refused = http
            .send(
                "POST",
                &detail,
                &[
                    ("cookie", &cookie),
                    ("origin", origin),
                    ("content-type", "application/x-www-form-urlencoded"),
                ],
                form.into_bytes(),
            )
            .expect("post");
        assert_eq!(refused.status, 403, "{origin}: {}", refused.body);
    }

    // A denial with a reason reaches the caller, who is told not to retry.
    alice.type_into("#reason", "not this customer");
    alice.click("#deny");
    alice.wait_for("#notice");
    assert!(
        alice.text("#notice").starts_with("Denied"),
        "{}",
        alice.text("#notice")
    );
    let (denied, _) = server.answer(second);
    assert!(is_error(&denied), "{denied}");
    assert_eq!(
        structured(&denied)["reason"],
        "not this customer",
        "{denied}"
    );
    assert!(
        denied.to_string().contains("Do not retry this action"),
        "{denied}"
    );
    assert_eq!(scratch.refunds().len(), 1);
    alice.goto(&detail);
    alice.wait_for("#decided-by");
    alice.screenshot(&shots.join("console-denied.png"));

    drop((alice, bob));
    drop(driver);
    console.stop();
    server.close();
    let (code, report) = verify_json(&scratch.audit());
    assert_eq!(code, 0, "{report}");
}

#[test]
fn sign_in_flags_without_a_console_to_sign_in_to_are_refused() {
    let scratch = Scratch::with_policy("orders.toml");
    let out = scratch
        .serve_command()
        .args(["--http", "127.0.0.1:0", "--insecure-no-auth"])
        .args([
            "--oidc-issuer",
            "http://127.0.0.1:9/",
            "--oidc-client-id",
            "toolgate",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run serve");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("it needs --console"), "{stderr}");
}

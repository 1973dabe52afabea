//! Execute-verify-stop as a corridor step (seed 000, DESIGN.md §1 step 8 and §4), against real
//! toolsets on real files: seed 000's ledger (`write_note`, then `read_ledger` must hold exactly
//! the note), called in-process through `corridor::call` as the agent calls it; and a kit server of
//! file tools over a temporary directory, called over MCP as a client calls it, for the
//! compensating call (ROLLBACK) and for reads that fail.
//!
//! Each test asserts the guarantee, not the happy path: CONTINUE only when the state was read and
//! holds; a read that was refused, failed or gave nothing to judge is STOP, never CONTINUE and never
//! a rollback; the mutation's own record still says committed; the compensating call is a call of
//! its own through the gate, and the file on disk is what the answer says it is.

use std::path::{Path, PathBuf};

use rmcp::ServiceExt;
use rmcp::model::CallToolResponse;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tempfile::TempDir;
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};
use tokio_util::sync::CancellationToken;
use toolgate::GateServer;
use toolgate::corridor::answer::{Check, Kind};
use toolgate::corridor::{self, Gate, Outcome, Request, Verify};
use toolgate::kit::{Env, Output, Server, Tool, ToolError, ok_result};
use toolgate::toolset::Toolset;
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_demos::Ledger;
use toolgate_store::journal::Durability;

/// Seed 000's worked example, as shipped.
const LEDGER_VERIFY: &str = include_str!("../../../../policies/ledger-verify.toml");

/// The shipped condition's last clause, which the variants below change.
const SAME_TEXT: &str = "n.text == args.text)";

/// `text` with `from` replaced by `to`; `from` must be there, so that a change to the shipped file
/// cannot leave a test on a policy it did not mean.
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the policy");
    text.replacen(from, to, 1)
}

/// A gate on a fresh data directory under `policy`, for `principal`, checked against the ledger's
/// tools as `toolgate serve` checks it.
async fn ledger_gate(policy: &str, principal: Principal) -> (Gate, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = Policy::from_bytes(policy.as_bytes()).expect("policy loads");
    let warnings = policy
        .check_tools(&Ledger::new().catalog().argument_types())
        .expect("policy fits the ledger");
    assert!(warnings.is_empty(), "{warnings:?}");
    let gate = Gate::open(policy, dir.path(), Durability::Synced)
        .await
        .expect("gate opens")
        .with_principal(principal);
    (gate, dir)
}

/// `write_note` through the corridor, as the agent calls it.
async fn write_note(gate: &Gate, request_id: &str, text: &str) -> Outcome {
    let arguments = json!({"request_id": request_id, "text": text});
    corridor::call(
        gate,
        &Ledger::new(),
        Request {
            name: "write_note".to_owned(),
            arguments: object(arguments),
            key: None,
            approvals_closed: None,
            ct: CancellationToken::new(),
        },
    )
    .await
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// The complete result an outcome was answered with, as JSON.
fn result_of(outcome: &Outcome) -> Value {
    match &outcome.response {
        Ok(CallToolResponse::Complete(result)) => serde_json::to_value(result).expect("JSON"),
        other => panic!("a complete result, got {other:?}"),
    }
}

/// Audit records as (name, decision, outcome), in order.
fn trail(dir: &Path) -> Vec<(String, String, String)> {
    records(dir)
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("name"), field("decision"), field("outcome"))
        })
        .collect()
}

fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .expect("audit log")
        .lines()
        .map(|line| serde_json::from_str(line).expect("record"))
        .collect()
}

fn row(name: &str, decision: &str, outcome: &str) -> (String, String, String) {
    (name.to_owned(), decision.to_owned(), outcome.to_owned())
}

/// The audit log is one intact chain, as `toolgate audit verify` checks it.
fn assert_chain_intact(dir: &Path) {
    let file = std::fs::File::open(dir.join("audit.jsonl")).expect("audit log");
    let report = toolgate_core::audit::verify(std::io::BufReader::new(file), None).expect("read");
    assert!(report.intact(), "{report:?}");
}

/// The notes the ledger really holds, from its journal.
fn notes(gate: &Gate) -> Vec<Value> {
    gate.journal()
        .effects()
        .into_iter()
        .map(|e| e.body)
        .collect()
}

fn counts(gate: &Gate) -> Vec<(String, Check, u64)> {
    gate.verify_counts()
        .into_iter()
        .map(|((tool, check), n)| (tool, check, n))
        .collect()
}

// 1. CONTINUE: the ledger holds exactly the note.

#[tokio::test]
async fn a_note_the_ledger_holds_exactly_is_verified_and_the_caller_may_go_on() {
    let (gate, dir) = ledger_gate(LEDGER_VERIFY, Principal::new("agent:test")).await;
    let outcome = write_note(&gate, "req-0001", "gate aplicado").await;

    assert_eq!(outcome.kind, Kind::Ran);
    assert_eq!(
        outcome.verify,
        Some(Verify {
            decision: Check::Continue,
            rolled_back: None
        })
    );
    let result = result_of(&outcome);
    assert_ne!(result["isError"], true, "{result}");
    assert_eq!(
        result["structuredContent"],
        json!({"request_id": "req-0001", "status": "committed", "verified": true})
    );
    assert_eq!(result["_meta"]["io.toolgate/verified"], true, "{result}");
    // The text a client that reads only text sees says the same.
    let text: Value =
        serde_json::from_str(result["content"][0]["text"].as_str().expect("text")).expect("JSON");
    assert_eq!(text, result["structuredContent"]);

    // The ledger's own records (it writes them with its effect), then the decision.
    assert_eq!(
        trail(dir.path()),
        [
            row("write_note", "allow", "committed"),
            row("read_ledger", "allow", "observed"),
            row("write_note", "verify", "continue"),
        ]
    );
    let verify = records(dir.path()).pop().expect("the verify record");
    assert_eq!(verify["request_id"], "req-0001");
    assert_eq!(verify["rule"], "tools.write_note.verify");
    assert_eq!(verify["read"], "read_ledger");
    assert_eq!(verify["principal"], "agent:test");
    assert_chain_intact(dir.path());
    assert_eq!(
        counts(&gate),
        [("write_note".to_owned(), Check::Continue, 1)]
    );
}

// 2. STOP: the state diverged from what the policy expects.

#[tokio::test]
async fn a_note_that_diverges_stops_and_the_write_is_still_recorded_as_committed() {
    let policy = replaced(
        LEDGER_VERIFY,
        SAME_TEXT,
        "n.text == args.text + ' (reviewed)')",
    );
    let (gate, dir) = ledger_gate(&policy, Principal::new("agent:test")).await;
    let outcome = write_note(&gate, "req-0002", "gate aplicado").await;

    assert_eq!(outcome.kind, Kind::Unverified);
    assert_eq!(
        outcome.verify,
        Some(Verify {
            decision: Check::Stop,
            rolled_back: None
        })
    );
    let result = result_of(&outcome);
    assert_eq!(result["isError"], true, "{result}");
    let detail = &result["structuredContent"];
    assert_eq!(detail["executed"], true, "the note was written: {detail}");
    assert_eq!(result["_meta"]["io.toolgate/executed"], true);
    assert_eq!(detail["status"], "unverified");
    assert_eq!(detail["decision"], "stop");
    assert_eq!(detail["diverged"], true);
    assert_eq!(
        detail["observed"],
        json!({"notes": [{"request_id": "req-0002", "text": "gate aplicado"}]})
    );
    assert!(
        detail["expected"]
            .as_str()
            .is_some_and(|e| e.contains("(reviewed)")),
        "{detail}"
    );
    assert!(detail.get("rolled_back").is_none(), "no rollback declared");
    let text = result["content"][0]["text"].as_str().expect("text");
    assert!(
        text.starts_with("write_note ran but its postcondition did not hold"),
        "{text}"
    );
    assert!(text.contains("Stop: do not continue"), "{text}");
    assert!(result["_meta"].get("io.toolgate/verified").is_none());

    // The effect happened and stays recorded as committed; the decision is a record of its own.
    assert_eq!(
        notes(&gate),
        [json!({"request_id": "req-0002", "text": "gate aplicado"})]
    );
    assert_eq!(
        trail(dir.path()),
        [
            row("write_note", "allow", "committed"),
            row("read_ledger", "allow", "observed"),
            row("write_note", "verify", "stop"),
        ]
    );
    assert_chain_intact(dir.path());
    assert_eq!(counts(&gate), [("write_note".to_owned(), Check::Stop, 1)]);
}

// 3. STOP: the state could not be read. The note is there and right; without a read, the gate
// does not say so.

#[tokio::test]
async fn a_read_the_policy_refuses_stops_and_never_continues() {
    // (how the read is refused, the principal, the read's own record)
    let scoped = replaced(
        LEDGER_VERIFY,
        "[tools.read_ledger]\ntier = \"low\"",
        "[tools.read_ledger]\ntier = \"low\"\nscope = \"ledger:read\"",
    );
    let gated = replaced(
        LEDGER_VERIFY,
        "[tools.read_ledger]\ntier = \"low\"",
        "[tools.read_ledger]\ntier = \"low\"\ngated = true",
    );
    let high = replaced(
        LEDGER_VERIFY,
        "[tools.read_ledger]\ntier = \"low\"",
        "[tools.read_ledger]\ntier = \"high\"",
    );
    let writer = Principal::from_token(
        "agent:writer".to_owned(),
        vec!["ledger:write".to_owned()],
        None,
    );
    let cases = [
        // A token that may write but not read: for this caller the read does not exist.
        (scoped, writer, row("read_ledger", "deny", "not_executed")),
        // Gated and its switch off: answered with a dry run, nothing read.
        (
            gated,
            Principal::new("agent:test"),
            row("read_ledger", "refuse", "dry_run"),
        ),
        // A read that needs a person is not held for one (and opens no request).
        (
            high,
            Principal::new("agent:test"),
            row("read_ledger", "deny", "not_executed"),
        ),
    ];
    for (policy, principal, read_record) in cases {
        let (gate, dir) = ledger_gate(&policy, principal).await;
        let outcome = write_note(&gate, "req-0003", "gate aplicado").await;

        assert_eq!(outcome.kind, Kind::Unverified, "{read_record:?}");
        assert_eq!(
            outcome.verify,
            Some(Verify {
                decision: Check::Stop,
                rolled_back: None
            }),
            "{read_record:?}"
        );
        let result = result_of(&outcome);
        assert_eq!(result["isError"], true, "{result}");
        let detail = &result["structuredContent"];
        assert_eq!(detail["executed"], true, "{detail}");
        assert_eq!(detail["decision"], "stop", "{detail}");
        assert_eq!(detail["diverged"], false, "{detail}");
        assert_eq!(detail["observed"], Value::Null, "{detail}");
        let text = result["content"][0]["text"].as_str().expect("text");
        assert!(text.contains("could not be checked"), "{text}");
        assert!(text.contains("read_ledger could not be read"), "{text}");
        assert!(text.contains("Stop:"), "{text}");

        assert_eq!(notes(&gate).len(), 1, "the write itself happened");
        assert_eq!(
            trail(dir.path()),
            [
                row("write_note", "allow", "committed"),
                read_record.clone(),
                row("write_note", "verify", "stop"),
            ]
        );
        let read = &records(dir.path())[1];
        assert_eq!(read["verify_of"], "write_note", "{read}");
        assert_eq!(read["request_id"], "req-0003", "{read}");
        assert_chain_intact(dir.path());
        let approvals = gate.approvals().expect("approval store");
        let opened = approvals
            .list(true, toolgate_core::time::now_ms())
            .await
            .expect("list");
        assert!(
            opened.is_empty(),
            "the gate's own read asks no person: {opened:?}"
        );
        assert_eq!(counts(&gate), [("write_note".to_owned(), Check::Stop, 1)]);
    }
}

// The kit: file tools over a real directory, served over MCP.

#[derive(Deserialize)]
struct Put {
    name: String,
    text: String,
}

#[derive(Deserialize)]
struct Name {
    name: String,
}

/// What `put_file` keeps of a text: the defect under test is a store that keeps a prefix and
/// still reports success, which only reading the file back shows.
const KEPT_CHARS: usize = 32;

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// `put_file`, `read_file` (JSON), `cat_file` (the same as plain prose), `remove_file` and
/// `list_files`, over `dir`.
fn file_tools(dir: &Path) -> Vec<Tool> {
    let name = json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"});
    let at = |dir: &Path| {
        let dir = dir.to_owned();
        move |name: &str| -> PathBuf { dir.join(name) }
    };
    let put = at(dir);
    let read = at(dir);
    let cat = at(dir);
    let remove = at(dir);
    let list_dir = dir.to_owned();
    vec![
        Tool::new("put_file")
            .description("Write one text file.")
            .input_schema(schema(
                json!({"name": name, "text": {"type": "string"}}),
                &["name", "text"],
            ))
            .handler(move |Put { name, text }, _ctx| {
                let path = put(&name);
                async move {
                    let kept: String = text.chars().take(KEPT_CHARS).collect();
                    std::fs::write(&path, kept.as_bytes())?;
                    ok_result(json!({"name": name, "written": true}))
                }
            }),
        Tool::new("read_file")
            .description("Read one text file.")
            .input_schema(schema(json!({"name": name}), &["name"]))
            .handler(move |Name { name }, _ctx| {
                let path = read(&name);
                async move {
                    match std::fs::read_to_string(&path) {
                        Ok(text) => ok_result(json!({"name": name, "text": text})),
                        Err(error) => Err(ToolError::new(format!("cannot read {name}: {error}"))
                            .with_code("NOT_FOUND")),
                    }
                }
            }),
        Tool::new("cat_file")
            .description("Print one text file.")
            .input_schema(schema(json!({"name": name}), &["name"]))
            .handler(move |Name { name }, _ctx| {
                let path = cat(&name);
                async move { Ok::<_, ToolError>(Output::text(std::fs::read_to_string(&path)?)) }
            }),
        Tool::new("remove_file")
            .description("Remove one text file.")
            .input_schema(schema(json!({"name": name}), &["name"]))
            .handler(move |Name { name }, _ctx| {
                let path = remove(&name);
                async move {
                    std::fs::remove_file(&path)?;
                    ok_result(json!({"removed": name}))
                }
            }),
        Tool::new("list_files")
            .description("List the files.")
            .input_schema(schema(json!({}), &[]))
            .handler(move |_: Map<String, Value>, _ctx| {
                let dir = list_dir.clone();
                async move {
                    let mut names: Vec<String> = std::fs::read_dir(&dir)?
                        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                        .collect::<Result<_, _>>()?;
                    names.sort();
                    ok_result(json!({"names": names}))
                }
            }),
    ]
}

/// The files policy: `put_file` is verified by reading the file back; `{verify}` is the rest of
/// its `[tools.put_file.verify]` table.
fn files_policy(verify: &str) -> String {
    format!(
        r#"
version = 2
name = "files"

[defaults]
tier = "blocked"

[tools.put_file]
tier = "low"
idempotency_key = "*"

[tools.put_file.verify]
{verify}

[tools.read_file]
tier = "low"

# A read with a postcondition of its own: inside a verification it is not verified again.
[tools.read_file.verify]
read = "list_files"
expect = "args.name in result.data.names"

[tools.cat_file]
tier = "low"

[tools.remove_file]
tier = "low"

[tools.list_files]
tier = "low"
"#
    )
}

/// Read the file back; the text must be the whole text; remove it when it is not.
const READ_BACK: &str = r#"read = "read_file"
args = { name = "args.name" }
expect = "result.data.text == args.text"
rollback = "remove_file"
rollback_args = { name = "args.name" }"#;

/// A kit server of the file tools over `files`, its data (audit log, stores) in `data`.
async fn files_server(policy: &str, files: &Path, data: &Path) -> GateServer {
    let policy = Policy::from_bytes(policy.as_bytes()).expect("policy loads");
    let built = Server::new("files")
        .env(Env::default())
        .data_dir(data)
        .policy(policy)
        .tools(file_tools(files))
        .build()
        .await
        .expect("the kit server builds");
    built.server().clone()
}

/// A raw 2026-07-28 client over an in-process pipe: one call at a time, answers matched by id.
struct Client {
    tx: WriteHalf<DuplexStream>,
    rx: Lines<BufReader<ReadHalf<DuplexStream>>>,
    id: u64,
}

impl Client {
    fn connect(server: GateServer) -> Self {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let running = server.serve(server_io).await.expect("server starts");
            let _ = running.waiting().await;
        });
        let (rx, tx) = tokio::io::split(client_io);
        Self {
            tx,
            rx: BufReader::new(rx).lines(),
            id: 0,
        }
    }

    /// Calls `tool` and returns the `result` of its answer.
    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.id += 1;
        let request = json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "method": "tools/call",
            "params": {
                "name": tool,
                "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        });
        let mut line = serde_json::to_vec(&request).expect("JSON");
        line.push(b'\n');
        self.tx.write_all(&line).await.expect("write");
        loop {
            let line =
                tokio::time::timeout(std::time::Duration::from_secs(10), self.rx.next_line())
                    .await
                    .expect("an answer in time")
                    .expect("read")
                    .expect("the server closed the stream");
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message["id"] == self.id {
                assert!(message["result"].is_object(), "a result: {message}");
                return message["result"].clone();
            }
        }
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A text longer than what `put_file` keeps.
fn long_text() -> String {
    "The gate reads the state back before the caller goes on.".to_owned()
}

// 4. ROLLBACK: the compensating call runs through the gate and the state is back.

#[tokio::test]
async fn a_file_that_diverges_is_removed_through_the_gate_and_the_answer_says_rolled_back() {
    let files = tempfile::tempdir().expect("files");
    let data = tempfile::tempdir().expect("data");
    let server = files_server(&files_policy(READ_BACK), files.path(), data.path()).await;
    let gate = server.gate().clone();
    let mut client = Client::connect(server);

    // A short text is kept whole: verified, the file stays.
    let ok = client
        .call(
            "put_file",
            json!({"name": "short.txt", "text": "kept whole"}),
        )
        .await;
    assert_ne!(ok["isError"], true, "{ok}");
    assert_eq!(ok["structuredContent"]["verified"], true, "{ok}");
    assert_eq!(ok["_meta"]["io.toolgate/verified"], true, "{ok}");
    assert_eq!(files_in(files.path()), ["short.txt"]);

    // A long one is cut by the defect: the read shows it, and the gate removes the file.
    let text = long_text();
    let answer = client
        .call("put_file", json!({"name": "long.txt", "text": text}))
        .await;
    assert_eq!(answer["isError"], true, "{answer}");
    let detail = &answer["structuredContent"];
    assert_eq!(detail["executed"], true, "{detail}");
    assert_eq!(detail["status"], "unverified", "{detail}");
    assert_eq!(detail["decision"], "rollback", "{detail}");
    assert_eq!(detail["diverged"], true, "{detail}");
    assert_eq!(detail["rolled_back"], true, "{detail}");
    assert_eq!(detail["rollback"]["tool"], "remove_file", "{detail}");
    let kept: String = text.chars().take(KEPT_CHARS).collect();
    assert_eq!(
        detail["observed"]["data"]["text"], kept,
        "what was observed: {detail}"
    );
    assert_eq!(detail["expected"], "result.data.text == args.text");
    let words = answer["content"][0]["text"].as_str().expect("text");
    assert!(words.contains("rolled back with remove_file"), "{words}");
    assert!(words.contains("Stop: do not continue"), "{words}");

    // The state is back: the file the call made is gone, the other one is untouched.
    assert_eq!(files_in(files.path()), ["short.txt"]);
    assert_eq!(
        std::fs::read_to_string(files.path().join("short.txt")).expect("short"),
        "kept whole"
    );

    // The mutation, its read, the decision (before the compensating call), and the compensating
    // call as a call of its own, each recorded; the read's own postcondition was not checked.
    let trail = trail(data.path());
    let long: Vec<_> = trail[trail.len() - 4..].to_vec();
    assert_eq!(
        long,
        [
            row("put_file", "allow", "committed"),
            row("read_file", "allow", "committed"),
            row("put_file", "verify", "rollback"),
            row("remove_file", "allow", "committed"),
        ]
    );
    assert!(
        !trail
            .iter()
            .any(|(name, decision, _)| name == "read_file" && decision == "verify"),
        "{trail:?}"
    );
    let last = records(data.path());
    let remove = last.last().expect("the compensating call");
    assert_eq!(remove["verify_of"], "put_file", "{remove}");
    assert_eq!(last[last.len() - 2]["rollback"], "remove_file");
    assert_chain_intact(data.path());
    assert_eq!(
        counts(&gate),
        [
            ("put_file".to_owned(), Check::Continue, 1),
            ("put_file".to_owned(), Check::Rollback, 1),
        ]
    );
}

#[tokio::test]
async fn a_rollback_that_fails_says_so_and_the_file_it_could_not_remove_is_still_there() {
    let files = tempfile::tempdir().expect("files");
    let data = tempfile::tempdir().expect("data");
    // The compensating call names a file that does not exist, so it fails.
    let verify = replaced(
        READ_BACK,
        "rollback_args = { name = \"args.name\" }",
        "rollback_args = { name = \"args.name + '.bak'\" }",
    );
    let server = files_server(&files_policy(&verify), files.path(), data.path()).await;
    let gate = server.gate().clone();
    let mut client = Client::connect(server);

    let answer = client
        .call("put_file", json!({"name": "long.txt", "text": long_text()}))
        .await;
    assert_eq!(answer["isError"], true, "{answer}");
    let detail = &answer["structuredContent"];
    assert_eq!(detail["decision"], "rollback", "{detail}");
    assert_eq!(detail["rolled_back"], false, "{detail}");
    let words = answer["content"][0]["text"].as_str().expect("text");
    assert!(
        words.contains("The rollback with remove_file did not succeed"),
        "{words}"
    );
    assert!(words.contains("may still be there"), "{words}");
    // It is still there, as the answer says.
    assert_eq!(files_in(files.path()), ["long.txt"]);
    let trail = trail(data.path());
    assert_eq!(
        trail[trail.len() - 2..],
        [
            row("put_file", "verify", "rollback"),
            row("remove_file", "allow", "failed"),
        ]
    );
    assert_eq!(counts(&gate), [("put_file".to_owned(), Check::Rollback, 1)]);
}

// 3 (continued). A read that fails, or that answers prose, stops: it never continues, and it is
// no divergence, so nothing is rolled back.

#[tokio::test]
async fn a_read_that_fails_or_gives_nothing_to_judge_stops_and_rolls_nothing_back() {
    let cases = [
        // The read looks for a file that is not there: the read tool fails.
        (
            replaced(
                READ_BACK,
                "args = { name = \"args.name\" }",
                "args = { name = \"args.name + '.txt'\" }",
            ),
            "read_file could not be read",
        ),
        // The read answers prose, not JSON: nothing the condition can judge.
        (
            replaced(READ_BACK, "read = \"read_file\"", "read = \"cat_file\""),
            "cat_file returned neither structured content nor JSON text",
        ),
        // The condition reads a field the result does not have.
        (
            replaced(
                READ_BACK,
                "result.data.text == args.text",
                "result.data.body == args.text",
            ),
            "could not be evaluated on what read_file returned",
        ),
    ];
    for (verify, why) in cases {
        let files = tempfile::tempdir().expect("files");
        let data = tempfile::tempdir().expect("data");
        let server = files_server(&files_policy(&verify), files.path(), data.path()).await;
        let gate = server.gate().clone();
        let mut client = Client::connect(server);

        // A short text: the file is right, but the gate could not see that, so it does not say so.
        let answer = client
            .call("put_file", json!({"name": "note", "text": "kept whole"}))
            .await;
        assert_eq!(answer["isError"], true, "{why}: {answer}");
        let detail = &answer["structuredContent"];
        assert_eq!(detail["executed"], true, "{detail}");
        assert_eq!(detail["decision"], "stop", "{detail}");
        assert_eq!(detail["diverged"], false, "{detail}");
        assert!(detail.get("rolled_back").is_none(), "{detail}");
        assert!(
            detail["why"].as_str().is_some_and(|w| w.contains(why)),
            "{why}: {detail}"
        );
        let words = answer["content"][0]["text"].as_str().expect("text");
        assert!(words.contains("could not be checked"), "{words}");
        // Nothing was rolled back: the file is there, and no compensating call was made.
        assert_eq!(files_in(files.path()), ["note"], "{why}");
        let trail = trail(data.path());
        assert!(
            !trail.iter().any(|(name, _, _)| name == "remove_file"),
            "{why}: {trail:?}"
        );
        assert_eq!(
            trail.last(),
            Some(&row("put_file", "verify", "stop")),
            "{why}"
        );
        assert_eq!(
            counts(&gate),
            [("put_file".to_owned(), Check::Stop, 1)],
            "{why}"
        );
    }
}

// 5. A replay is the stored answer of the first run, verified then: it is not verified again.

#[tokio::test]
async fn a_replayed_call_is_not_read_back_or_decided_again() {
    let files = tempfile::tempdir().expect("files");
    let data = tempfile::tempdir().expect("data");
    let server = files_server(&files_policy(READ_BACK), files.path(), data.path()).await;
    let gate = server.gate().clone();
    let mut client = Client::connect(server);

    let arguments = json!({"name": "once.txt", "text": "kept whole"});
    let first = client.call("put_file", arguments.clone()).await;
    assert_eq!(first["structuredContent"]["verified"], true, "{first}");
    let before = trail(data.path());
    let again = client.call("put_file", arguments).await;
    assert_eq!(again["_meta"]["io.toolgate/status"], "replay", "{again}");
    assert_ne!(again["isError"], true, "{again}");

    let after = trail(data.path());
    assert_eq!(
        after[before.len()..],
        [row("put_file", "allow", "replay")],
        "one record for the replay, no read and no decision"
    );
    assert_eq!(
        after
            .iter()
            .filter(|(name, _, _)| name == "read_file")
            .count(),
        1
    );
    assert_eq!(counts(&gate), [("put_file".to_owned(), Check::Continue, 1)]);
    assert_chain_intact(data.path());
}

// The read's own postcondition applies when it is called by a client.

#[tokio::test]
async fn a_read_called_on_its_own_is_verified_by_its_own_rule() {
    let files = tempfile::tempdir().expect("files");
    let data = tempfile::tempdir().expect("data");
    std::fs::write(files.path().join("a.txt"), "x").expect("a file");
    let server = files_server(&files_policy(READ_BACK), files.path(), data.path()).await;
    let gate = server.gate().clone();
    let mut client = Client::connect(server);

    let read = client.call("read_file", json!({"name": "a.txt"})).await;
    assert_eq!(read["structuredContent"]["verified"], true, "{read}");
    assert_eq!(
        trail(data.path()),
        [
            row("read_file", "allow", "committed"),
            row("list_files", "allow", "committed"),
            row("read_file", "verify", "continue"),
        ]
    );
    assert_eq!(
        counts(&gate),
        [("read_file".to_owned(), Check::Continue, 1)]
    );
}

// The read is judged on what it really returned; the caller is shown it redacted.

#[tokio::test]
async fn a_read_is_judged_unredacted_and_shown_redacted() {
    /// A credential shape the redactor knows without being told.
    const KEY: &str = "AKIAIOSFODNN7EXAMPLE";
    let text = format!("rotate {KEY} today");

    // The note holds exactly the text, secret and all: judged on a redacted copy it would not.
    let (gate, _dir) = ledger_gate(LEDGER_VERIFY, Principal::new("agent:test")).await;
    let outcome = write_note(&gate, "req-0004", &text).await;
    assert_eq!(
        outcome.verify.map(|v| v.decision),
        Some(Check::Continue),
        "{:?}",
        outcome.response
    );

    // When it stops, what was observed is quoted without the secret.
    let policy = replaced(
        LEDGER_VERIFY,
        SAME_TEXT,
        "n.text == args.text + ' (reviewed)')",
    );
    let (gate, _dir) = ledger_gate(&policy, Principal::new("agent:test")).await;
    let outcome = write_note(&gate, "req-0005", &text).await;
    let result = result_of(&outcome);
    assert_eq!(result["structuredContent"]["decision"], "stop", "{result}");
    let observed = &result["structuredContent"]["observed"]["notes"][0];
    assert_eq!(observed["request_id"], "req-0005", "{result}");
    let shown = result.to_string();
    assert!(!shown.contains(KEY), "{shown}");
}

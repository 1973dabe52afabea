#!/usr/bin/env python3
"""Drive `toolgate proxy` (the gateway) with the official MCP Python SDK (`mcp` 2.x).

The gateway sits between a client nobody on this project wrote and this repository's testbed
upstream (crates/toolgate-cli/examples/testbed_upstream.rs), whose tools leave their effects in
files. The gateway's own tests speak raw JSON lines; this one checks that a real client agrees.

    python3 tests/interop/python_sdk_gateway.py --toolgate target/debug/toolgate \\
        --testbed target/debug/examples/testbed_upstream --mode auto [--work DIR]

The policy is tests/gateway/testbed-keys.toml (`--policy` to give another copy of it): echo,
write_record (idempotency key `id`), slow and crash_after_write run; everything else is blocked.
The gateway runs as `toolgate proxy --policy P --data WORK/data --name tb -- testbed --dir WORK/up`.

Checked, in each of the SDK's modes (`auto`, `legacy`, `2026-07-28`):
- tools/list shows exactly the tools the policy names;
- echo returns its text;
- a blocked tool (delete_record) gets JSON-RPC error -32602 and never reaches the upstream;
- write_record with the same `id` twice: one record in WORK/up/records.jsonl, one call upstream,
  the second result marked `_meta["io.toolgate/status"] = "replay"`;
- progress from `slow` reaches the SDK's progress callback under the token the SDK chose;
- `toolgate audit verify` says the audit log is intact.

Prints one JSON summary line on stdout. Exit status: 0 every check held; 1 a check failed (the
reason, the JSON-RPC transcript and the gateway's stderr go to stderr); 2 the check could not run
(bad arguments, SDK missing, binary missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import uuid
from pathlib import Path
from typing import Any

# The SDK's names come through sdk_harness: importing it exits 2 if the SDK is missing.
from sdk_harness import (
    MODES,
    Client,
    StdioServerParameters,
    Transcript,
    anyio,
    check,
    check_negotiation,
    check_tool_list,
    connect,
    executable,
    expect_rpc_error,
    messages,
    run_checks,
    sdk_version,
)

DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "gateway" / "testbed-keys.toml"
# What testbed-keys.toml lets through; the testbed offers more (delete_record, hang, ...).
EXPECTED_TOOLS = {"echo", "write_record", "slow", "crash_after_write"}
BLOCKED_TOOL = "delete_record"
UPSTREAM = "tb"
STATUS = "io.toolgate/status"
SLOW_STEPS = 3


def json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def calls_log(up: Path) -> list[str]:
    path = up / "calls.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def status_of(result: Any) -> Any:
    return (result.meta or {}).get(STATUS)


def text_of(result: Any) -> str | None:
    for block in result.content:
        if getattr(block, "type", None) == "text":
            return block.text
    return None


async def scenario(
    client: Client, mode: str, up: Path, transcript: Transcript, summary: dict[str, Any]
) -> None:
    check_negotiation(client, mode, transcript, summary)
    # tools/list: exactly what the policy names, nothing the testbed offers beyond it.
    summary["tools"] = sorted(await check_tool_list(client, EXPECTED_TOOLS))

    # A low-tier tool runs; non-ASCII on purpose.
    said = f"through the gateway in {mode} mode: café ✓"
    echo = await client.call_tool("echo", {"text": said})
    check(not echo.is_error, f"echo: isError result: {echo.model_dump(by_alias=True)}")
    check(text_of(echo) == f"echo: {said}", f"echo: text is {text_of(echo)!r}, expected 'echo: {said}'")
    check(
        echo.structured_content == {"text": said},
        f"echo: structuredContent is {echo.structured_content!r}, expected {{'text': {said!r}}}",
    )
    summary["echo"] = text_of(echo)

    # A tool the policy does not name: refused as invalid params, and nothing reaches the upstream.
    err = await expect_rpc_error(client, BLOCKED_TOOL, {"id": "nope"})
    summary["blocked_error"] = {"code": err.code, "message": err.message}
    check(BLOCKED_TOOL not in calls_log(up), f"{BLOCKED_TOOL} reached the upstream: calls.log {calls_log(up)}")

    # The same idempotency key twice: one effect, the second answer a marked replay.
    key = f"py-gw-{mode}-{uuid.uuid4().hex[:12]}"
    record = {"id": key, "value": f"written once in {mode} mode"}
    first = await client.call_tool("write_record", record)
    check(not first.is_error, f"write_record (first): isError result: {first.model_dump(by_alias=True)}")
    again = await client.call_tool("write_record", record)
    check(not again.is_error, f"write_record (again): isError result: {again.model_dump(by_alias=True)}")
    check(status_of(again) == "replay", f"write_record (again): _meta[{STATUS!r}] is {status_of(again)!r}, expected 'replay'")
    check(
        status_of(first) != "replay",
        f"write_record (first): marked {status_of(first)!r}, but nothing ran before it",
    )
    check(
        [c.model_dump(by_alias=True) for c in again.content] == [c.model_dump(by_alias=True) for c in first.content],
        f"write_record (again): content differs from the first answer: {again.content} vs {first.content}",
    )
    records = json_lines(up / "records.jsonl")
    check(records == [record], f"records.jsonl holds {records}, expected exactly [{record}]")
    forwarded = calls_log(up).count("write_record")
    check(forwarded == 1, f"write_record reached the upstream {forwarded} times, expected once")
    summary["write_record"] = [status_of(first), status_of(again)]
    summary["records"] = len(records)

    # Progress: the SDK picks the token and routes notifications to the callback by it, so any
    # notification the callback sees came back under the SDK's own token.
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    slow = await client.call_tool("slow", {"ms": 600, "steps": SLOW_STEPS}, progress_callback=on_progress)
    check(not slow.is_error, f"slow: isError result: {slow.model_dump(by_alias=True)}")
    sent = [
        m
        for m in messages(transcript, "->")
        if m.get("method") == "tools/call" and m.get("params", {}).get("name") == "slow"
    ]
    check(len(sent) == 1, f"slow: expected one tools/call on the wire, saw {len(sent)}")
    token = sent[0]["params"].get("_meta", {}).get("progressToken")
    check(token is not None, f"slow: the SDK sent no progressToken: {sent[0]}")
    tokens = {
        json.dumps(m["params"].get("progressToken"))
        for m in messages(transcript, "<-")
        if m.get("method") == "notifications/progress"
    }
    check(tokens <= {json.dumps(token)}, f"progress under other tokens than {token!r}: {sorted(tokens)}")
    # The gateway forwards every step before it forwards the answer (the gateway tests check that
    # order on the wire), and the SDK dispatches in arrival order.
    expected = [(float(step), float(SLOW_STEPS)) for step in range(1, SLOW_STEPS + 1)]
    check(seen == expected, f"slow: the progress callback saw {seen}, expected {expected}")
    summary["progress"] = [p for p, _ in seen]
    summary["progress_token"] = token


def verify_audit(toolgate: str, data: Path, summary: dict[str, Any]) -> None:
    """`toolgate audit verify --json`: exit 0, intact, every record counted; records as expected."""
    audit = data / "audit.jsonl"
    records = json_lines(audit)
    check(records, f"{audit}: no audit record was written")
    out = subprocess.run(
        [toolgate, "audit", "verify", "--json", str(audit)], capture_output=True, text=True, timeout=30
    )
    try:
        report = json.loads(out.stdout)
    except ValueError:
        report = None
    check(
        out.returncode == 0 and isinstance(report, dict) and report.get("intact") is True,
        f"toolgate audit verify: exit {out.returncode}, stdout {out.stdout!r}, stderr {out.stderr!r}",
    )
    check(
        report.get("records") == len(records),
        f"toolgate audit verify counted {report.get('records')} records, the log has {len(records)}",
    )
    calls = [r for r in records if r.get("method") == "tools/call"]
    elsewhere = [r for r in calls if r.get("upstream") != UPSTREAM]
    check(not elsewhere, f"tool-call records without upstream {UPSTREAM!r}: {elsewhere}")
    writes = [r.get("outcome") for r in calls if r.get("name") == "write_record"]
    check(writes == ["committed", "replay"], f"write_record audit outcomes {writes}, expected ['committed', 'replay']")
    blocked = [(r.get("decision"), r.get("outcome")) for r in calls if r.get("name") == BLOCKED_TOOL]
    check(
        blocked == [("deny", "not_executed")],
        f"{BLOCKED_TOOL} audit records {blocked}, expected [('deny', 'not_executed')]",
    )
    summary["audit"] = {"intact": True, "records": len(records)}


def check_policy(policy: Path) -> None:
    """The scenario's expectations are this policy's: fail clearly if the file was changed."""
    raw = tomllib.loads(policy.read_text(encoding="utf-8"))
    check(raw.get("defaults", {}).get("tier") == "blocked", f"{policy}: defaults.tier is not \"blocked\"")
    named = {name for name, rule in raw.get("tools", {}).items() if rule.get("tier") != "blocked"}
    check(named == EXPECTED_TOOLS, f"{policy} lets {sorted(named)} through; this script expects {sorted(EXPECTED_TOOLS)}")
    check(
        raw["tools"]["write_record"].get("idempotency_key") == "id",
        f"{policy}: write_record's idempotency_key is not \"id\"",
    )


async def run(toolgate: str, testbed: str, policy_src: Path, mode: str, work: Path, timeout: float) -> int:
    summary: dict[str, Any] = {"ok": False, "mode": mode, "sdk_version": sdk_version(), "work": str(work)}
    transcript: Transcript = []
    data, up = work / "data", work / "up"
    up.mkdir(parents=True, exist_ok=True)
    # A copy, so the gateway never picks up a lock file someone left beside the shipped policy.
    policy = work / "policy.toml"
    if policy_src.resolve() != policy.resolve():
        shutil.copyfile(policy_src, policy)
    params = StdioServerParameters(
        command=toolgate,
        args=[
            "proxy", "--policy", str(policy), "--data", str(data), "--name", UPSTREAM,
            "--", testbed, "--dir", str(up),
        ],
    )
    # Gateway logs would drown the summary on success; keep them for the failure report.
    with open(work / "proxy.stderr", "w+", encoding="utf-8") as errlog:

        async def checks() -> None:
            check_policy(policy)
            async with connect(params, mode, timeout, errlog, transcript) as client:
                await scenario(client, mode, up, transcript, summary)
            # After the session: the gateway has exited and every record is on disk.
            verify_audit(toolgate, data, summary)

        return await run_checks(checks, mode, timeout, transcript, errlog, summary, peer="toolgate proxy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toolgate", required=True, help="path to the toolgate binary")
    parser.add_argument("--testbed", required=True, help="path to the testbed_upstream example binary")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--policy", default=str(DEFAULT_POLICY), help="the gateway policy (default: %(default)s)")
    parser.add_argument("--work", help="an empty directory for data/, up/ and logs (default: a fresh temp dir)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole scenario")
    args = parser.parse_args()
    if not (executable(args.toolgate, "--toolgate") and executable(args.testbed, "--testbed")):
        return 2
    policy = Path(args.policy)
    if not policy.is_file():
        print(f"--policy {args.policy!r} is not a file", file=sys.stderr)
        return 2
    toolgate, testbed = os.path.abspath(args.toolgate), os.path.abspath(args.testbed)
    if args.work:
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
        return anyio.run(run, toolgate, testbed, policy, args.mode, work, args.timeout)
    with tempfile.TemporaryDirectory(prefix="toolgate-pysdk-gw-") as tmp:
        return anyio.run(run, toolgate, testbed, policy, args.mode, Path(tmp), args.timeout)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drive `toolgate serve` with the official MCP Python SDK (`mcp` 2.x) and check the seed scenario.

The point is a client nobody on this project wrote: if toolgate only agreed with its own
rmcp-based client, a mistake shared by both sides would never show up.

    python3 tests/interop/python_sdk_client.py --toolgate target/debug/toolgate --mode auto

Modes are the SDK's own: `auto` probes server/discover and falls back to initialize, `legacy`
forces the initialize handshake, `2026-07-28` adopts that revision without any handshake.

Prints one JSON summary line on stdout. Exit status: 0 every check held; 1 a check failed
(the reason, the JSON-RPC transcript and the server's stderr go to stderr); 2 the check could
not run (bad arguments, SDK missing, binary missing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
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
    run_checks,
    sdk_version,
)

POLICY = {
    "version": 1,
    "allow": ["write_note", "read_ledger"],
    "deny": ["rm_rf"],
    "arg_rules": {"write_note": {"request_id": {"min_len": 8}, "text": {"max_len": 2000}}},
}
EXPECTED_TOOLS = {"write_note", "read_ledger"}


def structured(result: Any, what: str) -> dict[str, Any]:
    check(not result.is_error, f"{what}: isError result: {result.model_dump(by_alias=True)}")
    content = result.structured_content
    check(isinstance(content, dict), f"{what}: no structuredContent object, got {content!r}")
    return content


async def scenario(client: Client, mode: str, transcript: Transcript, summary: dict[str, Any]) -> None:
    check_negotiation(client, mode, transcript, summary)
    summary["tools"] = await check_tool_list(client, EXPECTED_TOOLS)

    # Unique per run so a reused data directory could not fake a replay; non-ASCII on purpose.
    request_id = f"py-sdk-{mode}-{uuid.uuid4().hex[:12]}"
    text = f"interop from the official Python SDK in {mode} mode: café ✓"
    summary["request_id"] = request_id
    args = {"request_id": request_id, "text": text}

    first = structured(await client.call_tool("write_note", args), "write_note (first)")
    check(first.get("status") == "committed", f"write_note (first): expected status committed, got {first}")
    check(first.get("request_id") == request_id, f"write_note (first): request_id not echoed: {first}")
    again = structured(await client.call_tool("write_note", args), "write_note (again)")
    check(again.get("status") == "replay", f"write_note (again): expected status replay, got {again}")
    summary["write_note"] = [first["status"], again["status"]]

    ledger = structured(await client.call_tool("read_ledger", {}), "read_ledger")
    notes = ledger.get("notes")
    check(isinstance(notes, list), f"read_ledger: notes is not a list: {ledger}")
    ours = [note for note in notes if isinstance(note, dict) and note.get("request_id") == request_id]
    check(len(ours) == 1, f"read_ledger: expected our note exactly once, found {len(ours)} in {notes}")
    check(ours[0] == args, f"read_ledger: note is {ours[0]}, expected {args}")
    # The data directory is fresh, so anything else in the ledger came from this session.
    check(len(notes) == 1, f"read_ledger: expected only our note in a fresh ledger, got {notes}")

    err = await expect_rpc_error(client, "rm_rf", {"path": "/"})
    summary["rm_rf_error"] = {"code": err.code, "message": err.message}


async def run(toolgate: str, mode: str, timeout: float) -> int:
    summary: dict[str, Any] = {"ok": False, "mode": mode, "sdk_version": sdk_version()}
    transcript: Transcript = []
    with tempfile.TemporaryDirectory(prefix="toolgate-pysdk-") as tmp:
        policy = os.path.join(tmp, "policy.json")
        with open(policy, "w", encoding="utf-8") as f:
            json.dump(POLICY, f)
        params = StdioServerParameters(
            command=toolgate,
            args=["serve", "--policy", policy, "--data", os.path.join(tmp, "data")],
        )
        # Server logs would drown the summary on success; keep them for the failure report.
        with open(os.path.join(tmp, "server.stderr"), "w+", encoding="utf-8") as errlog:

            async def checks() -> None:
                async with connect(params, mode, timeout, errlog, transcript) as client:
                    await scenario(client, mode, transcript, summary)

            return await run_checks(checks, mode, timeout, transcript, errlog, summary, peer="toolgate")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toolgate", required=True, help="path to the toolgate binary")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole scenario")
    args = parser.parse_args()
    if not executable(args.toolgate, "--toolgate"):
        return 2
    return anyio.run(run, os.path.abspath(args.toolgate), args.mode, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

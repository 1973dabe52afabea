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
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

try:
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
except ImportError as err:
    print(f"the official Python SDK is missing: pip install 'mcp>=2.1.1' ({err})", file=sys.stderr)
    sys.exit(2)

POLICY = {
    "version": 1,
    "allow": ["write_note", "read_ledger"],
    "deny": ["rm_rf"],
    "arg_rules": {"write_note": {"request_id": {"min_len": 8}, "text": {"max_len": 2000}}},
}
EXPECTED_TOOLS = {"write_note", "read_ledger"}
INVALID_PARAMS = -32602
MODERN = "2026-07-28"
# The handshake-era revisions toolgate accepts on initialize.
LEGACY = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}


class CheckFailed(Exception):
    """A property of toolgate that the Python client observed not to hold."""


def check(cond: bool, message: str) -> None:
    # Not `assert`: `python3 -O` would strip the checks and report success.
    if not cond:
        raise CheckFailed(message)


Transcript = list[tuple[str, str]]


@asynccontextmanager
async def tapped_stdio(
    params: StdioServerParameters, errlog: TextIO, transcript: Transcript
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's own stdio transport with a passive relay that records every message.

    A failed check is only actionable with the exact exchange that led to it; the relay
    forwards each message unchanged, so the SDK sees what it would see without it.
    """
    async with stdio_client(params, errlog=errlog) as (server_read, server_write):
        to_client, client_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        client_write, from_client = anyio.create_memory_object_stream[SessionMessage](0)

        async def upstream() -> None:
            async with from_client, server_write:
                async for msg in from_client:
                    transcript.append(("->", _dump(msg)))
                    await server_write.send(msg)

        async def downstream() -> None:
            async with to_client:
                async for msg in server_read:
                    transcript.append(("<-", _dump(msg)))
                    await to_client.send(msg)

        async with anyio.create_task_group() as tg:
            tg.start_soon(upstream)
            tg.start_soon(downstream)
            try:
                yield client_read, client_write
            finally:
                tg.cancel_scope.cancel()


def _dump(msg: SessionMessage | Exception) -> str:
    if isinstance(msg, Exception):
        return f"<unparseable line: {msg!r}>"
    return msg.message.model_dump_json(by_alias=True, exclude_unset=True)


def answered(transcript: Transcript, method: str) -> bool:
    """Whether a `method` request went out and a success result came back for its id."""
    ids = set()
    for direction, line in transcript:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if direction == "->" and obj.get("method") == method and "id" in obj:
            ids.add(obj["id"])
        elif direction == "<-" and obj.get("id") in ids and "result" in obj:
            return True
    return False


def structured(result: Any, what: str) -> dict[str, Any]:
    check(not result.is_error, f"{what}: isError result: {result.model_dump(by_alias=True)}")
    content = result.structured_content
    check(isinstance(content, dict), f"{what}: no structuredContent object, got {content!r}")
    return content


async def scenario(client: Client, mode: str, transcript: Transcript, summary: dict[str, Any]) -> None:
    version = client.protocol_version
    summary["protocol_version"] = version
    info = client.server_info
    summary["server_info"] = {"name": info.name, "version": info.version} if info else None
    if mode == "legacy":
        check(version in LEGACY, f"legacy mode negotiated {version!r}, expected one of {sorted(LEGACY)}")
        check(answered(transcript, "initialize"), "legacy mode: initialize was not answered with a result")
    else:
        check(version == MODERN, f"{mode} mode negotiated {version!r}, expected {MODERN}")
    if mode == "auto":
        # The SDK falls back to initialize on any discover error, so a broken discover would
        # otherwise pass quietly as a legacy connection.
        check(answered(transcript, "server/discover"), "auto mode: server/discover was not answered with a result")
        check(not answered(transcript, "initialize"), "auto mode fell back to initialize after discover")

    listing = await client.list_tools()
    names = [tool.name for tool in listing.tools]
    summary["tools"] = names
    check(len(names) == len(set(names)), f"tools/list repeats a name: {names}")
    check(set(names) == EXPECTED_TOOLS, f"tools/list gave {sorted(names)}, expected {sorted(EXPECTED_TOOLS)}")
    check(listing.next_cursor is None, f"tools/list paginated unexpectedly: nextCursor={listing.next_cursor!r}")

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

    try:
        result = await client.call_tool("rm_rf", {"path": "/"})
    except MCPError as err:
        check(
            err.code == INVALID_PARAMS,
            f"rm_rf: expected JSON-RPC error {INVALID_PARAMS}, got {err.code} ({err.message})",
        )
        summary["rm_rf_error"] = {"code": err.code, "message": err.message}
    else:
        raise CheckFailed(f"rm_rf: expected JSON-RPC error {INVALID_PARAMS}, got a result: {result.model_dump(by_alias=True)}")


def first_failure(err: BaseException) -> BaseException:
    """The exception worth reporting, dug out of the task groups the SDK nests it in."""
    if isinstance(err, BaseExceptionGroup):
        inner = [first_failure(e) for e in err.exceptions]
        return next((e for e in inner if isinstance(e, CheckFailed)), inner[0])
    return err


async def run(toolgate: str, mode: str, timeout: float) -> int:
    summary: dict[str, Any] = {"ok": False, "mode": mode, "sdk_version": _sdk_version()}
    transcript: Transcript = []
    started = time.monotonic()
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
            failure: BaseException | None = None
            try:
                with anyio.fail_after(timeout):
                    transport = tapped_stdio(params, errlog, transcript)
                    async with Client(transport, mode=mode, read_timeout_seconds=timeout) as client:
                        await scenario(client, mode, transcript, summary)
            except Exception as err:  # whatever went wrong, the report below says so
                failure = first_failure(err)
            summary["elapsed_s"] = round(time.monotonic() - started, 3)
            if failure is None:
                summary["ok"] = True
                print(json.dumps(summary, ensure_ascii=False), flush=True)
                return 0
            if isinstance(failure, TimeoutError):
                message = f"no answer within {timeout}s"
            elif isinstance(failure, MCPError):
                message = f"unexpected JSON-RPC error {failure.code}: {failure.message} (data {failure.data!r})"
            elif isinstance(failure, CheckFailed):
                message = str(failure)
            else:
                message = f"{type(failure).__name__}: {failure}"
            summary["error"] = message
            print(json.dumps(summary, ensure_ascii=False), flush=True)
            errlog.flush()
            errlog.seek(0)
            report(mode, message, transcript, errlog.read())
            return 1


def report(mode: str, message: str, transcript: Transcript, server_stderr: str) -> None:
    out = sys.stderr
    print(f"FAIL [{mode}]: {message}", file=out)
    print("--- JSON-RPC transcript (-> to toolgate, <- from toolgate) ---", file=out)
    for direction, line in transcript:
        print(f"{direction} {line}", file=out)
    print("--- toolgate stderr ---", file=out)
    print(server_stderr.rstrip(), file=out)


def _sdk_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp")
    except PackageNotFoundError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toolgate", required=True, help="path to the toolgate binary")
    parser.add_argument("--mode", required=True, choices=["auto", "legacy", MODERN])
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole scenario")
    args = parser.parse_args()
    if not (os.path.isfile(args.toolgate) and os.access(args.toolgate, os.X_OK)):
        print(f"--toolgate {args.toolgate!r} is not an executable file", file=sys.stderr)
        return 2
    return anyio.run(run, os.path.abspath(args.toolgate), args.mode, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

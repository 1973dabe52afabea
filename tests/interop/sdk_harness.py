"""What the scripts that drive toolgate with the official MCP Python SDK (`mcp` 2.x) share.

python_sdk_client.py (`toolgate serve`), python_sdk_gateway.py (`toolgate proxy`) and
python_sdk_http.py (`serve --http`) import this module from their own directory, which Python puts
first on sys.path when it runs a script. It owns the harness around a scenario: the recorded
transport (stdio, or any transport's streams through `recorded`), the checks every scenario makes
on the negotiated protocol and on tools/list, and the exit protocol (one JSON summary line on
stdout; 0 every check held, 1 a check failed with the reason, the JSON-RPC transcript and the
server's stderr on stderr). It holds no scenario: what is checked stays in each script.

Importing it is how a script learns whether the SDK is there: if it is missing, the import exits
2 ("could not run") with the message the tests look for, before any check can report 1. So the
scripts take the SDK's names from here rather than importing them first themselves.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

try:
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
except ImportError as err:
    print(f"the official Python SDK is missing: pip install mcp==2.3.0 (scripts/test does) ({err})", file=sys.stderr)
    sys.exit(2)

INVALID_PARAMS = -32602
MODERN = "2026-07-28"
# The handshake-era revisions toolgate accepts on initialize.
LEGACY = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}
# The SDK's own modes: `auto` probes server/discover and falls back to initialize, `legacy`
# forces the initialize handshake, `2026-07-28` adopts that revision without any handshake.
MODES = ["auto", "legacy", MODERN]


class CheckFailed(Exception):
    """A property of toolgate (server or gateway) that the Python client observed not to hold."""


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
        async with recorded(server_read, server_write, transcript) as streams:
            yield streams


@asynccontextmanager
async def recorded(
    server_read: Any, server_write: Any, transcript: Transcript
) -> AsyncIterator[tuple[Any, Any]]:
    """A passive relay over a transport's two streams that records every message in `transcript`
    and forwards it unchanged (stdio here, Streamable HTTP in python_sdk_http.py)."""
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
                try:
                    await to_client.send(msg)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    # The client closed while a notification was on its way (a server may log
                    # after its last answer); it is recorded, and nobody is left to read it.
                    return

    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream)
        tg.start_soon(downstream)
        try:
            yield client_read, client_write
        finally:
            tg.cancel_scope.cancel()


def _dump(msg: SessionMessage | Exception) -> str:
    if isinstance(msg, Exception):
        return f"<unreadable message: {msg!r}>"
    return msg.message.model_dump_json(by_alias=True, exclude_unset=True)


@asynccontextmanager
async def connect(
    params: StdioServerParameters,
    mode: str,
    timeout: float,
    errlog: TextIO,
    transcript: Transcript,
    **options: Any,
) -> AsyncIterator[Client]:
    """A client in `mode` over the recorded transport; the whole session must end within `timeout`.
    `options` go to the SDK's `Client` (its sampling, elicitation, roots and logging callbacks)."""
    with anyio.fail_after(timeout):
        transport = tapped_stdio(params, errlog, transcript)
        async with Client(transport, mode=mode, read_timeout_seconds=timeout, **options) as client:
            yield client


def messages(transcript: Transcript, direction: str) -> list[dict[str, Any]]:
    """The JSON messages that went in `direction` ("->" to toolgate, "<-" from it), in order."""
    found = []
    for d, line in transcript:
        if d != direction:
            continue
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def answered(transcript: Transcript, method: str) -> bool:
    """Whether a `method` request went out and a success result came back for its id."""
    ids = {m["id"] for m in messages(transcript, "->") if m.get("method") == method and "id" in m}
    return any(m.get("id") in ids and "result" in m for m in messages(transcript, "<-"))


def check_negotiation(client: Client, mode: str, transcript: Transcript, summary: dict[str, Any]) -> None:
    """The revision `mode` must end in, reached the way `mode` says (read off the wire)."""
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


async def check_tool_list(client: Client, expected: set[str]) -> list[str]:
    """tools/list: exactly `expected`, each once, on one page. Returns the names as listed."""
    listing = await client.list_tools()
    names = [tool.name for tool in listing.tools]
    check(len(names) == len(set(names)), f"tools/list repeats a name: {names}")
    check(set(names) == expected, f"tools/list gave {sorted(names)}, expected {sorted(expected)}")
    check(listing.next_cursor is None, f"tools/list paginated unexpectedly: nextCursor={listing.next_cursor!r}")
    return names


async def expect_rpc_error(client: Client, tool: str, args: dict[str, Any], code: int = INVALID_PARAMS) -> MCPError:
    """Calls `tool`, which must be refused with JSON-RPC error `code` rather than answered."""
    try:
        result = await client.call_tool(tool, args)
    except MCPError as err:
        check(err.code == code, f"{tool}: expected JSON-RPC error {code}, got {err.code} ({err.message})")
        return err
    raise CheckFailed(f"{tool}: expected JSON-RPC error {code}, got a result: {result.model_dump(by_alias=True)}")


def first_failure(err: BaseException) -> BaseException:
    """The exception worth reporting, dug out of the task groups the SDK nests it in."""
    if isinstance(err, BaseExceptionGroup):
        inner = [first_failure(e) for e in err.exceptions]
        return next((e for e in inner if isinstance(e, CheckFailed)), inner[0])
    return err


async def run_checks(
    checks: Callable[[], Awaitable[None]],
    mode: str,
    timeout: float,
    transcript: Transcript,
    errlog: TextIO,
    summary: dict[str, Any],
    *,
    peer: str,
) -> int:
    """Runs `checks`, prints `summary` as one JSON line and returns the exit status (0 or 1).

    On a failure the summary carries the reason in `error`, and stderr gets the reason, the
    transcript and what `peer` (the toolgate command under test) wrote to `errlog`.
    """
    started = time.monotonic()
    failure: BaseException | None = None
    try:
        await checks()
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
    report(peer, mode, message, transcript, errlog.read())
    return 1


def report(peer: str, mode: str, message: str, transcript: Transcript, server_stderr: str) -> None:
    out = sys.stderr
    print(f"FAIL [{mode}]: {message}", file=out)
    print(f"--- JSON-RPC transcript (-> to {peer}, <- from it) ---", file=out)
    for direction, line in transcript:
        print(f"{direction} {line}", file=out)
    print(f"--- {peer} stderr ---", file=out)
    print(server_stderr.rstrip(), file=out)


def sdk_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp")
    except PackageNotFoundError:
        return None


def executable(path: str, flag: str) -> bool:
    """Whether `path` (given as `flag`) is an executable file; says so on stderr when it is not."""
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return True
    print(f"{flag} {path!r} is not an executable file", file=sys.stderr)
    return False

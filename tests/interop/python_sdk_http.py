#!/usr/bin/env python3
"""Drive `toolgate serve --toolset helpdesk --http` with the official MCP Python SDK (`mcp` 2.x)
over Streamable HTTP, with OAuth bearer tokens, and check what each user sees.

The caller starts the server (with its OAuth resource server on) and mints the tokens; this script
is the client side only:

    TOOLGATE_TOKEN_ALICE=... TOOLGATE_TOKEN_BOB=... \\
        python3 tests/interop/python_sdk_http.py --url http://127.0.0.1:PORT/mcp --mode 2026-07-28

Both tokens carry the scope `tickets:read` only, for `user-alice` and `user-bob`. The token goes in
an `Authorization: Bearer` header on every request, through the httpx2 client the SDK's
`streamable_http_client` accepts. Modes are the SDK's own (`auto`, `legacy`, `2026-07-28`), as in
python_sdk_client.py.

Checks: the negotiated revision; a read-only token lists exactly the read tools; `search_tickets`
and `get_ticket` answer alice's tickets only (bob's are "not found", worded as a ticket that does
not exist); the body of T-1001 arrives without its hidden U+202E and inside an
`<untrusted-content>` envelope; the same calls with bob's token see bob's tickets; and a client
without a token gets no answer but an error.

Prints one JSON summary line on stdout. Exit status: 0 every check held; 1 a check failed (the
reason and the JSON-RPC transcript go to stderr); 2 the check could not run (bad arguments, SDK
missing, no tokens).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

# The SDK's names come through sdk_harness: importing it exits 2 if the SDK is missing.
from sdk_harness import (
    MODES,
    CheckFailed,
    Client,
    MCPError,
    Transcript,
    anyio,
    check,
    check_negotiation,
    check_tool_list,
    first_failure,
    recorded,
    run_checks,
    sdk_version,
)

import httpx2
from mcp.client.streamable_http import streamable_http_client

READ_TOOLS = {"search_tickets", "get_ticket"}
RLO = "\u202e"


@asynccontextmanager
async def tapped_http(
    url: str, token: str | None, transcript: Transcript, statuses: list[int] | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's Streamable HTTP transport with the bearer header, and a passive relay that records
    every message (a failed check is only actionable with the exchange that led to it). The HTTP
    status of every response goes to `statuses` (the SDK words an HTTP error its own way)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30.0, read=60.0)

    async def record_status(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    # trust_env=False: no proxy from the environment stands between the SDK and 127.0.0.1.
    async with httpx2.AsyncClient(
        headers=headers, timeout=timeout, trust_env=False, event_hooks={"response": [record_status]}
    ) as http:
        async with streamable_http_client(url, http_client=http) as (server_read, server_write):
            async with recorded(server_read, server_write, transcript) as streams:
                yield streams


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


async def tool_text(client: Client, tool: str, args: dict[str, Any], *, error: bool) -> str:
    result = await client.call_tool(tool, args)
    text = text_of(result)
    check(
        bool(result.is_error) == error,
        f"{tool} {args}: expected isError={error}, got {result.model_dump(by_alias=True)}",
    )
    return text


async def alice_scenario(client: Client, mode: str, transcript: Transcript, summary: dict[str, Any]) -> None:
    check_negotiation(client, mode, transcript, summary)
    summary["tools"] = await check_tool_list(client, READ_TOOLS)

    found = await tool_text(client, "search_tickets", {"query": "login"}, error=False)
    check("T-1001" in found, f"search_tickets login: alice's T-1001 missing: {found!r}")
    check("T-1004" not in found, f"search_tickets login: bob's T-1004 leaked to alice: {found!r}")
    check("<untrusted-content" in found, f"search_tickets: subjects not labelled untrusted: {found!r}")
    summary["alice_search"] = sorted(t for t in ("T-1001", "T-1003", "T-1002", "T-1004") if t in found)

    ticket = await tool_text(client, "get_ticket", {"id": "T-1001"}, error=False)
    check(RLO not in ticket, f"get_ticket T-1001: U+202E came through: {ticket!r}")
    check("<untrusted-content" in ticket, f"get_ticket T-1001: body not in an envelope: {ticket!r}")
    check("I keep getting logged out." in ticket, f"get_ticket T-1001: body missing: {ticket!r}")
    summary["ticket_clean"] = True

    others = await tool_text(client, "get_ticket", {"id": "T-1002"}, error=True)
    missing = await tool_text(client, "get_ticket", {"id": "T-9999"}, error=True)
    check("not found" in others, f"get_ticket T-1002 for alice: {others!r}")
    check(
        others.replace("T-1002", "T-9999") == missing,
        f"another user's ticket answers differently from a missing one: {others!r} vs {missing!r}",
    )
    summary["other_user"] = "not found"

    bad = await tool_text(client, "get_ticket", {"id": "1001; DROP"}, error=True)
    summary["bad_input"] = "isError"
    check("invalid" in bad, f"get_ticket '1001; DROP': {bad!r}")


async def bob_scenario(client: Client) -> list[str]:
    found = await tool_text(client, "search_tickets", {"query": "login"}, error=False)
    check("T-1004" in found and "T-1001" not in found, f"search_tickets login for bob: {found!r}")
    own = await tool_text(client, "get_ticket", {"id": "T-1002"}, error=False)
    check("Invoice copy" in own, f"get_ticket T-1002 for bob: {own!r}")
    await tool_text(client, "get_ticket", {"id": "T-1001"}, error=True)
    return sorted(t for t in ("T-1001", "T-1002", "T-1003", "T-1004") if t in found)


async def anonymous_is_refused(url: str, mode: str, timeout: float) -> dict[str, Any]:
    """A client with no token: whatever it tries first must fail with HTTP 401, not answer."""
    transcript: Transcript = []
    statuses: list[int] = []
    try:
        with anyio.fail_after(timeout):
            async with Client(
                tapped_http(url, None, transcript, statuses), mode=mode, read_timeout_seconds=timeout
            ) as client:
                await client.list_tools()
    except Exception as err:  # the SDK reports an HTTP 401 in more than one way, by mode
        inner = first_failure(err)
        error = f"MCPError {inner.code}: {inner.message}" if isinstance(inner, MCPError) else repr(inner)
        check(401 in statuses, f"no token: expected an HTTP 401, saw statuses {statuses} ({error})")
        check(all(s >= 400 for s in statuses), f"no token: a request succeeded: statuses {statuses}")
        return {"error": error, "http_statuses": statuses}
    raise CheckFailed(f"a client without a token was answered (statuses {statuses})")


async def run(url: str, mode: str, timeout: float) -> int:
    summary: dict[str, Any] = {"ok": False, "mode": mode, "sdk_version": sdk_version()}
    transcript: Transcript = []
    alice = os.environ.get("TOOLGATE_TOKEN_ALICE")
    bob = os.environ.get("TOOLGATE_TOKEN_BOB")
    if not alice or not bob:
        print("TOOLGATE_TOKEN_ALICE and TOOLGATE_TOKEN_BOB must hold bearer tokens", file=sys.stderr)
        return 2
    # The server runs elsewhere; its log is the caller's to show.
    errlog = io.StringIO()

    async def checks() -> None:
        with anyio.fail_after(timeout):
            async with Client(tapped_http(url, alice, transcript), mode=mode, read_timeout_seconds=timeout) as client:
                await alice_scenario(client, mode, transcript, summary)
            async with Client(tapped_http(url, bob, transcript), mode=mode, read_timeout_seconds=timeout) as client:
                summary["bob_search"] = await bob_scenario(client)
        summary["anonymous"] = await anonymous_is_refused(url, mode, timeout)

    return await run_checks(checks, mode, timeout, transcript, errlog, summary, peer="toolgate serve --http")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the MCP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole scenario")
    args = parser.parse_args()
    return anyio.run(run, args.url, args.mode, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

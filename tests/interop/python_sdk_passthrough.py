#!/usr/bin/env python3
"""Everything MCP besides tool results, through `toolgate proxy`, with the official Python SDK.

The gateway sits between the SDK's client (with sampling, elicitation, roots and logging
callbacks) and @modelcontextprotocol/server-everything, an `initialize`-era server that asks its
caller questions in the middle of a call. Each kind the gateway passes is checked from the
client's side and in the audit log:

    python3 tests/interop/python_sdk_passthrough.py --toolgate target/debug/toolgate \\
        --everything .peers/node/node_modules/.bin/mcp-server-everything --mode MODE

or, with `--everything-url URL` instead of `--everything`, in front of an everything server
already serving Streamable HTTP there (`mcp-server-everything streamableHttp`), whose requests
the gateway posts itself (gateway/post.rs) and whose questions arrive on the POST's stream.

Two gateways run, one after the other, with tests/gateway/everything-passthrough.toml and with a
copy of it that adds `sampling = ["ev"]`:
- sampling: refused by default (the gateway does not declare it to the upstream, which then does
  not offer its sampling tool; the callback is never called); passed when the policy names the
  upstream (the model's answer reaches the tool's result, audited allow);
- elicitation and roots: passed by default, the callbacks' answers reach the tool's result;
- resource templates: only those the policy's resource patterns cover are listed;
- completion of a prompt argument and of a template argument: the upstream's values;
- on `initialize` sessions only (2026-07-28 removed them): log messages after
  `logging/setLevel`, and `notifications/resources/updated` after `resources/subscribe`.

With a 2026-07-28 client the upstream's mid-call questions travel as `input_required` results
that the SDK answers and retries; with a legacy client they are requests of the gateway's own.
Prints one JSON summary line on stdout; exit 0 every check held, 1 one failed, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from sdk_harness import (
    MODERN,
    MODES,
    Client,
    StdioServerParameters,
    Transcript,
    anyio,
    check,
    check_negotiation,
    connect,
    executable,
    run_checks,
    sdk_version,
)
import mcp.types as types

POLICY = Path(__file__).resolve().parent.parent / "gateway" / "everything-passthrough.toml"
UPSTREAM = "ev"
MODEL_SAYS = "the caller's model answers 42"
ROOT = "file:///srv/toolgate-passthrough-root"
ELICITED = "toolgate-elicited-value"


class Seen:
    """What the client's callbacks were asked, and the notifications that reached it."""

    def __init__(self) -> None:
        self.sampling = 0
        self.elicitation = 0
        self.roots = 0
        self.logs: list[Any] = []
        self.updated: list[str] = []

    async def on_sampling(self, _ctx: Any, params: Any) -> Any:
        self.sampling += 1
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=MODEL_SAYS), model="test-model"
        )

    async def on_elicitation(self, _ctx: Any, params: Any) -> Any:
        self.elicitation += 1
        # Fill whatever the form asks for, with the same recognisable value for strings.
        schema = getattr(params, "requested_schema", None) or {}
        content: dict[str, Any] = {}
        for name, prop in (schema.get("properties") or {}).items():
            kind = prop.get("type")
            if kind == "string":
                content[name] = prop.get("enum", [ELICITED])[0] if "enum" in prop else ELICITED
            elif kind == "boolean":
                content[name] = True
            elif kind in ("number", "integer"):
                content[name] = 7
        return types.ElicitResult(action="accept", content=content)

    async def on_roots(self, _ctx: Any) -> Any:
        self.roots += 1
        return types.ListRootsResult(roots=[types.Root(uri=ROOT, name="passthrough-root")])

    async def on_log(self, params: Any) -> None:
        self.logs.append(params)

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))


def texts(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def records_for(data: Path, method: str) -> list[tuple[str, str, str, Any]]:
    return [
        (r.get("decision"), r.get("outcome"), r.get("rule"), r.get("upstream"))
        for r in json_lines(data / "audit.jsonl")
        if r.get("method") == method
    ]


async def refused_sampling(client: Client, seen: Seen, summary: dict[str, Any]) -> None:
    """The default policy: the gateway does not tell the upstream it can sample, so this upstream
    does not even offer its sampling tool, and the caller's model is never asked."""
    tools = {t.name for t in (await client.list_tools()).tools}
    check(
        "trigger-sampling-request" not in tools,
        f"the upstream offers its sampling tool although the policy passes no sampling: {sorted(tools)}",
    )
    check("trigger-elicitation-request" in tools, f"the elicitation tool is missing: {sorted(tools)}")
    summary["sampling_refused"] = "not offered"
    check(seen.sampling == 0, f"the sampling callback was called {seen.sampling} times under a policy that refuses it")


async def passthrough(client: Client, mode: str, seen: Seen, summary: dict[str, Any], http: bool) -> None:
    """What passes by default: elicitation, roots, templates, completions (and legacy utilities).

    Over HTTP the everything server asks for roots on its session's own stream, in relation to no
    call (it does not name the request it serves): the gateway cannot tell whose roots it wants,
    so it refuses the question rather than guess, and the tool reports no roots.
    """
    elicited = await client.call_tool("trigger-elicitation-request", {})
    check(not elicited.is_error, f"elicitation: isError result {texts(elicited)!r}")
    check(ELICITED in texts(elicited), f"elicitation: the user's answer is not in the result: {texts(elicited)!r}")
    check(seen.elicitation == 1, f"elicitation: the callback was called {seen.elicitation} times, expected once")

    roots = await client.call_tool("get-roots-list", {})
    if http:
        check(ROOT not in texts(roots), f"roots: an unrelated question was answered: {texts(roots)!r}")
        check(seen.roots == 0, f"roots: the callback was called {seen.roots} times for an unrelated question")
        summary["roots"] = "refused: related to no call"
    else:
        check(ROOT in texts(roots), f"roots: the client's root is not in the result: {texts(roots)!r}")
        check(seen.roots >= 1, "roots: the callback was never called")
        summary["roots"] = "passed"

    templates = await client.list_resource_templates()
    listed = sorted(t.uri_template for t in templates.resource_templates)
    check(
        listed == ["demo://resource/dynamic/text/{resourceId}"],
        f"templates: {listed}, expected only the text template the policy covers",
    )
    summary["templates"] = listed

    prompt = await client.complete(
        types.PromptReference(type="ref/prompt", name="completable-prompt"), {"name": "department", "value": "E"}
    )
    check("Engineering" in prompt.completion.values, f"completion (prompt): {prompt.completion.values}")
    resource = await client.complete(
        types.ResourceTemplateReference(type="ref/resource", uri="demo://resource/dynamic/text/{resourceId}"),
        {"name": "resourceId", "value": "1"},
    )
    check(resource.completion.values, f"completion (template): no values: {resource.completion}")
    summary["completions"] = [prompt.completion.values, resource.completion.values]

    if client.protocol_version == MODERN:
        return
    # logging/setLevel and resources/subscribe exist only on initialize sessions.
    await client.set_logging_level("debug")
    await client.call_tool("toggle-simulated-logging", {})
    uri = "demo://resource/static/document/architecture.md"
    await client.subscribe_resource(uri)
    await client.call_tool("toggle-subscriber-updates", {})
    with anyio.fail_after(20):
        while not (seen.logs and uri in seen.updated):
            await anyio.sleep(0.2)
    await client.call_tool("toggle-simulated-logging", {})
    await client.call_tool("toggle-subscriber-updates", {})
    await client.unsubscribe_resource(uri)
    summary["logs"] = len(seen.logs)
    summary["updated"] = sorted(set(seen.updated))


async def passed_sampling(client: Client, seen: Seen, summary: dict[str, Any]) -> None:
    result = await client.call_tool("trigger-sampling-request", {"prompt": "hello"})
    check(not result.is_error, f"sampling: isError result {texts(result)!r}")
    check(MODEL_SAYS in texts(result), f"sampling: the model's answer is not in the result: {texts(result)!r}")
    check(seen.sampling == 1, f"sampling: the callback was called {seen.sampling} times, expected once")


def gateway(toolgate: str, upstream: list[str], policy: Path, data: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=toolgate,
        args=["proxy", "--policy", str(policy), "--data", str(data), *upstream],
    )


async def run(toolgate: str, upstream: list[str], mode: str, work: Path, timeout: float) -> int:
    http = upstream[0] == "--upstream"
    summary: dict[str, Any] = {"ok": False, "mode": mode, "sdk_version": sdk_version(), "work": str(work)}
    transcript: Transcript = []
    default_policy = work / "policy.toml"
    default_policy.write_text(POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    sampling_policy = work / "policy-sampling.toml"
    text = POLICY.read_text(encoding="utf-8")
    check(re.search(r"^sampling\s*=", text, re.M) is None, f"{POLICY} names sampling; this script expects the default")
    sampling_policy.write_text(
        re.sub(r"^\[passthrough\]$", f'[passthrough]\nsampling = ["{UPSTREAM}"]', text, count=1, flags=re.M)
    )

    with open(work / "proxy.stderr", "w+", encoding="utf-8") as errlog:

        def session(policy: Path, data: Path, seen: Seen) -> Any:
            return connect(
                gateway(toolgate, upstream, policy, data),
                mode,
                timeout,
                errlog,
                transcript,
                sampling_callback=seen.on_sampling,
                elicitation_callback=seen.on_elicitation,
                list_roots_callback=seen.on_roots,
                logging_callback=seen.on_log,
                message_handler=seen.on_message,
            )

        async def checks() -> None:
            first, second = work / "data-default", work / "data-sampling"
            seen = Seen()
            async with session(default_policy, first, seen) as client:
                check_negotiation(client, mode, transcript, summary)
                await refused_sampling(client, seen, summary)
                await passthrough(client, mode, seen, summary, http)
            asked = [("elicitation/create", "passthrough.elicitation")]
            if not http:
                asked.append(("roots/list", "passthrough.roots"))
            for method, rule in asked:
                got = records_for(first, method)
                check(
                    got and all(r == ("allow", "observed", rule, UPSTREAM) for r in got),
                    f"audit of {method}: {got}",
                )
            completions = records_for(first, "completion/complete")
            check(len(completions) == 2 and all(r[0] == "allow" for r in completions), f"audit of completions: {completions}")

            seen = Seen()
            async with session(sampling_policy, second, seen) as client:
                await passed_sampling(client, seen, summary)
            sampling = records_for(second, "sampling/createMessage")
            check(
                sampling == [("allow", "observed", "passthrough.sampling", UPSTREAM)],
                f"audit of the passed sampling request: {sampling}",
            )
            summary["audit"] = "as the policy decided"

        return await run_checks(checks, mode, timeout, transcript, errlog, summary, peer="toolgate proxy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toolgate", required=True, help="path to the toolgate binary")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--everything", help="path to mcp-server-everything, started by the gateway on stdio")
    where.add_argument("--everything-url", help="the URL of an everything server serving Streamable HTTP")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--work", help="an empty directory for data and logs (default: a fresh temp dir)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds for each session")
    args = parser.parse_args()
    if not executable(args.toolgate, "--toolgate"):
        return 2
    if args.everything_url:
        upstream = ["--upstream", f"{UPSTREAM}={args.everything_url}"]
    elif executable(args.everything, "--everything"):
        upstream = ["--name", UPSTREAM, "--", os.path.abspath(args.everything)]
    else:
        return 2
    toolgate = os.path.abspath(args.toolgate)
    if args.work:
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
        return anyio.run(run, toolgate, upstream, args.mode, work, args.timeout)
    with tempfile.TemporaryDirectory(prefix="toolgate-pysdk-pass-") as tmp:
        return anyio.run(run, toolgate, upstream, args.mode, Path(tmp), args.timeout)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A minimal MCP server over Streamable HTTP (legacy session shape) that writes the headers of
every request it receives to a JSON Lines file: the witness that a gateway in front of it never
forwards its own callers' credentials.

    header_recorder.py --port PORT --log FILE

It answers `server/discover` with -32601 (so clients fall back to `initialize`), `initialize`
with a session, `tools/list` with one `echo` tool and `tools/call` by echoing `text`. Standard
library only; it serves until killed.
"""
import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = [{
    "name": "echo",
    "description": "Echo the text back.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def record(self, body: dict | None) -> None:
            entry = {"method": self.command, "headers": {k.lower(): v for k, v in self.headers.items()},
                     "rpc": (body or {}).get("method")}
            with open(args.log, "a", encoding="utf-8") as log:
                log.write(json.dumps(entry) + "\n")

        def reply(self, status: int, payload: dict | None, extra: dict | None = None) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            if payload is not None:
                self.send_header("Content-Type", "application/json")
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.record(None)
            self.reply(405, None, {"Allow": "POST"})

        def do_DELETE(self):  # noqa: N802
            self.record(None)
            self.reply(200, None)

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            self.record(body)
            method, ident = body.get("method"), body.get("id")
            if ident is None:
                self.reply(202, None)
            elif method == "initialize":
                result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                          "serverInfo": {"name": "header-recorder", "version": "0"}}
                self.reply(200, {"jsonrpc": "2.0", "id": ident, "result": result},
                           {"Mcp-Session-Id": "recorder-session"})
            elif method == "tools/list":
                self.reply(200, {"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
            elif method == "tools/call":
                text = (body.get("params", {}).get("arguments") or {}).get("text", "")
                result = {"content": [{"type": "text", "text": text}]}
                self.reply(200, {"jsonrpc": "2.0", "id": ident, "result": result})
            else:
                error = {"code": -32601, "message": f"method not found: {method}"}
                self.reply(200, {"jsonrpc": "2.0", "id": ident, "error": error})

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()

//! The line a session is mostly made of, a plain `tools/call` request, read in one pass.
//!
//! rmcp's decoder for a client message buffers the whole line into serde's generic `Content`
//! tree three times over (the untagged message kinds, the shape check, the method dispatch and
//! `_meta` split out of `params` are each a flatten): about 15% of the server's CPU on a
//! sequential `write_note`. A line of exactly the common shape, the members `jsonrpc`, `id`,
//! `method: "tools/call"` and `params` holding only `name`, `arguments` and `_meta`, each once, is
//! read here straight into the message rmcp would have built, `_meta` in the request's extensions
//! as rmcp puts it. Anything else (another method, another member, a repeated one, a value of the
//! wrong type) is not an error here: the line goes to rmcp's decoder, which decides and words the
//! error exactly as before. So this path never accepts a line rmcp would refuse, and never builds
//! a different message from one it accepts; the tests hold it to that on a corpus of lines.

use std::borrow::Cow;

use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, CallToolRequestParams, ClientJsonRpcMessage,
    ClientRequest, JsonObject, JsonRpcMessage, JsonRpcRequest, JsonRpcVersion2_0, RequestId,
    RequestMetaObject,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[allow(dead_code)] // Read only to check it is "2.0".
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    #[allow(dead_code)] // Read only to check it is "tools/call".
    method: CallToolRequestMethod,
    params: Params,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    name: Cow<'static, str>,
    #[serde(default)]
    arguments: Option<JsonObject>,
    #[serde(rename = "_meta", default)]
    meta: Option<JsonObject>,
}

/// The message for `line` when it is a plain `tools/call` request; `None` sends the line to rmcp.
pub(super) fn read(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    let Line { id, params, .. } = serde_json::from_slice(line).ok()?;
    let mut call = CallToolRequestParams::new(params.name);
    call.arguments = params.arguments;
    let mut request = CallToolRequest::new(call);
    if let Some(meta) = params.meta {
        request.extensions.insert(RequestMetaObject::from(meta));
    }
    Some(JsonRpcMessage::Request(JsonRpcRequest::new(
        id,
        ClientRequest::CallToolRequest(request),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a message is, as far as a handler can tell: its wire form, and the `_meta` a handler
    /// reads from the extensions and from the params.
    fn seen(
        message: &ClientJsonRpcMessage,
    ) -> (serde_json::Value, Option<RequestMetaObject>, bool) {
        let JsonRpcMessage::Request(request) = message else {
            panic!("not a request: {message:?}");
        };
        let ClientRequest::CallToolRequest(call) = &request.request else {
            panic!("not a tools/call: {message:?}");
        };
        (
            serde_json::to_value(message).expect("encode"),
            call.extensions.get::<RequestMetaObject>().cloned(),
            call.params.meta.is_some(),
        )
    }

    #[test]
    fn a_plain_call_is_read_as_rmcp_reads_it() {
        let lines = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_note","arguments":{"request_id":"r-0000001","text":"hi"}}}"#,
            r#"{"id":"a\"b","method":"tools/call","jsonrpc":"2.0","params":{"arguments":{},"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"x","arguments":null}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"p1","k":[1,2]}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"_meta":null,"name":"\u00e9\ud83d\ude00"}}"#,
            r#"{"jsonrpc":"2\u002e0","id":"","method":"tools\/call","params":{"name":"","arguments":{"a":{"b":[{"c":1.5e300}]}}}}"#,
        ];
        for line in lines {
            let fast = read(line.as_bytes()).unwrap_or_else(|| panic!("not read: {line}"));
            let rmcp: ClientJsonRpcMessage = serde_json::from_str(line).expect("rmcp reads it");
            assert_eq!(seen(&fast), seen(&rmcp), "{line}");
        }
    }

    #[test]
    fn any_other_line_is_left_to_rmcp() {
        let lines = [
            // Other methods, kinds and shapes.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            // A stray member rmcp refuses (a request with a result).
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"result":{}}"#,
            // Members of params this path does not build.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","requestState":"s"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{}}}"#,
            // A repeated member: which one wins is rmcp's to say.
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","name":"y"}}"#,
            // Wrong types and values.
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":"m"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[]}"#,
            // Not JSON, or more than one value.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}} {}"#,
        ];
        for line in lines {
            assert!(read(line.as_bytes()).is_none(), "read here: {line}");
        }
    }
}

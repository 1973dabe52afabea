//! Binary content crosses the gateway byte for byte: an image a real upstream returns decodes to
//! the same bytes through `toolgate proxy` as straight from the upstream, and a blob resource it
//! serves still decodes to what the upstream encoded.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Bench, Era, Proxy, peer};

const POLICY: &str = r#"
version = 2
name = "everything-binary"

[defaults]
tier = "blocked"
timeout = "20s"

[tools.get-tiny-image]
tier = "low"

[passthrough]
resources = ["demo://resource/dynamic/blob/*"]
"#;

const ERA: Era = Era::Legacy("2025-11-25");

fn decode(encoded: &Value) -> Vec<u8> {
    let encoded = encoded.as_str().expect("base64 is a string");
    STANDARD
        .decode(encoded)
        .unwrap_or_else(|e| panic!("not valid base64 ({e}): {encoded:.80}"))
}

fn image_digest(reply: &Value) -> String {
    let blocks = reply["result"]["content"].as_array().expect("content");
    let image = blocks
        .iter()
        .find(|b| b["type"] == "image")
        .unwrap_or_else(|| panic!("no image block: {reply}"));
    assert_eq!(image["mimeType"], "image/png", "{image}");
    hex::encode(Sha256::digest(decode(&image["data"])))
}

fn read_blob(proxy: &mut Proxy, uri: &str) -> Vec<u8> {
    let id = proxy.request("resources/read", json!({"uri": uri}));
    let (reply, _) = proxy.answer(id);
    let contents = reply["result"]["contents"]
        .as_array()
        .unwrap_or_else(|| panic!("resources/read: {reply}"));
    decode(&contents[0]["blob"])
}

#[test]
fn an_image_and_a_blob_resource_come_back_byte_for_byte() {
    let bench = Bench::with_policy_text("everything-binary.toml", POLICY);
    let server = peer("node/node_modules/.bin/mcp-server-everything");
    let uri = "demo://resource/dynamic/blob/7";

    let mut direct = Proxy::start(
        std::process::Command::new(&server),
        ERA,
        &bench.path("direct.log"),
    );
    let want_image = image_digest(&direct.call("get-tiny-image", json!({})));
    direct.close();

    let mut proxy = bench.proxy("everything", &[server.display().to_string()], ERA);
    let reply = proxy.call("get-tiny-image", json!({}));
    assert_eq!(
        image_digest(&reply),
        want_image,
        "the image changed: {reply}"
    );
    // The upstream makes this blob from a timestamp, so it is compared with what it encodes.
    let blob = String::from_utf8(read_blob(&mut proxy, uri)).expect("the blob is UTF-8 text");
    assert!(
        blob.starts_with("Resource 7: This is a base64 blob created at "),
        "{blob:?}"
    );
    proxy.close();
    bench.assert_audit_verifies();
}

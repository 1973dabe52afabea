//! What each feature of the library pulls in: built without its default features it is an MCP
//! server on stdio, and its dependency tree holds no HTTP stack (issue 12: a stdio-only kit user
//! does not compile axum, jsonwebtoken, a rate-limiting crate or reqwest). Read from `cargo tree`,
//! the resolver's own answer, for this workspace's lock file.

use std::process::Command;

/// The crates (by name) in the normal dependency tree of `toolgate` with `features`.
fn tree(features: &[&str]) -> Vec<String> {
    let mut command = Command::new(env!("CARGO"));
    command
        .args(["tree", "--package", "toolgate", "--edges", "normal"])
        .args(["--prefix", "none", "--no-default-features"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let output = command.output().expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

const HTTP_STACK: [&str; 7] = [
    "axum",
    "hyper",
    "jsonwebtoken",
    "governor",
    "reqwest",
    "rustls",
    "tower",
];

#[test]
fn without_features_the_library_pulls_in_no_http_stack() {
    let names = tree(&[]);
    assert!(
        names.iter().any(|n| n == "rmcp"),
        "the tree was not read: {names:?}"
    );
    let found: Vec<&str> = HTTP_STACK
        .into_iter()
        .filter(|c| names.iter().any(|n| n == c))
        .collect();
    assert!(found.is_empty(), "a stdio-only build pulls in {found:?}");
}

#[test]
fn each_feature_brings_its_own_stack_and_no_rate_limiting_crate() {
    let http = tree(&["http"]);
    for name in ["axum", "hyper", "jsonwebtoken"] {
        assert!(http.iter().any(|n| n == name), "http lacks {name}");
    }
    let gateway = tree(&["gateway"]);
    assert!(
        gateway.iter().any(|n| n == "reqwest"),
        "gateway lacks reqwest"
    );
    assert!(
        !gateway.iter().any(|n| n == "axum" || n == "jsonwebtoken"),
        "the gateway alone pulls in the HTTP server"
    );
    let all = tree(&["http", "gateway"]);
    assert!(!all.iter().any(|n| n == "governor"), "{all:?}");
}

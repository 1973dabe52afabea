//! `proxy --metrics`: a scrape shows each upstream's connection and the calls forwarded to it,
//! read by the official Prometheus Python client's parser.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Bench, Era, Proxy, assert_ran, testbed, until};
use crate::http::metrics::{parse, sample};

/// `GET /metrics` on a plain socket; the body.
fn scrape(address: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect to the metrics listener");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[test]
fn a_proxy_scrape_shows_its_upstream_connected_and_the_calls_it_forwarded() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let log = bench.log_path();
    let flags = ["--name", "tb", "--metrics", "127.0.0.1:0"].map(str::to_owned);
    let command = bench.proxy_command(&flags, &testbed(&up, "both"));
    let mut proxy = Proxy::start(command, Era::Modern, &log);
    let mut address = None;
    until(
        "the metrics address in the log",
        Duration::from_secs(10),
        || {
            address = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|line| line["fields"]["message"] == "toolgate serving metrics")
                .and_then(|line| line["fields"]["address"].as_str().map(str::to_owned));
            address.is_some()
        },
    );
    let address = address.expect("logged");

    assert_ran(&proxy.call("echo", json!({"text": "counted"})), "counted");
    let body = scrape(&address);
    let samples = parse(&body);
    assert_eq!(
        sample(&samples, "toolgate_upstream_up", &json!({"upstream": "tb"})),
        Some(1.0),
        "{body}"
    );
    let echoed: f64 = samples
        .iter()
        .filter(|s| s["name"] == "toolgate_calls_total" && s["labels"]["tool"] == "echo")
        .filter_map(|s| s["value"].as_f64())
        .sum();
    assert!((echoed - 1.0).abs() < f64::EPSILON, "{body}");
    drop(proxy);
}

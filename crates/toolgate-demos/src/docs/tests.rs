//! Unit tests of the docs toolset: the guard as tables (addresses, URLs, the escape's two keys),
//! then `fetch_doc` against real sockets on 127.0.0.1. Nothing leaves the machine: names resolve
//! through an injected resolver or the escape's pins, and the one real lookup is `localhost`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::guard::{Cidr, Guard, Resolver, non_public};
use super::{Docs, MAX_REDIRECTS, TestEscape};
use crate::Options;
use toolgate::toolset::{CallError, Toolset};

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP address in a test table")
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|&s| s.to_owned()).collect()
}

/// A resolver that answers from `table` and fails for any other name; it counts its lookups.
fn table_resolver(table: &[(&str, &[&str])]) -> (Resolver, Arc<AtomicUsize>) {
    let table: HashMap<String, Vec<IpAddr>> = table
        .iter()
        .map(|(name, addrs)| ((*name).to_owned(), addrs.iter().map(|a| ip(a)).collect()))
        .collect();
    let lookups = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&lookups);
    let resolver = Resolver::from_fn(move |host, _port| {
        counter.fetch_add(1, Ordering::SeqCst);
        let answer = table.get(&host).cloned().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such host (test table)")
        });
        Box::pin(std::future::ready(answer))
    });
    (resolver, lookups)
}

// ---------------------------------------------------------------------------------------------
// The address table

#[test]
fn every_special_purpose_range_is_refused_and_public_addresses_pass() {
    let rows: &[(&str, Option<&str>)] = &[
        // IPv4
        ("0.0.0.0", Some("unspecified")),
        ("0.1.2.3", Some("\"this network\" 0.0.0.0/8")),
        ("10.0.0.1", Some("private 10.0.0.0/8")),
        ("10.255.255.255", Some("private 10.0.0.0/8")),
        (
            "100.64.0.1",
            Some("shared address space (CGNAT) 100.64.0.0/10"),
        ),
        (
            "100.127.255.254",
            Some("shared address space (CGNAT) 100.64.0.0/10"),
        ),
        ("100.128.0.1", None),
        ("127.0.0.1", Some("loopback")),
        ("127.255.255.254", Some("loopback")),
        (
            "169.254.169.254",
            Some("link-local, cloud metadata service"),
        ),
        ("169.254.1.1", Some("link-local 169.254.0.0/16")),
        ("172.16.0.1", Some("private 172.16.0.0/12")),
        ("172.31.255.255", Some("private 172.16.0.0/12")),
        ("172.32.0.1", None),
        ("192.0.0.8", Some("IETF protocol assignments 192.0.0.0/24")),
        ("192.0.2.1", Some("documentation 192.0.2.0/24")),
        ("192.88.99.1", Some("6to4 relay anycast 192.88.99.0/24")),
        ("192.168.1.1", Some("private 192.168.0.0/16")),
        ("198.18.0.1", Some("benchmarking 198.18.0.0/15")),
        ("198.19.255.255", Some("benchmarking 198.18.0.0/15")),
        ("198.20.0.1", None),
        ("198.51.100.7", Some("documentation 198.51.100.0/24")),
        ("203.0.113.9", Some("documentation 203.0.113.0/24")),
        ("224.0.0.1", Some("multicast 224.0.0.0/4")),
        ("239.255.255.250", Some("multicast 224.0.0.0/4")),
        ("240.0.0.1", Some("reserved 240.0.0.0/4")),
        ("255.255.255.254", Some("reserved 240.0.0.0/4")),
        ("255.255.255.255", Some("broadcast")),
        ("8.8.8.8", None),
        ("151.101.0.223", None),
        // IPv6
        ("::", Some("unspecified")),
        ("::1", Some("loopback")),
        ("::ffff:127.0.0.1", Some("IPv4-mapped 127.0.0.1: loopback")),
        (
            "::ffff:10.0.0.1",
            Some("IPv4-mapped 10.0.0.1: private 10.0.0.0/8"),
        ),
        (
            "::ffff:169.254.169.254",
            Some("IPv4-mapped 169.254.169.254: link-local, cloud metadata service"),
        ),
        ("::ffff:8.8.8.8", None),
        ("::127.0.0.1", Some("IPv4-compatible ::/96 (deprecated)")),
        ("::8.8.8.8", Some("IPv4-compatible ::/96 (deprecated)")),
        ("64:ff9b::7f00:1", Some("NAT64 127.0.0.1: loopback")),
        (
            "64:ff9b::a9fe:a9fe",
            Some("NAT64 169.254.169.254: link-local, cloud metadata service"),
        ),
        ("64:ff9b::808:808", None),
        ("64:ff9b:1::808:808", Some("local-use NAT64 64:ff9b:1::/48")),
        ("100::1", Some("discard-only 100::/64")),
        ("2001::1", Some("Teredo 2001::/32")),
        (
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            Some("Teredo 2001::/32"),
        ),
        ("2001:2::1", Some("benchmarking 2001:2::/48")),
        ("2001:10::1", Some("IETF protocol assignments 2001::/23")),
        ("2001:db8::1", Some("documentation 2001:db8::/32")),
        ("2002:7f00:1::1", Some("6to4 127.0.0.1: loopback")),
        (
            "2002:a9fe:a9fe::1",
            Some("6to4 169.254.169.254: link-local, cloud metadata service"),
        ),
        ("2002:808:808::1", None),
        ("3fff::1", Some("documentation 3fff::/20")),
        ("fc00::1", Some("unique local fc00::/7")),
        ("fd12:3456::1", Some("unique local fc00::/7")),
        ("fe80::1", Some("link-local fe80::/10")),
        ("febf::1", Some("link-local fe80::/10")),
        ("fec0::1", Some("site-local fec0::/10 (deprecated)")),
        ("ff02::1", Some("multicast ff00::/8")),
        (
            "4000::1",
            Some("reserved (outside global unicast 2000::/3)"),
        ),
        (
            "5f00::1",
            Some("reserved (outside global unicast 2000::/3)"),
        ),
        ("2606:4700::1111", None),
        ("2a00:1450:4001::200e", None),
    ];
    for &(addr, expected) in rows {
        let got = non_public(ip(addr)).map(|range| range.to_string());
        assert_eq!(got.as_deref(), expected, "{addr}");
    }
}

#[test]
fn cidr_parses_and_matches() {
    let net = Cidr::parse("10.0.0.0/8").expect("valid");
    assert!(net.contains(ip("10.200.1.1")));
    assert!(!net.contains(ip("11.0.0.1")));
    assert!(!net.contains(ip("::ffff:10.0.0.1")), "families never mix");
    let one = Cidr::parse("127.0.0.1").expect("valid");
    assert!(one.contains(ip("127.0.0.1")));
    assert!(!one.contains(ip("127.0.0.2")));
    assert!(Cidr::parse("::1").expect("valid").contains(ip("::1")));
    assert!(
        Cidr::parse("0.0.0.0/0")
            .expect("valid")
            .contains(ip("8.8.8.8"))
    );
    assert!(
        Cidr::parse("::/0")
            .expect("valid")
            .contains(ip("2001:db8::1"))
    );
    for bad in ["10.0.0.0/33", "::/129", "abc", "1.2.3.4/x", "", "1.2.3.4/"] {
        assert!(Cidr::parse(bad).is_none(), "{bad}");
    }
}

// ---------------------------------------------------------------------------------------------
// The URL table

/// Allow-listed on purpose, so the address check, not the allow-list, is what refuses them.
const TABLE_HOSTS: &[&str] = &[
    "docs.python.org",
    "developer.mozilla.org",
    "developer.mozilla.org:8443",
    "localhost",
    "127.0.0.1",
    "127.0.0.1:8443",
    "::1",
    "::ffff:127.0.0.1",
    "169.254.169.254",
    "0.0.0.0",
    "10.1.2.3",
    "rebind.test",
    "metadata.test",
    "mapped.test",
    "nat64.test",
    "gone.test",
    "empty.test",
];

const TABLE_DNS: &[(&str, &[&str])] = &[
    ("docs.python.org", &["151.101.0.223", "2a04:4e42::223"]),
    ("developer.mozilla.org", &["34.111.97.67"]),
    ("localhost", &["127.0.0.1", "::1"]),
    // A rebinding or split answer: one public address and one private is still refused.
    ("rebind.test", &["93.184.216.34", "10.0.0.5"]),
    ("metadata.test", &["169.254.169.254"]),
    ("mapped.test", &["::ffff:192.168.0.1"]),
    ("nat64.test", &["64:ff9b::a9fe:a9fe"]),
    ("empty.test", &[]),
];

#[tokio::test]
async fn hostile_urls_are_refused_with_their_reason() {
    let guard = Guard::new(&strings(TABLE_HOSTS), None).expect("valid allow-list");
    let (resolver, _) = table_resolver(TABLE_DNS);
    let loopback = "127.0.0.1 is a non-public address (loopback)";
    let metadata = "169.254.169.254 is a non-public address (link-local, cloud metadata service)";
    let rows: &[(&str, &str)] = &[
        // The seed's own table.
        (
            "http://docs.python.org/",
            "only https URLs are fetched, not http",
        ),
        ("https://169.254.169.254/latest/meta-data", metadata),
        (
            "https://localhost/admin",
            "localhost resolves to a non-public address 127.0.0.1 (loopback)",
        ),
        (
            "https://user:pw@docs.python.org/",
            "the URL carries user info (credentials)",
        ),
        (
            "file:///etc/passwd",
            "only https URLs are fetched, not file",
        ),
        // Form.
        (
            "ftp://docs.python.org/",
            "only https URLs are fetched, not ftp",
        ),
        (
            "HTTP://docs.python.org/",
            "only https URLs are fetched, not http",
        ),
        (
            "https://user@docs.python.org/",
            "the URL carries user info (credentials)",
        ),
        (
            "https://:pw@docs.python.org/",
            "the URL carries user info (credentials)",
        ),
        (
            "https://docs.python.org@evil.test/",
            "the URL carries user info (credentials)",
        ),
        (
            "docs.python.org/3/",
            "not a valid URL: relative URL without a base",
        ),
        ("https://", "not a valid URL: empty host"),
        (
            "https://exa mple.org/",
            "not a valid URL: invalid international domain name",
        ),
        // The allow-list.
        ("https://evil.test/", "host not allow-listed: evil.test"),
        (
            "https://docs.python.org.evil.test/",
            "host not allow-listed: docs.python.org.evil.test",
        ),
        (
            "https://evil.test#@docs.python.org/",
            "host not allow-listed: evil.test",
        ),
        (
            "https://evil.test\\@docs.python.org/",
            "host not allow-listed: evil.test",
        ),
        (
            "https://docs.python.org./",
            "host not allow-listed: docs.python.org.",
        ),
        ("https://python.org/", "host not allow-listed: python.org"),
        // Only 443, unless an entry names the port.
        (
            "https://docs.python.org:8443/",
            "port 8443 is not allow-listed for docs.python.org (only 443, unless an entry names \
             the port)",
        ),
        (
            "https://docs.python.org:22/",
            "port 22 is not allow-listed for docs.python.org (only 443, unless an entry names the \
             port)",
        ),
        (
            "https://developer.mozilla.org:8080/",
            "port 8080 is not allow-listed for developer.mozilla.org (only 443, unless an entry \
             names the port)",
        ),
        (
            "https://localhost:8443/",
            "port 8443 is not allow-listed for localhost (only 443, unless an entry names the \
             port)",
        ),
        // A Cyrillic "о" is another host once IDNA has turned it into punycode.
        (
            "https://d\u{43e}cs.python.org/",
            "host not allow-listed: xn--dcs-sed.python.org",
        ),
        ("https://8.8.8.8/", "host not allow-listed: 8.8.8.8"),
        (
            "https://[2606:4700::1111]/",
            "host not allow-listed: [2606:4700::1111]",
        ),
        // Every spelling of 127.0.0.1 is normalised before the check sees it.
        ("https://127.0.0.1/", loopback),
        ("https://2130706433/", loopback),
        ("https://0177.0.0.1/", loopback),
        ("https://017700000001/", loopback),
        ("https://0x7f.0.0.1/", loopback),
        ("https://0x7f000001/", loopback),
        ("https://0x7f.1/", loopback),
        ("https://127.1/", loopback),
        ("https://127.0.1/", loopback),
        ("https://127.0.0.%31/", loopback),
        ("https://127.0.0.1:8443/", loopback),
        (
            "https://[::ffff:127.0.0.1]/",
            "::ffff:127.0.0.1 is a non-public address (IPv4-mapped 127.0.0.1: loopback)",
        ),
        (
            "https://[::ffff:7f00:1]/",
            "::ffff:127.0.0.1 is a non-public address (IPv4-mapped 127.0.0.1: loopback)",
        ),
        ("https://[::1]/", "::1 is a non-public address (loopback)"),
        (
            "https://[0:0:0:0:0:0:0:1]/",
            "::1 is a non-public address (loopback)",
        ),
        // And of 169.254.169.254.
        ("https://2852039166/", metadata),
        ("https://0xa9fea9fe/", metadata),
        ("https://0251.0376.0251.0376/", metadata),
        (
            "https://0.0.0.0/",
            "0.0.0.0 is a non-public address (unspecified)",
        ),
        (
            "https://0/",
            "0.0.0.0 is a non-public address (unspecified)",
        ),
        (
            "https://10.1.2.3/",
            "10.1.2.3 is a non-public address (private 10.0.0.0/8)",
        ),
        // Names: every address is checked, one bad one refuses.
        ("https://LOCALHOST./x", "host not allow-listed: localhost."),
        (
            "https://LocalHost/x",
            "localhost resolves to a non-public address 127.0.0.1 (loopback)",
        ),
        (
            "https://rebind.test/",
            "rebind.test resolves to a non-public address 10.0.0.5 (private 10.0.0.0/8)",
        ),
        (
            "https://metadata.test/",
            "metadata.test resolves to a non-public address 169.254.169.254 (link-local, cloud \
             metadata service)",
        ),
        (
            "https://mapped.test/",
            "mapped.test resolves to a non-public address ::ffff:192.168.0.1 (IPv4-mapped \
             192.168.0.1: private 192.168.0.0/16)",
        ),
        (
            "https://nat64.test/",
            "nat64.test resolves to a non-public address 64:ff9b::a9fe:a9fe (NAT64 \
             169.254.169.254: link-local, cloud metadata service)",
        ),
        (
            "https://gone.test/",
            "gone.test could not be resolved: no such host (test table)",
        ),
        ("https://empty.test/", "empty.test resolves to no address"),
    ];
    for &(url, expected) in rows {
        match guard.check(url, &resolver).await {
            Ok(target) => panic!("{url}: expected a refusal, got {target:?}"),
            Err(refusal) => assert_eq!(refusal.to_string(), expected, "{url}"),
        }
    }
}

#[tokio::test]
async fn allowed_urls_pass_with_the_addresses_that_were_checked() {
    let guard = Guard::new(&strings(TABLE_HOSTS), None).expect("valid allow-list");
    let (resolver, lookups) = table_resolver(TABLE_DNS);
    let target = guard
        .check("https://DOCS.Python.org/3/library/", &resolver)
        .await
        .expect("allowed");
    assert_eq!(target.url.as_str(), "https://docs.python.org/3/library/");
    assert_eq!(target.domain.as_deref(), Some("docs.python.org"));
    let expected: Vec<SocketAddr> = vec![
        "151.101.0.223:443".parse().expect("addr"),
        "[2a04:4e42::223]:443".parse().expect("addr"),
    ];
    assert_eq!(target.addrs, expected);
    let target = guard
        .check("https://developer.mozilla.org:8443/en-US/", &resolver)
        .await
        .expect("a port its entry names");
    assert_eq!(
        target.addrs,
        vec!["34.111.97.67:8443".parse::<SocketAddr>().expect("addr")]
    );
    let target = guard
        .check("https://docs.python.org:443/", &resolver)
        .await
        .expect("443 spelt out");
    assert_eq!(target.url.as_str(), "https://docs.python.org/");
    assert_eq!(lookups.load(Ordering::SeqCst), 3, "one lookup per check");
}

#[tokio::test]
async fn the_form_and_allow_list_are_checked_before_any_lookup() {
    let guard = Guard::new(&strings(TABLE_HOSTS), None).expect("valid allow-list");
    let (resolver, lookups) = table_resolver(TABLE_DNS);
    for url in [
        "http://localhost/",
        "https://u@localhost/",
        "https://evil.test/",
        "https://localhost:8443/",
        "https://127.0.0.1/",
    ] {
        assert!(guard.check(url, &resolver).await.is_err(), "{url}");
    }
    assert_eq!(lookups.load(Ordering::SeqCst), 0);
}

#[test]
fn allow_list_entries_are_hosts_with_an_optional_port_normalised_like_urls() {
    for bad in [
        "docs.python.org/3/",
        "docs.python.org:https",
        "docs.python.org:65536",
        "user@docs.python.org",
        "https://docs.python.org",
        "",
        "exa mple.org",
    ] {
        let error = Guard::new(&strings(&[bad]), None).expect_err(bad);
        assert_eq!(
            error.to_string(),
            format!(
                "allow-listed host {bad:?} is not a host name or IP address, with an optional :port"
            )
        );
    }
    let guard = Guard::new(
        &strings(&[
            "DOCS.Python.ORG",
            "2130706433",
            "::FFFF:7f00:1",
            "docs.rs:8443",
            "[2001:db8::1]:8443",
            "example.org:443",
        ]),
        None,
    )
    .expect("valid");
    assert!(guard.check_url("https://docs.python.org/").is_ok());
    assert!(
        guard.check_url("https://127.0.0.1/").is_ok(),
        "2130706433 is 127.0.0.1"
    );
    assert!(guard.check_url("https://[::ffff:127.0.0.1]/").is_ok());
    // An entry with a port opens that port only; 443 spelt out is the bare name.
    assert!(guard.check_url("https://docs.rs:8443/").is_ok());
    assert!(guard.check_url("https://docs.rs/").is_err());
    assert!(guard.check_url("https://[2001:db8::1]:8443/").is_ok());
    assert!(guard.check_url("https://[2001:db8::1]/").is_err());
    assert!(guard.check_url("https://example.org/").is_ok());
    assert!(guard.check_url("https://example.org:8443/").is_err());
}

// ---------------------------------------------------------------------------------------------
// The escape: two keys

fn escape_for(addr: &str, trusted: &str) -> TestEscape {
    TestEscape::dangerously_allow_private_addresses_for_tests()
        .with_pinned_host("docs.test", ip(addr))
        .with_trusted_network(trusted)
        .expect("valid network")
}

#[tokio::test]
async fn the_escape_opens_a_pinned_host_in_a_trusted_network_and_nothing_else() {
    let hosts = strings(&[
        "docs.test",
        "docs.test:4443",
        "127.0.0.1",
        "rebind.test",
        "localhost",
    ]);
    let (resolver, lookups) = table_resolver(&[
        ("rebind.test", &["127.0.0.1"]),
        ("localhost", &["127.0.0.1"]),
    ]);

    // Both keys: pinned and trusted. No DNS is asked.
    let guard = Guard::new(&hosts, Some(&escape_for("127.0.0.1", "127.0.0.1/32"))).expect("valid");
    let target = guard
        .check("https://docs.test:4443/", &resolver)
        .await
        .expect("opened");
    assert_eq!(
        target.addrs,
        vec!["127.0.0.1:4443".parse::<SocketAddr>().expect("addr")]
    );
    assert_eq!(lookups.load(Ordering::SeqCst), 0);

    // The trusted network does not open an IP literal, nor a name that DNS puts there.
    let refusals = [
        (
            "https://127.0.0.1/",
            "127.0.0.1 is a non-public address (loopback)",
        ),
        (
            "https://rebind.test/",
            "rebind.test resolves to a non-public address 127.0.0.1 (loopback)",
        ),
        (
            "https://localhost/",
            "localhost resolves to a non-public address 127.0.0.1 (loopback)",
        ),
    ];
    for (url, expected) in refusals {
        let refusal = guard.check(url, &resolver).await.expect_err(url);
        assert_eq!(refusal.to_string(), expected);
    }

    // Pinned alone is not enough: the address must be in a trusted network.
    let guard =
        Guard::new(&hosts, Some(&escape_for("169.254.169.254", "127.0.0.0/8"))).expect("valid");
    let refusal = guard
        .check("https://docs.test/", &resolver)
        .await
        .expect_err("untrusted");
    assert_eq!(
        refusal.to_string(),
        "docs.test resolves to a non-public address 169.254.169.254 (link-local, cloud metadata \
         service)"
    );
    let escape = TestEscape::dangerously_allow_private_addresses_for_tests()
        .with_pinned_host("docs.test", ip("127.0.0.1"));
    let guard = Guard::new(&hosts, Some(&escape)).expect("valid");
    assert!(guard.check("https://docs.test/", &resolver).await.is_err());

    // A pinned host must be allow-listed, and a network must parse.
    let error = Guard::new(&strings(&["docs.python.org"]), Some(&escape)).expect_err("not listed");
    assert_eq!(
        error.to_string(),
        "pinned host \"docs.test\" is not on the allow-list"
    );
    assert!(
        TestEscape::dangerously_allow_private_addresses_for_tests()
            .with_trusted_network("localhost")
            .is_err()
    );
    assert!(
        TestEscape::dangerously_allow_private_addresses_for_tests()
            .with_root_certificate_pem("not a certificate")
            .is_err()
    );
}

// ---------------------------------------------------------------------------------------------
// The toolset

fn args(url: &str, max_chars: Option<u64>) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("url".to_owned(), json!(url));
    if let Some(max) = max_chars {
        map.insert("max_chars".to_owned(), json!(max));
    }
    map
}

/// The reason `fetch_doc` gave, which must be a failure.
async fn failure(docs: &Docs, arguments: Map<String, Value>) -> String {
    match docs.fetch_doc(arguments.clone()).await {
        Err(CallError::Failed(why)) => why,
        other => panic!("{arguments:?}: expected a failure, got {other:?}"),
    }
}

/// The text `fetch_doc` returned, which must be a success with one text block.
async fn text(docs: &Docs, arguments: Map<String, Value>) -> String {
    match docs.fetch_doc(arguments.clone()).await {
        Ok(result) => {
            assert_ne!(result.is_error, Some(true));
            assert_eq!(result.content.len(), 1);
            result.content[0]
                .as_text()
                .expect("a text block")
                .text
                .clone()
        }
        Err(error) => panic!("{arguments:?}: expected the page, got {error:?}"),
    }
}

#[test]
fn the_tool_is_strict_read_only_open_world_and_says_its_output_is_untrusted() {
    let docs = Docs::new(&[]).expect("defaults");
    let catalog = docs.catalog();
    assert_eq!(catalog.tools().len(), 1);
    let tool = serde_json::to_value(&catalog.tools()[0]).expect("serialises");
    assert_eq!(tool["name"], "fetch_doc");
    assert!(
        tool["description"]
            .as_str()
            .expect("text")
            .contains("untrusted third-party content")
    );
    assert_eq!(tool["annotations"]["readOnlyHint"], true);
    assert_eq!(tool["annotations"]["openWorldHint"], true);
    let schema = &tool["inputSchema"];
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["required"], json!(["url"]));
    assert_eq!(schema["properties"]["url"]["maxLength"], 500);
    assert_eq!(schema["properties"]["max_chars"]["minimum"], 100);
    assert_eq!(schema["properties"]["max_chars"]["maximum"], 8000);
    assert_eq!(schema["properties"]["max_chars"]["default"], 4000);
    let url = schema["properties"]["url"]["description"]
        .as_str()
        .expect("text");
    assert!(
        url.contains("docs.python.org, developer.mozilla.org"),
        "{url}"
    );
}

#[test]
fn by_name_builds_docs_from_options_and_refuses_a_bad_allow_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = super::super::by_name("docs", dir.path(), &Options::default()).expect("built");
    assert!(docs.catalog().has("fetch_doc"));
    let bad = Options {
        docs_hosts: strings(&["docs.python.org/3/"]),
        ..Options::default()
    };
    let error = super::super::by_name("docs", dir.path(), &bad)
        .expect_err("bad host")
        .to_string();
    assert!(
        error.starts_with("docs toolset: allow-listed host"),
        "{error}"
    );
    let error = super::super::by_name("nope", dir.path(), &Options::default())
        .expect_err("unknown")
        .to_string();
    assert!(error.contains("docs"), "{error}");
}

#[tokio::test]
async fn arguments_are_checked_again_by_the_handler() {
    let docs = Docs::new(&[]).expect("defaults");
    let long = format!("https://docs.python.org/{}", "a".repeat(500));
    assert_eq!(
        failure(&docs, args(&long, None)).await,
        "invalid arguments: url is longer than 500 characters"
    );
    for max in [0, 99, 8001] {
        assert_eq!(
            failure(&docs, args("https://docs.python.org/", Some(max))).await,
            "invalid arguments: max_chars must be between 100 and 8000"
        );
    }
    let mut extra = args("https://docs.python.org/", None);
    extra.insert("proxy".to_owned(), json!("http://evil.test"));
    assert!(
        failure(&docs, extra)
            .await
            .starts_with("invalid arguments: unknown field `proxy`")
    );
    assert_eq!(
        failure(&docs, args("https://evil.test/", None)).await,
        "refused: host not allow-listed: evil.test"
    );
}

/// A TCP listener on 127.0.0.1 that counts the connections it accepts.
struct Counter {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Counter {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { port, accepted }
    }

    /// Asserts that nothing connected, then that the listener does count (so 0 meant something).
    async fn assert_untouched(&self) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            self.accepted.load(Ordering::SeqCst),
            0,
            "a connection reached the listener"
        );
        drop(
            TcpStream::connect(("127.0.0.1", self.port))
                .await
                .expect("connect"),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.accepted.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the listener does not count");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn loopback_in_any_spelling_is_refused_before_a_connection() {
    let listener = Counter::start().await;
    let port = listener.port;
    // Every host is allow-listed on the listener's port, so the address check is what refuses.
    let hosts: Vec<String> = [
        "localhost",
        "127.0.0.1",
        "[::ffff:127.0.0.1]",
        "[::1]",
        "127.0.0.2",
    ]
    .iter()
    .map(|host| format!("{host}:{port}"))
    .collect();
    let docs = Docs::new(&hosts).expect("valid");
    let loopback = "refused: 127.0.0.1 is a non-public address (loopback)";
    let mapped =
        "refused: ::ffff:127.0.0.1 is a non-public address (IPv4-mapped 127.0.0.1: loopback)";
    let rows = [
        (format!("https://127.0.0.1:{port}/"), loopback),
        (format!("https://2130706433:{port}/"), loopback),
        (format!("https://0x7f.1:{port}/"), loopback),
        (format!("https://0x7f.0.0.1:{port}/"), loopback),
        (format!("https://0177.0.0.1:{port}/"), loopback),
        (format!("https://127.1:{port}/"), loopback),
        (format!("https://[::ffff:127.0.0.1]:{port}/"), mapped),
        (format!("https://[::ffff:7f00:1]:{port}/"), mapped),
        (
            format!("https://[::1]:{port}/"),
            "refused: ::1 is a non-public address (loopback)",
        ),
        (
            format!("https://127.0.0.2:{port}/"),
            "refused: 127.0.0.2 is a non-public address (loopback)",
        ),
    ];
    for (url, expected) in &rows {
        assert_eq!(&failure(&docs, args(url, None)).await, expected, "{url}");
    }
    // The one real lookup: the system resolver's answer for localhost is checked too.
    let why = failure(&docs, args(&format!("https://localhost:{port}/"), None)).await;
    assert!(
        why.starts_with("refused: localhost resolves to a non-public address"),
        "{why}"
    );
    listener.assert_untouched().await;
}

// ---------------------------------------------------------------------------------------------
// End to end against a local TLS server

/// What the test site answers for a request target.
enum Reply {
    Page(&'static str, String),
    Redirect(String),
    Status(&'static str),
    /// A body far larger than any cap, written until the client goes away.
    Endless,
    /// Accepts and never answers.
    Hang,
}

const ENDLESS_BYTES: usize = 64 << 20;

fn routes(target: &str) -> Reply {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/page" => Reply::Page("text/html; charset=utf-8", "<h1>asyncio</h1>".to_owned()),
        "/long" => Reply::Page("text/plain; charset=utf-8", "é".repeat(10_000)),
        "/a" => Reply::Redirect("/b".to_owned()),
        "/b" => Reply::Page("text/plain", "arrived after a redirect".to_owned()),
        "/to" => Reply::Redirect(query.to_owned()),
        "/img" => Reply::Page("image/png", "\u{89}PNG".to_owned()),
        "/untyped" => Reply::Page("", "no type".to_owned()),
        "/endless" => Reply::Endless,
        "/hang" => Reply::Hang,
        "/teapot" => Reply::Status("418 I'm a teapot"),
        _ => match path
            .strip_prefix("/loop/")
            .and_then(|n| n.parse::<u32>().ok())
        {
            Some(n) => Reply::Redirect(format!("/loop/{}", n + 1)),
            None => Reply::Status("404 Not Found"),
        },
    }
}

/// An HTTPS server for `docs.test` on 127.0.0.1, with its own certificate authority.
struct Site {
    port: u16,
    root_pem: String,
    accepted: Arc<AtomicUsize>,
    /// Body bytes `Reply::Endless` managed to write before the client went away.
    streamed: Arc<AtomicUsize>,
    /// Set when an endless body ended (the client closed, or it was all written).
    endless_done: Arc<tokio::sync::Notify>,
}

impl Site {
    async fn start() -> Self {
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "toolgate docs test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA");
        let leaf_key = KeyPair::generate().expect("key");
        let leaf = CertificateParams::new(vec!["docs.test".to_owned()])
            .expect("params")
            .signed_by(&leaf_key, &*ca)
            .expect("leaf");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let streamed = Arc::new(AtomicUsize::new(0));
        let endless_done = Arc::new(tokio::sync::Notify::new());
        let (count, bytes, done) = (
            Arc::clone(&accepted),
            Arc::clone(&streamed),
            Arc::clone(&endless_done),
        );
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let (acceptor, bytes, done) =
                    (acceptor.clone(), Arc::clone(&bytes), Arc::clone(&done));
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(tls, &bytes, &done).await;
                    }
                });
            }
        });
        Self {
            port,
            root_pem: ca.pem(),
            accepted,
            streamed,
            endless_done,
        }
    }

    /// `fetch_doc` allowed to reach this site, and only it, through a test escape.
    fn docs(&self) -> Docs {
        self.docs_also(&[])
    }

    /// [`Site::docs`] with more allow-list entries.
    fn docs_also(&self, more: &[String]) -> Docs {
        let escape = TestEscape::dangerously_allow_private_addresses_for_tests()
            .with_pinned_host("docs.test", ip("127.0.0.1"))
            .with_trusted_network("127.0.0.1/32")
            .expect("network")
            .with_root_certificate_pem(&self.root_pem)
            .expect("root");
        // The redirect targets are allow-listed so that the address check is what refuses them.
        let mut hosts = strings(&["127.0.0.1", "169.254.169.254", "localhost"]);
        hosts.push(format!("docs.test:{}", self.port));
        hosts.extend_from_slice(more);
        let options = Options {
            docs_hosts: hosts,
            docs_test_escape: Some(escape),
        };
        Docs::from_options(&options).expect("valid")
    }

    fn url(&self, target: &str) -> String {
        format!("https://docs.test:{}{target}", self.port)
    }
}

/// One HTTP/1.1 exchange, then the connection closes.
async fn serve<S>(mut stream: S, streamed: &AtomicUsize, done: &tokio::sync::Notify)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0_u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split(' ').nth(1).unwrap_or("/").to_owned();
    let response = match routes(&target) {
        Reply::Page(kind, body) => {
            let kind = if kind.is_empty() {
                String::new()
            } else {
                format!("content-type: {kind}\r\n")
            };
            format!(
                "HTTP/1.1 200 OK\r\n{kind}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
        }
        Reply::Redirect(location) => format!(
            "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ),
        Reply::Status(status) => {
            format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        }
        Reply::Endless => {
            let header = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
            if stream.write_all(header.as_bytes()).await.is_ok() {
                let chunk = vec![b'x'; 64 * 1024];
                while streamed.load(Ordering::SeqCst) < ENDLESS_BYTES {
                    if stream.write_all(&chunk).await.is_err() || stream.flush().await.is_err() {
                        break;
                    }
                    streamed.fetch_add(chunk.len(), Ordering::SeqCst);
                }
            }
            done.notify_one();
            return;
        }
    };
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[tokio::test]
async fn a_page_is_fetched_through_the_escape_and_cut_to_max_chars() {
    let site = Site::start().await;
    let docs = site.docs();
    assert_eq!(
        text(&docs, args(&site.url("/page"), None)).await,
        "<h1>asyncio</h1>"
    );
    // Characters, not bytes: "é" is two bytes.
    let long = text(&docs, args(&site.url("/long"), Some(150))).await;
    assert_eq!(long, "é".repeat(150));
    assert_eq!(
        text(&docs, args(&site.url("/a"), None)).await,
        "arrived after a redirect"
    );
    assert_eq!(
        site.accepted.load(Ordering::SeqCst),
        4,
        "one connection per request"
    );
}

#[tokio::test]
async fn a_redirect_to_a_private_address_is_refused_before_a_connection() {
    let site = Site::start().await;
    let listener = Counter::start().await;
    let port = listener.port;
    let docs = site.docs_also(&[format!("127.0.0.1:{port}"), format!("localhost:{port}")]);
    let rows = [
        (
            "https://169.254.169.254/latest/meta-data".to_owned(),
            "169.254.169.254 is a non-public address (link-local, cloud metadata service)",
        ),
        // 127.0.0.1 is a trusted network of the escape, yet an IP literal never uses it.
        (
            format!("https://127.0.0.1:{port}/"),
            "127.0.0.1 is a non-public address (loopback)",
        ),
        (
            format!("https://2130706433:{port}/"),
            "127.0.0.1 is a non-public address (loopback)",
        ),
        (
            format!("https://localhost:{port}/"),
            "localhost resolves to a non-public address 127.0.0.1 (loopback)",
        ),
        (
            format!("http://docs.test:{port}/"),
            "only https URLs are fetched, not http",
        ),
        (
            "https://evil.test/".to_owned(),
            "host not allow-listed: evil.test",
        ),
    ];
    for (location, reason) in &rows {
        let url = site.url(&format!("/to?{location}"));
        let why = failure(&docs, args(&url, None)).await;
        if location.contains("localhost") {
            // The system resolver may list ::1 first or only.
            assert!(
                why.starts_with(&format!(
                    "refused: redirect 1 to {location}: localhost resolves to a non-public address"
                )),
                "{why}"
            );
        } else {
            let shown = url::Url::parse(location).expect("valid").to_string();
            assert_eq!(
                why,
                format!("refused: redirect 1 to {shown}: {reason}"),
                "{location}"
            );
        }
    }
    listener.assert_untouched().await;
}

/// `docs.test` pinned to 127.0.0.1 (trusted), where a listener counts connections: only the
/// port rule stands between `fetch_doc` and it.
fn docs_on_loopback(hosts: &[String]) -> Docs {
    let escape = TestEscape::dangerously_allow_private_addresses_for_tests()
        .with_pinned_host("docs.test", ip("127.0.0.1"))
        .with_trusted_network("127.0.0.1/32")
        .expect("network");
    Docs::new(hosts)
        .expect("valid")
        .with_test_escape(&escape)
        .expect("valid")
}

#[tokio::test]
async fn a_port_no_entry_names_is_refused_before_a_connection() {
    let listener = Counter::start().await;
    let port = listener.port;
    let refused = |host: &str| {
        format!(
            "refused: port {port} is not allow-listed for {host} (only 443, unless an entry names \
             the port)"
        )
    };
    let url = format!("https://docs.test:{port}/");
    let rows: [(&str, Vec<String>); 3] = [
        ("the bare name means 443", strings(&["docs.test"])),
        ("443 spelt out", strings(&["docs.test:443"])),
        (
            "an entry for another port",
            vec![format!("docs.test:{}", port.wrapping_add(1))],
        ),
    ];
    for (name, hosts) in &rows {
        let docs = docs_on_loopback(hosts);
        assert_eq!(
            failure(&docs, args(&url, None)).await,
            refused("docs.test"),
            "{name}"
        );
    }
    // A redirect to another port of an allow-listed name is checked like the first URL.
    let site = Site::start().await;
    let docs = site.docs();
    let why = failure(&docs, args(&site.url(&format!("/to?{url}")), None)).await;
    assert_eq!(
        why,
        format!(
            "refused: redirect 1 to {url}: {}",
            refused("docs.test").trim_start_matches("refused: ")
        )
    );
    listener.assert_untouched().await;

    // With the port on the list the same URL is fetched: the port was all that refused it.
    let open = Counter::start().await;
    let docs = docs_on_loopback(&[format!("docs.test:{}", open.port)]);
    let why = failure(
        &docs,
        args(&format!("https://docs.test:{}/", open.port), None),
    )
    .await;
    assert!(why.starts_with("could not fetch"), "{why}");
    assert_ne!(
        open.accepted.load(Ordering::SeqCst),
        0,
        "no connection was made"
    );
}

#[tokio::test]
async fn more_than_three_redirects_are_refused() {
    let site = Site::start().await;
    let docs = site.docs();
    let why = failure(&docs, args(&site.url("/loop/0"), None)).await;
    assert_eq!(
        why,
        format!(
            "refused: more than {MAX_REDIRECTS} redirects (the next one to {})",
            site.url("/loop/4")
        )
    );
    assert_eq!(site.accepted.load(Ordering::SeqCst), MAX_REDIRECTS + 1);
}

#[tokio::test]
async fn an_oversize_body_is_cut_and_not_read_to_the_end() {
    let site = Site::start().await;
    let docs = site.docs();
    let started = Instant::now();
    let page = text(&docs, args(&site.url("/endless"), Some(8000))).await;
    assert_eq!(page, "x".repeat(8000));
    // The server notices the closed connection and stops long before it has written it all.
    tokio::time::timeout(Duration::from_secs(20), site.endless_done.notified())
        .await
        .expect("the server stops writing");
    let written = site.streamed.load(Ordering::SeqCst);
    assert!(
        written < ENDLESS_BYTES,
        "the whole {written}-byte body was sent"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn a_slow_server_times_out() {
    let site = Site::start().await;
    let mut docs = site.docs();
    docs.limits.total = Duration::from_millis(500);
    let started = Instant::now();
    let why = failure(&docs, args(&site.url("/hang"), None)).await;
    assert_eq!(why, "timed out: no complete answer within 500ms");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn errors_statuses_and_non_text_are_failures_with_the_reason() {
    let site = Site::start().await;
    let docs = site.docs();
    assert_eq!(
        failure(&docs, args(&site.url("/missing"), None)).await,
        format!("{} answered HTTP 404 Not Found", site.url("/missing"))
    );
    assert_eq!(
        failure(&docs, args(&site.url("/teapot"), None)).await,
        format!("{} answered HTTP 418 I'm a teapot", site.url("/teapot"))
    );
    assert_eq!(
        failure(&docs, args(&site.url("/img"), None)).await,
        format!("refused: {} is image/png, not text", site.url("/img"))
    );
    assert_eq!(
        failure(&docs, args(&site.url("/untyped"), None)).await,
        format!("refused: {} has no content type", site.url("/untyped"))
    );
}

#[tokio::test]
async fn the_escape_does_not_switch_off_certificate_checks() {
    let site = Site::start().await;
    let other = Site::start().await;
    // Pinned to `site`, but trusting the other site's authority only.
    let escape = TestEscape::dangerously_allow_private_addresses_for_tests()
        .with_pinned_host("docs.test", ip("127.0.0.1"))
        .with_trusted_network("127.0.0.1/32")
        .expect("network")
        .with_root_certificate_pem(&other.root_pem)
        .expect("root");
    let docs = Docs::new(&[format!("docs.test:{}", site.port)])
        .expect("valid")
        .with_test_escape(&escape)
        .expect("valid");
    let why = failure(&docs, args(&site.url("/page"), None)).await;
    assert!(
        why.starts_with(&format!("could not fetch {}", site.url("/page"))),
        "{why}"
    );
}

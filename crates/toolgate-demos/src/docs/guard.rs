//! The SSRF guard of `fetch_doc`: decides, before any connection, whether a URL may be fetched and
//! at which addresses (seed 003, second article; OWASP SSRF Prevention Cheat Sheet).
//!
//! It owns the rules and nothing else: it parses, resolves through a [`Resolver`] it is given and
//! classifies addresses, but never connects. A URL passes when its scheme is `https`, it carries
//! no user info, its host (as the `url` crate normalises it: lower-cased, IDNA to punycode, and
//! IPv4 spellings such as `2130706433`, `0177.0.0.1`, `0x7f.1` or `127.1` turned into dotted
//! decimal) is on the allow-list, its port is 443 or one an allow-list entry names for that host
//! (`host:8443`), and every address the host resolves to is public. One bad address refuses the
//! whole URL: a resolver hands out its answers in any order, and the client must not be able to
//! land on the bad one. The port rule keeps an allow-listed name from being turned against some
//! other service on the same machine (an admin port, a database, a mail relay).
//!
//! Design decision: the guard returns the addresses it checked ([`Target::addrs`]) and the caller
//! connects to exactly those, so there is no second lookup for a rebinding DNS server to answer
//! differently. IPv6 forms that carry an IPv4 address (IPv4-mapped, NAT64 `64:ff9b::/96`, 6to4)
//! are judged by the IPv4 address inside; forms whose IPv4 part cannot be trusted or that no
//! public site uses (IPv4-compatible, Teredo, local-use NAT64) are refused outright, and so is any
//! IPv6 address outside global unicast `2000::/3`. Ranges follow the IANA special-purpose address
//! registries (RFC 6890 and its updates).
//!
//! The only way to reach a non-public address is a [`TestEscape`], which needs two keys at once:
//! the host is pinned to the address in the escape (never a DNS answer, never an IP literal), and
//! the address lies in one of the escape's trusted networks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use url::{Host, Url};

use super::error::DocsConfigError;

/// The answer of a [`Resolver`]: every address the name has.
pub(super) type Resolving = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves a host name (with the port it will be reached on); injected so tests choose answers.
#[derive(Clone)]
pub(super) struct Resolver(Arc<dyn Fn(String, u16) -> Resolving + Send + Sync>);

impl Resolver {
    /// The system resolver, through tokio's `lookup_host`.
    pub(super) fn system() -> Self {
        Self::from_fn(|host, port| {
            Box::pin(async move {
                let addrs = tokio::net::lookup_host((host.as_str(), port)).await?;
                Ok(addrs.map(|addr| addr.ip()).collect())
            })
        })
    }

    pub(super) fn from_fn(
        resolve: impl Fn(String, u16) -> Resolving + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(resolve))
    }

    fn resolve(&self, host: &str, port: u16) -> Resolving {
        (self.0)(host.to_owned(), port)
    }
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

/// Why a URL is not fetched. The messages are for the model; the caller prefixes `refused: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    #[error("not a valid URL: {reason}")]
    Malformed { reason: String },
    #[error("only https URLs are fetched, not {scheme}")]
    Scheme { scheme: String },
    #[error("the URL carries user info (credentials)")]
    UserInfo,
    #[error("the URL has no host")]
    NoHost,
    #[error("host not allow-listed: {host}")]
    NotAllowed { host: String },
    #[error(
        "port {port} is not allow-listed for {host} (only 443, unless an entry names the port)"
    )]
    Port { host: String, port: u16 },
    #[error("{host} could not be resolved: {reason}")]
    Unresolved { host: String, reason: String },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("{host} resolves to a non-public address {addr} ({range})")]
    NonPublic {
        host: String,
        addr: IpAddr,
        range: Range,
    },
    #[error("{addr} is a non-public address ({range})")]
    NonPublicLiteral { addr: IpAddr, range: Range },
}

/// A URL that passed, and the addresses the connection must use (no other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) url: Url,
    /// The host name to pin to [`Target::addrs`]; `None` for an IP literal, which needs no lookup.
    pub(super) domain: Option<String>,
    pub(super) addrs: Vec<SocketAddr>,
}

/// The special-purpose range an address fell in; `via` names the IPv4 address an IPv6 one embeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Range {
    pub(super) name: &'static str,
    pub(super) via: Option<(&'static str, Ipv4Addr)>,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.via {
            Some((form, v4)) => write!(f, "{form} {v4}: {}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// An address prefix such as `127.0.0.0/8` or `fe80::/10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Self {
        Self {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            len,
        }
    }

    const fn v6(segments: [u16; 8], len: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            len,
        }
    }

    /// `ADDRESS/LEN`, or a bare address for a prefix of that one address.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let (addr, len) = match text.split_once('/') {
            Some((addr, len)) => (addr.parse::<IpAddr>().ok()?, Some(len.parse::<u8>().ok()?)),
            None => (text.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        (len <= max).then_some(Self { addr, len })
    }

    pub(super) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(u32::from(net)),
                u128::from(u32::from(ip)),
                32,
                self.len,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), 128, self.len)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Whether the first `len` of the `bits` low bits of `a` and `b` agree.
fn prefix_eq(a: u128, b: u128, bits: u8, len: u8) -> bool {
    let shift = u32::from(bits.saturating_sub(len));
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

/// IPv4 ranges that are never fetched, most specific first (the first match names the refusal).
const V4_BLOCKED: &[(Cidr, &str)] = &[
    (Cidr::v4(0, 0, 0, 0, 32), "unspecified"),
    (Cidr::v4(255, 255, 255, 255, 32), "broadcast"),
    (Cidr::v4(0, 0, 0, 0, 8), "\"this network\" 0.0.0.0/8"),
    (Cidr::v4(10, 0, 0, 0, 8), "private 10.0.0.0/8"),
    (
        Cidr::v4(100, 64, 0, 0, 10),
        "shared address space (CGNAT) 100.64.0.0/10",
    ),
    (Cidr::v4(127, 0, 0, 0, 8), "loopback"),
    (
        Cidr::v4(169, 254, 169, 254, 32),
        "link-local, cloud metadata service",
    ),
    (Cidr::v4(169, 254, 0, 0, 16), "link-local 169.254.0.0/16"),
    (Cidr::v4(172, 16, 0, 0, 12), "private 172.16.0.0/12"),
    (
        Cidr::v4(192, 0, 0, 0, 24),
        "IETF protocol assignments 192.0.0.0/24",
    ),
    (Cidr::v4(192, 0, 2, 0, 24), "documentation 192.0.2.0/24"),
    (
        Cidr::v4(192, 88, 99, 0, 24),
        "6to4 relay anycast 192.88.99.0/24",
    ),
    (Cidr::v4(192, 168, 0, 0, 16), "private 192.168.0.0/16"),
    (Cidr::v4(198, 18, 0, 0, 15), "benchmarking 198.18.0.0/15"),
    (
        Cidr::v4(198, 51, 100, 0, 24),
        "documentation 198.51.100.0/24",
    ),
    (Cidr::v4(203, 0, 113, 0, 24), "documentation 203.0.113.0/24"),
    (Cidr::v4(224, 0, 0, 0, 4), "multicast 224.0.0.0/4"),
    (Cidr::v4(240, 0, 0, 0, 4), "reserved 240.0.0.0/4"),
];

/// How an IPv6 range is judged.
enum V6Rule {
    Refuse(&'static str),
    /// The low 32 bits are an IPv4 address, judged by [`V4_BLOCKED`].
    EmbedsLow(&'static str),
    /// Bits 16..48 are an IPv4 address (6to4, RFC 3056).
    Embeds6to4,
}

/// IPv6 ranges, most specific first; an address outside all of them and outside `2000::/3` is
/// refused as reserved.
const V6_RULES: &[(Cidr, V6Rule)] = &[
    (Cidr::v6([0; 8], 128), V6Rule::Refuse("unspecified")),
    (
        Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
        V6Rule::Refuse("loopback"),
    ),
    (
        Cidr::v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
        V6Rule::EmbedsLow("IPv4-mapped"),
    ),
    (
        Cidr::v6([0; 8], 96),
        V6Rule::Refuse("IPv4-compatible ::/96 (deprecated)"),
    ),
    (
        Cidr::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
        V6Rule::EmbedsLow("NAT64"),
    ),
    (
        Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        V6Rule::Refuse("local-use NAT64 64:ff9b:1::/48"),
    ),
    (
        Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        V6Rule::Refuse("discard-only 100::/64"),
    ),
    (
        Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        V6Rule::Refuse("Teredo 2001::/32"),
    ),
    (
        Cidr::v6([0x2001, 0x2, 0, 0, 0, 0, 0, 0], 48),
        V6Rule::Refuse("benchmarking 2001:2::/48"),
    ),
    (
        Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        V6Rule::Refuse("IETF protocol assignments 2001::/23"),
    ),
    (
        Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        V6Rule::Refuse("documentation 2001:db8::/32"),
    ),
    (
        Cidr::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),
        V6Rule::Embeds6to4,
    ),
    (
        Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        V6Rule::Refuse("documentation 3fff::/20"),
    ),
    (
        Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        V6Rule::Refuse("unique local fc00::/7"),
    ),
    (
        Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        V6Rule::Refuse("link-local fe80::/10"),
    ),
    (
        Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        V6Rule::Refuse("site-local fec0::/10 (deprecated)"),
    ),
    (
        Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        V6Rule::Refuse("multicast ff00::/8"),
    ),
];

const GLOBAL_UNICAST: Cidr = Cidr::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The special-purpose range `ip` is in, or `None` for a public address.
pub(super) fn non_public(ip: IpAddr) -> Option<Range> {
    match ip {
        IpAddr::V4(v4) => v4_range(v4).map(|name| Range { name, via: None }),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    V4_BLOCKED
        .iter()
        .find(|(cidr, _)| cidr.contains(IpAddr::V4(ip)))
        .map(|&(_, name)| name)
}

fn v6_range(ip: Ipv6Addr) -> Option<Range> {
    let bits = u128::from(ip);
    let embedded = |form: &'static str, v4: Ipv4Addr| {
        v4_range(v4).map(|name| Range {
            name,
            via: Some((form, v4)),
        })
    };
    for (cidr, rule) in V6_RULES {
        if !cidr.contains(IpAddr::V6(ip)) {
            continue;
        }
        // `as u32` keeps the low 32 bits: exactly the embedded IPv4 address.
        return match rule {
            V6Rule::Refuse(name) => Some(Range { name, via: None }),
            V6Rule::EmbedsLow(form) => embedded(form, Ipv4Addr::from(bits as u32)),
            V6Rule::Embeds6to4 => embedded("6to4", Ipv4Addr::from((bits >> 80) as u32)),
        };
    }
    (!GLOBAL_UNICAST.contains(IpAddr::V6(ip))).then_some(Range {
        name: "reserved (outside global unicast 2000::/3)",
        via: None,
    })
}

/// A test-only way for `fetch_doc` to reach a server on a non-public address, such as a local TLS
/// server in a test.
///
/// Opening an address takes two keys, so one slip in a configuration cannot open loopback or the
/// cloud metadata service: the host must be pinned here to that address (DNS is then not asked,
/// so a rebinding name can never use the exemption, and IP-literal URLs never do), and the address
/// must lie in a trusted network given here. The host must also be on the allow-list. A root
/// certificate given here is trusted for every host, like the system's roots. Nothing
/// reads an escape from a policy file, a flag or the environment: only Rust code can build one,
/// through a constructor whose name says what it does, and the toolset logs a warning when one is
/// in use.
#[derive(Clone, Debug, Default)]
pub struct TestEscape {
    pinned: BTreeMap<String, Vec<IpAddr>>,
    trusted: Vec<Cidr>,
    roots: Vec<reqwest::Certificate>,
}

impl TestEscape {
    /// An escape that opens nothing until names are pinned and networks trusted.
    #[must_use]
    pub fn dangerously_allow_private_addresses_for_tests() -> Self {
        Self::default()
    }

    /// Resolves `host` to `addr` without DNS (repeat for more addresses).
    #[must_use]
    pub fn with_pinned_host(mut self, host: &str, addr: IpAddr) -> Self {
        self.pinned
            .entry(host.to_ascii_lowercase())
            .or_default()
            .push(addr);
        self
    }

    /// Exempts `cidr` (`127.0.0.1/32`, `::1`) from the address check for pinned hosts only.
    ///
    /// # Errors
    /// `cidr` is not an address or an address with a prefix length.
    pub fn with_trusted_network(mut self, cidr: &str) -> Result<Self, DocsConfigError> {
        let net = Cidr::parse(cidr).ok_or_else(|| DocsConfigError::Network {
            cidr: cidr.to_owned(),
        })?;
        self.trusted.push(net);
        Ok(self)
    }

    /// Trusts the certificates in `pem` as roots too (besides the system's roots).
    ///
    /// # Errors
    /// `pem` holds no PEM certificate.
    pub fn with_root_certificate_pem(mut self, pem: &str) -> Result<Self, DocsConfigError> {
        let roots = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(DocsConfigError::RootCertificate)?;
        if roots.is_empty() {
            return Err(DocsConfigError::NoRootCertificate);
        }
        self.roots.extend(roots);
        Ok(self)
    }

    pub(super) fn roots(&self) -> &[reqwest::Certificate] {
        &self.roots
    }
}

/// The rules for one toolset: the allow-list and an optional escape.
#[derive(Debug, Clone)]
pub(super) struct Guard {
    /// Each allowed host and the ports it may be reached on.
    allowed: BTreeMap<String, BTreeSet<u16>>,
    pinned: BTreeMap<String, Vec<IpAddr>>,
    trusted: Vec<Cidr>,
}

/// The port of an https URL that names none, and of an allow-list entry that names none.
const HTTPS_PORT: u16 = 443;

impl Guard {
    /// `hosts` are `host` (port 443) or `host:port` entries; the host is normalised exactly like a
    /// URL's, so `DOCS.python.org` or `2130706433` match what the `url` crate makes of them.
    ///
    /// # Errors
    /// An entry is not a host with an optional port, or a pinned host is not allow-listed.
    pub(super) fn new(
        hosts: &[String],
        escape: Option<&TestEscape>,
    ) -> Result<Self, DocsConfigError> {
        let mut allowed: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
        for entry in hosts {
            let (host, port) = normalise_entry(entry).ok_or_else(|| DocsConfigError::Host {
                entry: entry.clone(),
            })?;
            allowed.entry(host).or_default().insert(port);
        }
        let mut pinned = BTreeMap::new();
        let mut trusted = Vec::new();
        if let Some(escape) = escape {
            for (host, addrs) in &escape.pinned {
                let normal = normalise_entry(host)
                    .map(|(host, _)| host)
                    .filter(|normal| allowed.contains_key(normal))
                    .ok_or_else(|| DocsConfigError::PinnedHost { host: host.clone() })?;
                pinned.insert(normal, addrs.clone());
            }
            trusted.clone_from(&escape.trusted);
        }
        Ok(Self {
            allowed,
            pinned,
            trusted,
        })
    }

    /// Every check that needs no lookup: the URL's form and the allow-list, port included.
    pub(super) fn check_url(&self, raw: &str) -> Result<Url, Refusal> {
        let url = Url::parse(raw).map_err(|e| Refusal::Malformed {
            reason: e.to_string(),
        })?;
        if url.scheme() != "https" {
            return Err(Refusal::Scheme {
                scheme: url.scheme().to_owned(),
            });
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal::UserInfo);
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or(Refusal::NoHost)?;
        let Some(ports) = self.allowed.get(host) else {
            return Err(Refusal::NotAllowed {
                host: host.to_owned(),
            });
        };
        // https always has a port: the URL's, or 443.
        let port = url.port_or_known_default().unwrap_or(HTTPS_PORT);
        if !ports.contains(&port) {
            return Err(Refusal::Port {
                host: host.to_owned(),
                port,
            });
        }
        Ok(url)
    }

    /// The whole guard: [`Guard::check_url`], then every address the host has.
    pub(super) async fn check(&self, raw: &str, resolver: &Resolver) -> Result<Target, Refusal> {
        let url = self.check_url(raw)?;
        let port = url.port_or_known_default().unwrap_or(HTTPS_PORT);
        let (domain, ips) = match url.host() {
            Some(Host::Ipv4(v4)) => (None, self.literal(IpAddr::V4(v4))?),
            Some(Host::Ipv6(v6)) => (None, self.literal(IpAddr::V6(v6))?),
            Some(Host::Domain(domain)) => {
                let ips = self.resolve(domain, port, resolver).await?;
                (Some(domain.to_owned()), ips)
            }
            None => return Err(Refusal::NoHost),
        };
        let addrs = ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect();
        Ok(Target { url, domain, addrs })
    }

    /// An IP-literal host is never exempt: the escape opens pinned names only.
    fn literal(&self, ip: IpAddr) -> Result<Vec<IpAddr>, Refusal> {
        match non_public(ip) {
            Some(range) => Err(Refusal::NonPublicLiteral { addr: ip, range }),
            None => Ok(vec![ip]),
        }
    }

    async fn resolve(
        &self,
        host: &str,
        port: u16,
        resolver: &Resolver,
    ) -> Result<Vec<IpAddr>, Refusal> {
        let (mut ips, pinned) = match self.pinned.get(host) {
            Some(ips) => (ips.clone(), true),
            None => {
                let ips = resolver
                    .resolve(host, port)
                    .await
                    .map_err(|e| Refusal::Unresolved {
                        host: host.to_owned(),
                        reason: e.to_string(),
                    })?;
                (ips, false)
            }
        };
        ips.sort_unstable();
        ips.dedup();
        if ips.is_empty() {
            return Err(Refusal::NoAddress {
                host: host.to_owned(),
            });
        }
        for &ip in &ips {
            let Some(range) = non_public(ip) else {
                continue;
            };
            let trusted = pinned && self.trusted.iter().any(|net| net.contains(ip));
            if !trusted {
                return Err(Refusal::NonPublic {
                    host: host.to_owned(),
                    addr: ip,
                    range,
                });
            }
        }
        Ok(ips)
    }
}

/// What the `url` crate makes of `entry` as the host and port of an https URL (443 when it names
/// none); `None` when `entry` is more than that (a path, user info, a scheme) or not a host at all.
/// An IPv6 address with a port is written in brackets: `[2001:db8::1]:8443`.
fn normalise_entry(entry: &str) -> Option<(String, u16)> {
    let entry = entry.trim();
    // A bare IPv6 address is written in brackets in a URL.
    let bracketed;
    let entry = if entry.parse::<Ipv6Addr>().is_ok() {
        bracketed = format!("[{entry}]");
        &bracketed
    } else {
        entry
    };
    let url = Url::parse(&format!("https://{entry}/")).ok()?;
    let host = url.host_str()?.to_owned();
    let port = url
        .port()
        .map(|port| format!(":{port}"))
        .unwrap_or_default();
    (url.as_str() == format!("https://{host}{port}/") && !host.is_empty())
        .then(|| (host, url.port_or_known_default().unwrap_or(HTTPS_PORT)))
}

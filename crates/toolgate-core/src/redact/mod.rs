//! Redaction: the last filter before text leaves toolgate in a log line, an error message sent to a
//! client, or an echoed argument (DESIGN.md §1 step 8, §4 "the real (redacted) reason"; seed 004
//! "Redacted logs and errors").
//!
//! It owns two kinds of knowledge: the exact values of registered secrets (read by the CLI from the
//! files the configuration names) and the shapes of common credentials (`api_key=…`, `Bearer …`,
//! JWTs, PEM private keys, GitHub, Slack, AWS and Stripe keys, passwords in URLs, long random
//! strings). It must not read files or the environment, and must not decide anything about a call
//! (redaction changes what is printed, never what runs). Like any pattern matcher it can miss a
//! secret of an unusual shape and hide a harmless string that looks like a token; registering the
//! real values is what makes it exact.
//!
//! What is and is not redacted: text a person or model reads (log lines, error messages, text
//! content, JSON strings and object keys) is; binary content is the caller's to skip (an
//! image's base64 is not text, and one changed character breaks it). In JSON no type ever
//! changes: a secret inside a string is replaced inside it, numbers, booleans and nulls stay, and
//! under a sensitive key every string becomes [`REDACTED`]. A secret in an object key is redacted
//! like other text; a key that then equals one already present is dropped, keeping the first. The
//! random-string rule is the only guess, so it stays off what is ordinary: runs of hex digits
//! (digests, ids), UUIDs, names of plain pieces (`req-journal-fdatasync-EIO-10-000`), base64 that
//! starts with a file signature, and the strings the caller sent in the call ([`Echoes`]).
//!
//! Design decision: one [`RegexSet`] pass over the text answers "could anything match?"; only when
//! it could is each matching shape run on its own, and the spans they report are merged and replaced
//! in one splice. The common case (clean text) then costs one scan and returns the input borrowed.
//! Collecting spans per shape, instead of taking the leftmost alternative of one big pattern, also
//! means a candidate that a later check rejects (a low-entropy run, a plain word after `Bearer`)
//! cannot hide a real secret that overlaps it.

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use regex::{Captures, Regex, RegexSet};
use serde_json::Value;

use crate::secret::Secret;

/// What replaces a secret in text, and the whole value of a sensitive JSON key.
pub const REDACTED: &str = "[REDACTED]";

/// Registered secrets shorter than this (in characters, after trimming) are ignored.
///
/// A five-character value such as `admin` or `12345` occurs in ordinary text often enough that
/// replacing every occurrence would make logs unreadable, and a value that short is guessable
/// anyway; six is the shortest length at which an exact match is more likely the secret than a
/// coincidence.
pub const MIN_SECRET_LEN: usize = 6;

/// Shortest run of base64/hex characters judged by entropy. Shorter random-looking runs are too
/// often identifiers, and the credentials of this length or less that matter have a known prefix.
const MIN_RANDOM_LEN: usize = 32;

/// Bits per character a base64-ish run needs to count as random. 32 random base64 characters
/// average 4.56 bits and stay above 4.0 in well over 99.9% of draws.
const MIN_BASE64_ENTROPY: f64 = 4.0;

/// Base64 of the first bytes of common binary formats: PNG, JPEG, GIF87a/89a, RIFF (WebP, WAV),
/// PDF, ID3 (MP3), Ogg, FLAC, ZIP and gzip. A run that starts like this is a file someone put in
/// text (a `data:` URI, an image in structured content), not a credential; no credential format
/// starts with a file signature.
const BINARY_PREFIXES: [&str; 11] = [
    "iVBORw0KGgo",
    "/9j/",
    "R0lGODdh",
    "R0lGODlh",
    "UklGR",
    "JVBERi0",
    "SUQz",
    "T2dnUw",
    "ZkxhQw",
    "UEsDBA",
    "H4sI",
];

/// A string the caller sent must be at least this long for a returned run to be judged without
/// it. Shorter ones would let a caller switch the rule off by sending single characters; one this
/// long it could only send if it already knew that part of the value.
const MIN_ECHO_LEN: usize = 16;

/// A base64-ish run in which at least this share of the characters (numerator, denominator) sits in
/// word-shaped pieces (`[A-Z]?[a-z]{3,}`) is a path or an identifier, not a secret. Random base64
/// reaches it in under 1% of 32-character draws, while `AbstractSingletonProxyFactoryBean2` (0.97)
/// and `/Users/JohnSmith/AppData/Local/Programs/Python311` (0.76) pass the entropy test (4.1 and
/// 4.4 bits) and the character-class test.
const WORD_SHARE: (usize, usize) = (6, 10);

/// A bare `Bearer` token shorter than this is a word of a sentence ("the bearer of…").
const MIN_BEARER_LEN: usize = 8;

/// A credential shape. Each is found by its own regex; [`Shape::ALL`] fixes the order in which the
/// patterns sit in the prefilter set.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Assignment,
    Authorization,
    Bearer,
    UrlPassword,
    SlackWebhook,
    PemPrivateKey,
    Jwt,
    GitHub,
    Slack,
    Stripe,
    AwsKeyId,
    HighEntropy,
}

impl Shape {
    const ALL: [Self; 12] = [
        Self::Assignment,
        Self::Authorization,
        Self::Bearer,
        Self::UrlPassword,
        Self::SlackWebhook,
        Self::PemPrivateKey,
        Self::Jwt,
        Self::GitHub,
        Self::Slack,
        Self::Stripe,
        Self::AwsKeyId,
        Self::HighEntropy,
    ];

    // Word boundaries are ASCII (`(?-u:\b)`): the Unicode one makes the regex crate leave its DFA
    // for a slower engine as soon as the text holds a non-ASCII character.
    fn pattern(self) -> &'static str {
        match self {
            // The key must end at the keyword (`max_tokens=`, `secret_name=` are not credentials);
            // whitespace around the separator stays on the line so a YAML key with a nested block
            // does not swallow the next line. A bare value may not start with `=` (`token == x`).
            Self::Assignment => {
                r#"(?i)(?:passw(?:or)?d|passphrase|secret|token|api[_-]?key|private[_-]?key|secret[_-]?key|access[_-]?key|credentials?)(?:\\?["'])?(?P<sep>[ \t]*(?::=|[:=])[ \t]*)(?:\\?"(?P<dq>[^"\r\n]*?)\\?"|'(?P<sq>[^'\r\n]*)'|(?P<bare>[^\s"'`,;&\\()\[\]{}<>=][^\s"'`,;&\\()\[\]{}<>]*))"#
            }
            Self::Authorization => {
                r#"(?i)(?-u:\b)(?:proxy-)?authorization(?:\\?["'])?[ \t]*[:=][ \t]*(?:\\?["'])?(?:(?P<scheme>bearer|basic|digest|token|bot|apikey|negotiate|ntlm|dpop|mac)[ \t]+(?P<cred>[^\s"'\\,;()\[\]{}<>]+)|(?P<bare>[^\s"'\\,;()\[\]{}<>]+))"#
            }
            // RFC 6750 §2.1 b64token.
            Self::Bearer => r"(?i)(?-u:\b)bearer[ \t]+(?P<tok>[A-Za-z0-9\-._~+/]+=*)",
            // RFC 3986 §3.2.1 userinfo; the greedy password runs to the last `@` of the authority so
            // an unencoded `@` in it does not leave a tail visible.
            Self::UrlPassword => r"(?i)(?-u:\b)[a-z][a-z0-9+.-]*://[^\s:/?#@]*:(?P<pw>[^\s/?#]+)@",
            Self::SlackWebhook => {
                r"(?i)https://hooks\.slack\.com/(?:services|workflows|triggers)/(?P<path>[A-Za-z0-9_/-]+)"
            }
            // A block cut off before its END line (a truncated error message) is redacted to the end
            // of the text: failing closed costs a tail of log, failing open costs the key.
            Self::PemPrivateKey => {
                r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?P<body>.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\z)"
            }
            // RFC 7519: a JOSE header is a JSON object, so its base64url always starts `eyJ`. The
            // signature may be empty (`alg: none`).
            Self::Jwt => r"(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*",
            Self::GitHub => r"(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
            Self::Slack => r"(?-u:\b)xox[abprs]-[A-Za-z0-9-]{10,}",
            Self::Stripe => {
                r"(?-u:\b)(?:(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{20,})"
            }
            Self::AwsKeyId => r"(?-u:\b)(?:AKIA|ASIA)[A-Z0-9]{16}(?-u:\b)",
            // A candidate only; `looks_random` decides. `=` is allowed only as trailing padding so
            // `sha256=<digest>` splits into a short key and a digest rather than one long run.
            Self::HighEntropy => r"[A-Za-z0-9+/_-]{32,}={0,2}",
        }
    }

    /// Appends the byte ranges to replace in `text`, found by this shape's compiled `re`.
    fn collect(self, re: &Regex, text: &str, echoes: &Echoes, out: &mut Vec<Range<usize>>) {
        // Captures cost more than a plain search; only the shapes that keep part of the match use
        // them. The entropy candidate matters most: every line with a digest in it runs it.
        match self {
            Self::HighEntropy => {
                for m in re.find_iter(text) {
                    if looks_random(m.as_str()) && !echoes.covers(m.as_str()) {
                        push(out, text, m.range());
                    }
                }
            }
            Self::Jwt | Self::GitHub | Self::Slack | Self::Stripe | Self::AwsKeyId => {
                for m in re.find_iter(text) {
                    push(out, text, m.range());
                }
            }
            Self::Assignment
            | Self::Authorization
            | Self::Bearer
            | Self::UrlPassword
            | Self::SlackWebhook
            | Self::PemPrivateKey => {
                for caps in re.captures_iter(text) {
                    if let Some(range) = self.secret_part(&caps) {
                        push(out, text, range);
                    }
                }
            }
        }
    }

    /// The part of a match that is the secret, for the shapes that keep a name around it; `None`
    /// when a check after the regex says the match is not a credential.
    fn secret_part(self, caps: &Captures<'_>) -> Option<Range<usize>> {
        let group = |name| caps.name(name).map(|m| m.range());
        match self {
            Self::Assignment => assignment_value(caps),
            Self::Authorization => group("cred").or_else(|| {
                // A lone word is a scheme whose credential is absent or already redacted
                // (`Authorization: Bearer [REDACTED]`), or prose (`authorization: denied`).
                let bare = caps.name("bare")?;
                (!bare.as_str().chars().all(char::is_alphabetic)).then(|| bare.range())
            }),
            Self::Bearer => {
                let tok = caps.name("tok")?;
                // A token may end in `.`, but a sentence does far more often.
                let value = tok.as_str().trim_end_matches('.');
                (value.len() >= MIN_BEARER_LEN && !value.chars().all(char::is_alphabetic))
                    .then(|| tok.start()..tok.start() + value.len())
            }
            Self::UrlPassword => group("pw"),
            Self::SlackWebhook => group("path"),
            Self::PemPrivateKey => group("body"),
            Self::HighEntropy
            | Self::Jwt
            | Self::GitHub
            | Self::Slack
            | Self::Stripe
            | Self::AwsKeyId => caps.get(0).map(|m| m.range()),
        }
    }
}

/// The value range of a `key: value` / `key=value` match, or `None` when the match is prose.
///
/// `invalid token: expired` and `Password: must be 8 characters` are error messages, not
/// credentials: after `:` and a space, a bare value made only of letters is read as a word. A
/// value with a digit or a symbol, a quoted value, and anything after `=` are always redacted.
fn assignment_value(caps: &Captures<'_>) -> Option<Range<usize>> {
    if let Some(v) = caps.name("dq").or_else(|| caps.name("sq")) {
        return Some(v.range());
    }
    let bare = caps.name("bare")?;
    let sep = caps.name("sep").map_or("", |m| m.as_str());
    let prose = sep.trim() == ":"
        && sep.ends_with([' ', '\t'])
        && bare.as_str().chars().all(char::is_alphabetic);
    (!prose).then(|| bare.range())
}

/// Records a span, skipping empty ones and ones already redacted, so that redacting twice gives
/// the same text and an already-clean line stays borrowed.
fn push(out: &mut Vec<Range<usize>>, text: &str, range: Range<usize>) {
    if !range.is_empty() && &text[range.clone()] != REDACTED {
        out.push(range);
    }
}

/// Whether a base64 candidate run is random enough to be a secret (see the thresholds above).
///
/// Runs of hex digits alone are never judged random: they are digests (MD5, SHA-1, SHA-256,
/// SHA-512), object ids and trace ids far more often than keys, and a hex key is caught by name
/// (`api_key=…`, a sensitive JSON key) or by registering it.
fn looks_random(candidate: &str) -> bool {
    let body = candidate.trim_end_matches('=').as_bytes();
    if body.len() < MIN_RANDOM_LEN || body.iter().all(u8::is_ascii_hexdigit) {
        return false;
    }
    if BINARY_PREFIXES.iter().any(|p| candidate.starts_with(p)) {
        return false;
    }
    let has = |f: fn(&u8) -> bool| body.iter().any(f);
    // Requiring all three classes gives up lowercase-and-digit runs: paths, crate directories and
    // kebab-case names look exactly like that, and random base64 lacks one of the three in only
    // about 0.4% of 32-character draws. UUIDs fail here too (one case only), as they should.
    has(u8::is_ascii_digit)
        && has(u8::is_ascii_uppercase)
        && has(u8::is_ascii_lowercase)
        && entropy(body) >= MIN_BASE64_ENTROPY
        && word_share_below(body, WORD_SHARE)
        && !is_identifier(body)
}

/// Whether `body` is a name built of plain pieces joined by `-`, `_` or `/`
/// (`req-journal-fdatasync-EIO-10-000`, `build_2026_x86_64-Linux`): every piece holds at most two
/// of lowercase, uppercase and digits, and a piece with both cases is made of words.
///
/// A random base64url token of 32 characters is cut by a separator into pieces of about 16, and
/// a random piece that long lacks one of the three classes in about 6% of draws, so all of its
/// pieces do in well under 1%; a token without a separator is never judged here.
fn is_identifier(body: &[u8]) -> bool {
    let mut pieces = body
        .split(|b| matches!(b, b'-' | b'_' | b'/'))
        .filter(|p| !p.is_empty())
        .peekable();
    let first = pieces.next();
    if pieces.peek().is_none() {
        return false;
    }
    first.into_iter().chain(pieces).all(|piece| {
        let has = |f: fn(&u8) -> bool| piece.iter().any(f);
        match (
            has(u8::is_ascii_lowercase),
            has(u8::is_ascii_uppercase),
            has(u8::is_ascii_digit),
        ) {
            (true, true, true) => false,
            (true, true, false) => !word_share_below(piece, WORD_SHARE),
            _ => true,
        }
    })
}

/// Shannon entropy of `bytes` in bits per byte.
fn entropy(bytes: &[u8]) -> f64 {
    let mut counts = [0_u32; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    // Candidates are far below 2^52 bytes, so the conversion is exact.
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// Whether fewer than `num/den` of `bytes` sit in word-shaped pieces (`[A-Z]?[a-z]{3,}`).
fn word_share_below(bytes: &[u8], (num, den): (usize, usize)) -> bool {
    let mut covered = 0;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        if bytes[i].is_ascii_uppercase() {
            i += 1;
        }
        let lower = i;
        while i < bytes.len() && bytes[i].is_ascii_lowercase() {
            i += 1;
        }
        if i - lower >= 3 {
            covered += i - start;
        }
        if i == start {
            i += 1;
        }
    }
    covered * den < bytes.len() * num
}

/// Compiled once per process: every redactor shares them.
static SHAPES: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    Shape::ALL
        .iter()
        .map(|s| Regex::new(s.pattern()).expect("built-in redaction pattern compiles"))
        .collect()
});

static DEFAULT: LazyLock<Redactor> = LazyLock::new(|| Redactor::build(Vec::new(), true));

/// Registered values are looked for by their first this-many bytes, and a hit is then extended
/// as far as the text agrees with the value. Tokens (nearly all shorter) are matched whole by the
/// alternation; a PEM key or a JSON credentials file kilobytes long would otherwise become a
/// pattern so large that the regex engine leaves its DFA and every line costs milliseconds.
const PREFIX_LEN: usize = 64;

/// Registered values grouped by their prefix (usually one value per prefix).
type ByPrefix = BTreeMap<String, Vec<String>>;

/// How registered secrets are found.
#[derive(Clone)]
enum Registered {
    None,
    /// One escaped alternation of the prefixes, longest first; it is also the prefilter's last
    /// pattern.
    Combined {
        prefixes: Regex,
        values: Arc<ByPrefix>,
    },
    /// Too many values to compile as one pattern: each prefix is searched for in turn. Slower,
    /// still exact, and never a reason to drop a secret.
    Each(Arc<ByPrefix>),
}

/// Replaces registered secrets and secret-shaped substrings with [`REDACTED`].
///
/// Cheap to clone: the compiled patterns are shared.
#[derive(Clone)]
pub struct Redactor {
    /// The shapes' patterns in [`Shape::ALL`] order, then the registered secrets when `Combined`.
    prefilter: RegexSet,
    registered: Registered,
    count: usize,
}

impl fmt::Debug for Redactor {
    // Derived Debug would print the compiled patterns, and with them every registered secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("registered_secrets", &self.count)
            .finish_non_exhaustive()
    }
}

impl Default for Redactor {
    /// Built-in shapes only, no registered secrets.
    fn default() -> Self {
        DEFAULT.clone()
    }
}

impl Redactor {
    /// A redactor that also replaces every occurrence of each registered secret.
    ///
    /// Values are trimmed (a secret file usually ends with a newline that is never part of the
    /// token, and trimming only widens what matches); values shorter than [`MIN_SECRET_LEN`]
    /// characters after trimming are ignored.
    #[must_use]
    pub fn new(secrets: Vec<Secret>) -> Self {
        let mut values: Vec<String> = secrets
            .iter()
            .map(|s| s.expose().trim())
            .filter(|v| v.chars().count() >= MIN_SECRET_LEN)
            .map(str::to_owned)
            .collect();
        if values.is_empty() {
            return Self::default();
        }
        values.sort_unstable();
        values.dedup();
        Self::build(values, true)
    }

    /// `combine: false` skips the single-pattern attempt; tests use it to exercise the fallback.
    fn build(values: Vec<String>, combine: bool) -> Self {
        let count = values.len();
        let mut by_prefix = ByPrefix::new();
        for value in values {
            let mut end = PREFIX_LEN.min(value.len());
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            by_prefix
                .entry(value[..end].to_owned())
                .or_default()
                .push(value);
        }
        // Longest first: where two prefixes start at the same place, the alternation takes the
        // first that matches, and the longer one covers more.
        let mut prefixes: Vec<&String> = by_prefix.keys().collect();
        prefixes.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let literal = prefixes
            .iter()
            .map(|p| regex::escape(p))
            .collect::<Vec<_>>()
            .join("|");
        let by_prefix = Arc::new(by_prefix);

        let mut patterns: Vec<&str> = Shape::ALL.iter().map(|s| s.pattern()).collect();
        if combine && count > 0 {
            patterns.push(&literal);
            if let (Ok(prefixes), Ok(prefilter)) = (Regex::new(&literal), RegexSet::new(&patterns))
            {
                return Self {
                    prefilter,
                    registered: Registered::Combined {
                        prefixes,
                        values: by_prefix,
                    },
                    count,
                };
            }
            patterns.pop();
        }
        Self {
            prefilter: RegexSet::new(&patterns).expect("built-in redaction patterns compile"),
            registered: if count == 0 {
                Registered::None
            } else {
                Registered::Each(by_prefix)
            },
            count,
        }
    }

    /// `text` with every registered secret and every secret-shaped substring replaced by
    /// [`REDACTED`]; borrowed when nothing matched.
    ///
    /// Where the shape has a name worth keeping (`api_key=`, `Authorization: Bearer`, the user of
    /// a URL, the BEGIN/END lines of a PEM block), only the secret part is replaced, so the reader
    /// still knows what was there.
    #[must_use]
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redact_echoing(text, &Echoes::NONE)
    }

    /// As [`Redactor::redact`], except that the random-string rule leaves alone what the caller
    /// sent itself (see [`Echoes`]). Registered secrets and credential shapes are redacted all
    /// the same: sending a secret does not make it the caller's to read back.
    #[must_use]
    pub fn redact_echoing<'a>(&self, text: &'a str, echoes: &Echoes) -> Cow<'a, str> {
        let each = matches!(self.registered, Registered::Each(_));
        if !each && !self.prefilter.is_match(text) {
            return Cow::Borrowed(text);
        }
        let mut spans = Vec::new();
        self.registered_spans(text, &mut spans);
        let hits = self.prefilter.matches(text);
        for ((shape, re), _) in Shape::ALL
            .iter()
            .zip(SHAPES.iter())
            .zip(0..)
            .filter(|&(_, i)| hits.matched(i))
        {
            shape.collect(re, text, echoes, &mut spans);
        }
        splice(text, spans)
    }

    /// `value` with every string in it, object keys included, redacted as by
    /// [`Redactor::redact`], and every string under an object key whose name looks sensitive (see
    /// [`is_sensitive_key`]) replaced whole by [`REDACTED`] (see [`blank_strings`]).
    ///
    /// Types never change: a secret inside a string is replaced inside that string, and numbers,
    /// booleans and nulls stay what they were, even under a sensitive key. A key whose text holds a
    /// secret is redacted like any other text a reader sees; if that makes it equal to a key
    /// already in the object, the first in the map's order is kept.
    #[must_use]
    pub fn redact_value(&self, value: &Value) -> Value {
        self.redact_value_echoing(value, &Echoes::NONE)
    }

    /// As [`Redactor::redact_value`], with the caller's own strings treated as in
    /// [`Redactor::redact_echoing`].
    #[must_use]
    pub fn redact_value_echoing(&self, value: &Value, echoes: &Echoes) -> Value {
        match value {
            Value::String(s) => Value::String(self.redact_echoing(s, echoes).into_owned()),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|v| self.redact_value_echoing(v, echoes))
                    .collect(),
            ),
            Value::Object(map) => {
                let mut out = serde_json::Map::new();
                for (key, v) in map {
                    let v = if is_sensitive_key(key) {
                        blank_strings(v)
                    } else {
                        self.redact_value_echoing(v, echoes)
                    };
                    out.entry(self.redact_echoing(key, echoes).into_owned())
                        .or_insert(v);
                }
                Value::Object(out)
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        }
    }

    /// Whether [`Redactor::redact_value_echoing`] would change anything in `value`, found without
    /// building a copy: most results hold nothing to redact, and the copy is most of the cost.
    #[must_use]
    pub fn changes_value(&self, value: &Value, echoes: &Echoes) -> bool {
        match value {
            Value::String(s) => self.changes(s, echoes),
            Value::Array(items) => items.iter().any(|v| self.changes_value(v, echoes)),
            Value::Object(map) => map.iter().any(|(key, v)| {
                self.changes(key, echoes)
                    || if is_sensitive_key(key) {
                        holds_string(v)
                    } else {
                        self.changes_value(v, echoes)
                    }
            }),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }

    fn changes(&self, text: &str, echoes: &Echoes) -> bool {
        matches!(self.redact_echoing(text, echoes), Cow::Owned(_))
    }

    fn registered_spans(&self, text: &str, out: &mut Vec<Range<usize>>) {
        match &self.registered {
            Registered::None => {}
            Registered::Combined { prefixes, values } => scan(text, values, out, |at| {
                prefixes.find_at(text, at).map(|m| (m.start(), m.as_str()))
            }),
            Registered::Each(values) => {
                for prefix in values.keys() {
                    scan(text, values, out, |at| {
                        text[at..]
                            .find(prefix.as_str())
                            .map(|i| (at + i, prefix.as_str()))
                    });
                }
            }
        }
    }
}

/// Records every occurrence that `find(from)` reports (start and prefix), each extended by
/// [`agreement`].
fn scan<'p>(
    text: &str,
    values: &ByPrefix,
    out: &mut Vec<Range<usize>>,
    mut find: impl FnMut(usize) -> Option<(usize, &'p str)>,
) {
    let mut at = 0;
    while let Some((start, prefix)) = find(at) {
        let len = values
            .get(prefix)
            .map_or(prefix.len(), |v| agreement(&text[start..], v));
        out.push(start..start + len);
        // Overlapping occurrences are all wanted (values `abcdef` and `cdefgh` in `abcdefgh`), so
        // the next search starts one character after this hit, not at its end. Inside a long
        // value's occurrence that would compare the same kilobytes again from every place its
        // prefix recurs (quadratic for a periodic value), so the search skips to the last prefix
        // length of the span; a hit before that could only reach further by agreeing with a
        // value for more than a prefix across this one, which independent secrets do not.
        let tail = text.floor_char_boundary((start + len).saturating_sub(PREFIX_LEN));
        at = next_char(text, start).max(tail);
    }
}

/// How many bytes at the start of `rest` agree with the registered value that agrees longest.
///
/// A whole occurrence gives the value's length. A hit on the prefix of a long value that the text
/// then leaves (a key cut off by a truncated message) still covers what agrees: that part is the
/// secret, and failing closed costs a few characters of log.
fn agreement(rest: &str, values: &[String]) -> usize {
    let longest = values
        .iter()
        .map(|v| {
            rest.bytes()
                .zip(v.bytes())
                .take_while(|(a, b)| a == b)
                .count()
        })
        .max()
        .unwrap_or(0);
    (0..=longest)
        .rev()
        .find(|&i| rest.is_char_boundary(i))
        .unwrap_or(0)
}

/// The byte index of the character after the one at `i`.
fn next_char(text: &str, i: usize) -> usize {
    text[i..]
        .chars()
        .next()
        .map_or(text.len(), |c| i + c.len_utf8())
}

/// Whether [`blank_strings`] has a string to blank in `value` (conservatively: any string).
fn holds_string(value: &Value) -> bool {
    match value {
        Value::String(_) => true,
        Value::Array(items) => items.iter().any(holds_string),
        Value::Object(map) => map.values().any(holds_string),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// `value` with every string in it replaced by [`REDACTED`] and everything else kept: what sits
/// under a key that names a credential. A number there (a PIN, a numeric token) stays a number,
/// because a client that validates the result's schema must still be able to read it; a
/// credential worth protecting is a string, and registering it catches it anywhere.
#[must_use]
pub fn blank_strings(value: &Value) -> Value {
    match value {
        Value::String(_) => Value::String(REDACTED.to_owned()),
        Value::Array(items) => Value::Array(items.iter().map(blank_strings).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), blank_strings(v)))
                .collect(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
    }
}

/// The strings a caller sent in one call's arguments, which the random-string rule does not
/// flag when the tool's answer repeats them: a `request_id` the caller made up, a content hash
/// it computed, a note it wrote. Without this a client told to verify by its id before retrying
/// would get the id back as [`REDACTED`].
///
/// A random-looking run in the answer is left alone when it lies inside one of these strings, or
/// when what remains of it around them (`notes/<id>.md`) does not look random on its own. Only
/// strings of at least 16 characters count. `Debug` prints how many there are, never them.
#[derive(Clone, Default)]
pub struct Echoes {
    values: Vec<String>,
}

impl fmt::Debug for Echoes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Echoes")
            .field("count", &self.values.len())
            .finish()
    }
}

impl Echoes {
    /// No echoes: every random-looking run is judged on its own.
    pub const NONE: Echoes = Echoes { values: Vec::new() };

    /// The string values (not the keys) anywhere in `arguments`, copied: the handler takes the
    /// arguments before its answer is redacted.
    #[must_use]
    pub fn of(arguments: &Value) -> Self {
        fn walk(value: &Value, out: &mut Vec<String>) {
            match value {
                Value::String(s) if s.len() >= MIN_ECHO_LEN => out.push(s.clone()),
                Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
                Value::Object(map) => map.values().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let mut values = Vec::new();
        walk(arguments, &mut values);
        Self { values }
    }

    /// Whether the random-looking `candidate` is the caller's own (see the type's docs).
    fn covers(&self, candidate: &str) -> bool {
        if self.values.is_empty() {
            return false;
        }
        if self.values.iter().any(|v| v.contains(candidate)) {
            return true;
        }
        let mut sent: Vec<Range<usize>> = self
            .values
            .iter()
            .flat_map(|v| {
                candidate
                    .match_indices(v.as_str())
                    .map(|(i, m)| i..i + m.len())
            })
            .collect();
        if sent.is_empty() {
            return false;
        }
        sent.sort_unstable_by_key(|r| r.start);
        let mut rest = 0;
        let mut random = false;
        for r in sent
            .iter()
            .chain(std::iter::once(&(candidate.len()..candidate.len())))
        {
            if r.start > rest {
                random |= looks_random(&candidate[rest..r.start]);
            }
            rest = rest.max(r.end);
        }
        !random
    }
}

/// Whether a JSON object key names a credential: after lower-casing and dropping `-`, `_`, `.` and
/// spaces, it ends with password, passwd, passphrase, secret, token, apikey, authorization,
/// privatekey, secretkey, accesskey, credential or credentials.
///
/// "Ends with" catches `GITHUB_TOKEN`, `db-password`, `clientSecret`, `x-api-key`, and leaves
/// `max_tokens`, `token_count` and `secret_name` alone.
#[must_use]
pub fn is_sensitive_key(key: &str) -> bool {
    const SUFFIXES: [&str; 12] = [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "authorization",
        "privatekey",
        "secretkey",
        "accesskey",
        "credential",
        "credentials",
    ];
    let normal: String = key
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    SUFFIXES.iter().any(|s| normal.ends_with(s))
}

/// Replaces the union of `spans` in `text` with [`REDACTED`], one marker per connected run.
fn splice(text: &str, mut spans: Vec<Range<usize>>) -> Cow<'_, str> {
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    spans.sort_unstable_by_key(|s| (s.start, s.end));
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    let mut spans = spans.into_iter();
    let mut current = spans.next().unwrap_or(0..0);
    let mut emit = |r: &Range<usize>, out: &mut String| {
        out.push_str(&text[cursor..r.start]);
        out.push_str(REDACTED);
        cursor = r.end;
    };
    for next in spans {
        // Touching spans merge too: `[REDACTED][REDACTED]` says nothing one marker does not.
        if next.start <= current.end {
            current.end = current.end.max(next.end);
        } else {
            emit(&current, &mut out);
            current = next;
        }
    }
    emit(&current, &mut out);
    out.push_str(&text[cursor..]);
    Cow::Owned(out)
}

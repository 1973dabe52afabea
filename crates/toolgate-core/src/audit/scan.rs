//! A one-pass check that a line is already in canonical form, locating the fields the chain needs.
//!
//! Why: re-parsing and re-encoding every record makes `audit verify` several times slower than
//! hashing the file. A line the writer produced is canonical, so its bytes minus the `sha256` member
//! are exactly what was hashed. This scanner proves that claim (sorted keys, compact separators,
//! minimal escapes, plain integers, valid UTF-8) without building a value; whenever it cannot be sure
//! (escaped keys, fractions, exponents, huge integers) it answers `None` and the caller takes the
//! slow path, so it may be conservative but never wrong.

use std::ops::Range;

/// Where the chain's fields are in a canonical record line.
pub(super) struct Fast {
    /// The 64 hex characters of `prev_sha256`.
    pub(super) prev: Range<usize>,
    /// The 64 hex characters of `sha256`.
    pub(super) sha: Range<usize>,
    /// The `sha256` member with the comma that joins it to its neighbours, to cut out before hashing.
    pub(super) member: Range<usize>,
}

/// `Some` when `line` is a canonical JSON object with hex `prev_sha256` and `sha256` members.
pub(super) fn canonical_record(line: &[u8]) -> Option<Fast> {
    // Compact JSON has no whitespace, and a string spells control characters as escapes: no byte
    // below 0x20 belongs in the line. One pass that the compiler vectorises, so that strings need
    // only look for their end.
    if line.iter().fold(false, |control, &b| control | (b < 0x20)) {
        return None;
    }
    std::str::from_utf8(line).ok()?;
    let mut scanner = Scanner {
        bytes: line,
        pos: 0,
        depth: 0,
    };
    let mut top = TopFields::default();
    scanner.object(Some(&mut top))?;
    if scanner.pos != line.len() {
        return None;
    }
    let (prev, sha, member) = (top.prev?, top.sha?, top.member?);
    Some(Fast { prev, sha, member })
}

#[derive(Default)]
struct TopFields {
    prev: Option<Range<usize>>,
    sha: Option<Range<usize>>,
    member: Option<Range<usize>>,
}

struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
    depth: u32,
}

/// Deeper nesting than this is legal JSON but not a record; leave it to the slow path.
const MAX_DEPTH: u32 = 64;

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(None),
            b'[' => self.array(),
            b'"' => self.string().map(|_| ()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.integer(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes[self.pos..]
            .starts_with(word)
            .then(|| self.pos += word.len())
    }

    /// Integers within i64 / u64, in the one form every encoder agrees on; anything else goes the
    /// slow way.
    fn integer(&mut self) -> Option<()> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let digits = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        let len = self.pos - digits;
        let leading_zero = len > 1 && self.bytes[digits] == b'0';
        let negative_zero = self.bytes[start] == b'-' && len == 1 && self.bytes[digits] == b'0';
        if len == 0 || leading_zero || negative_zero {
            return None;
        }
        // Beyond i64 / u64 serde_json would read a float and write it back differently.
        let text = std::str::from_utf8(&self.bytes[start..self.pos]).ok()?;
        if text.parse::<i64>().is_err() && text.parse::<u64>().is_err() {
            return None;
        }
        match self.peek() {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(()),
        }
    }

    /// A string in minimal escaped form; returns the range of its raw content and whether it had
    /// escapes. Control bytes were refused for the whole line already, so only `"` and `\\` matter.
    fn string(&mut self) -> Option<(Range<usize>, bool)> {
        self.eat(b'"')?;
        let start = self.pos;
        let mut escaped = false;
        loop {
            self.pos += memchr::memchr2(b'"', b'\\', self.bytes.get(self.pos..)?)?;
            if self.bytes[self.pos] == b'"' {
                let range = start..self.pos;
                self.pos += 1;
                return Some((range, escaped));
            }
            escaped = true;
            self.pos += 1;
            match self.peek()? {
                b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 1,
                b'u' => {
                    let hex = self.bytes.get(self.pos + 1..self.pos + 5)?;
                    let code = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                    let lower = hex.iter().all(|b| !b.is_ascii_uppercase());
                    let has_short_form = matches!(code, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d);
                    if !hex.starts_with(b"00") || code >= 0x20 || !lower || has_short_form {
                        return None;
                    }
                    self.pos += 5;
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self) -> Option<()> {
        self.enter()?;
        self.eat(b'[')?;
        if self.eat(b']').is_none() {
            loop {
                self.value()?;
                if self.eat(b',').is_none() {
                    self.eat(b']')?;
                    break;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn object(&mut self, mut top: Option<&mut TopFields>) -> Option<()> {
        self.enter()?;
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            self.depth -= 1;
            return Some(());
        }
        let mut previous: Option<Range<usize>> = None;
        loop {
            let member_start = self.pos;
            let (key, escaped) = self.string()?;
            if escaped {
                return None;
            }
            if let Some(previous) = &previous
                && self.bytes[previous.clone()] >= self.bytes[key.clone()]
            {
                return None;
            }
            self.eat(b':')?;
            let value_start = self.pos;
            self.value()?;
            let value = value_start..self.pos;
            if let Some(top) = top.as_deref_mut() {
                match &self.bytes[key.clone()] {
                    b"prev_sha256" => top.prev = Some(hex64(self.bytes, value)?),
                    b"sha256" => {
                        top.sha = Some(hex64(self.bytes, value)?);
                        // Cut the member and one adjoining comma so the rest stays canonical.
                        top.member = Some(if self.peek() == Some(b',') {
                            member_start..self.pos + 1
                        } else if previous.is_some() {
                            member_start - 1..self.pos
                        } else {
                            member_start..self.pos
                        });
                    }
                    _ => {}
                }
            }
            previous = Some(key);
            if self.eat(b',').is_none() {
                self.eat(b'}')?;
                break;
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }
}

/// The inner range of a string value that is exactly 64 lower-case hex characters.
fn hex64(bytes: &[u8], value: Range<usize>) -> Option<Range<usize>> {
    let inner = value.start + 1..value.end - 1;
    let text = bytes.get(inner.clone())?;
    let ok = bytes[value.start] == b'"'
        && text.len() == 64
        && text.iter().all(|&b| IS_LOWER_HEX[usize::from(b)]);
    ok.then_some(inner)
}

/// Which bytes are lower-case hex digits.
const IS_LOWER_HEX: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = matches!(b as u8, b'0'..=b'9' | b'a'..=b'f');
        b += 1;
    }
    table
};

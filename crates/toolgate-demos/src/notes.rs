//! The notes toolset of seed 004: Markdown notes (`NAME.md`) in one directory, read and searched
//! freely, deleted only through the gate (`delete_note` is `gated = true` in the demo policy, so
//! until `NOTES_ALLOW_GATED` is set the gate answers with this toolset's dry run instead).
//!
//! It owns that one directory and must not reach outside it. A note name is a file stem checked
//! twice, by the `inputSchema` the gate validates against and again here before any path is built,
//! so no argument can name a path; entries that are not regular files (symlinks included) are
//! never read, listed or deleted. Results are honest (seed 004, DESIGN.md §4): a search that ran
//! and matched nothing says so with `verified_empty`, a lookup that failed is an error with its
//! real reason, a missing note is "not found" and never an empty list.
//!
//! Design decision: handlers do their file I/O synchronously with `std::fs`. Notes are small, a
//! call touches one directory, and keeping the logic in plain methods lets the tests drive it
//! without a gate or a runtime. The dry run of `delete_note` reads metadata only (no `open`), so a
//! refused call leaves the file's bytes, size, modification time and even access time unchanged.

use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::{CallToolResult, Tool, ToolAnnotations};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use toolgate::corridor::answer;
use toolgate::toolset::{Call, CallError, CallFuture, Catalog, DryRunFuture, Toolset};

/// The schema's pattern for a note name; [`check_name`] enforces the same rule and more.
const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

const MAX_NAME_CHARS: usize = 64;

const EXTENSION: &str = "md";

/// Bytes of a note returned or searched. Notes are meant to be small; a larger file is cut here
/// and the result says so, rather than a model-triggered read pulling a huge file into memory.
const MAX_NOTE_BYTES: u64 = 1 << 20;

const MAX_QUERY_CHARS: u64 = 200;

const DEFAULT_MAX_RESULTS: u64 = 20;

const MAX_RESULTS: u64 = 100;

/// Matching lines quoted per note; the rest are counted.
const MAX_LINES_PER_NOTE: usize = 20;

/// Characters of one matching line quoted in a search result.
const MAX_LINE_CHARS: usize = 300;

/// The notes of one directory, and the four tools over them.
#[derive(Debug)]
pub struct Notes {
    dir: PathBuf,
    catalog: Arc<Catalog>,
}

/// Why a notes call did not do what it was asked; each becomes an `isError` result.
#[derive(Debug, thiserror::Error)]
enum NotesError {
    #[error(
        "{name:?} is not a valid note name: use 1 to 64 letters, digits, '.', '_' or '-', starting \
         with a letter or digit, without \"..\""
    )]
    InvalidName { name: String },
    #[error("note {name} not found")]
    NotFound { name: String },
    #[error("note {name} is not a regular file, so it is not served")]
    NotRegular { name: String },
    #[error("note {name} is not UTF-8 text")]
    NotText { name: String },
    #[error("could not {action}: {reason}")]
    Io { action: String, reason: io::Error },
    #[error(
        "note {name} was removed but the removal could not be made durable ({reason}); verify \
         before retrying"
    )]
    Unsynced { name: String, reason: io::Error },
}

impl NotesError {
    fn io(action: impl Into<String>, reason: io::Error) -> Self {
        Self::Io {
            action: action.into(),
            reason,
        }
    }

    fn into_result(self) -> CallToolResult {
        let detail = match &self {
            Self::InvalidName { name } => json!({"status": "invalid_name", "name": name}),
            Self::NotFound { name } => json!({"status": "not_found", "name": name}),
            Self::NotRegular { name } => json!({"status": "not_regular_file", "name": name}),
            Self::NotText { name } => json!({"status": "not_text", "name": name}),
            Self::Io { .. } => json!({"status": "io_error"}),
            // The file is gone from the directory; only its durability is unknown.
            Self::Unsynced { name, .. } => json!({"status": "in_doubt", "name": name}),
        };
        let executed = match self {
            Self::Unsynced { .. } => answer::Executed::Unknown,
            _ => answer::Executed::No,
        };
        answer::tool_error(self.to_string(), executed, detail)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameArgs {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    max_results: Option<u64>,
}

/// One note file as a listing sees it.
struct Entry {
    name: String,
    meta: Metadata,
}

impl Notes {
    /// Serves the notes in `dir`, creating the directory if it is missing.
    ///
    /// # Errors
    /// The directory cannot be created, or `dir` exists and is not a directory.
    pub fn new(dir: PathBuf) -> io::Result<Self> {
        fs::create_dir_all(&dir)?;
        // Resolved once, so a later rename of a parent symlink cannot move the served directory.
        let dir = fs::canonicalize(&dir)?;
        if !fs::metadata(&dir)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(Self {
            dir,
            catalog: Arc::new(Catalog::new(tools())),
        })
    }

    /// The directory the notes live in.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes three small example notes into `dir` (created if missing) for the demo, but only when
    /// the directory is empty: someone's own notes are never mixed with examples or overwritten.
    /// Returns how many notes were written (3 or 0).
    ///
    /// # Errors
    /// The directory cannot be created or read, or a note cannot be written.
    pub fn seed_demo(dir: &Path) -> io::Result<usize> {
        fs::create_dir_all(dir)?;
        if fs::read_dir(dir)?.next().is_some() {
            return Ok(0);
        }
        let examples = [
            (
                "groceries",
                "# Groceries\n\n- oat milk\n- lemons\n- coffee beans\n",
            ),
            (
                "ideas",
                "# Ideas\n\n- A gate in front of every tool that can delete, send or pay.\n\
                 - Dry runs that say exactly what would change.\n",
            ),
            (
                "trip",
                "# Trip\n\nTrain to Lyon on Friday; pack the coffee grinder.\n",
            ),
        ];
        for (name, text) in examples {
            // create_new: a note that appeared meanwhile is someone's, and is not overwritten.
            let mut file = File::options()
                .write(true)
                .create_new(true)
                .open(dir.join(format!("{name}.{EXTENSION}")))?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
        }
        sync_dir(dir)?;
        Ok(examples.len())
    }

    /// Parses and runs one call; the `Toolset::call` of the gate is a thin wrapper around it.
    fn dispatch(
        &self,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, CallError> {
        let result = match name {
            "list_notes" => parse::<ListArgs>(name, arguments).map(|ListArgs {}| self.list()),
            "read_note" => parse::<NameArgs>(name, arguments).map(|args| self.read(&args.name)),
            "search_notes" => parse::<SearchArgs>(name, arguments).map(|args| {
                let max = args.max_results.unwrap_or(DEFAULT_MAX_RESULTS);
                self.search(&args.query, max)
            }),
            "delete_note" => parse::<NameArgs>(name, arguments).map(|args| self.delete(&args.name)),
            other => return Err(CallError::unknown(other)),
        };
        Ok(match result {
            Ok(Ok(value)) => answer::success(value),
            Ok(Err(error)) => error.into_result(),
            Err(invalid) => invalid,
        })
    }

    /// Every note, sorted by name.
    fn list(&self) -> Result<Value, NotesError> {
        let (entries, skipped) = self.entries()?;
        let notes: Vec<Value> = entries
            .iter()
            .map(|entry| {
                json!({
                    "name": entry.name,
                    "bytes": entry.meta.len(),
                    "modified": modified(&entry.meta),
                })
            })
            .collect();
        let mut result = json!({
            "count": notes.len(),
            "notes": notes,
            "verified_empty": notes.is_empty(),
            "skipped": skipped,
        });
        if notes.is_empty() {
            result["status"] = json!("empty");
            result["message"] = json!("the notes directory was read and holds no notes");
        }
        Ok(result)
    }

    fn read(&self, name: &str) -> Result<Value, NotesError> {
        check_name(name)?;
        let (file, meta) = self.open_note(name)?;
        let (bytes, truncated) = read_capped(file, name)?;
        let content = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => {
                let utf8 = error.utf8_error();
                // A cut can split the last character; only that tail is dropped, nothing else.
                if truncated && utf8.error_len().is_none() {
                    let mut bytes = error.into_bytes();
                    bytes.truncate(utf8.valid_up_to());
                    String::from_utf8(bytes).map_err(|_| NotesError::NotText {
                        name: name.to_owned(),
                    })?
                } else {
                    return Err(NotesError::NotText {
                        name: name.to_owned(),
                    });
                }
            }
        };
        Ok(json!({
            "name": name,
            "content": content,
            "bytes": meta.len(),
            "modified": modified(&meta),
            "truncated": truncated,
        }))
    }

    /// Notes whose lines contain `query`, ignoring case; at most `max_results` notes.
    fn search(&self, query: &str, max_results: u64) -> Result<Value, NotesError> {
        let needle = query.to_lowercase();
        let max_results = usize::try_from(max_results.clamp(1, MAX_RESULTS)).unwrap_or(1);
        let (entries, skipped) = self.entries()?;
        let mut hits = Vec::new();
        let mut matching_notes = 0_usize;
        let mut partially_searched = Vec::new();
        for entry in &entries {
            let file = match self.open_note(&entry.name) {
                Ok((file, _)) => file,
                // Deleted between the listing and now: it is no longer a note to search.
                Err(NotesError::NotFound { .. }) => continue,
                Err(error) => return Err(error),
            };
            let (bytes, truncated) = read_capped(file, &entry.name)?;
            if truncated {
                partially_searched.push(entry.name.clone());
            }
            // Lossy on purpose: one stray byte must not hide every other line of the note from a
            // search, and the quoted line shows the replacement character where the byte was.
            let text = String::from_utf8_lossy(&bytes);
            let mut lines = Vec::new();
            let mut match_count = 0_usize;
            for (index, line) in text.lines().enumerate() {
                if line.to_lowercase().contains(&needle) {
                    match_count += 1;
                    if lines.len() < MAX_LINES_PER_NOTE {
                        lines.push(json!({"line": index + 1, "text": clip(line, MAX_LINE_CHARS)}));
                    }
                }
            }
            if match_count == 0 {
                continue;
            }
            matching_notes += 1;
            if hits.len() < max_results {
                hits.push(json!({
                    "name": entry.name,
                    "match_count": match_count,
                    "matches": lines,
                }));
            }
        }
        let mut result = json!({
            "query": query,
            "count": hits.len(),
            "matching_notes": matching_notes,
            "notes": hits,
            "searched": entries.len(),
            "skipped": skipped,
            "truncated": matching_notes > max_results,
            // Only a search that read every note whole can vouch that nothing matches.
            "verified_empty": matching_notes == 0 && partially_searched.is_empty(),
            "partially_searched": partially_searched,
        });
        if matching_notes == 0 {
            result["status"] = json!("empty");
            result["message"] = json!(format!(
                "the search ran over {} notes and none contains {query:?}{}",
                entries.len(),
                if result["verified_empty"] == true {
                    ""
                } else {
                    " in the part searched (some notes are larger than the search reads)"
                }
            ));
        }
        Ok(result)
    }

    fn delete(&self, name: &str) -> Result<Value, NotesError> {
        check_name(name)?;
        let path = self.path(name);
        let meta = self.note_meta(name, &path)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(NotesError::NotFound {
                    name: name.to_owned(),
                });
            }
            Err(error) => return Err(NotesError::io(format!("delete note {name}"), error)),
        }
        // The answer says "deleted"; without the directory's fsync a crash could bring it back.
        sync_dir(&self.dir).map_err(|reason| NotesError::Unsynced {
            name: name.to_owned(),
            reason,
        })?;
        Ok(json!({
            "status": "deleted",
            "deleted": name,
            "target": target(name),
            "bytes": meta.len(),
        }))
    }

    /// What `delete_note` would do, from the file's metadata alone.
    fn preview_delete(&self, name: &str) -> Value {
        if let Err(error) = check_name(name) {
            return json!({
                "would": format!("fail: {error}"),
                "reversible": false,
                "target": Value::Null,
                "bytes": 0,
                "exists": false,
            });
        }
        let preview = |would: String, exists: bool| {
            json!({
                "would": would,
                "reversible": false,
                "target": target(name),
                "bytes": 0,
                "exists": exists,
            })
        };
        match fs::symlink_metadata(self.path(name)) {
            Ok(meta) if meta.file_type().is_file() => {
                let modified = modified(&meta);
                let when = modified.as_deref().unwrap_or("at an unknown time");
                json!({
                    "would": format!("delete note {name} ({} bytes, modified {when})", meta.len()),
                    "reversible": false,
                    "target": target(name),
                    "bytes": meta.len(),
                    "exists": true,
                    "modified": modified,
                })
            }
            Ok(_) => preview(format!("fail: note {name} is not a regular file"), true),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                preview(format!("fail: note {name} does not exist"), false)
            }
            // Not "does not exist": the inspection itself failed, and the preview says so.
            Err(error) => preview(
                format!("unknown: note {name} could not be inspected: {error}"),
                false,
            ),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(target(name))
    }

    /// The note's metadata, without following a symlink.
    fn note_meta(&self, name: &str, path: &Path) -> Result<Metadata, NotesError> {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_file() => Ok(meta),
            Ok(_) => Err(NotesError::NotRegular {
                name: name.to_owned(),
            }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Err(NotesError::NotFound {
                name: name.to_owned(),
            }),
            Err(error) => Err(NotesError::io(format!("inspect note {name}"), error)),
        }
    }

    /// Opens a note that is a regular file. On Unix the opened file is checked to be the one that
    /// was inspected, so a symlink swapped in between the two steps is refused, not followed.
    fn open_note(&self, name: &str) -> Result<(File, Metadata), NotesError> {
        let path = self.path(name);
        let before = self.note_meta(name, &path)?;
        let file = File::open(&path).map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => NotesError::NotFound {
                name: name.to_owned(),
            },
            _ => NotesError::io(format!("open note {name}"), error),
        })?;
        let meta = file
            .metadata()
            .map_err(|error| NotesError::io(format!("inspect note {name}"), error))?;
        if !meta.is_file() || !same_file(&before, &meta) {
            return Err(NotesError::NotRegular {
                name: name.to_owned(),
            });
        }
        Ok((file, meta))
    }

    /// The addressable notes, sorted by name, and how many `*.md` entries were left out because
    /// no valid name reaches them or they are not regular files.
    fn entries(&self) -> Result<(Vec<Entry>, usize), NotesError> {
        let read = |error| NotesError::io("read the notes directory", error);
        let mut entries = Vec::new();
        let mut skipped = 0;
        for item in fs::read_dir(&self.dir).map_err(read)? {
            let item = item.map_err(read)?;
            let file_name = item.file_name();
            let Some(name) = file_name
                .to_str()
                .and_then(|n| n.strip_suffix(&format!(".{EXTENSION}")))
            else {
                continue;
            };
            let meta = match fs::symlink_metadata(item.path()) {
                Ok(meta) => meta,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(NotesError::io(format!("inspect note {name}"), error)),
            };
            if check_name(name).is_err() || !meta.file_type().is_file() {
                skipped += 1;
                continue;
            }
            entries.push(Entry {
                name: name.to_owned(),
                meta,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((entries, skipped))
    }
}

impl Toolset for Notes {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            // Defence in depth (seed 000): the handler repeats the policy's check itself.
            call.admit()?;
            self.dispatch(call.name, call.arguments)
        })
    }

    fn dry_run<'a>(&'a self, name: &'a str, arguments: &'a Map<String, Value>) -> DryRunFuture<'a> {
        Box::pin(std::future::ready(self.preview(name, arguments)))
    }
}

impl Notes {
    /// What a call would do, touching nothing; `None` for the read tools.
    fn preview(&self, name: &str, arguments: &Map<String, Value>) -> Option<Value> {
        if name != "delete_note" {
            // The read tools change nothing; the gate's own preview describes them well enough.
            return None;
        }
        Some(match parse::<NameArgs>(name, arguments.clone()) {
            Ok(args) => self.preview_delete(&args.name),
            Err(_) => json!({
                "would": "fail: the arguments do not name one note",
                "reversible": false,
                "exists": false,
            }),
        })
    }
}

/// The four tools with their schemas and truthful annotations.
fn tools() -> Vec<Tool> {
    let schema = |value: Value| match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    };
    let name = json!({
        "type": "string",
        "pattern": NAME_PATTERN,
        "minLength": 1,
        "maxLength": MAX_NAME_CHARS,
        "description": "The note's name: its file name without \".md\", as list_notes shows it.",
    });
    let read_only = ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false);
    vec![
        Tool::new(
            "list_notes",
            "List every note: name, size in bytes and last modification time (UTC), sorted by \
             name. An empty list is a verified empty directory.",
            schema(json!({
                "type": "object",
                "properties": {},
                "additionalProperties": false,
            })),
        )
        .with_title("List notes")
        .with_annotations(read_only.clone()),
        Tool::new(
            "read_note",
            "Read one note's Markdown text. A note that does not exist is an error, not an empty \
             note.",
            schema(json!({
                "type": "object",
                "properties": {"name": name},
                "required": ["name"],
                "additionalProperties": false,
            })),
        )
        .with_title("Read a note")
        .with_annotations(read_only.clone()),
        Tool::new(
            "search_notes",
            "Find the notes containing a phrase (case-insensitive) and the lines that contain it. \
             No match is reported as a verified empty result; a search that could not run is an \
             error.",
            schema(json!({
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_QUERY_CHARS,
                        "description": "The phrase to look for, matched case-insensitively.",
                    },
                    "max_results": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_RESULTS,
                        "default": DEFAULT_MAX_RESULTS,
                        "description": "At most this many notes are returned.",
                    },
                },
                "required": ["query"],
                "additionalProperties": false,
            })),
        )
        .with_title("Search notes")
        .with_annotations(read_only),
        Tool::new(
            "delete_note",
            "Permanently delete one note file. It cannot be undone.",
            schema(json!({
                "type": "object",
                "properties": {"name": name},
                "required": ["name"],
                "additionalProperties": false,
            })),
        )
        .with_title("Delete a note")
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(false),
        ),
    ]
}

/// Arguments into the handler's type; on failure the `isError` result to send.
fn parse<T: DeserializeOwned>(
    tool: &str,
    arguments: Map<String, Value>,
) -> Result<T, CallToolResult> {
    T::deserialize(Value::Object(arguments)).map_err(|error| {
        answer::refusal(
            format!("invalid arguments for {tool}: {error}"),
            json!({"status": "invalid_args"}),
        )
    })
}

/// The schema's rule, enforced again before a name becomes a path, plus no `..` anywhere: the
/// pattern already keeps out `/`, `\`, NUL and a leading dot, and this does not rely on it.
fn check_name(name: &str) -> Result<(), NotesError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && name.len() <= MAX_NAME_CHARS
        && !name.contains("..");
    if valid {
        Ok(())
    } else {
        Err(NotesError::InvalidName {
            name: clip(name, MAX_NAME_CHARS + 1),
        })
    }
}

/// The note's file name, relative to the notes directory.
fn target(name: &str) -> String {
    format!("{name}.{EXTENSION}")
}

/// Reads at most [`MAX_NOTE_BYTES`]; `true` when the file held more.
fn read_capped(file: File, name: &str) -> Result<(Vec<u8>, bool), NotesError> {
    let mut bytes = Vec::new();
    file.take(MAX_NOTE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| NotesError::io(format!("read note {name}"), error))?;
    let truncated = bytes.len() as u64 > MAX_NOTE_BYTES;
    if truncated {
        bytes.truncate(usize::try_from(MAX_NOTE_BYTES).unwrap_or(usize::MAX));
    }
    Ok((bytes, truncated))
}

#[cfg(unix)]
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_a: &Metadata, _b: &Metadata) -> bool {
    // No portable file identity in std; the symlink check before opening still applies.
    true
}

/// Makes the directory's entries (a creation, a removal) durable.
#[cfg(unix)]
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
pub(crate) fn sync_dir(_dir: &Path) -> io::Result<()> {
    // Directories cannot be opened for syncing here; the file system orders the metadata itself.
    Ok(())
}

/// The modification time in RFC 3339, or `None` where the platform does not keep one.
fn modified(meta: &Metadata) -> Option<String> {
    meta.modified().ok().map(utc_timestamp)
}

/// `text` cut to at most `max` characters, the last being `…` when anything was cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max.saturating_sub(1)) {
        Some((cut, _)) if text[cut..].chars().nth(1).is_some() => format!("{}…", &text[..cut]),
        _ => text.to_owned(),
    }
}

/// RFC 3339 in UTC to the second (`2026-10-19T11:12:36Z`), through the server's one date formatter.
pub(crate) fn utc_timestamp(time: SystemTime) -> String {
    let ms: i64 = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => {
            let before = before.duration();
            let whole = i64::try_from(before.as_millis()).unwrap_or(i64::MAX);
            // A fraction of a millisecond before a boundary still belongs to the earlier one.
            -whole - i64::from(before.subsec_nanos() % 1_000_000 > 0)
        }
    };
    toolgate_core::time::rfc3339(ms)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use toolgate_core::canonical::sha256_hex;
    use toolgate_core::schema::ToolSchema;

    use super::*;

    fn notes() -> (tempfile::TempDir, Notes) {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("notes");
        assert_eq!(Notes::seed_demo(&dir).expect("seed"), 3);
        let notes = Notes::new(dir).expect("open notes");
        (tmp, notes)
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("arguments must be an object, got {other}"),
        }
    }

    fn call(notes: &Notes, tool: &str, arguments: Value) -> CallToolResult {
        notes
            .dispatch(tool, args(arguments))
            .expect("registered tool")
    }

    fn structured(result: &CallToolResult) -> &Value {
        result
            .structured_content
            .as_ref()
            .expect("structured content")
    }

    fn is_error(result: &CallToolResult) -> bool {
        result.is_error == Some(true)
    }

    fn text(result: &CallToolResult) -> String {
        result
            .content
            .iter()
            .filter_map(|block| block.as_text().map(|t| t.text.clone()))
            .collect()
    }

    fn schema(notes: &Notes, tool: &str) -> ToolSchema {
        let catalog = notes.catalog();
        let tool = catalog.get(tool).expect("tool registered");
        ToolSchema::compile(&Value::Object((*tool.input_schema).clone())).expect("schema compiles")
    }

    fn md_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Content hash, size and modification time in nanoseconds: what "touched nothing" means.
    fn fingerprint(path: &Path) -> (String, u64, u128) {
        let bytes = fs::read(path).expect("read target");
        let meta = fs::metadata(path).expect("stat target");
        let mtime_ns = meta
            .modified()
            .expect("mtime")
            .duration_since(UNIX_EPOCH)
            .expect("after epoch")
            .as_nanos();
        (sha256_hex(&bytes), meta.len(), mtime_ns)
    }

    #[test]
    fn every_schema_compiles_and_is_closed() {
        let (_tmp, notes) = notes();
        let catalog = notes.catalog();
        let names: Vec<&str> = catalog.tools().iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            ["list_notes", "read_note", "search_notes", "delete_note"]
        );
        for tool in notes.catalog().tools() {
            assert_eq!(
                tool.input_schema.get("additionalProperties"),
                Some(&json!(false)),
                "{}",
                tool.name
            );
            schema(&notes, &tool.name);
        }
        let catalog = notes.catalog();
        let delete = catalog.get("delete_note");
        let hints = delete.and_then(|t| t.annotations.clone()).expect("hints");
        assert_eq!(hints.destructive_hint, Some(true));
        assert_eq!(hints.idempotent_hint, Some(false));
        assert_eq!(hints.read_only_hint, Some(false));
    }

    #[test]
    fn lists_notes_sorted_with_sizes() {
        let (_tmp, notes) = notes();
        let result = call(&notes, "list_notes", json!({}));
        assert!(!is_error(&result));
        let value = structured(&result);
        assert_eq!(value["count"], 3);
        assert_eq!(value["verified_empty"], false);
        let names: Vec<&str> = value["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .map(|n| n["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["groceries", "ideas", "trip"]);
        let size = fs::metadata(notes.dir().join("trip.md"))
            .expect("stat")
            .len();
        assert_eq!(value["notes"][2]["bytes"], size);
        assert!(
            value["notes"][0]["modified"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
    }

    #[test]
    fn an_empty_directory_is_a_verified_empty_list() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let notes = Notes::new(tmp.path().join("created")).expect("creates the directory");
        let result = call(&notes, "list_notes", json!({}));
        assert!(!is_error(&result));
        assert_eq!(structured(&result)["count"], 0);
        assert_eq!(structured(&result)["verified_empty"], true);
    }

    #[test]
    fn reads_a_note_and_reports_a_missing_one_as_not_found() {
        let (_tmp, notes) = notes();
        let result = call(&notes, "read_note", json!({"name": "groceries"}));
        assert!(!is_error(&result));
        assert!(
            structured(&result)["content"]
                .as_str()
                .is_some_and(|c| c.contains("oat milk"))
        );

        let missing = call(&notes, "read_note", json!({"name": "shopping"}));
        assert!(is_error(&missing));
        assert_eq!(text(&missing), "note shopping not found");
        assert_eq!(structured(&missing)["status"], "not_found");
        assert!(structured(&missing).get("content").is_none());
    }

    #[test]
    fn traversal_names_are_refused_by_schema_and_handler() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let outside = tmp.path().join("secret.md");
        fs::write(&outside, "outside the notes directory").expect("write outside");
        let notes = Notes::new(tmp.path().join("notes")).expect("open");
        fs::write(notes.dir().join("kept.md"), "kept").expect("write note");
        let schema = schema(&notes, "read_note");
        let cases = [
            "..",
            "../secret",
            "../../etc/passwd",
            "a/b",
            "/etc/passwd",
            ".hidden",
            "a\\b",
            "a\0b",
            "",
            " kept",
            "kept ",
            "ké",
        ];
        for name in cases {
            assert!(
                schema.validate(&json!({"name": name})).is_err(),
                "schema admitted {name:?}"
            );
        }
        // The pattern admits these; the handler refuses them anyway.
        let long = "a".repeat(65);
        let handler_only = ["a..b", "kept..", long.as_str()];
        for name in cases.iter().chain(handler_only.iter()) {
            for tool in ["read_note", "delete_note"] {
                let result = call(&notes, tool, json!({"name": name}));
                assert!(is_error(&result), "{tool} accepted {name:?}");
                assert_eq!(structured(&result)["status"], "invalid_name", "{name:?}");
            }
            let preview = notes
                .preview("delete_note", &args(json!({"name": name})))
                .expect("preview");
            assert!(
                preview["would"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("fail:"))
            );
        }
        assert!(outside.exists());
        assert_eq!(md_files(notes.dir()), ["kept.md"]);
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_not_followed() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let outside = tmp.path().join("secret.txt");
        fs::write(&outside, "password: hunter2").expect("write outside");
        let notes = Notes::new(tmp.path().join("notes")).expect("open");
        std::os::unix::fs::symlink(&outside, notes.dir().join("link.md")).expect("symlink");

        let read = call(&notes, "read_note", json!({"name": "link"}));
        assert!(is_error(&read));
        assert_eq!(structured(&read)["status"], "not_regular_file");
        assert!(!text(&read).contains("hunter2"));

        let search = call(&notes, "search_notes", json!({"query": "hunter2"}));
        assert!(!is_error(&search));
        assert_eq!(structured(&search)["count"], 0);
        assert_eq!(structured(&search)["skipped"], 1);

        let delete = call(&notes, "delete_note", json!({"name": "link"}));
        assert!(is_error(&delete));
        assert!(notes.dir().join("link.md").exists());
        assert!(outside.exists());
    }

    #[test]
    fn search_finds_lines_case_insensitively() {
        let (_tmp, notes) = notes();
        let result = call(&notes, "search_notes", json!({"query": "COFFEE"}));
        assert!(!is_error(&result));
        let value = structured(&result);
        assert_eq!(value["count"], 2);
        assert_eq!(value["verified_empty"], false);
        assert_eq!(value["notes"][0]["name"], "groceries");
        assert_eq!(value["notes"][0]["matches"][0]["line"], 5);
        assert_eq!(value["notes"][0]["matches"][0]["text"], "- coffee beans");
        assert_eq!(value["notes"][1]["name"], "trip");

        let capped = call(
            &notes,
            "search_notes",
            json!({"query": "coffee", "max_results": 1}),
        );
        assert_eq!(structured(&capped)["count"], 1);
        assert_eq!(structured(&capped)["matching_notes"], 2);
        assert_eq!(structured(&capped)["truncated"], true);
    }

    #[test]
    fn an_empty_search_is_verified_and_a_failed_one_is_an_error() {
        let (tmp, notes) = notes();
        let result = call(&notes, "search_notes", json!({"query": "zanzibar"}));
        assert!(!is_error(&result));
        let value = structured(&result);
        assert_eq!(value["count"], 0);
        assert_eq!(value["verified_empty"], true);
        assert_eq!(value["searched"], 3);
        assert_eq!(value["status"], "empty");

        // The directory vanishes: the lookup failed, which is not "found nothing".
        fs::remove_dir_all(tmp.path().join("notes")).expect("remove dir");
        let failed = call(&notes, "search_notes", json!({"query": "zanzibar"}));
        assert!(is_error(&failed));
        assert_eq!(structured(&failed)["status"], "io_error");
        assert!(structured(&failed).get("verified_empty").is_none());
        assert!(text(&failed).starts_with("could not read the notes directory"));
        let listed = call(&notes, "list_notes", json!({}));
        assert!(is_error(&listed));
    }

    #[test]
    fn search_arguments_are_checked_by_the_schema() {
        let (_tmp, notes) = notes();
        let schema = schema(&notes, "search_notes");
        assert!(schema.validate(&json!({"query": "x"})).is_ok());
        assert!(
            schema
                .validate(&json!({"query": "x", "max_results": 100}))
                .is_ok()
        );
        for bad in [
            json!({}),
            json!({"query": ""}),
            json!({"query": "x", "max_results": 0}),
            json!({"query": "x", "max_results": 101}),
            json!({"query": "x", "max_results": "5"}),
            json!({"query": "x", "limit": 5}),
            json!({"query": "x".repeat(201)}),
        ] {
            assert!(schema.validate(&bad).is_err(), "schema admitted {bad}");
        }
    }

    #[test]
    fn unknown_arguments_are_refused_by_the_handler() {
        let (_tmp, notes) = notes();
        let result = call(
            &notes,
            "delete_note",
            json!({"name": "trip", "force": true}),
        );
        assert!(is_error(&result));
        assert_eq!(structured(&result)["status"], "invalid_args");
        assert!(notes.dir().join("trip.md").exists());
    }

    #[test]
    fn dry_run_touches_nothing() {
        let (_tmp, notes) = notes();
        let path = notes.dir().join("groceries.md");
        // Far enough in the past that any write during the test would show in the mtime.
        let old = SystemTime::now() - Duration::from_secs(3_600);
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(old))
            .expect("set mtime");
        let before = fingerprint(&path);
        let listing = md_files(notes.dir());

        let preview = notes
            .preview("delete_note", &args(json!({"name": "groceries"})))
            .expect("delete_note has a dry run");

        assert_eq!(fingerprint(&path), before);
        assert!(path.exists());
        assert_eq!(md_files(notes.dir()), listing);
        assert_eq!(preview["reversible"], false);
        assert_eq!(preview["exists"], true);
        assert_eq!(preview["target"], "groceries.md");
        assert_eq!(preview["bytes"], before.1);
        let would = preview["would"].as_str().expect("would");
        let expected = format!(
            "delete note groceries ({} bytes, modified {})",
            before.1,
            utc_timestamp(old)
        );
        assert_eq!(would, expected);
    }

    #[test]
    fn dry_run_of_a_missing_note_says_it_would_fail() {
        let (_tmp, notes) = notes();
        let listing = md_files(notes.dir());
        let preview = notes
            .preview("delete_note", &args(json!({"name": "shopping"})))
            .expect("preview");
        assert_eq!(preview["would"], "fail: note shopping does not exist");
        assert_eq!(preview["exists"], false);
        assert_eq!(preview["reversible"], false);
        assert_eq!(md_files(notes.dir()), listing);
        assert!(
            notes
                .preview("read_note", &args(json!({"name": "trip"})))
                .is_none()
        );
    }

    #[test]
    fn delete_removes_exactly_one_file() {
        let (_tmp, notes) = notes();
        let others = ["groceries.md", "ideas.md"].map(|n| fingerprint(&notes.dir().join(n)));
        let bytes = fs::metadata(notes.dir().join("trip.md"))
            .expect("stat")
            .len();

        let result = call(&notes, "delete_note", json!({"name": "trip"}));
        assert!(!is_error(&result), "{}", text(&result));
        assert_eq!(structured(&result)["deleted"], "trip");
        assert_eq!(structured(&result)["bytes"], bytes);
        assert_eq!(md_files(notes.dir()), ["groceries.md", "ideas.md"]);
        let after = ["groceries.md", "ideas.md"].map(|n| fingerprint(&notes.dir().join(n)));
        assert_eq!(after, others);

        // Not idempotent: the second call finds nothing to delete, and says so.
        let again = call(&notes, "delete_note", json!({"name": "trip"}));
        assert!(is_error(&again));
        assert_eq!(text(&again), "note trip not found");
        assert_eq!(md_files(notes.dir()), ["groceries.md", "ideas.md"]);
    }

    #[test]
    fn seed_demo_leaves_a_used_directory_alone() {
        let tmp = tempfile::tempdir().expect("temp dir");
        fs::write(tmp.path().join("mine.md"), "my own").expect("write");
        assert_eq!(Notes::seed_demo(tmp.path()).expect("seed"), 0);
        assert_eq!(md_files(tmp.path()), ["mine.md"]);
    }

    #[test]
    fn a_large_note_is_cut_and_says_so() {
        let (_tmp, notes) = notes();
        let size = usize::try_from(MAX_NOTE_BYTES).expect("fits") + 10;
        // A multi-byte character straddles the cut, which must not make the note "not text".
        let mut text = "a".repeat(size - 12);
        text.push_str("éééééé");
        fs::write(notes.dir().join("big.md"), &text).expect("write");
        let result = call(&notes, "read_note", json!({"name": "big"}));
        assert!(!is_error(&result), "{}", self::text(&result));
        assert_eq!(structured(&result)["truncated"], true);
        assert_eq!(structured(&result)["bytes"], size);
        // The tail past the cut was not searched, so "no match" cannot be vouched for.
        let search = call(&notes, "search_notes", json!({"query": "zanzibar"}));
        assert_eq!(structured(&search)["count"], 0);
        assert_eq!(structured(&search)["verified_empty"], false);
        assert_eq!(structured(&search)["partially_searched"], json!(["big"]));

        fs::write(notes.dir().join("binary.md"), [0xff, 0xfe, b'x']).expect("write");
        let binary = call(&notes, "read_note", json!({"name": "binary"}));
        assert!(is_error(&binary));
        assert_eq!(structured(&binary)["status"], "not_text");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_792_408_356);
        assert_eq!(utc_timestamp(t), "2026-10-19T11:12:36Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_timestamp(leap), "2000-02-29T00:00:00Z");
        let before = UNIX_EPOCH - Duration::from_millis(500);
        assert_eq!(utc_timestamp(before), "1969-12-31T23:59:59Z");
    }
}

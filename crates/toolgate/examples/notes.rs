//! Seed 004's notes server, written against toolgate's kit: `list_notes`, `read_note` and
//! `search_notes` read Markdown files; `delete_note` is gated, and until `NOTES_ALLOW_GATED=1` is
//! set a call to it deletes nothing and answers with its dry run.
//!
//! ```sh
//! cargo run -p toolgate --example notes            # notes in examples/data/notes
//! NOTES_DIR=/path/to/notes cargo run -p toolgate --example notes
//! ```
//!
//! Notes are the `NAME.md` files of `NOTES_DIR`. A note id is a file stem, checked by the input
//! schema the gate validates against and again here before a path is built, so no argument can
//! name a file outside the directory. The audit log goes to the kit's default data directory
//! (`$XDG_STATE_HOME/toolgate/notes`), or to `NOTES_DATA` when it is set.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgate::kit::{Context, Lookup, Output, Server, Tool, ToolError, collect, ok_result};

/// What a note id may be: a file stem without dots at the start, so never `..` or a path.
const ID_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$";

#[derive(Deserialize)]
struct Id {
    id: String,
}

#[derive(Deserialize)]
struct Query {
    query: String,
}

/// The notes directory every tool works in.
#[derive(Debug)]
struct Notes {
    dir: PathBuf,
}

impl Notes {
    /// The file of note `id`, after the same check the schema makes.
    fn path(&self, id: &str) -> Result<PathBuf, ToolError> {
        let valid = !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && !id.starts_with(['-', '_']);
        if !valid {
            return Err(ToolError::new(format!("{id:?} is not a note id")).with_code("BAD_ID"));
        }
        Ok(self.dir.join(format!("{id}.md")))
    }

    /// Every note's id, sorted. A directory that cannot be read is an error, never "no notes".
    async fn ids(&self) -> std::io::Result<Vec<String>> {
        let mut entries = tokio::fs::read_dir(&self.dir).await?;
        let mut ids = Vec::new();
        while let Some(entry) = entries.next_entry().await? {
            let path = entry.path();
            // Regular files only: a symlink could point anywhere.
            if entry.file_type().await?.is_file()
                && path.extension().is_some_and(|e| e == "md")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                ids.push(stem.to_owned());
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// A note's text; a missing note is "not found", not an empty note.
    async fn read(&self, id: &str) -> Result<String, ToolError> {
        let path = self.path(id)?;
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ToolError::new(format!("no note {id:?}")).with_code("NOT_FOUND"))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// A note's title: its first `# ` heading, else its id.
fn title(id: &str, text: &str) -> String {
    text.lines()
        .find_map(|line| line.strip_prefix("# "))
        .map_or_else(|| id.to_owned(), |t| t.trim().to_owned())
}

fn id_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": ID_PATTERN}},
        "required": ["id"],
        "additionalProperties": false,
    })
}

fn tools(notes: &Arc<Notes>) -> Vec<Tool> {
    let source = notes.dir.display().to_string();
    let list = {
        let (notes, lookup) = (notes.clone(), Lookup::new("notes", &source));
        Tool::new("list_notes")
            .description("List the ids of all notes.")
            .handler(move |_: Map<String, Value>, _ctx: Context| {
                let (notes, lookup) = (notes.clone(), lookup.clone());
                async move { collect(&lookup, async { notes.ids().await.map(Some) }).await }
            })
    };
    let read = {
        let notes = notes.clone();
        Tool::new("read_note")
            .description("Read one note.")
            .input_schema(id_schema())
            .handler(move |Id { id }, _ctx: Context| {
                let notes = notes.clone();
                async move {
                    let text = notes.read(&id).await?;
                    ok_result(json!({"id": id, "title": title(&id, &text), "text": text}))
                }
            })
    };
    let search = {
        let (notes, lookup) = (notes.clone(), Lookup::new("notes", &source));
        Tool::new("search_notes")
            .description("Find notes that contain a phrase (case-insensitive).")
            .input_schema(json!({
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
                "required": ["query"],
            }))
            .handler(move |Query { query }, ctx: Context| {
                let (notes, lookup) = (notes.clone(), lookup.clone());
                async move { search(&notes, &query, &lookup, &ctx).await }
            })
    };
    let delete = {
        let (preview, notes) = (notes.clone(), notes.clone());
        Tool::new("delete_note")
            .description("Permanently delete one note file.")
            .input_schema(id_schema())
            .gated()
            .dry_run(move |Id { id }, _ctx: Context| {
                let notes = preview.clone();
                async move {
                    let path = notes.path(&id)?;
                    let text = notes.read(&id).await?;
                    Ok(json!({
                        "would": format!("delete the file {}", path.display()),
                        "bytes": text.len(),
                        "title": title(&id, &text),
                        "reversible": false,
                    }))
                }
            })
            .handler(move |Id { id }, ctx: Context| {
                let notes = notes.clone();
                async move {
                    let path = notes.path(&id)?;
                    let bytes = notes.read(&id).await?.len();
                    tokio::fs::remove_file(&path).await?;
                    ctx.log().info(format_args!("deleted note {id}"));
                    ok_result(json!({"deleted": path.display().to_string(), "bytes": bytes}))
                }
            })
    };
    vec![list, read, search, delete]
}

/// The notes whose text contains `query`, with their matching lines. A search that ran and
/// matched nothing is a verified empty result; a note that could not be read fails the search.
async fn search(
    notes: &Notes,
    query: &str,
    lookup: &Lookup,
    ctx: &Context,
) -> Result<Output, ToolError> {
    let needle = query.to_lowercase();
    collect(lookup, async {
        let mut hits = Vec::new();
        for id in notes.ids().await.map_err(ToolError::from)? {
            if ctx.is_cancelled() {
                return Err(ToolError::new("cancelled"));
            }
            let text = notes.read(&id).await?;
            let lines: Vec<&str> = text
                .lines()
                .filter(|line| line.to_lowercase().contains(&needle))
                .collect();
            if !lines.is_empty() {
                hits.push(json!({"id": id, "title": title(&id, &text), "lines": lines}));
            }
        }
        Ok::<_, ToolError>(Some(hits))
    })
    .await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The example's own settings come from its environment, as the seed's do.
    #[allow(clippy::disallowed_methods)]
    let (dir, data) = (std::env::var("NOTES_DIR"), std::env::var("NOTES_DATA"));
    let dir = dir.map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/notes"),
        PathBuf::from,
    );
    let notes = Arc::new(Notes { dir });
    let mut server = Server::new("notes")
        .version("1.0.0")
        .instructions("Markdown notes: list, read and search them. delete_note is gated.")
        .tools(tools(&notes));
    if let Ok(data) = data {
        server = server.data_dir(data);
    }
    match server.serve_stdio().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // stderr: stdout carries the protocol.
            let _ =
                std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("notes: {error}\n"));
            std::process::ExitCode::FAILURE
        }
    }
}

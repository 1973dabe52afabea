//! The sync ring: where a synced audit record is made durable without syncing `audit.jsonl`.
//!
//! `fdatasync` after an append must also commit the file's new size to the file system's journal,
//! a second write and flush; `fdatasync` after overwriting bytes the file already holds only
//! flushes the data. So synced records are written twice: into `audit.ring`, a file of
//! [`RING_BYTES`] written full of zeros once, at the next offset (wrapping to the start), and
//! synced there; then appended to `audit.jsonl` without a sync of their own. Measured on the
//! project's bench disk, one record's write and sync took two-thirds of the time and CPU an
//! append's did (docs/performance.md, "The sync ring").
//!
//! What it guarantees: every record acknowledged as synced is in `audit.jsonl` once the OS has
//! written the file, or in the ring. Before the ring wraps to its start, `audit.jsonl` is synced,
//! so everything the ring is about to overwrite is durable in the log itself; at start, after a
//! crash, [`scan`] offers every intact record of the ring, and the journal re-appends those that
//! continue the log's chain (module `open`). A record in the ring is only ever a copy: torn or
//! stale lines there are ignored, never an error, because each line is taken only if its own
//! `sha256` matches its content and its `prev_sha256` is the log's head.
//!
//! The ring's size is whatever the file holds when the journal opens it (a missing or empty file is
//! created at [`RING_BYTES`], by renaming a synced file into place so a crash cannot leave half a
//! ring); a batch that does not fit in it is synced in `audit.jsonl` as before.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use toolgate_core::audit;

use super::JournalError;

/// Size of a new ring: about 1,700 records of the proxy's size, so `audit.jsonl` is synced once
/// per that many synced records (at each wrap), and start-up reads 1 MiB at most to recover.
pub(crate) const RING_BYTES: u64 = 1 << 20;

/// The ring file, open for writing at `at`.
pub(crate) struct Ring {
    file: File,
    pub(crate) path: PathBuf,
    len: u64,
    at: u64,
}

impl Ring {
    /// Opens the ring at `path` for writing from its start, creating it full of zeros if it is
    /// missing or empty. The caller must have made `audit.jsonl` durable first: what the ring
    /// held is overwritten from now on.
    pub(crate) fn open(path: &Path) -> Result<Self, JournalError> {
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        if len == 0 {
            create(path)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(JournalError::io("cannot open", path))?;
        let len = file
            .metadata()
            .map_err(JournalError::io("cannot stat", path))?
            .len();
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len,
            at: 0,
        })
    }

    /// Whether `bytes` can be written to the ring without wrapping.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        self.at + bytes as u64 <= self.len
    }

    /// Whether `bytes` can be written to the ring at all, wrapping if needed.
    pub(crate) fn holds(&self, bytes: usize) -> bool {
        bytes as u64 <= self.len
    }

    /// Starts writing from the ring's start again. The caller must have synced `audit.jsonl`.
    pub(crate) fn wrap(&mut self) {
        self.at = 0;
    }

    /// Writes `bytes` at the next offset and syncs them; the caller checked [`Ring::fits`].
    pub(crate) fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(bytes, self.at)?;
        self.file.sync_data()?;
        self.at += bytes.len() as u64;
        Ok(())
    }
}

/// Writes a ring of [`RING_BYTES`] zeros beside `path`, syncs it and renames it into place.
fn create(path: &Path) -> Result<(), JournalError> {
    let fresh = path.with_extension("ring.new");
    let write = || -> std::io::Result<()> {
        let mut file = File::create(&fresh)?;
        let zeros = vec![0_u8; 1 << 16];
        for _ in 0..RING_BYTES / zeros.len() as u64 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        std::fs::rename(&fresh, path)
    };
    write().map_err(JournalError::io("cannot create", path))?;
    super::open::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Every intact record in the ring at `path`, by its `prev_sha256`: lines whose own `sha256`
/// matches their content (the zeros after the last write, a line partly overwritten after a wrap
/// and a torn write are none). Nothing if there is no ring.
pub(crate) fn scan(path: &Path) -> Result<HashMap<String, Vec<u8>>, JournalError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut file) => {
            file.read_to_end(&mut bytes)
                .map_err(JournalError::io("cannot read", path))?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(JournalError::io("cannot open", path)(error)),
    }
    let mut records = HashMap::new();
    for line in bytes.split(|b| *b == b'\n') {
        if let Some((prev, _)) = audit::line_link(line) {
            records.entry(prev).or_insert_with(|| line.to_vec());
        }
    }
    Ok(records)
}

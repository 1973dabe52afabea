//! Named crash points for the crash tests (feature `failpoints`; absent from release builds).
//!
//! A test arms a point with `FAILPOINTS=<name>=return(<marker file>)`. When the writer reaches it,
//! it creates the marker and stops dead, so the test can SIGKILL the process at exactly that step.

/// Before anything of the batch is written: the effect is not durable.
pub(crate) const BEFORE_APPEND: &str = "journal.before_append";
/// Half of the batch's effect frames written, not synced: a torn write-ahead record.
pub(crate) const TORN_WAL: &str = "journal.torn_wal";
/// Effect frames synced (the effect is durable), audit lines not yet written: the seed's cut point,
/// data written and synced but not yet published.
pub(crate) const AFTER_WAL_SYNC: &str = "journal.after_wal_sync";
/// A batch's audit lines synced in the ring (module `ring`), not yet appended to `audit.jsonl`:
/// what a power cut leaves when the log's unsynced tail is lost.
pub(crate) const AFTER_RING_SYNC: &str = "journal.after_ring_sync";
/// Half of the audit lines written: a torn audit record.
pub(crate) const TORN_AUDIT: &str = "journal.torn_audit";
/// Everything durable, no caller told yet: the answer never leaves.
pub(crate) const BEFORE_ANSWER: &str = "journal.before_answer";

/// The audit file's sync fails (as `fdatasync` does on EIO): not a crash, an error the writer
/// must survive by refusing everything after it.
pub(crate) const AUDIT_SYNC_FAILS: &str = "journal.audit_sync_fails";

/// An injected I/O error at `name` when armed (e.g. `FAILPOINTS=journal.audit_sync_fails=1*off->return`
/// lets the first sync through and fails the second).
#[cfg(feature = "failpoints")]
pub(crate) fn io_error(name: &str) -> std::io::Result<()> {
    match fail::eval(name, |_| std::io::Error::other("injected I/O error")) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn io_error(_name: &str) -> std::io::Result<()> {
    Ok(())
}

/// Stops at `name` when armed. `partial` runs first (used to leave a torn write behind).
#[cfg(feature = "failpoints")]
pub(crate) fn point(name: &str, partial: impl FnOnce()) {
    let armed: Option<()> = fail::eval(name, |marker| {
        partial();
        if let Some(marker) = marker {
            let _ = std::fs::write(marker, name);
        }
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    });
    let _ = armed;
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn point(_name: &str, _partial: impl FnOnce()) {}

//! The stray-write guard: on stdio, stdout is the protocol's, so a `println!` in a handler or in a
//! dependency must not land in the middle of the JSON-RPC stream (seed 004: "a stray
//! `console.log` should not break the connection").
//!
//! [`StrayStdout::install`] keeps a private copy of the real stdout for the protocol and points
//! file descriptor 1 at a pipe. Everything written to "stdout" by anyone else (Rust's
//! `std::io::stdout`, C's `printf`, a child process that inherits fd 1) arrives in that pipe, and
//! a thread of the guard's own writes it to stderr one line at a time as a warning, redacted.
//! Dropping the guard points fd 1 back at the real stdout.
//!
//! Design decision: a pipe and a reader thread rather than `dup2(2, 1)`. Both keep the protocol
//! stream whole; the pipe also lets every stray line be marked as such and passed through the
//! redactor before it reaches a log, which a plain redirection cannot do.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// What a stray line passes through before it is written to stderr (the server's redactor).
pub type Scrub = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Keeps fd 1 on the guard's pipe while alive; the protocol writes to [`StrayStdout::protocol`].
#[derive(Debug)]
pub struct StrayStdout {
    protocol: OwnedFd,
}

impl StrayStdout {
    /// Moves this process's stdout aside for the protocol and catches every other write to it.
    ///
    /// # Errors
    /// A descriptor could not be duplicated, or the pipe or its reader thread could not be made;
    /// stdout is then as it was.
    pub fn install(scrub: Scrub) -> io::Result<Self> {
        // Flush what Rust's own stdout buffer holds: it belongs before the guard, not in the pipe.
        io::stdout().flush()?;
        let protocol = rustix::io::fcntl_dupfd_cloexec(io::stdout(), 3)?;
        let (reader, writer) = io::pipe()?;
        std::thread::Builder::new()
            .name("toolgate-stray-stdout".to_owned())
            .spawn(move || relay(reader, &scrub))?;
        rustix::stdio::dup2_stdout(&writer)?;
        // fd 1 now holds the pipe's write end; this copy closes.
        drop(writer);
        Ok(Self { protocol })
    }

    /// The real stdout, where the protocol's messages go.
    #[must_use]
    pub fn protocol(&self) -> BorrowedFd<'_> {
        self.protocol.as_fd()
    }
}

impl Drop for StrayStdout {
    /// Points fd 1 back at the real stdout; the pipe's last writer closes, and the relay thread
    /// ends after the lines still in it.
    fn drop(&mut self) {
        let _ = io::stdout().flush();
        let _ = rustix::stdio::dup2_stdout(&self.protocol);
    }
}

/// Writes each line that arrives in the pipe to stderr as a warning, until every writer closed.
fn relay(reader: io::PipeReader, scrub: &Scrub) {
    let mut lines = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = scrub(text.trim_end_matches(['\n', '\r']));
                let mut stderr = io::stderr().lock();
                let _ = writeln!(
                    stderr,
                    "warning: a write to stdout was moved to stderr (stdout carries the protocol only): {text}"
                );
            }
        }
    }
}

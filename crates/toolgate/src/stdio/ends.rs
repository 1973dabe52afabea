//! This process's stdin and stdout as the reader and writer the stdio transport runs on.
//!
//! tokio's `Stdin` and `Stdout` do every read and write on its blocking thread pool: a pool thread
//! sits in `read(2)` and wakes a worker for each line, and each answer is handed to a pool thread
//! that wakes the worker again once written. On a sequential call those hand-offs (futex
//! wake-ups, context switches) were most of the server's kernel time. A pipe or a socket does not
//! need them: it is switched to non-blocking mode and driven by tokio's reactor on the worker
//! that handles the message. MCP clients spawn their server with one or the other (Python's
//! asyncio gives the child's stdin a socketpair and its stdout a pipe, Node's libuv socketpairs
//! for each), so that is the path a real session takes. Anything else (a terminal, a file,
//! `/dev/null`) keeps tokio's blocking pool, which reads and writes those correctly.
//!
//! Non-blocking mode belongs to the open file description, which the process that gave us the
//! pipe may share (a shell's terminal is not such a case: it stays on the pool). [`Restore`] puts
//! back the flags each end had when the session ends.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;

use rustix::fs::OFlags;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

pub(super) type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub(super) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// What stdin and stdout are, as far as how to drive them goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pipe,
    Socket,
    /// A terminal, a file, a device: read and written on the blocking pool.
    Other,
}

/// stdin and `stdout` (this process's stdout, or the protocol's own copy of it when stray writes
/// are guarded: [`super::guard`]) for the transport, and the guard that restores their flags when
/// dropped.
pub(super) fn open(stdout: BorrowedFd<'_>) -> (Reader, Writer, Restore) {
    let restore = Restore::remember(stdout);
    let reader = on_reactor(
        io::stdin().as_fd(),
        "stdin",
        |fd, kind| -> io::Result<Reader> {
            Ok(match kind {
                Kind::Pipe => Box::new(pipe::Receiver::from_owned_fd(fd)?),
                _ => Box::new(socket(fd)?),
            })
        },
    )
    .unwrap_or_else(|| Box::new(tokio::io::stdin()));
    let guarded = stdout.as_raw_fd() != io::stdout().as_raw_fd();
    let writer = on_reactor(stdout, "stdout", |fd, kind| -> io::Result<Writer> {
        Ok(match kind {
            Kind::Pipe => Box::new(pipe::Sender::from_owned_fd(fd)?),
            _ => Box::new(socket(fd)?),
        })
    })
    .unwrap_or_else(|| blocking_writer(stdout, guarded));
    (reader, writer, restore)
}

/// A duplicate of `fd` driven by the reactor, when it is a pipe or a socket; `None` sends the
/// caller to the blocking pool (logged when a pipe or socket could not be set up).
fn on_reactor<T>(
    fd: BorrowedFd<'_>,
    name: &'static str,
    wrap: impl FnOnce(OwnedFd, Kind) -> io::Result<T>,
) -> Option<T> {
    let attempt = || -> io::Result<Option<T>> {
        let file = File::from(fd.try_clone_to_owned()?);
        let kind = kind_of(&file)?;
        if kind == Kind::Other {
            return Ok(None);
        }
        wrap(OwnedFd::from(file), kind).map(Some)
    };
    attempt().unwrap_or_else(|error| {
        tracing::warn!(end = name, error = %error, "cannot drive this end on the reactor; using the blocking pool");
        None
    })
}

/// stdout on the blocking pool: tokio's own handle, or a file on the protocol's copy of the
/// descriptor when fd 1 is the stray-write guard's pipe.
fn blocking_writer(stdout: BorrowedFd<'_>, guarded: bool) -> Writer {
    if guarded && let Ok(fd) = stdout.try_clone_to_owned() {
        return Box::new(tokio::fs::File::from_std(File::from(fd)));
    }
    Box::new(tokio::io::stdout())
}

fn kind_of(file: &File) -> io::Result<Kind> {
    let kind = file.metadata()?.file_type();
    Ok(if kind.is_fifo() {
        Kind::Pipe
    } else if kind.is_socket() {
        Kind::Socket
    } else {
        Kind::Other
    })
}

/// A stream socket read or written as a byte stream: only `read`, `write` and readiness are used,
/// so its address family does not matter.
fn socket(fd: OwnedFd) -> io::Result<tokio::net::UnixStream> {
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(stream)
}

/// The file status flags stdin and stdout had before the session, put back when dropped (stdout's
/// through a copy of its descriptor, which shares the flags).
#[derive(Debug)]
pub(super) struct Restore {
    stdin: Option<OFlags>,
    stdout: Option<(OwnedFd, OFlags)>,
}

impl Restore {
    fn remember(stdout: BorrowedFd<'_>) -> Self {
        Self {
            stdin: rustix::fs::fcntl_getfl(io::stdin()).ok(),
            stdout: stdout.try_clone_to_owned().ok().and_then(|fd| {
                let flags = rustix::fs::fcntl_getfl(&fd).ok()?;
                Some((fd, flags))
            }),
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(flags) = self.stdin {
            let _ = rustix::fs::fcntl_setfl(io::stdin(), flags);
        }
        if let Some((fd, flags)) = &self.stdout {
            let _ = rustix::fs::fcntl_setfl(fd, *flags);
        }
    }
}

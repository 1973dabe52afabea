//! How a command runs: the log filter it starts with, and the tokio runtime under it.
//!
//! Each command is one `async` job; what differs between them is decided here, from the parsed
//! command line, so `main` stays parse → run → exit code and the commands stay free of setup.
//! The one rule that is not obvious: a stdio session, and the HTTP gateway on a small host, run
//! on one worker thread (below).

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::Command;

/// How long shutdown waits for tasks still running: not for a blocked stdin reader thread, since
/// every answer is already written by then.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// The setup one command runs under.
#[derive(Debug)]
pub(crate) struct Shape {
    /// Default for `TOOLGATE_LOG`.
    log_filter: &'static str,
    /// One tokio worker, unless `TOKIO_WORKER_THREADS` says otherwise.
    one_worker: bool,
}

impl Shape {
    pub(crate) fn of(command: &Command) -> Self {
        let log_filter = match command {
            // rmcp's service logs three info lines per HTTP request (a service per stateless
            // request): 10-15% of the server's CPU at saturation, and nothing an operator acts on.
            Command::Serve(_) | Command::Proxy(_) => "info,rmcp::service=warn",
            Command::Console(_) => "info",
            Command::Audit(_)
            | Command::Demo(_)
            | Command::Policy(_)
            | Command::Approvals(_)
            | Command::Killswitch(_)
            | Command::Pin(_)
            | Command::Keys(_)
            | Command::Agent(_) => "warn",
        };
        // On stdio the server has one client, reads and writes its pipes on the reactor, and
        // syncs on its journal's own thread; on one worker it does fewer cross-thread wake-ups
        // (a second worker is woken, finds nothing and parks again on every call). The gateway:
        // 14-25% more calls/s at 16 in flight and 0.05 ms less per sequential call
        // (bench/proxy.sh); `serve`: one context switch less per sequential call
        // (docs/performance.md).
        // The HTTP gateway relays to an upstream that does the call's real work, often on the
        // same host; where there are two CPUs or fewer, a second worker has no CPU of its own
        // and every wake-up of the first also wakes it to look for work. On two CPUs, one worker:
        // 9-22% less CPU per call at one connection, more req/s at 16 in 5 of 6 runs, latency
        // unchanged (docs/performance.md, "One worker on a small host"). On a larger host
        // tokio's default (one per CPU) stays.
        let one_worker = match command {
            Command::Serve(args) => !args.http.enabled(),
            Command::Proxy(args) => !args.http.enabled() || small_host(),
            _ => false,
        };
        Self {
            log_filter,
            one_worker,
        }
    }

    /// Starts logging and the runtime, runs `job` to completion, and shuts the runtime down.
    ///
    /// # Errors
    /// The runtime cannot start, or `job` failed.
    pub(crate) fn run(
        self,
        job: impl Future<Output = anyhow::Result<ExitCode>>,
    ) -> anyhow::Result<ExitCode> {
        crate::logging::init(self.log_filter);
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        // tokio's own variable still decides when it is set, as it does for every tokio program.
        #[allow(clippy::disallowed_methods)]
        let workers_set = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
        if self.one_worker && !workers_set {
            builder.worker_threads(1);
        }
        let runtime = builder
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let result = runtime.block_on(job);
        runtime.shutdown_timeout(SHUTDOWN_WAIT);
        result
    }
}

/// At most two CPUs available to this process (or the count unknown).
fn small_host() -> bool {
    std::thread::available_parallelism().map_or(true, |cpus| cpus.get() <= 2)
}

//! The `toolgate` command. Thin on purpose: parse, run, map the result to an exit code.
//!
//! This crate is the only place that reads the environment and picks concrete stores (DESIGN.md §2).
//! Exit codes: 0 success; 1 the job ran and found a failure (a broken audit chain, a demo check that
//! did not hold); 2 the job could not run (bad arguments, unreadable policy or file, store locked);
//! 3 an agent run paused for a person's decision.

mod agent;
mod approvals;
mod audit;
mod checkpoint;
mod console;
mod demo;
mod gate;
mod http;
mod keys;
mod killswitch;
mod logging;
mod metrics;
mod pin;
mod policy;
mod proxy;
mod reload;
mod runtime;
mod serve;
mod store;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc, not glibc's malloc: a gateway call allocates and frees a few hundred blocks, and
/// jemalloc does it in 12% fewer instructions per call for about 1.3 MiB more idle heap
/// (docs/performance.md, "Instructions per call"). `examples/http_relay.rs` uses the same.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// toolgate: the tool-call boundary for MCP. Decides which tool calls run, and audits every decision.
#[derive(Debug, Parser)]
#[command(name = "toolgate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a built-in toolset over MCP on stdin/stdout (or Streamable HTTP with `--http`),
    /// behind the policy gate.
    Serve(serve::Args),
    /// Put the gate in front of existing MCP servers (stdio child processes or HTTP URLs) and
    /// serve their tools on stdin/stdout (or Streamable HTTP with `--http`).
    Proxy(proxy::Args),
    /// Pin the upstreams' tool definitions in a lock file that `proxy` enforces.
    Pin(pin::Args),
    /// Work with the audit log.
    #[command(subcommand)]
    Audit(audit::Command),
    /// Run the seed scenario against a real `toolgate serve` child and print what happened.
    Demo(demo::Args),
    /// Decide pending approvals from another terminal while the server runs.
    Approvals(approvals::Args),
    /// Decide pending approvals in a browser: a live web console on the data directory.
    Console(console::Args),
    /// Idempotency keys whose outcome is unknown: list them, or forget one after checking.
    Keys(keys::Args),
    /// Block every tool (durable; a running server obeys on its next call).
    Killswitch(killswitch::Args),
    /// Run an agent whose every tool call goes through the gate (seed 003), resume it, list runs.
    #[command(subcommand)]
    Agent(agent::Command),
    /// Validate a policy, or explain how it decides one call.
    #[command(subcommand)]
    Policy(policy::Command),
}

fn main() -> ExitCode {
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("toolgate: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs the command on the runtime its kind needs (`runtime.rs`).
fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    runtime::Shape::of(&cli.command).run(async move {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Proxy(args) => proxy::run(args).await,
            Command::Pin(args) => pin::run(args).await,
            Command::Keys(args) => keys::run(args).await,
            Command::Audit(command) => audit::run(command).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Policy(command) => policy::run(command).await,
            Command::Approvals(args) => approvals::run(args).await,
            Command::Console(args) => console::run(args).await,
            Command::Killswitch(args) => killswitch::run(args).await,
            Command::Agent(command) => agent::run(command).await,
        }
    })
}

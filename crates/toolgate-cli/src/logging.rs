//! Logs: JSON lines on stderr, because stdout is the stdio transport's wire.
//! `TOOLGATE_LOG` takes a tracing filter; the default depends on the command (`info` for a server,
//! `warn` where stdout is a report a person reads).

use tracing_subscriber::EnvFilter;

pub(crate) fn init(default: &str) {
    let filter =
        EnvFilter::try_from_env("TOOLGATE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(false)
        .try_init();
}

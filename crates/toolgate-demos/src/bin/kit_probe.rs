//! A kit server with one tool for each behaviour of seed 004 that the kit tests check over real
//! stdio (`tests/it/kit.rs`), written against the public kit API only.
//!
//! Environment: `PROBE_DATA` (data directory, required), `PROBE_SECRET_FILE` (a secret to load),
//! `PROBE_GRACE_MS` (shutdown grace), `PROBE_ALLOW_GATED` and `PROBE_OWN_SWITCH` (gate
//! variables), `MCP_LOG_LEVEL`.

use std::process::ExitCode;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgate::kit::{
    Context, Lookup, Server, Tool, ToolError, collect, list_result, load_secret, ok_result,
};

type Args = Map<String, Value>;

#[derive(Deserialize)]
struct Sleep {
    ms: u64,
}

#[derive(Deserialize)]
struct Target {
    target: String,
}

fn tools(secret: Option<String>) -> Vec<Tool> {
    let secret = secret.unwrap_or_default();
    let leaked = secret.clone();
    vec![
        Tool::new("echo")
            .description("Answers with its arguments.")
            .handler(|args: Args, _ctx: Context| async move { ok_result(args) }),
        Tool::new("sleep")
            .description("Sleeps `ms` milliseconds, or until cancelled, then answers.")
            .input_schema(json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"],
            }))
            .handler(|Sleep { ms }, ctx: Context| async move {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => ok_result(json!({"slept_ms": ms})),
                    () = ctx.ct().cancelled() => Err(ToolError::new("cancelled").with_code("CANCELLED")),
                }
            }),
        Tool::new("hang")
            .description("Never answers on its own and ignores its cancellation; times out after 300 ms.")
            .timeout(Duration::from_millis(300))
            .handler(|_: Args, _ctx: Context| async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                ok_result("woke")
            }),
        Tool::new("stray")
            .description("Writes to stdout, as careless code does, then answers.")
            .handler(move |_: Args, _ctx: Context| {
                let secret = secret.clone();
                async move {
                    // The point of this tool: a stray write the guard must keep off the protocol.
                    #[allow(clippy::print_stdout)]
                    {
                        println!("stray output {{\"jsonrpc\":\"2.0\"}} key={secret}");
                    }
                    ok_result("wrote to stdout")
                }
            }),
        Tool::new("leak")
            .description("Logs the loaded secret and fails with it in the message.")
            .handler(move |_: Args, ctx: Context| {
                let secret = leaked.clone();
                async move {
                    ctx.log().info(format_args!("using the key {secret}"));
                    Err::<toolgate::kit::Output, _>(
                        ToolError::new(format!("the billing api refused key {secret}"))
                            .with_code("UPSTREAM_DOWN"),
                    )
                }
            }),
        Tool::new("found_nothing")
            .description("A lookup that ran and found nothing.")
            .handler(|_: Args, _ctx: Context| async move {
                list_result(Vec::<String>::new(), &Lookup::new("invoices", "billing db"))
            }),
        Tool::new("lookup_failed")
            .description("A lookup whose source failed.")
            .handler(|_: Args, _ctx: Context| async move {
                collect(&Lookup::new("invoices", "billing api"), async {
                    Err::<Option<Vec<String>>, _>("billing api returned 503")
                })
                .await
            }),
        Tool::new("lookup_no_value")
            .description("A lookup that returned no value at all.")
            .handler(|_: Args, _ctx: Context| async move {
                collect(&Lookup::new("invoices", "billing api"), async {
                    Ok::<Option<Vec<String>>, String>(None)
                })
                .await
            }),
        Tool::new("wipe")
            .description("Wipes a target. Gated, with a dry run.")
            .input_schema(json!({
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
            }))
            .gated()
            .dry_run(|Target { target }, _ctx: Context| async move {
                Ok(json!({"would": format!("wipe {target}"), "reversible": false}))
            })
            .handler(|Target { target }, _ctx: Context| async move {
                ok_result(json!({"wiped": target}))
            }),
        Tool::new("zap")
            .description("Gated, without a dry run.")
            .gated()
            .handler(|_: Args, _ctx: Context| async move { ok_result("zapped") }),
        Tool::new("own_switch")
            .description("Gated behind a variable of its own.")
            .gated()
            .gate_env("PROBE_OWN_SWITCH")
            .handler(|_: Args, _ctx: Context| async move { ok_result("switched") }),
    ]
}

#[tokio::main]
async fn main() -> ExitCode {
    // This probe is configured by its environment, like the seed's servers.
    #[allow(clippy::disallowed_methods)]
    let var = |name: &str| std::env::var(name).ok();
    let secret = match var("PROBE_SECRET_FILE").map(load_secret).transpose() {
        Ok(secret) => secret.map(|s| s.expose().to_owned()),
        Err(error) => return fail(&error),
    };
    let Some(data) = var("PROBE_DATA") else {
        return fail(&"PROBE_DATA is not set");
    };
    let grace = var("PROBE_GRACE_MS")
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis);
    let server = Server::new("probe")
        .version("0.1.0")
        .shutdown_grace(grace)
        .data_dir(data)
        .tools(tools(secret));
    match server.serve_stdio().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    }
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("kit_probe: {error}\n"));
    ExitCode::FAILURE
}

#!/usr/bin/env bash
# Instructions per tools/call spent by `toolgate proxy --http` (and by the no-gate relay under it),
# counted by valgrind's callgrind: a figure that does not move with the machine's load, for A/B
# questions that latency medians on a shared 2-core host cannot settle (docs/performance.md,
# "Instructions per call").
#
#   bench/instructions.sh [--seconds S] [--warmup S]
#
# Upstream: @modelcontextprotocol/server-everything over Streamable HTTP (scripts/install-peers),
# a fresh process for each configuration. Client: examples/http_bench.rs, legacy sessions, `echo`,
# 1 connection, closed loop. Configurations, one after the other: examples/http_relay.rs (the
# proxy's HTTP parts relaying bytes, no gate); `toolgate proxy --audit buffered` with this
# checkout's release build; and, with TOOLGATE_BIN_B, the same with that binary. Each runs under
# `valgrind --tool=callgrind --instr-atstart=no` on one tokio worker; counting is switched on for
# the counted window only (--seconds, default 10; after --warmup, default 3), so start-up, the
# handshake and the shutdown are not in the figure. Prints instructions per call for each, and
# the callgrind output files for callgrind_annotate.
#
# Under valgrind the sha2 crate does not see the CPU's SHA extensions and runs its portable code:
# the audit chain's hashing counts about 34k instructions per call here, far more than it costs
# natively. Compare configurations with each other, not with native CPU time.
#
# Needs valgrind (Debian: apt-get install valgrind).
# TOOLGATE_BIN     the toolgate binary to count (default: this checkout's release build).
# TOOLGATE_BIN_B   a second toolgate binary (e.g. another commit's, scripts/build-at).
set -euo pipefail

seconds=10
warmup=3

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

while (($#)); do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench/instructions.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
command -v valgrind >/dev/null || { echo "bench/instructions.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
everything=$repo/.peers/node/node_modules/.bin/mcp-server-everything
[[ -x $everything ]] || { echo "bench/instructions.sh: $everything is missing; run scripts/install-peers" >&2; exit 2; }

if [[ -z ${TOOLGATE_BIN:-} ]]; then
    cargo build --release --quiet --manifest-path "$repo/Cargo.toml" -p toolgate-cli --bin toolgate \
        --example http_bench --example http_relay
fi
toolgate=${TOOLGATE_BIN:-$repo/target/release/toolgate}
http_bench=$repo/target/release/examples/http_bench
http_relay=$repo/target/release/examples/http_relay
if [[ -n ${TOOLGATE_BIN_B:-} && ! -x $TOOLGATE_BIN_B ]]; then
    echo "bench/instructions.sh: TOOLGATE_BIN_B=$TOOLGATE_BIN_B is not an executable" >&2
    exit 2
fi

tmp=$(mktemp -d "${BENCH_TMP:-$repo/target}/instructions.XXXXXX")
started=()
cleanup() {
    local p
    for p in "${started[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

load() { # load URL SECONDS: one closed-loop run at 1 connection; prints http_bench's JSON line
    "$http_bench" load --url "$1" --mode legacy --tool echo --args '{"message":"call {i}"}' \
        --concurrency 1 --duration "$2" --warmup 0 2>/dev/null
}

cat >"$tmp/policy.toml" <<'TOML'
version = 2
name = "bench-instructions"

[defaults]
tier = "blocked"

[tools.echo]
tier = "low"
TOML

# count CONFIG: instructions per call of CONFIG (relay, or a toolgate binary's path), printed.
count() {
    local config=$1 up_port port up_pid pid out calls total dir
    dir=$tmp/$(basename "$config")-$RANDOM
    mkdir -p "$dir"
    up_port=$(free_port)
    port=$(free_port)
    PORT=$up_port "$everything" streamableHttp >"$dir/everything.log" 2>&1 &
    up_pid=$!
    started+=("$up_pid")
    local server=("$config" proxy --policy "$tmp/policy.toml" --data "$dir/data" --audit buffered --grace 1
        --http "127.0.0.1:$port" --insecure-no-auth --upstream "ev=http://127.0.0.1:$up_port/mcp")
    [[ $config == relay ]] && server=("$http_relay" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$up_port")
    TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$dir/callgrind.out" "${server[@]}" >"$dir/server.log" 2>&1 &
    pid=$!
    started+=("$pid")
    # Under valgrind start-up takes seconds.
    await_calls 120 0.5 "bench/instructions.sh: $config" "$dir/server.log" load "http://127.0.0.1:$port/mcp" 0.5
    load "http://127.0.0.1:$port/mcp" "$warmup" >/dev/null
    callgrind_control --instr=on "$pid" >/dev/null 2>&1
    out=$(load "http://127.0.0.1:$port/mcp" "$seconds")
    callgrind_control --instr=off "$pid" >/dev/null 2>&1
    calls=$(field "$out" ok)
    if [[ -z $calls || $calls == 0 || $(field "$out" errors) != 0 ]]; then
        log "bench/instructions.sh: errors ($config): $out"
        return 1
    fi
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    kill "$up_pid" 2>/dev/null || true
    total=$(callgrind_annotate "$dir/callgrind.out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    printf '%-28s %8d calls  %8d instructions/call  %s\n' "$(basename "$config")" "$calls" \
        "$((total / calls))" "$dir/callgrind.out"
}

log "== instructions per call, echo, 1 connection, ${warmup} s warm-up + ${seconds} s counted (callgrind)"
count relay
count "$toolgate"
[[ -z ${TOOLGATE_BIN_B:-} ]] || count "$TOOLGATE_BIN_B"

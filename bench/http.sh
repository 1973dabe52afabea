#!/usr/bin/env bash
# tools/call over Streamable HTTP: toolgate with auth on, toolgate with auth off, and the seed 000
# server served over HTTP by the official Python SDK, at fixed rates (open loop) and at saturation
# (closed loop), in one run.
#
#   bench/http.sh [--baseline DIR | --no-baseline] [--rates "100 500 1000"] [--concurrency "16 64"]
#                 [--duration S] [--warmup S] [--mode modern|legacy] [--alg ES256|RS256]
#                 [--no-fresh-tokens]
#
# --baseline DIR   the seed 000 server (`server.py`, `policy.json`); default ../shared/peers/
#                  seed-gated-fs next to the repository, if it is there. Its `server.py` is copied
#                  with only its last line changed to `mcp.run(transport="streamable-http", port=…)`
#                  and run with the official Python SDK (mcp==2.1.1, from its requirements.lock.txt)
#                  in $BENCH_VENV if set (and kept), else in the run's temporary directory.
# --rates          open-loop rates, requests per second (default "100 500 1000")
# --concurrency    closed-loop levels, requests outstanding (default "16 64")
# --duration S     counted seconds per run (default 20); --warmup S before it (default 5)
# --mode           modern (stateless MCP 2026-07-28 POSTs, default) or legacy (initialize 2025-11-25
#                  per worker, then Mcp-Session-Id)
# --alg            the signing algorithm of the bench's JWTs (default ES256)
# --no-fresh-tokens  skip the fourth configuration: toolgate with auth on where every call carries
#                  a token it has not verified yet (20,000 distinct tokens in turn, more than its
#                  cache of verified tokens holds), i.e. a full signature check on every call
# BENCH_TMP        where the data directories go (default ./target): the disk being measured.
# TOOLGATE_BIN     the toolgate binary to measure (default: this checkout's release build); an A/B
#                  against another commit runs the script twice, once with a build of it
#                  (scripts/build-at COMMIT).
#
# Every run is a fresh server process on a fresh data directory; the servers take turns at
# each load level. Calls are `write_note` with a request_id unique per call, so every call is a
# durable write. See docs/performance.md, "HTTP (issue 5)".
set -euo pipefail

baseline=auto
rates="100 500 1000"
levels="16 64"
duration=20
warmup=5
mode=modern
alg=ES256
fresh=1

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
        --baseline) baseline=$2; shift 2 ;;
        --no-baseline) baseline=""; shift ;;
        --rates) rates=$2; shift 2 ;;
        --concurrency) levels=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --mode) mode=$2; shift 2 ;;
        --alg) alg=$2; shift 2 ;;
        --no-fresh-tokens) fresh=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench/http.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
cd "$repo"
if [[ $baseline == auto ]]; then
    baseline=""
    [[ -f $repo/../shared/peers/seed-gated-fs/server.py ]] && baseline=$repo/../shared/peers/seed-gated-fs
fi
if [[ -n $baseline ]]; then
    baseline=$(cd "$baseline" && pwd)
    [[ -f $baseline/server.py && -f $baseline/policy.json ]] ||
        { echo "bench/http.sh: $baseline has no server.py and policy.json" >&2; exit 2; }
fi

trap 'log "bench/http.sh: a step failed (line $LINENO); its output is above"' ERR

log "== building release binaries"
cargo build --quiet --release -p toolgate-cli --bin toolgate --example http_bench
toolgate=${TOOLGATE_BIN:-$repo/target/release/toolgate}
bench=$repo/target/release/examples/http_bench

mkdir -p "${BENCH_TMP:-$repo/target}"
tmp=$(mktemp -d -p "${BENCH_TMP:-$repo/target}" http-bench.XXXXXX)
server_pid=""
stop_server() {
    if [[ -n $server_pid ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
cleanup() {
    stop_server
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The seed's own policy, for both servers (toolgate serves it with --toolset ledger).
policy=${baseline:+$baseline/policy.json}
if [[ -z $policy ]]; then
    policy=$tmp/policy.json
    cat >"$policy" <<'JSON'
{"version":1,"allow":["write_note","read_ledger"],"deny":["rm_rf"],"arg_rules":{"write_note":{"request_id":{"min_len":8},"text":{"max_len":2000}}}}
JSON
fi

# Every timed run starts with nothing dirty in the page cache (see bench/run.sh).
settle() { sync; }

port_auth=$(free_port) port_noauth=$(free_port) port_seed=$(free_port)

# --- The seed server over HTTP ---
if [[ -n $baseline ]]; then
    venv=${BENCH_VENV:-$tmp/venv}
    if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import mcp' 2>/dev/null; then
        log "== creating the baseline's Python environment in $venv"
        python3 -m venv "$venv"
        if [[ -f $baseline/requirements.lock.txt ]]; then
            "$venv/bin/pip" install --quiet -r "$baseline/requirements.lock.txt"
        else
            "$venv/bin/pip" install --quiet "mcp==2.1.1"
        fi
    fi
    mkdir -p "$tmp/seed"
    # Only the last line changes: mcp==2.1.1 takes host and port as arguments of run() (no
    # settings or environment variables for them); the host defaults to 127.0.0.1.
    last=$(tail -n 1 "$baseline/server.py")
    [[ $last == '    mcp.run(transport="stdio")' ]] ||
        { log "bench/http.sh: unexpected last line of $baseline/server.py: $last"; exit 2; }
    sed '$ s/.*/    mcp.run(transport="streamable-http", port=int(os.environ["SEED_HTTP_PORT"]))/' \
        "$baseline/server.py" >"$tmp/seed/server.py"
    [[ $(diff "$baseline/server.py" "$tmp/seed/server.py" | grep -c '^[<>]') == 2 ]]
    log "   seed server: $(diff "$baseline/server.py" "$tmp/seed/server.py" | grep '^>' | sed 's/^> *//')"
    seed_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))')
else
    log "== no --baseline: the comparison with the seed server is skipped"
fi

# --- Keys and a token for toolgate with auth on ---
issuer=https://issuer.bench.invalid
resource=http://127.0.0.1:$port_auth/mcp
"$bench" keys --dir "$tmp/keys" --alg "$alg" 2>/dev/null
token=$("$bench" mint --dir "$tmp/keys" --iss "$issuer" --aud "$resource" --sub bench-user \
    --scope "ledger" --ttl 86400)
if ((fresh)); then
    "$bench" mint --dir "$tmp/keys" --iss "$issuer" --aud "$resource" --sub bench-user \
        --scope "ledger" --ttl 86400 --count 20000 >"$tmp/tokens.txt"
fi

# start CONFIG DIR: starts one server on a fresh DIR; sets server_pid and url.
start() {
    local config=$1 dir=$2 port
    mkdir -p "$dir"
    case "$config" in
        auth | authx)
            port=$port_auth
            "$toolgate" serve --policy "$policy" --data "$dir/data" --toolset ledger --grace 1 \
                --http "127.0.0.1:$port" --issuer "$issuer" --jwks-file "$tmp/keys/jwks.json" \
                --algorithm "$alg" >"$dir/server.log" 2>&1 &
            ;;
        noauth)
            port=$port_noauth
            "$toolgate" serve --policy "$policy" --data "$dir/data" --toolset ledger --grace 1 \
                --http "127.0.0.1:$port" --insecure-no-auth >"$dir/server.log" 2>&1 &
            ;;
        seed)
            port=$port_seed
            mkdir -p "$dir/cwd"
            (cd "$dir/cwd" && SEED_HTTP_PORT=$port LEDGER_DIR=$dir/ledger POLICY_PATH=$policy \
                exec "$venv/bin/python" "$tmp/seed/server.py" >"$dir/server.log" 2>&1) &
            ;;
    esac
    server_pid=$!
    url=http://127.0.0.1:$port/mcp
    local i
    for ((i = 0; i < 200; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
    log "bench/http.sh: the $config server did not start on port $port; its output:"
    tail -n 20 "$dir/server.log" >&2
    return 1
}

declare -A result
# run CONFIG KIND(rate|conc) VALUE: one load run against a fresh server; stores the JSON line.
run() {
    local config=$1 kind=$2 value=$3 tag=$1-$2-$3 out
    local dir=$tmp/$tag
    start "$config" "$dir"
    local load=(--rate "$value")
    [[ $kind == conc ]] && load=(--concurrency "$value")
    local auth=()
    [[ $config == auth ]] && auth=(--token "$token")
    [[ $config == authx ]] && auth=(--token-file "$tmp/tokens.txt")
    settle
    out=$("$bench" load --url "$url" "${auth[@]}" --tool write_note --mode "$mode" \
        --args "{\"request_id\":\"bench-{i}-$tag\",\"text\":\"note {i}\"}" --expect-status committed \
        "${load[@]}" --duration "$duration" --warmup "$warmup" --server-pid "$server_pid" \
        2>"$dir/client.err")
    stop_server
    if [[ -s $dir/client.err ]]; then sed 's/^/   /' "$dir/client.err" >&2; fi
    if [[ $config != seed ]]; then
        # Every answered call left one record in the chain; the chain must verify.
        local v
        v=$("$toolgate" audit verify "$dir/data/audit.jsonl" --json) ||
            { log "bench/http.sh: audit chain of $tag does not verify: $v"; return 1; }
        out="${out%\}},\"audit_records\":$(field "$v" records)}"
        # The server logs its journal's counts at exit: records and the flushes that carried them.
        local stats
        stats=$(grep -F '"journal stats at exit"' "$dir/server.log" | tail -n1 || true)
        if [[ -n $stats ]]; then
            out="${out%\}},\"journal_records\":$(field "$stats" records),\"journal_syncs\":$(field "$stats" syncs)}"
        fi
    fi
    log "   $(printf '%-7s' "$config") $out"
    result[$tag]=$out
    rm -rf "$dir"
}

fstype=$(df -T "$tmp" | awk 'NR == 2 { print $2 }')
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
load_avg=$(cut -d' ' -f1-3 /proc/loadavg)
log "== machine: $(nproc) cores available ($cpu), $(uname -sr), data on $fstype, load average $load_avg"
warn_if_cpus_busy

configs=(auth noauth)
((fresh)) && configs=(auth authx noauth)
[[ -n $baseline ]] && configs+=(seed)
loads=()
for r in $rates; do loads+=("rate $r"); done
for c in $levels; do loads+=("conc $c"); done
for l in "${loads[@]}"; do
    read -r kind value <<<"$l"
    log "== $([[ $kind == rate ]] && echo "open loop, $value/s" || echo "closed loop, $value outstanding"): ${warmup} s warm-up + ${duration} s"
    for config in "${configs[@]}"; do
        run "$config" "$kind" "$value"
    done
done

# --- Report ---
name() {
    case "$1" in
        auth) echo "toolgate, auth on (JWT $alg)" ;;
        authx) echo "toolgate, auth on, a new token every call" ;;
        noauth) echo "toolgate, auth off" ;;
        seed) echo "seed server (Python SDK $seed_version)" ;;
    esac
}
us_per() { # CPU seconds, calls -> microseconds per call
    if [[ -z $1 || -z $2 || $2 == 0 ]]; then echo "-"; else calc "$1 * 1000000 / $2" 0; fi
}
echo
echo "tools/call over HTTP ($mode), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $fstype, CPUs busy before the first run $busy%"
echo "write_note, unique request_id per call (every call a durable write); ${warmup} s warm-up + ${duration} s counted per run; fresh server and data directory per run"
echo
echo "| Server | Load | Sent | OK | Errors (http/transport/jsonrpc/tool/unexp./unsent) | Req/s | p50 ms | p90 ms | p99 ms | max ms | Server CPU µs/call | Client CPU µs/call | Others' CPU (cores) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for l in "${loads[@]}"; do
    read -r kind value <<<"$l"
    for config in "${configs[@]}"; do
        o=${result[$config-$kind-$value]}
        ok=$(field "$o" ok)
        label="$value/s"
        [[ $kind == conc ]] && label="saturation, $value outstanding"
        others=$(calc "($(field "$o" machine_cpu_s) - $(field "$o" client_cpu_s) - $(field "$o" server_cpu_s)) / $(field "$o" window_s)")
        printf '| %s | %s | %s | %s | %s (%s/%s/%s/%s/%s/%s) | %s | %s | %s | %s | %s | %s | %s | %s |\n' \
            "$(name "$config")" "$label" "$(field "$o" sent)" "$ok" "$(field "$o" errors)" \
            "$(field "$o" errors_http)" "$(field "$o" errors_transport)" "$(field "$o" errors_jsonrpc)" \
            "$(field "$o" errors_tool)" "$(field "$o" errors_unexpected)" "$(field "$o" errors_unsent)" \
            "$(calc "$(field "$o" rps)" 0)" "$(field "$o" p50_ms)" "$(field "$o" p90_ms)" "$(field "$o" p99_ms)" \
            "$(field "$o" max_ms)" "$(us_per "$(field "$o" server_cpu_s)" "$ok")" "$(us_per "$(field "$o" client_cpu_s)" "$ok")" \
            "$others"
    done
done

echo
best_auth=0 best_level=""
for c in $levels; do
    r=$(field "${result[auth-conc-$c]}" rps)
    if awk "BEGIN { exit !($r > $best_auth) }"; then best_auth=$r best_level=$c; fi
    line="saturation, $c outstanding: toolgate-auth / toolgate-noauth = $(calc "$r / $(field "${result[noauth-conc-$c]}" rps)")x"
    if ((fresh)); then
        line+=", new token every call / toolgate-noauth = $(calc "$(field "${result[authx-conc-$c]}" rps) / $(field "${result[noauth-conc-$c]}" rps)")x"
    fi
    if [[ -n $baseline ]]; then
        line+=", toolgate-auth / seed = $(calc "$r / $(field "${result[seed-conc-$c]}" rps)" 1)x"
    fi
    echo "$line"
done
for r in $rates; do
    a=$(field "${result[auth-rate-$r]}" p50_ms) n=$(field "${result[noauth-rate-$r]}" p50_ms)
    line="$r/s: p50 toolgate-auth / toolgate-noauth = $(calc "$a / $n")x"
    if [[ -n $baseline ]]; then
        line+=", seed / toolgate-auth = $(calc "$(field "${result[seed-rate-$r]}" p50_ms) / $a" 1)x (latency)"
    fi
    echo "$line"
done
for c in $levels; do
    for config in "${configs[@]}"; do
        [[ $config == seed ]] && continue
        o=${result[$config-conc-$c]}
        rec=$(field "$o" journal_records) syn=$(field "$o" journal_syncs)
        if [[ -n $rec && -n $syn && $syn != 0 ]]; then
            echo "$(name "$config"), $c outstanding: $rec audit records in $syn flushes ($(calc "$rec / $syn" 1) per flush, warm-up included)"
        fi
    done
done
echo
verdict() { awk "BEGIN { exit !($1) }" && echo met || echo "not met"; }
echo "| Target | Measured | Result |"
echo "| --- | --- | --- |"
if [[ -n $best_level ]]; then
    echo "| >= 4,000 requests/s, auth + policy + durable audit (saturation) | $(calc "$best_auth" 0) req/s ($best_level outstanding) | $(verdict "$best_auth >= 4000") |"
fi
if [[ -n ${result[auth-rate-1000]:-} ]]; then
    e=$(field "${result[auth-rate-1000]}" errors)
    echo "| 0 errors at 1,000 requests/s, auth on | $e errors of $(field "${result[auth-rate-1000]}" sent) sent | $(verdict "$e == 0") |"
fi

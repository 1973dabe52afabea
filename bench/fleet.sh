#!/usr/bin/env bash
# A fleet's cost (issue 15): tools/call over Streamable HTTP with JWT auth, the orders policy and a
# durable audit record per call, on the embedded store and on PostgreSQL, in one run:
#   sqlite   one replica, toolgate.db and DATA/audit.jsonl (synced): the default
#   postgres one replica, --store postgres://… (approvals, keys, switch in the database; every
#            record appended to the central ledger)
#   fleet3   three replicas on the same PostgreSQL store, the load spread evenly over them
# then the audit append alone (examples/ledger_bench.rs): the local journal beside the central
# ledger, p50/p99 at 1, 16 and 64 appends in flight.
#
#   bench/fleet.sh [--concurrency 16] [--duration 10] [--warmup 3] [--rounds 3] [--store URL]
#
# --store   the PostgreSQL server (default TOOLGATE_TEST_POSTGRES, else the local one that
#           scripts/start-postgres starts); each run gets a fresh schema of its own.
# Calls are `lookup_order` (low tier: allowed, run, audited). Rounds alternate the configurations;
# each figure is the median of the rounds. See docs/performance.md, "A fleet on PostgreSQL".
set -euo pipefail

conc=16
duration=10
warmup=3
rounds=3
store=${TOOLGATE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        --concurrency) conc=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --store) store=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench/fleet.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
cd "$repo"

log "== building release binaries"
cargo build --quiet --release -p toolgate-cli --bin toolgate --example http_bench --example ledger_bench
toolgate=${TOOLGATE_BIN:-$repo/target/release/toolgate}
bench=$repo/target/release/examples/http_bench
ledger_bench=$repo/target/release/examples/ledger_bench
TOOLGATE_TEST_POSTGRES=$store ./scripts/start-postgres

tmp=$(mktemp -d -p "$repo/target" fleet-bench.XXXXXX)
pids=()
stop_servers() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
cleanup() { stop_servers; rm -rf "$tmp"; }
trap cleanup EXIT

issuer=https://issuer.bench.invalid
"$bench" keys --dir "$tmp/keys" --alg ES256 2>/dev/null
fresh_store() {
    local schema=tg_bench_$RANDOM$RANDOM
    psql "$store" -qAtc "CREATE SCHEMA $schema" >/dev/null
    local sep='?'
    [[ $store == *\?* ]] && sep='&'
    echo "$store${sep}options=-c%20search_path%3D$schema"
}

# start_replicas N STORE|-: N servers on fresh data directories; sets urls[] and pids[].
start_replicas() {
    local n=$1 url=$2 i port dir
    urls=()
    for ((i = 0; i < n; i++)); do
        port=$(free_port)
        dir=$tmp/run-$RANDOM
        mkdir -p "$dir"
        local with_store=()
        [[ $url != - ]] && with_store=(--store "$url")
        "$toolgate" serve --policy policies/orders.toml --toolset orders --data "$dir/data" \
            --grace 1 --http "127.0.0.1:$port" --issuer "$issuer" --jwks-file "$tmp/keys/jwks.json" \
            --algorithm ES256 "${with_store[@]}" >"$dir/server.log" 2>&1 &
        pids+=($!)
        urls+=("http://127.0.0.1:$port/mcp")
        local tries
        for ((tries = 0; tries < 200; tries++)); do
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
            sleep 0.1
        done
    done
}

# load N: closed-loop load spread over the replicas in urls[] (conc/N each, at once); prints
# "rps p50_ms p99_ms errors" (rps summed, latencies of the first replica's client).
load() {
    local n=${#urls[@]} i each=$((conc / ${#urls[@]})) outs=()
    for ((i = 0; i < n; i++)); do
        local token
        token=$("$bench" mint --dir "$tmp/keys" --iss "$issuer" --aud "${urls[$i]}" --sub bench-user \
            --scope "payments:write" --ttl 86400)
        "$bench" load --url "${urls[$i]}" --token "$token" --tool lookup_order --mode modern \
            --args '{"order_id":"ord_1001"}' --concurrency "$each" --duration "$duration" \
            --warmup "$warmup" >"$tmp/load-$i.json" 2>"$tmp/load-$i.err" &
        outs+=($!)
    done
    wait "${outs[@]}"
    local rps=0 errors=0 p50 p99
    for ((i = 0; i < n; i++)); do
        local line
        line=$(cat "$tmp/load-$i.json")
        rps=$(calc "$rps + $(field "$line" rps)" 1)
        errors=$((errors + $(field "$line" errors)))
    done
    p50=$(field "$(cat "$tmp/load-0.json")" p50_ms)
    p99=$(field "$(cat "$tmp/load-0.json")" p99_ms)
    echo "$rps $p50 $p99 $errors"
}

log "== machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); PostgreSQL $(psql "$store" -qAtc 'SHOW server_version')"
warn_if_cpus_busy
declare -A seen
for ((round = 1; round <= rounds; round++)); do
    for config in sqlite postgres fleet3; do
        case $config in
            sqlite) start_replicas 1 - ;;
            postgres) start_replicas 1 "$(fresh_store)" ;;
            fleet3) start_replicas 3 "$(fresh_store)" ;;
        esac
        sync
        result=$(load)
        stop_servers
        log "   round $round $(printf '%-8s' $config) rps p50_ms p99_ms errors: $result"
        seen[$config]+="$result"$'\n'
    done
done

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
log ""
printf '%-9s %10s %8s %8s\n' config "req/s" "p50 ms" "p99 ms"
for config in sqlite postgres fleet3; do
    rows=${seen[$config]}
    printf '%-9s %10s %8s %8s\n' "$config" \
        "$(cut -d' ' -f1 <<<"$rows" | grep . | median)" \
        "$(cut -d' ' -f2 <<<"$rows" | grep . | median)" \
        "$(cut -d' ' -f3 <<<"$rows" | grep . | median)"
done

log ""
log "== audit append alone: local journal (synced) vs central ledger"
"$ledger_bench" --store "$store" --dir "$tmp" --records 20000 --concurrency "1 16 64"

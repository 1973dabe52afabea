#!/usr/bin/env bash
# tools/call latency through `toolgate proxy` against the same upstream called directly, in one run.
#
#   bench/proxy.sh [--transport stdio|http|both] [--http] [--rounds N] [--seq-calls N]
#                  [--burst-calls N] [--inflight K] [--mutation-calls N] [--warmup N] [--one-cpu]
#                  [--http-seconds S] [--http-warmup S]
#
# --transport      stdio (default): the testbed upstream over stdio (below); http: the everything
#                  server over Streamable HTTP (further below); both: the two, one after the other.
#                  --http is --transport http.
#
# Configurations: the testbed upstream (examples/testbed_upstream.rs) called directly; behind
# `toolgate proxy --audit buffered` ("audit off": the proxy has no switch that removes the audit, and
# buffered writes every record but leaves the flush to the OS); behind `toolgate proxy --audit synced`
# (durable, the default). Each at 1 call in flight (--seq-calls) and at K in flight (--burst-calls),
# on `echo` (tier low), alternated in --rounds rounds; every statistic is the median over rounds.
# Then `write_record` sequentially: direct, proxy synced with the tool at tier medium and
# idempotency_key = "id" (budget charge and idempotency claim in SQLite on the path), and proxy
# synced with the tool at tier low without a key (the same call with the audit only). Last, a bare
# append + fdatasync loop (examples/stdio_load.rs) with records of the audit's size, on the same disk,
# and in turns with it the same records written over a file of zeros and synced (the sync ring's way).
# --one-cpu        run every process on CPU 0 (taskset): no wake-up crosses CPUs, so what is left of
#                  the added latency is work, not waiting for an idle CPU to wake (a diagnostic).
#
# HTTP: the upstream is @modelcontextprotocol/server-everything (`mcp-server-everything
# streamableHttp`, from scripts/install-peers); the client is examples/http_bench.rs, in its legacy
# mode (the everything server speaks only the `initialize` revisions: one session per connection,
# then tools/call `echo` in it). Configurations: the everything server called directly; behind
# examples/http_relay.rs, the proxy's HTTP parts (axum in front, hyper's client connections
# behind, one runtime) relaying bytes with no gate: the floor under any proxy built of them;
# behind `toolgate proxy --http 127.0.0.1:PORT --insecure-no-auth --upstream ev=URL --audit
# buffered`; the same with `--audit synced`.
# - At 1 connection (latency): one upstream; each of --rounds rounds starts the relay and every
#   proxy in front of it afresh and is one `http_bench interleave` run, which calls the
#   configurations one call at a time, ten calls to each in turn, in a new random order every
#   cycle (--http-warmup seconds, default 2, then --http-seconds, default 5, counted per
#   configuration).
#   All of them meet the same upstream at the same moments, so its drift cancels out of the added
#   latencies.
# - At --inflight connections (requests/s): a fresh upstream (and relay or proxy) per run, closed
#   loop, --http-warmup then --http-seconds counted, configurations alternated over the rounds.
# Every figure is the median over rounds, and every ratio or difference is against the direct
# figure of the same round.
# BENCH_TMP        where the data directories go (default ./target): the disk being measured.
# TOOLGATE_BIN     the toolgate binary to measure (default: this checkout's release build).
# TOOLGATE_BIN_B   HTTP only: a second toolgate binary (e.g. another commit's, scripts/build-at),
#                  whose buffered and synced configurations take turns with the others in the
#                  same rounds: an A/B in one run.
#
# See docs/performance.md, "Gateway latency" and "Gateway over HTTP".
set -euo pipefail

transport=stdio
rounds=5
seq_calls=5000
burst_calls=20000
inflight=16
mutation_calls=2000
warmup=500
pin=()
http_seconds=5
http_warmup=2

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

while (($#)); do
    case "$1" in
        --transport) transport=$2; shift 2 ;;
        --http) transport=http; shift ;;
        --http-seconds) http_seconds=$2; shift 2 ;;
        --http-warmup) http_warmup=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --seq-calls) seq_calls=$2; shift 2 ;;
        --burst-calls) burst_calls=$2; shift 2 ;;
        --inflight) inflight=$2; shift 2 ;;
        --mutation-calls) mutation_calls=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --one-cpu) pin=(taskset -c 0); shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench/proxy.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$transport" in
    stdio | http | both) ;;
    *) echo "bench/proxy.sh: --transport is stdio, http or both, not $transport" >&2; exit 2 ;;
esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
cd "$repo"

trap 'log "bench/proxy.sh: a step failed (line $LINENO); its output is above"' ERR

log "== building release binaries"
cargo build --quiet --release -p toolgate-cli --bin toolgate --example testbed_upstream --example proxy_bench \
    --example stdio_load --example http_bench --example http_relay
toolgate=${TOOLGATE_BIN:-$repo/target/release/toolgate}
testbed=$repo/target/release/examples/testbed_upstream
bench=$repo/target/release/examples/proxy_bench
load=$repo/target/release/examples/stdio_load
http_bench=$repo/target/release/examples/http_bench
http_relay=$repo/target/release/examples/http_relay

mkdir -p "${BENCH_TMP:-$repo/target}"
tmp=$(mktemp -d -p "${BENCH_TMP:-$repo/target}" proxy-bench.XXXXXX)
started=() # pids of servers this script started and has not stopped yet
stop() { # stop PID: ends one server this script started
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local keep=() p
    for p in "${started[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    started=("${keep[@]}")
}
cleanup() {
    local p
    for p in "${started[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# echo is read-only and low; write_record is a medium mutation whose idempotency key is its id, so
# every call claims a key in toolgate.db before it is forwarded and completes it after. The medium
# budget is set out of reach: past it a call would wait for a person's approval.
policy=$tmp/policy.toml
cat >"$policy" <<'TOML'
version = 2
name = "bench"

[defaults]
tier = "blocked"
medium_budget = 4000000000

[tools.echo]
tier = "low"

[tools.write_record]
tier = "medium"
idempotency_key = "id"
TOML
# The same with write_record as a plain low call: what the SQLite work of the line above costs.
policy_low=$tmp/policy-low.toml
sed -e 's/^tier = "medium"$/tier = "low"/' -e '/^idempotency_key/d' "$policy" >"$policy_low"

# Every timed run starts with nothing dirty in the page cache (see bench/run.sh).
settle() { sync; }

median() { tr -s ' ' '\n' <<<"$*" | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# run CONFIG TOOL CALLS INFLIGHT TAG: one proxy_bench run against a fresh upstream directory (and a
# fresh proxy data directory); prints proxy_bench's JSON line. Servers' stderr goes to $tmp/TAG.err.
run() {
    local config=$1 tool=$2 n=$3 k=$4 tag=$5
    local dir=$tmp/$tag server=()
    mkdir -p "$dir"
    case "$config" in
        direct) server=("$testbed" --dir "$dir/upstream") ;;
        buffered | synced)
            server=("$toolgate" proxy --policy "$policy" --data "$dir/data" --audit "$config" --name testbed --
                "$testbed" --dir "$dir/upstream") ;;
        synced-low)
            server=("$toolgate" proxy --policy "$policy_low" --data "$dir/data" --audit synced --name testbed --
                "$testbed" --dir "$dir/upstream") ;;
        *) log "unknown configuration $config"; return 2 ;;
    esac
    settle
    if ! "${pin[@]}" "$bench" --calls "$n" --inflight "$k" --tool "$tool" --warmup "$warmup" --prefix "$tag" -- \
        "${server[@]}" 2>"$tmp/$tag.err"; then
        log "proxy_bench failed ($config, $tool, $k in flight); servers' stderr:"
        tail -n 20 "$tmp/$tag.err" >&2
        return 1
    fi
    # The proxy logs its journal's counts at exit: keep the last run's for the report.
    grep -F '"journal stats at exit"' "$tmp/$tag.err" | tail -n1 >"$tmp/$tag.stats" || true
    if [[ $config == synced && ! -s $tmp/record-bytes && -s $dir/data/audit.jsonl ]]; then
        echo $(($(stat -c %s "$dir/data/audit.jsonl") / $(wc -l <"$dir/data/audit.jsonl") - 1)) >"$tmp/record-bytes"
    fi
    rm -rf "$dir"
}

# The stdio section: testbed_upstream as a child, proxy_bench on its pipes.
stdio_section() {
    configs=(direct buffered synced)
    fsync_p50="" fsync_p99="" ring_p50="" ring_p99=""
    declare -A p50 p99 rate
    add() { # add KEY JSON: appends this run's figures to the lists under KEY
        p50[$1]+=" $(field "$2" p50_us)"
        p99[$1]+=" $(field "$2" p99_us)"
        rate[$1]+=" $(field "$2" calls_per_s)"
    }

    for ((r = 1; r <= rounds; r++)); do
        # The order of configurations rotates each round, so no configuration always runs first.
        order=("${configs[@]:r % 3}" "${configs[@]:0:r % 3}")
        for k in 1 "$inflight"; do
            n=$seq_calls
            ((k == 1)) || n=$burst_calls
            log "== round $r/$rounds: echo, $n calls, $k in flight (${order[*]})"
            for config in "${order[@]}"; do
                out=$(run "$config" echo "$n" "$k" "$config-k$k-r$r")
                log "   $(printf '%-8s' "$config") $out"
                add "$config/$k" "$out"
            done
        done
        mutation_configs=(direct synced synced-low)
        order=("${mutation_configs[@]:r % 3}" "${mutation_configs[@]:0:r % 3}")
        log "== round $r/$rounds: write_record, $mutation_calls calls, 1 in flight (${order[*]})"
        for config in "${order[@]}"; do
            out=$(run "$config" write_record "$mutation_calls" 1 "write-$config-r$r")
            log "   $(printf '%-10s' "$config") $out"
            add "write/$config" "$out"
        done
        settle
        out=$("${pin[@]}" "$load" --fsync-loop "$seq_calls" --dir "$tmp" --record-bytes "$(cat "$tmp/record-bytes" 2>/dev/null || echo 540)")
        log "   fsync loop $out"
        fsync_p50+=" $(field "$out" p50_ms)" fsync_p99+=" $(field "$out" p99_ms)"
        ring_p50+=" $(field "$out" overwrite_p50_ms)" ring_p99+=" $(field "$out" overwrite_p99_ms)"
    done

    med() { local -n list=$1; median "${list[$2]}"; }
    ms() { calc "$1 / 1000" 3; }
    le() { awk "BEGIN { exit !($1 <= $2) }" && echo met || echo "not met"; }

    echo
    echo "toolgate proxy latency, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $fstype, load average after the build $load_avg"
    ((${#pin[@]} == 0)) || echo "every process on CPU 0 (--one-cpu)"
    echo "CPUs busy before the first run: $busy%; median of $rounds rounds; echo: $seq_calls calls at 1 in flight, $burst_calls at $inflight; write_record: $mutation_calls at 1; $warmup warm-up calls each"
    echo
    echo "| Path | In flight | Direct p50 / p99 (ms) | Proxy p50 / p99 (ms) | Added p50 / p99 (ms) | Proxy / direct p50 | Calls/s direct / proxy | Target | Result |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    row() { # row LABEL K DIRECT_KEY PROXY_KEY TARGET_P50_US TARGET_P99_US(or -)
        local d50 d99 x50 x99 a50 a99 target verdict
        d50=$(med p50 "$3") d99=$(med p99 "$3") x50=$(med p50 "$4") x99=$(med p99 "$4")
        a50=$(calc "$x50 - $d50" 1) a99=$(calc "$x99 - $d99" 1)
        if [[ $5 == - ]]; then
            target="-" verdict="-"
        elif [[ $6 == - ]]; then
            target="added p50 <= $(ms "$5")"
            verdict=$(le "$a50" "$5")
        else
            target="added p50 <= $(ms "$5"), p99 <= $(ms "$6")"
            local v50 v99
            v50=$(le "$a50" "$5") v99=$(le "$a99" "$6")
            if [[ $v50 == met && $v99 == met ]]; then verdict="met"
            else verdict="p50 $v50, p99 $v99"; fi
        fi
        printf '| %s | %s | %s / %s | %s / %s | %s / %s | %sx | %s / %s | %s | %s |\n' \
            "$1" "$2" "$(ms "$d50")" "$(ms "$d99")" "$(ms "$x50")" "$(ms "$x99")" "$(ms "$a50")" "$(ms "$a99")" \
            "$(calc "$x50 / $d50")" "$(calc "$(med rate "$3")" 0)" "$(calc "$(med rate "$4")" 0)" "$target" "$verdict"
    }
    for k in 1 "$inflight"; do
        row "echo, proxy --audit buffered (audit off)" "$k" "direct/$k" "buffered/$k" 300 1000
    done
    for k in 1 "$inflight"; do
        row "echo, proxy --audit synced (durable)" "$k" "direct/$k" "synced/$k" 600 -
    done
    row "write_record (medium, idempotency key), proxy synced" 1 "write/direct" "write/synced" - -
    row "write_record (low, no key), proxy synced" 1 "write/direct" "write/synced-low" - -

    echo
    echo "bare append + fdatasync loop, $(cat "$tmp/record-bytes" 2>/dev/null || echo 540)-byte records, same disk: p50 $(median "$fsync_p50") ms, p99 $(median "$fsync_p99") ms; written over zeros + fdatasync (the sync ring's way), in turns with it: p50 $(median "$ring_p50") ms, p99 $(median "$ring_p99") ms"

    echo
    for k in 1 "$inflight"; do
        stats=$(cat "$tmp/synced-k$k-r$rounds.stats" 2>/dev/null || true)
        if [[ -n $stats ]]; then
            echo "proxy synced, echo, $k in flight (last round): audit records $(field "$stats" records), syncs $(field "$stats" syncs)"
        fi
    done
    stats=$(cat "$tmp/write-synced-r$rounds.stats" 2>/dev/null || true)
    if [[ -n $stats ]]; then
        echo "proxy synced, write_record (last round): audit records $(field "$stats" records), syncs $(field "$stats" syncs)"
    fi
}
# The HTTP section: the everything server over Streamable HTTP, http_bench as the client.
everything=$repo/.peers/node/node_modules/.bin/mcp-server-everything

# listening PORT PID LOG: waits until PORT accepts connections (PID must stay alive).
listening() {
    local i
    for ((i = 0; i < 300; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        kill -0 "$2" 2>/dev/null || break
        sleep 0.05
    done
    log "nothing listens on port $1; the server's output:"
    tail -n 20 "$3" >&2
    return 1
}

# http_load URL K SECONDS WARMUP PID: one closed-loop http_bench run of echo; prints its JSON line.
http_load() {
    "${pin[@]}" "$http_bench" load --url "$1" --mode legacy --tool echo --args '{"message":"call {i}"}' \
        --concurrency "$2" --duration "$3" --warmup "$4" --server-pid "$5"
}

# http_front CONFIG UPSTREAM DIR: the relay (CONFIG relay) or a proxy (buffered, synced, and their
# -b twins from TOOLGATE_BIN_B) in front of the upstream URL, its files in DIR; leaves its pid in
# `pid` and its endpoint in `url`, once a call goes through it.
http_front() {
    local config=$1 upstream=$2 dir=$3 bin=$toolgate audit=${1%-b} port
    [[ $config == *-b ]] && bin=$TOOLGATE_BIN_B
    mkdir -p "$dir"
    port=$(free_port)
    if [[ $config == relay ]]; then
        "$http_relay" --listen "127.0.0.1:$port" --upstream "${upstream%/mcp}" >"$dir/front.log" 2>&1 &
    else
        "$bin" proxy --policy "$http_policy" --data "$dir/data" --audit "$audit" --grace 1 \
            --http "127.0.0.1:$port" --insecure-no-auth --upstream "ev=$upstream" >"$dir/front.log" 2>&1 &
    fi
    pid=$!
    started+=("$pid")
    listening "$port" "$pid" "$dir/front.log"
    url=http://127.0.0.1:$port/mcp
    # A proxy serves once the upstream's first connection attempt has ended.
    await_calls 50 0.1 "the $config front" "$dir/front.log" http_load_quiet "$url" 1 0.2 0 "$pid"
}

# http_load_quiet: http_load without its stderr (the first error of each kind).
http_load_quiet() { http_load "$@" 2>/dev/null; }

# http_upstream DIR: a fresh everything server on a free port, its log in DIR; leaves its pid in
# `up_pid` and its endpoint in `upstream`.
http_upstream() {
    local port
    mkdir -p "$1"
    port=$(free_port)
    PORT=$port "$everything" streamableHttp >"$1/everything.log" 2>&1 &
    up_pid=$!
    started+=("$up_pid")
    listening "$port" "$up_pid" "$1/everything.log"
    upstream=http://127.0.0.1:$port/mcp
}

# http_run CONFIG K TAG: a fresh everything server and, unless CONFIG is direct, a fresh relay or
# proxy in front of it; one counted http_bench run at K connections; leaves its JSON line, with a
# proxy's journal counts, in `out` (not printed: run in this shell, so that `started` knows the
# servers it has to stop).
http_run() {
    local config=$1 k=$2 dir=$tmp/$3 up_pid upstream pid url
    http_upstream "$dir"
    pid=$up_pid url=$upstream
    [[ $config == direct ]] || http_front "$config" "$upstream" "$dir"
    settle
    out=$(http_load "$url" "$k" "$http_seconds" "$http_warmup" "$pid" 2>"$dir/client.err")
    if [[ $(field "$out" errors) != 0 || $(field "$out" ok) == 0 ]]; then
        log "http_bench: errors ($config, $k connections): $out"
        cat "$dir/client.err" >&2
        tail -n 20 "$dir"/*.log >&2
        return 1
    fi
    if [[ $config != direct ]]; then
        stop "$pid"
    fi
    # A proxy's journal counts (records, syncs) at exit: how many records shared a sync.
    if [[ $config != direct && $config != relay ]]; then
        local stats
        stats=$(grep -F '"journal stats at exit"' "$dir/front.log" | tail -n1 || true)
        [[ -z $stats ]] || out="${out%\}},\"journal_records\":$(field "$stats" records),\"journal_syncs\":$(field "$stats" syncs)}"
    fi
    stop "$up_pid"
    rm -rf "$dir"
}

# http_latency: the 1-connection figures. One everything server; in every round, the relay and
# every proxy configuration started afresh in front of it, and one `http_bench interleave` run
# over them all (one call at a time, ten calls to each configuration in turn, in a new random
# order every cycle). Every configuration meets the same upstream at the same moments: the
# upstream's drift, which between separate runs is larger than what a proxy adds, falls on all of
# them alike and cancels out of the added latencies. Fresh processes every round: two processes
# of one binary, started side by side, can differ for as long as they live (by up to 0.035 ms of
# added p50, docs/performance.md, "Futures that fit the common path"); the median over rounds is
# then over several of each.
http_latency() {
    local dir=$tmp/http-latency up_pid upstream pid url config r line name targets fronts
    http_upstream "$dir"
    for ((r = 1; r <= rounds; r++)); do
        targets=() fronts=()
        for config in "${configs[@]}"; do
            if [[ $config == direct ]]; then
                targets+=(--target "direct=$upstream")
                continue
            fi
            rm -rf "$dir/$config"
            http_front "$config" "$upstream" "$dir/$config"
            fronts+=("$pid")
            targets+=(--target "$config=$url" --pid "$config=$pid")
        done
        log "== HTTP round $r/$rounds: echo, 1 connection, interleaved, ${http_warmup} s + $((http_seconds * n)) s (${configs[*]})"
        settle
        local -A radded=()
        out=$("${pin[@]}" "$http_bench" interleave "${targets[@]}" --mode legacy --tool echo \
            --args '{"message":"call {i}"}' --duration "$((http_seconds * n))" --warmup "$http_warmup" 2>"$dir/client.err")
        while read -r line; do
            name=$(sed -n 's/.*"target":"\([^"]*\)".*/\1/p' <<<"$line")
            log "   $(printf '%-10s' "$name") $line"
            if [[ $(field "$line" errors) != 0 || $(field "$line" ok) == 0 ]]; then
                log "http_bench interleave: errors ($name)"
                cat "$dir/client.err" >&2
                return 1
            fi
            hp50[$name]+=" $(field "$line" p50_ms)"
            hp90[$name]+=" $(field "$line" p90_ms)"
            hp99[$name]+=" $(field "$line" p99_ms)"
            radded[$name]=$(field "$line" added_p50_ms)
            hadded[$name]+=" ${radded[$name]}"
            hpaired[$name]+=" $(field "$line" paired_added_p50_ms)"
            hcpu1[$name]+=" $(field "$line" cpu_us_per_call)"
        done <<<"$out"
        # The gate's own share: what each proxy adds above the relay in the same round.
        for name in "${!radded[@]}"; do
            [[ $name == direct || $name == relay ]] ||
                habove[$name]+=" $(calc "${radded[$name]} - ${radded[relay]}" 3)"
        done
        for pid in "${fronts[@]}"; do stop "$pid"; done
    done
    stop "$up_pid"
}

http_section() {
    [[ -x $everything ]] || { log "bench/proxy.sh: $everything is missing; run scripts/install-peers"; return 1; }
    if [[ -n ${TOOLGATE_BIN_B:-} && ! -x $TOOLGATE_BIN_B ]]; then
        log "bench/proxy.sh: TOOLGATE_BIN_B=$TOOLGATE_BIN_B is not an executable"
        return 1
    fi
    http_policy=$tmp/http-policy.toml
    cat >"$http_policy" <<'TOML'
version = 2
name = "bench-http"

[defaults]
tier = "blocked"

[tools.echo]
tier = "low"
TOML
    local configs=(direct relay buffered synced) r config order n
    [[ -z ${TOOLGATE_BIN_B:-} ]] || configs+=(buffered-b synced-b)
    n=${#configs[@]}
    declare -A hp50 hp90 hp99 hadded hpaired habove hcpu1 hrate hcpu
    http_latency
    for ((r = 1; r <= rounds; r++)); do
        order=("${configs[@]:r % n}" "${configs[@]:0:r % n}")
        log "== HTTP round $r/$rounds: echo, $inflight connections, ${http_warmup} s + ${http_seconds} s (${order[*]})"
        for config in "${order[@]}"; do
            http_run "$config" "$inflight" "http-$config-r$r"
            log "   $(printf '%-10s' "$config") $out"
            hrate[$config]+=" $(field "$out" rps)"
            hcpu[$config]+=" $(calc "$(field "$out" server_cpu_s) * 1000000 / $(field "$out" ok)" 0)"
        done
    done

    local name d_rate target
    echo
    echo "toolgate proxy over HTTP, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, data on $fstype, CPUs busy before the first run $busy%"
    ((${#pin[@]} == 0)) || echo "every process on CPU 0 (--one-cpu)"
    echo "upstream: mcp-server-everything streamableHttp; client: http_bench, legacy sessions, echo; median of $rounds rounds"
    echo "1 connection: one upstream, every other configuration started afresh each round, called in turn, 10 calls each (http_bench interleave), ${http_warmup} s warm-up + $((http_seconds * n)) s counted per round"
    echo "$inflight connections: a fresh upstream (and relay or proxy) per run, ${http_warmup} s warm-up + ${http_seconds} s counted"
    [[ -z ${TOOLGATE_BIN_B:-} ]] || echo "A: $toolgate; B: $TOOLGATE_BIN_B"
    echo
    echo "| Configuration | p50 / p90 / p99 (ms), 1 connection | Added p50 (ms) | Paired added (ms) | Above the relay (ms) | Target | Result | CPU µs/call, 1 conn. | Req/s, $inflight connections | Proxy / direct req/s | Target | Result | CPU µs/call, $inflight conn. |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    d_rate=$(median "${hrate[direct]}")
    for config in "${configs[@]}"; do
        case "$config" in
            direct) name="direct to the upstream" target=- ;;
            relay) name="relay, no gate (the floor)" target=- ;;
            buffered*) name="proxy --audit buffered" target=0.3 ;;
            synced*) name="proxy --audit synced" target=0.6 ;;
        esac
        [[ $config == *-b ]] && name+=" (B)"
        [[ -z ${TOOLGATE_BIN_B:-} || $config == *-b || $config == direct || $config == relay ]] || name+=" (A)"
        local rate ratio added paired above cpu1 t50 v50 trate vrate
        rate=$(median "${hrate[$config]}")
        ratio=$(calc "$rate / $d_rate")
        added=- paired=- above=- cpu1=- t50=- v50=- trate=- vrate=-
        if [[ $config != direct ]]; then
            added=$(median "${hadded[$config]}") paired=$(median "${hpaired[$config]}") cpu1=$(median "${hcpu1[$config]}")
        fi
        [[ $config == direct || $config == relay ]] || above=$(median "${habove[$config]}")
        if [[ $target != - ]]; then
            t50="added p50 <= $target" trate=">= 0.80x"
            v50=$(awk "BEGIN { exit !($added <= $target) }" && echo met || echo "not met")
            vrate=$(awk "BEGIN { exit !($ratio >= 0.8) }" && echo met || echo "not met")
        fi
        printf '| %s | %s / %s / %s | %s | %s | %s | %s | %s | %s | %s | %sx | %s | %s | %s |\n' "$name" \
            "$(median "${hp50[$config]}")" "$(median "${hp90[$config]}")" "$(median "${hp99[$config]}")" \
            "$added" "$paired" "$above" "$t50" "$v50" "$cpu1" "$(calc "$rate" 0)" "$ratio" "$trate" "$vrate" \
            "$(median "${hcpu[$config]}")"
    done
    echo
    echo "Added p50: the median over rounds of each round's p50 minus the direct p50 of the same round. Paired added: the median over rounds of the median, over a round's cycles, of the configuration's median latency in the cycle minus direct's. Above the relay: the median over rounds of the proxy's added p50 minus the relay's in the same round (the gate's own share; the relay's is what two HTTP hops cost on the machine at the time)."
    echo "CPU µs/call: the CPU time of the relay or the proxy over the counted window, per call it answered (at $inflight connections: of the process the client talks to, the everything server for direct)."
}

fstype=$(df -T "$tmp" | awk 'NR == 2 { print $2 }')
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
load_avg=$(cut -d' ' -f1-3 /proc/loadavg)
log "== machine: $(nproc) cores available ($cpu), $(uname -sr), data on $fstype ($(df "$tmp" | awk 'NR == 2 { print $1 }')), load average $load_avg"
# The load average still counts the build above for a minute or more; what matters is whether
# anything else uses the CPUs now: the busy share of all CPUs over two seconds, from /proc/stat.
warn_if_cpus_busy

[[ $transport == http ]] || stdio_section
[[ $transport == stdio ]] || http_section

#!/usr/bin/env bash
# tools/call latency through `toolgate proxy` against the same upstream called directly, in one run.
#
#   bench/proxy.sh [--rounds N] [--seq-calls N] [--burst-calls N] [--inflight K]
#                  [--mutation-calls N] [--warmup N] [--one-cpu]
#
# Configurations: the testbed upstream (examples/testbed_upstream.rs) called directly; behind
# `toolgate proxy --audit buffered` ("audit off": the proxy has no switch that removes the audit, and
# buffered writes every record but leaves the flush to the OS); behind `toolgate proxy --audit synced`
# (durable, the default). Each at 1 call in flight (--seq-calls) and at K in flight (--burst-calls),
# on `echo` (tier low), alternated in --rounds rounds; every statistic is the median over rounds.
# Then `write_record` sequentially: direct, proxy synced with the tool at tier medium and
# idempotency_key = "id" (budget charge and idempotency claim in SQLite on the path), and proxy
# synced with the tool at tier low without a key (the same call with the audit only). Last, a bare
# append + fdatasync loop (examples/stdio_load.rs) with records of the audit's size, on the same disk.
# --one-cpu        run every process on CPU 0 (taskset): no wake-up crosses CPUs, so what is left of
#                  the added latency is work, not waiting for an idle CPU to wake (a diagnostic).
# BENCH_TMP        where the data directories go (default ./target): the disk being measured.
#
# See docs/performance.md, "Gateway latency".
set -euo pipefail

rounds=5
seq_calls=5000
burst_calls=20000
inflight=16
mutation_calls=2000
warmup=500
pin=()

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
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

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
cd "$repo"

log() { printf '%s\n' "$*" >&2; }
trap 'log "bench/proxy.sh: a step failed (line $LINENO); its output is above"' ERR

log "== building release binaries"
cargo build --quiet --release -p toolgate-cli --bin toolgate --example testbed_upstream --example proxy_bench \
    --example stdio_load
toolgate=$repo/target/release/toolgate
testbed=$repo/target/release/examples/testbed_upstream
bench=$repo/target/release/examples/proxy_bench
load=$repo/target/release/examples/stdio_load

mkdir -p "${BENCH_TMP:-$repo/target}"
tmp=$(mktemp -d -p "${BENCH_TMP:-$repo/target}" proxy-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

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

# Value of a flat JSON field (numbers only) in one line of JSON.
field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" <<<"$1" | head -n1; }
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

fstype=$(df -T "$tmp" | awk 'NR == 2 { print $2 }')
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
load_avg=$(cut -d' ' -f1-3 /proc/loadavg)
log "== machine: $(nproc) cores available ($cpu), $(uname -sr), data on $fstype ($(df "$tmp" | awk 'NR == 2 { print $1 }')), load average $load_avg"
# The load average still counts the build above for a minute or more; what matters is whether
# anything else uses the CPUs now: the busy share of all CPUs over two seconds, from /proc/stat.
warn_if_cpus_busy

configs=(direct buffered synced)
fsync_p50="" fsync_p99=""
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
echo "bare append + fdatasync loop, $(cat "$tmp/record-bytes" 2>/dev/null || echo 540)-byte records, same disk: p50 $(median "$fsync_p50") ms, p99 $(median "$fsync_p99") ms"

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

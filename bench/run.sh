#!/usr/bin/env bash
# toolgate's performance figures, all measured in one run on one disk, each printed with its target.
#
#   bench/run.sh [--baseline DIR] [--calls N] [--baseline-calls N] [--burst-calls N]
#                [--verify-records N] [--rounds N] [--compare BINARY]
#
# --baseline DIR   the seed 000 server (`server.py`, `policy.json`); without it the comparison with
#                  the seed server is skipped. Its Python environment (mcp==2.1.1) is made in
#                  $BENCH_VENV if set (and kept), else in the run's temporary directory.
# --compare BIN    another build of `toolgate` (say, of the commit before a change): only the
#                  sequential A/B is run, alternating rounds of this build and BIN on the same disk,
#                  and the server CPU per call of each is printed (on tmpfs the flush is free, so
#                  CPU is what is left). Build one with scripts/build-at COMMIT.
# BENCH_TMP        where the data directories go (default ./target): the disk being measured.
#
# See docs/performance.md for what each figure means.
set -euo pipefail

baseline=""
calls=2000
baseline_calls=1000
burst_calls=20000
verify_records=1000000
prefill_records=100000
rounds=5
compare=""

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
        --baseline) baseline=$2; shift 2 ;;
        --calls) calls=$2; shift 2 ;;
        --baseline-calls) baseline_calls=$2; shift 2 ;;
        --burst-calls) burst_calls=$2; shift 2 ;;
        --verify-records) verify_records=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --compare) compare=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench/run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
cd "$repo"
if [[ -n $baseline ]]; then
    baseline=$(cd "$baseline" && pwd)
    [[ -f $baseline/server.py && -f $baseline/policy.json ]] ||
        { echo "bench/run.sh: $baseline has no server.py and policy.json" >&2; exit 2; }
fi

trap 'log "bench/run.sh: a step failed (line $LINENO); its output is above"' ERR

log "== building release binaries"
cargo build --quiet --release -p toolgate-cli --bin toolgate --example stdio_load --example decide_bench
toolgate=$repo/target/release/toolgate
load=$repo/target/release/examples/stdio_load
decide_bench=$repo/target/release/examples/decide_bench

mkdir -p "${BENCH_TMP:-$repo/target}"
tmp=$(mktemp -d -p "${BENCH_TMP:-$repo/target}" bench.XXXXXX)
idle_pid=""
cleanup() {
    if [[ -n $idle_pid ]]; then kill "$idle_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

policy=$tmp/policy.json
cat >"$policy" <<'JSON'
{"version":1,"allow":["write_note","read_ledger"],"deny":["rm_rf"],"arg_rules":{"write_note":{"request_id":{"min_len":8},"text":{"max_len":2000}}}}
JSON

# Every timed run starts with nothing dirty in the page cache: otherwise the writeback of an earlier
# step (a copied log, a deleted directory) lands in the journal commit of a timed fdatasync.
settle() { sync; }

median() { tr ' ' '\n' <<<"$*" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
min() { tr ' ' '\n' <<<"$*" | sort -g | head -n1; }

# Runs stdio_load against a toolgate serve on a data directory; prints stdio_load's JSON line.
# The server's stderr (its JSON logs) goes to $4.
toolgate_load() {
    local data=$1 n=$2 k=$3 err=$4
    settle
    "$load" --calls "$n" --inflight "$k" --prefix "tg" -- \
        "$toolgate" serve --policy "$policy" --data "$data" 2>"$err"
}

# Server CPU (user + system, µs) per call of BINARY over N sequential calls: the server runs under a
# shell that prints its children's times to stderr when the server exits (stdout is the protocol).
cpu_per_call() {
    local binary=$1 n=$2 data=$3 out times
    settle
    out=$("$load" --calls "$n" --inflight 1 --prefix "ab" -- bash -c \
        '"$0" serve --policy "$1" --data "$2" 2>/dev/null; times >&2' \
        "$binary" "$policy" "$data" 2>"$data.times")
    # `times`: the shell's own line, then its children's: "0m0.420s 0m0.080s".
    times=$(sed -n 2p "$data.times")
    awk -v t="$times" -v n="$n" -v rate="$(field "$out" calls_per_s)" 'BEGIN {
        split(t, p, " ")
        for (i = 1; i <= 2; i++) { split(p[i], ms, "m"); sub("s", "", ms[2]); us[i] = (ms[1] * 60 + ms[2]) * 1e6 }
        printf "%.1f %.1f %.1f %s\n", (us[1] + us[2]) / n, us[1] / n, us[2] / n, rate }'
}

fstype=$(df -T "$tmp" | awk 'NR == 2 { print $2 }')
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
load_avg=$(cut -d' ' -f1-3 /proc/loadavg)
log "== machine: $(nproc) cores available ($cpu), $(uname -sr), data on $fstype ($(df "$tmp" | awk 'NR == 2 { print $1 }')), load average $load_avg"
# Every figure here is a ratio of two runs on this machine, but fdatasync latency and CPU share swing
# wildly while something else compiles or writes: say so rather than print numbers that mislead.
if awk "BEGIN { exit !(${load_avg%% *} > $(nproc) / 2) }"; then
    log "   warning: the machine is busy (load average $load_avg); figures will be noisy"
fi

if [[ -n $compare ]]; then
    compare=$(cd "$(dirname "$compare")" && pwd)/$(basename "$compare")
    [[ -x $compare ]] || { log "bench/run.sh: --compare $compare is not an executable"; exit 2; }
    this_cpu=() that_cpu=() this_rate=() that_rate=() this_user=() that_user=() this_sys=() that_sys=()
    for ((r = 1; r <= rounds; r++)); do
        # Alternate which build goes first, so a drift in the machine's state favours neither.
        for which in $( ((r % 2)) && echo "this that" || echo "that this"); do
            binary=$toolgate
            [[ $which == that ]] && binary=$compare
            read -r cpu user sys rate < <(cpu_per_call "$binary" "$calls" "$tmp/ab-$which-$r")
            log "   round $r $which: $cpu us of server CPU per call (user $user, system $sys), $rate calls/s"
            if [[ $which == this ]]; then
                this_cpu+=("$cpu") this_user+=("$user") this_sys+=("$sys") this_rate+=("$rate")
            else
                that_cpu+=("$cpu") that_user+=("$user") that_sys+=("$sys") that_rate+=("$rate")
            fi
            rm -rf "$tmp/ab-$which-$r"
        done
    done
    a=$(median "${this_cpu[@]}") b=$(median "${that_cpu[@]}")
    echo
    echo "sequential A/B, $rounds rounds of $calls calls each, alternating, data on $fstype"
    echo "this build:    $a us server CPU per call (median; user $(median "${this_user[@]}"), system $(median "${this_sys[@]}")), $(median "${this_rate[@]}") calls/s"
    echo "compare build: $b us server CPU per call (median; user $(median "${that_user[@]}"), system $(median "${that_sys[@]}")), $(median "${that_rate[@]}") calls/s"
    echo "ratio (this / compare): $(calc "$a / $b" 2)x  target <= 0.5x"
    echo "user-space only:        $(calc "$(median "${this_user[@]}") / $(median "${that_user[@]}")" 2)x"
    exit 0
fi

rows=()
# figure NAME MEASURED TARGET_TEXT OK(1/0/-)
figure() {
    local verdict
    case "$4" in 1) verdict="met" ;; 0) verdict="not met" ;; *) verdict="$4" ;; esac
    printf '%-52s %-28s target %-16s %s\n' "$1" "$2" "$3" "$verdict"
    rows+=("| $1 | $2 | $3 | $verdict |")
}
# Verdicts compare unrounded numbers, so that 9.96x never shows as a met 10x.
ge() { awk "BEGIN { exit !($1 >= $2) }" && echo 1 || echo 0; }
le() { awk "BEGIN { exit !($1 <= $2) }" && echo 1 || echo 0; }

# --- Sequential calls: empty log, 100k-record log, bare fdatasync loop, interleaved per round ---
log "== pre-filling an audit log with $prefill_records records"
"$load" --gen-audit "$prefill_records" --out "$tmp/prefill.jsonl" >/dev/null

seq_empty=() seq_full=() fsync=() fsync_p50=() p50_empty=() p99_empty=() frame_bytes=450
for ((r = 1; r <= rounds; r++)); do
    log "== round $r/$rounds: $calls sequential calls, empty log / $prefill_records-record log / fdatasync loop"
    dir=$tmp/seq-empty-$r
    out=$(toolgate_load "$dir" "$calls" 1 "$tmp/seq-empty-$r.err")
    log "   empty:  $out"
    seq_empty+=("$(field "$out" calls_per_s)")
    p50_empty+=("$(field "$out" p50_ms)") p99_empty+=("$(field "$out" p99_ms)")
    if ((r == 1)); then
        # The bare loop writes records the size of toolgate's own WAL frames, measured here.
        frame_bytes=$(($(stat -c %s "$dir/ledger.wal") / $(wc -l <"$dir/ledger.wal") - 1))
    fi
    rm -rf "$dir"

    dir=$tmp/seq-full-$r
    mkdir -p "$dir"
    # A log that is already there is at rest on disk, as after a restart.
    cp "$tmp/prefill.jsonl" "$dir/audit.jsonl"
    out=$(toolgate_load "$dir" "$calls" 1 "$tmp/seq-full-$r.err")
    log "   100k:   $out"
    seq_full+=("$(field "$out" calls_per_s)")
    rm -rf "$dir"

    settle
    out=$("$load" --fsync-loop "$calls" --dir "$tmp" --record-bytes "$frame_bytes")
    log "   fsync:  $out"
    fsync+=("$(field "$out" per_s)") fsync_p50+=("$(field "$out" p50_ms)")
done
tg_seq=$(median "${seq_empty[@]}")
tg_full=$(median "${seq_full[@]}")
fsync_rate=$(median "${fsync[@]}")

# What the client and two pipe hops cost by themselves: stdio_load against its own echo server.
out=$("$load" --calls "$calls" --inflight 1 -- "$load" --echo)
log "== client + pipes alone (echo server): $out"
floor_rate=$(field "$out" calls_per_s) floor_p50=$(field "$out" p50_ms)

# --- The seed server, same client, same kind of calls ---
base_seq=""
if [[ -n $baseline ]]; then
    # Absolute: the seed server runs from a directory of its own below.
    venv=$(realpath -m "${BENCH_VENV:-$tmp/venv}")
    if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import mcp' 2>/dev/null; then
        log "== creating the baseline's Python environment in $venv"
        python3 -m venv "$venv"
        if [[ -f $baseline/requirements.lock.txt ]]; then
            "$venv/bin/pip" install --quiet -r "$baseline/requirements.lock.txt"
        else
            "$venv/bin/pip" install --quiet "mcp==2.1.1"
        fi
    fi
    log "== seed server: $baseline_calls sequential calls"
    bdir=$tmp/baseline
    mkdir -p "$bdir/cwd"
    settle
    out=$(cd "$bdir/cwd" && LEDGER_DIR=$bdir/ledger POLICY_PATH=$baseline/policy.json \
        "$load" --calls "$baseline_calls" --inflight 1 --prefix "seed" -- \
        "$venv/bin/python" "$baseline/server.py" 2>"$bdir/stderr")
    log "   seed:   $out"
    base_seq=$(field "$out" calls_per_s)
else
    log "== no --baseline given: the comparison with the seed 000 server is skipped"
fi

# --- 64 calls in flight on one connection: group commit ---
log "== $burst_calls calls, 64 in flight"
# perf, where it works, counts the fdatasync calls too (a tracepoint counter costs nothing that
# shows); the server's own exit line is preferred when it logs one.
perf=()
if command -v perf >/dev/null && perf stat -x, -e syscalls:sys_enter_fdatasync -o /dev/null true 2>/dev/null; then
    perf=(perf stat -x, -e syscalls:sys_enter_fdatasync -o "$tmp/burst.perf" --)
fi
settle
out=$("${perf[@]}" "$load" --calls "$burst_calls" --inflight 64 --prefix "tg" -- \
    "$toolgate" serve --policy "$policy" --data "$tmp/burst" 2>"$tmp/burst.err")
log "   burst:  $out"
burst=$(field "$out" calls_per_s)
burst_p99=$(field "$out" p99_ms)
stats=$(grep -F '"journal stats at exit"' "$tmp/burst.err" | tail -n1 || true)
per_sync="" sync_source=""
if [[ -n $stats ]]; then
    records=$(field "$stats" records) syncs=$(field "$stats" syncs) batches=$(field "$stats" batches)
    sync_source="server's exit log"
    log "   server: records=$records syncs=$syncs batches=$batches"
elif [[ -s $tmp/burst.perf ]]; then
    records=$(wc -l <"$tmp/burst/audit.jsonl")
    syncs=$(awk -F, '/sys_enter_fdatasync/ { print $1 }' "$tmp/burst.perf")
    sync_source="perf count of fdatasync"
    log "   server logged no \"journal stats at exit\"; perf counted $syncs fdatasync calls for $records records"
else
    log "   server logged no \"journal stats at exit\" and perf is not usable; calls per fsync not measured"
fi
if [[ -n $sync_source ]] && ((syncs > 0)); then
    per_sync=$(calc "$records / $syncs" 1)
fi

# --- audit verify against openssl and sha256sum (bench/verify.sh), on the same disk ---
log "== audit verify"
mapfile -t verify_rows < <("$repo/bench/verify.sh" --records "$verify_records" --built)

# --- Idle memory ---
log "== resident memory of an idle server"
mkfifo "$tmp/idle.in"
"$toolgate" serve --policy "$policy" --data "$tmp/idle" <"$tmp/idle.in" 2>"$tmp/idle.err" &
idle_pid=$!
exec 9>"$tmp/idle.in"
sleep 1
rss_kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$idle_pid/status")
exec 9>&-
wait "$idle_pid" || true
idle_pid=""
rss_mib=$(calc "$rss_kb / 1024" 1)

# --- Figures ---
echo
echo "toolgate performance, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $fstype, load average at start $load_avg"
echo "sequential figures: median of $rounds rounds of $calls calls; WAL frame $frame_bytes bytes"
echo
int() { calc "$1" 0; }
figure "sequential durable calls/s (1 connection, inflight 1)" "$(int "$tg_seq") (p50 $(median "${p50_empty[@]}") ms, p99 $(median "${p99_empty[@]}") ms)" "-" "-"
if [[ -n $base_seq ]]; then
    ratio="$tg_seq / $base_seq"
    figure "sequential vs seed 000 server ($(int "$base_seq") calls/s)" "$(calc "$ratio" 1)x" ">= 10x" "$(ge "$ratio" 10)"
else
    figure "sequential vs seed 000 server" "skipped (no --baseline)" ">= 10x" "not measured"
fi
ratio="$tg_seq / $fsync_rate"
figure "sequential vs bare fdatasync loop ($(int "$fsync_rate")/s, p50 $(median "${fsync_p50[@]}") ms)" "$(calc "$ratio")x" ">= 0.8x" "$(ge "$ratio" 0.8)"
figure "client + pipe round trip alone (echo server)" "$(int "$floor_rate") calls/s (p50 $floor_p50 ms)" "-" "-"
figure "64 in flight: durable calls/s" "$(int "$burst") (p99 $burst_p99 ms)" ">= 10000" "$(ge "$burst" 10000)"
if [[ -n $per_sync ]]; then
    figure "64 in flight: calls per fdatasync" "$per_sync ($records records, $syncs syncs; $sync_source)" "-" "-"
else
    figure "64 in flight: calls per fdatasync" "not measured" "-" "-"
fi
ratio="$tg_full / $tg_seq"
figure "calls/s with $prefill_records records in log vs empty" "$(calc "$ratio")x ($(int "$tg_full") vs $(int "$tg_seq") calls/s)" ">= 0.9x" "$(ge "$ratio" 0.9)"
printf '%s\n' "${verify_rows[@]}"
rows+=("${verify_rows[@]}")
figure "idle serve resident memory (VmRSS after 1 s)" "$rss_mib MiB" "<= 15 MiB" "$(le "$rss_kb / 1024" 15)"

# Policy decisions and the approval store (examples/decide_bench.rs), on the same disk.
settle
decide_out=$("$decide_bench" --dir "$tmp")
decision=$(grep '"figure":"decision"' <<<"$decide_out")
store=$(grep '"figure":"approval_store"' <<<"$decide_out")
d50=$(field "$decision" p50_us)
figure "policy decision, 101 tools with CEL escalation (p50)" "$(calc "$d50") us (p99 $(calc "$(field "$decision" p99_us)") us; no-CEL lookup $(calc "$(field "$decision" baseline_no_cel_p50_us)") us)" "<= 5 us" "$(le "$d50" 5)"
figure "approval store: open+decide+consume cycles/s" "$(int "$(field "$store" cycles_per_s)") ($(int "$(field "$store" ops_per_s)") ops/s, synchronous=FULL)" "-" "-"
figure "kill switch check per call (SQLite read, no stamp cache)" "$(calc "$(field "$store" killswitch_read_us)") us" "-" "-"

echo
echo "| Figure | Measured | Target | Result |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"

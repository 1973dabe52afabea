#!/usr/bin/env bash
# `toolgate audit verify` against the hashers a reader would compare it with, on one generated
# chain in the page cache: `openssl dgst -sha256` (SHA-NI where the CPU has it; issue 15's
# baseline), `sha256sum`, and verify on one thread (what verify was before it used every core).
#
#   bench/verify.sh [--records N] [--rounds N] [--built]
#
# --records N   records in the generated chain (default 1000000)
# --rounds N    timed rounds of each command; the best of each is kept (default 3)
# --built       the release binaries are already built (bench/run.sh builds them)
#
# Progress goes to stderr; stdout gets one Markdown table row per figure, for docs/performance.md.
set -euo pipefail

records=1000000
rounds=3
built=""
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        --records) records=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --built) built=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench/verify.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/common.sh
source "$repo/bench/common.sh"
cd "$repo"
command -v openssl >/dev/null || { log "bench/verify.sh: openssl is not installed"; exit 2; }
if [[ -z $built ]]; then
    log "== building release binaries"
    cargo build --quiet --release -p toolgate-cli --bin toolgate --example stdio_load
fi
toolgate=$repo/target/release/toolgate
load=$repo/target/release/examples/stdio_load
tmp=$(mktemp -d "${BENCH_TMP:-$repo/target}/verify-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

log "== generating a $records-record audit log"
chain=$tmp/verify.jsonl
"$load" --gen-audit "$records" --out "$chain" >/dev/null
bytes=$(stat -c %s "$chain")
checked=$("$toolgate" audit verify --json "$chain")
[[ $checked == *'"intact":true'* && $checked =~ \"records\":$records[,}] ]] ||
    { log "audit verify did not accept the generated chain: $checked"; exit 1; }
cat "$chain" >/dev/null # into the page cache
mb=$(calc "$bytes / 1000000" 1)
warn_if_cpus_busy

seconds_of() {
    local start end
    start=$EPOCHREALTIME
    "$@" >/dev/null
    end=$EPOCHREALTIME
    calc "$end - $start" 4
}
best() { printf '%s\n' "$@" | sort -g | head -n1; }
openssl_t=() sha_t=() one_t=() all_t=()
for ((round = 1; round <= rounds; round++)); do
    openssl_t+=("$(seconds_of openssl dgst -sha256 "$chain")")
    sha_t+=("$(seconds_of sha256sum "$chain")")
    one_t+=("$(seconds_of "$toolgate" audit verify --threads 1 "$chain")")
    all_t+=("$(seconds_of "$toolgate" audit verify "$chain")")
done
log "   $mb MB, seconds per round: openssl ${openssl_t[*]}; sha256sum ${sha_t[*]};" \
    "verify --threads 1 ${one_t[*]}; verify ${all_t[*]}"
openssl_best=$(best "${openssl_t[@]}") sha_best=$(best "${sha_t[@]}")
one_best=$(best "${one_t[@]}") all_best=$(best "${all_t[@]}")
mbs() { calc "$bytes / $1 / 1000000" 0; }
ge() { awk "BEGIN { exit !($1 >= $2) }" && echo met || echo "not met"; }

cores=$(nproc)
ratio=$(calc "$openssl_best / $all_best")
row() { printf '| %s | %s | %s | %s |\n' "$@"; }
row "audit verify ($cores threads) vs openssl dgst -sha256 ($mb MB, $records records)" \
    "${ratio}x ($(mbs "$all_best") vs $(mbs "$openssl_best") MB/s)" ">= 0.5x" \
    "$(ge "$openssl_best / $all_best" 0.5)"
row "audit verify --threads 1 vs openssl dgst -sha256" \
    "$(calc "$openssl_best / $one_best")x ($(mbs "$one_best") MB/s)" "-" "-"
row "audit verify ($cores threads) vs sha256sum" \
    "$(calc "$sha_best / $all_best")x (sha256sum $(mbs "$sha_best") MB/s)" ">= 0.5x" \
    "$(ge "$sha_best / $all_best" 0.5)"

#!/usr/bin/env bash
# Binary size and idle resident memory of a kit server against `toolgate serve` (issue 12).
#
#   bench/footprint.sh [--profile NAME] [--rounds N]
#
# The kit server is the notes example built stdio-only (`-p toolgate --no-default-features`, as a
# kit user with `default-features = false` builds it); the baseline is `toolgate serve --toolset
# notes` from the same profile. Each binary is stripped into a scratch directory, started with its
# stdin held open (an idle stdio server, as an MCP client leaves it between calls) on a fresh data
# directory, and its VmRSS read after 3 s. Both run alternately, N rounds; the medians are printed.
# See docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
rounds=3
while (($#)); do
    case "$1" in
        --profile) profile=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

cargo build --quiet --profile "$profile" -p toolgate --no-default-features --example notes
cargo build --quiet --profile "$profile" -p toolgate-cli
dir=target/$profile
[ "$profile" = dev ] && dir=target/debug

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
strip -o "$scratch/notes" "$dir/examples/notes"
strip -o "$scratch/toolgate" "$dir/toolgate"

# Resident set of a server idling on an open stdin, in KiB.
idle_rss() {
    local data=$1
    shift
    mkdir -p "$data"
    sleep 6 | "$@" >/dev/null 2>"$data.log" &
    local pid
    sleep 3
    pid=$(pgrep -n -f "^$1( |$)") || { echo "did not start: $(cat "$data.log")" >&2; exit 1; }
    awk '/^VmRSS:/ {print $2}' "/proc/$pid/status"
    wait
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

kit=()
serve=()
for round in $(seq "$rounds"); do
    kit+=("$(NOTES_DATA="$scratch/kit-$round" NOTES_DIR=crates/toolgate/examples/data/notes \
        idle_rss "$scratch/kit-$round" "$scratch/notes")")
    serve+=("$(idle_rss "$scratch/serve-$round" "$scratch/toolgate" serve \
        --policy policies/notes.toml --data "$scratch/serve-$round" --toolset notes)")
done

kit_rss=$(printf '%s\n' "${kit[@]}" | median)
serve_rss=$(printf '%s\n' "${serve[@]}" | median)
kit_size=$(stat -c %s "$scratch/notes")
serve_size=$(stat -c %s "$scratch/toolgate")
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
kib_mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
printf 'profile %s, %s rounds (idle RSS per round: kit %s; serve %s)\n' \
    "$profile" "$rounds" "${kit[*]}" "${serve[*]}"
printf '%-34s %14s %16s\n' "" "stripped size" "idle RSS"
printf '%-34s %10s MiB %12s MiB\n' "kit: notes example, stdio-only" "$(mib "$kit_size")" "$(kib_mib "$kit_rss")"
printf '%-34s %10s MiB %12s MiB\n' "toolgate serve --toolset notes" "$(mib "$serve_size")" "$(kib_mib "$serve_rss")"
awk -v a="$kit_size" -v b="$serve_size" -v c="$kit_rss" -v d="$serve_rss" \
    'BEGIN {printf "kit / serve: size %.2fx, idle RSS %.2fx; idle RSS target 15 MiB: %s\n", a / b, c / d, (c / 1024 <= 15 ? "met" : "not met")}'

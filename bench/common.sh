# What the benchmark scripts share; sourced by every script in bench/ but footprint.sh.

# log MESSAGE...: a line on stderr (stdout is each script's report).
log() { printf '%s\n' "$*" >&2; }

# field JSON NAME: the value of a flat numeric field in one line of JSON.
field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" <<<"$1" | head -n1; }

# free_port: a TCP port of 127.0.0.1 nothing listens on now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# await_calls TRIES PAUSE WHAT LOG CMD...: runs CMD, an http_bench load that prints its JSON line,
# until a call goes through and none fails, PAUSE seconds apart (a server that has just started may
# not serve yet); after TRIES failed tries, says WHAT does not pass calls, shows the end of LOG and
# fails. Leaves CMD's last line in `out`.
await_calls() {
    local tries=$1 pause=$2 what=$3 file=$4 i
    shift 4
    for ((i = 0; ; i++)); do
        out=$("$@") || true
        [[ $(field "$out" ok) -gt 0 && $(field "$out" errors) == 0 ]] && return 0
        if ((i == tries)); then
            log "$what does not pass calls; its output:"
            tail -n 20 "$file" >&2
            return 1
        fi
        sleep "$pause"
    done
}

# calc EXPR [DECIMALS]: floating-point arithmetic (default 2 decimals).
calc() { awk "BEGIN { printf \"%.${2:-2}f\", $1 }"; }

# warn_if_cpus_busy: the busy share of all CPUs over two seconds, from /proc/stat (the load average
# still counts the release build for a minute or more), left in `busy`; a warning when something
# else runs.
warn_if_cpus_busy() {
    local busy0 total0 busy1 total1
    read -r busy0 total0 < <(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)
    sleep 2
    read -r busy1 total1 < <(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)
    busy=$(calc "100 * ($busy1 - $busy0) / ($total1 - $total0 + 1)" 0)
    printf '%s\n' "   CPUs busy before the first run: $busy% (over 2 s)" >&2
    if ((busy > 10)); then
        printf '%s\n' "   warning: something else is using the CPUs ($busy%); figures will be noisy" >&2
    fi
}

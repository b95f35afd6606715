#!/usr/bin/env bash
# What skiff-relay asks of the kernel per second on one of moq_load's rows:
# its system calls and io_uring operations, the size of its writes, and how
# many reads each readiness event costs. One second of the relay, traced
# with perf's tracepoints after the row's warm-up.
#
#   benches/relay-syscalls.sh [SKIFF_RELAY_BINARY]
#
# Env: SUBS (default 100), FRAME (65536), FPS (max), TRACE (seconds traced,
# default 1).
#
# Prints per second: system calls by name (recvfrom, setsockopt,
# io_uring_enter, others by number), io_uring operations by opcode, the
# WRITEV operations' count, mean bytes and how many wrote over 64 KiB, and
# recvfrom calls per POLL_ADD (readiness events). Needs perf (apt:
# linux-perf) and release builds of skiff-relay and moq_load in
# $CARGO_TARGET_DIR (default target). x86_64 system call numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
bin="${CARGO_TARGET_DIR:-target}/release"
relay="$(realpath "${1:-$bin/skiff-relay}")"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
trace="${TRACE:-1}"
"$bin/moq_load" --relay skiff --skiff-relay "$relay" \
  --subscribers "${SUBS:-100}" --frame-bytes "${FRAME:-65536}" --fps "${FPS:-max}" \
  --seconds $((trace + 8)) >"$out/load.log" 2>&1 &
load=$!
# Past the subscribers' start and the warm-up.
sleep 6
pid="$(pgrep -f "^$relay serve" | head -1)"
perf record -q -e raw_syscalls:sys_enter -e io_uring:io_uring_submit_req \
  -e io_uring:io_uring_complete -p "$pid" -o "$out/perf.data" -- sleep "$trace" >/dev/null 2>&1
wait "$load" || true
grep -E '^(skiff-relay|machine)' "$out/load.log" || true
perf script -i "$out/perf.data" -F event,trace 2>/dev/null | awk -v secs="$trace" '
  function field(name,   i) { for (i = 1; i < NF; i++) if ($i == name) return $(i + 1); return "" }
  /sys_enter:/ {
    nr = field("NR")
    name = nr == 45 ? "recvfrom" : nr == 54 ? "setsockopt" : nr == 426 ? "io_uring_enter" : "nr " nr
    sys[name]++
    next
  }
  /io_uring_submit_req:/ {
    op = field("opcode"); sub(/,$/, "", op)
    req = field("req"); sub(/,$/, "", req)
    ops[op]++; opof[req] = op
    next
  }
  /io_uring_complete:/ {
    req = field("req"); sub(/,$/, "", req)
    res = field("result"); sub(/,$/, "", res)
    if (opof[req] == "WRITEV" && res + 0 > 0) {
      writes++; bytes += res; if (res + 0 > 65536) big++
    }
    next
  }
  END {
    for (k in sys) printf "syscall %-16s %9.0f /s\n", k, sys[k] / secs
    for (k in ops) printf "io_uring %-15s %9.0f /s\n", k, ops[k] / secs
    if (writes) printf "writev: %.0f /s, mean %.1f KiB, %.0f /s over 64 KiB\n", writes / secs, bytes / writes / 1024, big / secs
    if (ops["POLL_ADD"]) printf "recvfrom per POLL_ADD: %.2f\n", sys["recvfrom"] / ops["POLL_ADD"]
  }' | sort

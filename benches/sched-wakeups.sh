#!/usr/bin/env bash
# Where the readers woken by the relay's writes run, and how long they wait
# for a CPU, on moq_load's latency row: moq-net's publisher and subscribers
# through skiff-relay, the scheduler traced with `perf sched record -a`.
#
#   benches/sched-wakeups.sh [SKIFF_RELAY_BINARY]
#
# Env: SUBS (default 10), FRAME (16384), FPS (60), TRACE (seconds traced,
# default 2), DRIVER (the relay's --driver; default: the relay's own).
#
# Prints the generator threads the relay woke, how many of them on the
# relay's own CPU, their median wait for a CPU (perf's "sch delay") on the
# same and on the other CPU, and the median length of the relay's runs over
# 0.2 ms (on the latency row: one per frame, taking it in and writing it to
# every subscriber). Needs perf (apt: linux-perf) and release builds of
# skiff-relay and moq_load in $CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
bin="${CARGO_TARGET_DIR:-target}/release"
relay="$(realpath "${1:-$bin/skiff-relay}")"
args="--max-connections-per-ip 100000"
[ -n "${DRIVER:-}" ] && args="$args --driver $DRIVER"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
trace="${TRACE:-2}"
"$bin/moq_load" --relay skiff --skiff-relay "$relay" --skiff-args="$args" \
  --subscribers "${SUBS:-10}" --frame-bytes "${FRAME:-16384}" --fps "${FPS:-60}" \
  --seconds $((trace + 6)) >"$out/load.log" 2>&1 &
load=$!
# Past the subscribers' start and the warm-up.
sleep 4
timeout "$trace" perf sched record -a -o "$out/sched.data" >/dev/null 2>&1 || true
wait "$load" || true
grep -E '^(skiff-relay|moq_load|machine)' "$out/load.log" || true
perf sched timehist -w -i "$out/sched.data" 2>/dev/null >"$out/timehist.txt"

# timehist lines: "TIME [CPU] TASK awakened: WAKEE" for a wake-up, and
# "TIME [CPU] TASK WAIT SCH_DELAY RUN" (ms) when TASK leaves its CPU.
awk -v same="$out/same" -v other="$out/other" -v runs="$out/runs" '
  $4 == "awakened:" {
    if ($3 ~ /^skiff-worker/ && $5 ~ /^tokio-rt-worker/) { waker_cpu[$5] = $2 }
    next
  }
  NF >= 6 && $4 ~ /^[0-9.]+$/ {
    if ($3 in waker_cpu) {
      print $5 > (($2 == waker_cpu[$3]) ? same : other)
      delete waker_cpu[$3]
    }
    if ($3 ~ /^skiff-worker/ && $6 + 0 > 0.2) { print $6 > runs }
  }
' "$out/timehist.txt"
median() { [ -s "$1" ] && sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }' || echo -; }
count() { [ -s "$1" ] && wc -l <"$1" || echo 0; }
echo "readers woken by the relay: $(( $(count "$out/same") + $(count "$out/other") ))," \
  "on the relay's CPU: $(count "$out/same") (median wait $(median "$out/same") ms)," \
  "on the other: $(count "$out/other") (median wait $(median "$out/other") ms)"
echo "relay runs over 0.2 ms: $(count "$out/runs"), median $(median "$out/runs") ms"

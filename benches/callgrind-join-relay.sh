#!/usr/bin/env bash
# Instructions and heap allocations per subscriber join (+ leave) through
# the relay's own path (skiff-core's Router, a Peer per session, relay-side
# sessions fed real moq-lite bytes in memory), for steady audiences of 1,
# 100, 1,000 and 10,000 subscribers of the joined track. See
# benches/src/bin/join_relay_probe.rs for the set-up and what is counted.
#
# Each audience runs under callgrind at two join counts; callgrind collects
# inside the relay side's functions only (relay_pass, relay_release), and
# the difference of the totals over the difference of joins is the relay's
# cost of one join + leave, free of start-up and audience set-up. The
# allocations are the whole join loop's (both sides), counted the same way.
#
#   benches/callgrind-join-relay.sh [PER_SESSION [FRAMES]]
#
# Prints one line per audience: audience instructions/join allocations/join
# Env: OUT keeps the callgrind files in that directory (for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }

CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
  cargo build --release -q -p skiff-benches --bin join_relay_probe
probe="${CARGO_TARGET_DIR:-target}/release/join_relay_probe"
if [ -n "${OUT:-}" ]; then
  out="$OUT"
  mkdir -p "$out"
else
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
extra=("$@")

run() { # audience joins -> "instructions allocations"
  local cg="$out/cg.$1.$2"
  valgrind --tool=callgrind --collect-atstart=no \
    --toggle-collect='*join_relay_probe::relay_pass*' \
    --toggle-collect='*join_relay_probe::relay_release*' \
    --callgrind-out-file="$cg" "$probe" "$1" "$2" "${extra[@]}" >"$out/stdout.$1.$2" 2>"$out/log.$1.$2" ||
    { cat "$out/log.$1.$2" >&2; exit 1; }
  local instr allocs
  instr=$(grep -E '^(summary|totals):' "$cg" | head -1 | awk '{print $2}')
  allocs=$(sed -n 's/.*allocations=\([0-9]*\).*/\1/p' "$out/stdout.$1.$2")
  echo "$instr $allocs"
}

low=100
high=200
echo "audience  instructions/join  allocations/join" >&2
for audience in 1 100 1000 10000; do
  read -r ia aa < <(run "$audience" "$low")
  read -r ib ab < <(run "$audience" "$high")
  awk -v n="$audience" -v i=$(( ib - ia )) -v a=$(( ab - aa )) -v d=$(( high - low )) \
    'BEGIN { printf "%d  %d  %g\n", n, i / d, a / d }'
done

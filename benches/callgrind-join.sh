#!/usr/bin/env bash
# Instructions per subscriber join (+ leave), counted by callgrind, for steady
# audiences of 1, 100, 1,000 and 10,000. Each audience runs at two iteration
# counts; the difference of the totals over the difference of iterations is the
# cost of one join + leave, free of start-up and audience set-up.
#
# Prints: join instr_per_op=<x> audience=<n>
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }

CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
  cargo build --release -q -p skiff-benches --bin join_probe
probe="${CARGO_TARGET_DIR:-target}/release/join_probe"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

total() { # audience iters -> total instructions
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1.$2" "$probe" "$1" "$2" 2>"$out/log.$1.$2"
  grep -E '^(summary|totals):' "$out/cg.$1.$2" | head -1 | awk '{print $2}'
}

low=1000
high=11000
for audience in 1 100 1000 10000; do
  a=$(total "$audience" "$low")
  b=$(total "$audience" "$high")
  echo "join instr_per_op=$(( (b - a) / (high - low) )) audience=$audience"
done

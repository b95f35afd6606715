#!/usr/bin/env bash
# Interleaved A/B of relay builds on the fan-out load: ROUNDS rounds, each
# build in turn, each run with its own copy-only baseline (the machine is
# noisy; compare builds within one sitting, as ratios).
#
#   benches/relay-ab.sh ROUNDS SKIFF_RELAY_BINARY...
#
# Env: SUBS (default 100), FPS (30), FRAME (65536), SECS (5).
# Needs release builds of relay_load and copy_relay in $CARGO_TARGET_DIR
# (default target): cargo build --release -p skiff-benches --bin relay_load --bin copy_relay
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="$1"; shift
bin="${CARGO_TARGET_DIR:-target}/release"
for _ in $(seq "$rounds"); do
  for relay in "$@"; do
    printf '%-40s ' "$relay"
    "$bin/relay_load" --subscribers "${SUBS:-100}" --frame-bytes "${FRAME:-65536}" \
      --fps "${FPS:-30}" --seconds "${SECS:-5}" --relay-bin "$relay" \
      --copy-bin "$bin/copy_relay" | grep -A1 '^subs' | tail -1
  done
done

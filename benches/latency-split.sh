#!/usr/bin/env bash
# Where a frame's latency goes, hop by hop, on moq_load's latency row:
# moq-net's publisher and subscribers through skiff-relay, every socket read
# and write of both processes logged with its time by an LD_PRELOAD library
# (benches/timeline), then split per frame by timeline-split. The relay runs
# on its epoll driver, whose writes are calls the library sees. moq_load's
# --marks adds the generator's own time on each side of the sockets (send
# time stamped -> first byte written, last byte read -> frame handed over),
# so the rows add up to the tool's latency.
#
#   benches/latency-split.sh [SKIFF_RELAY_BINARY]
#
# Env: SUBS (default 10), FRAME (16384), FPS (60), SECS (10).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
bin="$CARGO_TARGET_DIR/release"
cargo build -q --release -p skiff-timeline
cargo build -q --release -p skiff-interop --bin moq_load
[ $# -ge 1 ] || cargo build -q --release -p skiff-relay --bin skiff-relay
relay="${1:-$bin/skiff-relay}"
subs="${SUBS:-10}"; frame="${FRAME:-16384}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
SKIFF_TIMELINE_DIR="$logs" LD_PRELOAD="$bin/libskiff_timeline.so" \
  "$bin/moq_load" --relay skiff --skiff-relay "$relay" \
  --skiff-args="--max-connections-per-ip 100000 --driver legacy" \
  --subscribers "$subs" --frame-bytes "$frame" --fps "${FPS:-60}" --seconds "${SECS:-10}" \
  --marks "$logs/marks"
"$bin/timeline-split" --dir "$logs" --frame-bytes "$frame" --subscribers "$subs" \
  --marks "$logs/marks"

#!/usr/bin/env bash
# Time to the first checked frame of a rewind (BENCHMARKS.md C37).
#
# Records the camera (the stamped test pattern, 320x240, 30 fps, 1-second
# groups) through skiff-relay with `--record`, and after WARM seconds runs
# `viewer --from -BACKs` RUNS times for each BACK in BACKS: the viewer reads
# the replay's catalog and timeline, fetches the past groups (from the
# relay's cache within its 32 groups, from the recording beyond) and plays
# on to live. Prints each run's "first frame captured X s ago, checked
# after Y s" line, then a live viewer's first group as the anchor.
#
#   benches/rewind-ttff.sh [WORKDIR]
#
# Env: WARM (120), BACKS ("30 100"), RUNS (6), PORT (24443).
# Needs release builds of skiff-relay, camera and viewer in
# $CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d /tmp/rewind-ttff.XXXXXX)}"
mkdir -p "$work"
bin="${CARGO_TARGET_DIR:-target}/release"
port="${PORT:-24443}"
url="tcp://127.0.0.1:$port/anon"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
"$bin/skiff-relay" serve --listen "127.0.0.1:$port" --threads 1 \
  --record 'anon/**' --record-dir "$work/rec" >"$work/relay.log" 2>&1 &
pids+=($!)
sleep 1
"$bin/camera" --url "$url" >"$work/camera.log" 2>&1 &
pids+=($!)
sleep "${WARM:-120}"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for back in ${BACKS:-30 100}; do
  for _ in $(seq "${RUNS:-6}"); do
    "$bin/viewer" --url "$url" --broadcast cam.hang --from "-${back}s" --frames 300 |
      grep -E "first frame captured|FAIL" || true
  done
done
for _ in $(seq "${RUNS:-6}"); do
  "$bin/viewer" --url "$url" --broadcast cam.hang --frames 30 | grep -E "first group|FAIL" || true
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

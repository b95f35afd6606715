#!/usr/bin/env bash
# Recording against not recording (BENCHMARKS.md C35): ROUNDS rounds, each a
# moq_load row of skiff-relay without `--record` and one with
# `--record anon/load/** --record-dir` a fresh directory (which goes first
# alternates from round to round), BROADCASTS hang broadcasts of FRAME bytes
# at FPS with GROUP frames per group, SUBS viewers (one per broadcast by
# default). moq_load prints the relay's CPU, RSS, the viewers' latency, its
# disk writes over the window (/proc/PID/io) and the recorder's counters.
# After a recording row, a skiff-relay started on the directory lists it
# (`GET /recordings`): broadcasts, segments and frames stored, and the bytes
# of every file in the directory (segments, indexes, init segments) per byte
# of the frames stored.
#
#   benches/record-ab.sh ROUNDS [WORKDIR]
#
# Env: BROADCASTS (100), SUBS (BROADCASTS), FRAME (8333), FPS (30),
# GROUP (60), SECS (20), WARMUP (4), ALIGNED (every broadcast's groups end
# together: moq_load --aligned-groups), KEEP (keep the directories).
# Needs release builds of skiff-relay and moq_load in $CARGO_TARGET_DIR
# (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="$1"
work="${2:-$(mktemp -d /tmp/record-ab.XXXXXX)}"
mkdir -p "$work"
bin="${CARGO_TARGET_DIR:-target}/release"
broadcasts="${BROADCASTS:-100}"
subs="${SUBS:-$broadcasts}"
frame="${FRAME:-8333}"
metrics=127.0.0.1:9475

# Lists the recordings in $1 with a skiff-relay started on it, and sums them.
readback() {
  local dir="$1" out="$work/readback.out" addr="" pid
  "$bin/skiff-relay" serve --listen 127.0.0.1:0 --record-dir "$dir" --log error >"$out" &
  pid=$!
  for _ in $(seq 100); do
    addr=$(sed -n 's/^listening on //p' "$out" | head -1)
    [ -n "$addr" ] && break
    sleep 0.05
  done
  curl -s "http://$addr/recordings" >"$work/recordings.json"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  local dir_bytes
  dir_bytes=$(find "$dir" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  jq -r --argjson frame "$frame" --argjson dir "$dir_bytes" '
    [.[] | .tracks[]] as $t
    | ($t | map(.frames) | add // 0) as $frames
    | "            stored: \(length) broadcasts (\(map(select(.ended)) | length) ended), \($t | map(.segments) | add // 0) segments (\($t | map(.segments) | min // 0) to \($t | map(.segments) | max // 0) each), \($frames) frames; segments \(($t | map(.bytes) | add // 0) / 1e6) MB, directory \($dir / 1e6) MB = \(if $frames > 0 then ($dir / ($frames * $frame) * 1000 | round / 1000) else "-" end) × the frames stored"
  ' "$work/recordings.json"
}

row() {
  local record="$1" extra="--max-connections-per-ip 100000 --metrics $metrics"
  if [ "$record" = yes ]; then
    local dir="$work/rec.$round"
    rm -rf "$dir"
    mkdir -p "$dir"
    extra="$extra --record anon/load/** --record-dir $dir"
  fi
  echo "## recording: $record (round $round) $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$bin/moq_load" --relay skiff --broadcasts "$broadcasts" --hang --subscribers "$subs" \
    --frame-bytes "$frame" --fps "${FPS:-30}" --group-frames "${GROUP:-60}" \
    --seconds "${SECS:-20}" --warmup "${WARMUP:-4}" --relay-metrics "$metrics" ${ALIGNED:+--aligned-groups} \
    --skiff-args="$extra" | grep -v '^transport:'
  if [ "$record" = yes ]; then
    readback "$dir"
    [ -n "${KEEP:-}" ] || rm -rf "$dir"
  fi
}

for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then
    row no
    row yes
  else
    row yes
    row no
  fi
done

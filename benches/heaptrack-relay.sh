#!/usr/bin/env bash
# Peak heap of skiff-relay by allocation site under moq-net's clients
# (interop/src/bin/moq_load.rs), counted by heaptrack (apt-get install
# heaptrack): the relay runs under heaptrack, the load runs as usual, then
# the relay is stopped and heaptrack_print lists the peak consumers.
#
#   benches/heaptrack-relay.sh [moq_load options...]
#
# Default load: 1,000 subscribers, 16 KiB frames, 30 fps, 10 s. Needs release
# builds of skiff-relay and moq_load in $CARGO_TARGET_DIR (default target).
# Output: $OUT (default /tmp/skiff-heaptrack), its peaks.txt the full report.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(pwd)/${CARGO_TARGET_DIR:-target}/release"
out="${OUT:-/tmp/skiff-heaptrack}"
mkdir -p "$out"
rm -f "$out"/relay*.zst
# moq_load reads the relay's "listening on" line from its stdout; heaptrack
# prints lines of its own there, which the filter drops.
cat > "$out/relay.sh" <<WRAP
#!/usr/bin/env bash
heaptrack -o "$out/relay" "$bin/skiff-relay" "\$@" | grep --line-buffered '^listening'
WRAP
chmod +x "$out/relay.sh"
if [ "$#" -eq 0 ]; then
  set -- --subscribers 1000 --frame-bytes 16384 --fps 30 --seconds 10
fi
"$bin/moq_load" --relay skiff --skiff-relay "$out/relay.sh" "$@"
# moq_load stops the wrapper, not the relay under heaptrack: stop it so
# heaptrack writes its data out.
pkill -TERM -f "^$bin/skiff-relay serve" || true
sleep 5
heaptrack_print -f "$out"/relay.zst --print-peaks 1 --print-allocators 0 \
  --print-temporary 0 --print-leaks 0 --peak-limit 40 --merge-backtraces 1 \
  > "$out/peaks.txt" 2>/dev/null
grep -A3 "consumed over" "$out/peaks.txt" | grep -E "consumed over|at backends/" | head -40
heaptrack_print -f "$out"/relay.zst 2>/dev/null | tail -4

#!/usr/bin/env bash
# Instructions a relay build spends per delivered frame, counted by callgrind
# over 10 s of steady fan-out (30 subscribers, 64 KiB frames, 10 fps: 3,000
# frame deliveries; the relay is too slow under valgrind for more).
#
#   benches/callgrind-relay.sh SKIFF_RELAY_BINARY
#
# Env: THREADS (default 1): relay worker threads; with 2, the subscribers
# spread over both workers and the track crosses the link between them.
#
# Prints the total and per-delivery instruction counts and leaves the
# callgrind file in $OUT (default: a temporary directory, printed).
# Needs a release build of relay_load in $CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
relay="$(realpath "$1")"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
wrapper="$out/relay-under-callgrind.sh"
# relay_load starts the wrapper as the relay; it zeroes the counters once the
# load has settled (20 s: valgrind start-up and 30 subscriptions) and dumps
# them 10 s later. The epoll driver: valgrind does not follow io_uring
# reliably (the relay can sit idle under it). A 64 MiB cache starts faster.
cat >"$wrapper" <<WRAP
#!/usr/bin/env bash
( sleep 20; callgrind_control -z \$\$ >/dev/null 2>&1; sleep 10; callgrind_control -d \$\$ >/dev/null 2>&1 ) &
exec valgrind --tool=callgrind --callgrind-out-file=$out/callgrind.%p "$relay" "\$@" \
  --handshake-timeout 600s --idle-timeout 600s --write-timeout 600s --driver legacy --cache-bytes 64MiB
WRAP
chmod +x "$wrapper"
"${CARGO_TARGET_DIR:-target}/release/relay_load" --subscribers 30 --frame-bytes 65536 --fps 10 \
  --seconds 32 --threads "${THREADS:-1}" --no-baseline --relay-bin "$wrapper" >"$out/relay_load.log" 2>&1 &
load=$!
# The dump is all we need; then stop the load and the relay under valgrind.
for _ in $(seq 120); do
  ls "$out"/callgrind.*.1 >/dev/null 2>&1 && break
  sleep 1
done
sleep 2
kill "$load" 2>/dev/null || true
pkill -f "callgrind-out-file=$out/" 2>/dev/null || true
wait "$load" 2>/dev/null || true
file="$(ls "$out"/callgrind.*.1 2>/dev/null | head -1)"
[ -n "$file" ] || { echo "no callgrind dump; relay_load said:" >&2; cat "$out/relay_load.log" >&2; exit 1; }
total="$(grep -E '^summary:' "$file" | awk '{print $2}')"
echo "callgrind file: $file"
echo "relay instructions: total=$total per_delivery=$((total / 3000))"

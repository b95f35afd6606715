#!/usr/bin/env bash
# Instructions a relay build spends per delivered frame, counted by callgrind
# over 10 s of steady fan-out, 3,000 frame deliveries (the relay is too slow
# under valgrind for more), on one of two loads:
#
#   benches/callgrind-relay.sh SKIFF_RELAY_BINARY
#
# Env: LOAD (default skiff): `skiff`, skiff's own client by relay_load (30
# subscribers, 64 KiB frames, 10 fps); `moq`, moq_load's latency load with the
# published moq-net client on both ends (10 subscribers, 16 KiB frames,
# 30 fps). THREADS (default 1, skiff load only): relay worker threads; with 2,
# the subscribers spread over both workers and the track crosses the link
# between them.
#
# Prints the total and per-delivery instruction counts and the calls of the
# session's send and input steps and of writev, and leaves the callgrind file
# in $OUT (default: a temporary directory, printed). Needs a release build of
# relay_load or moq_load in $CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
relay="$(realpath "$1")"
load="${LOAD:-skiff}"
bin="${CARGO_TARGET_DIR:-target}/release"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
wrapper="$out/relay-under-callgrind.sh"
# The load starts the wrapper as the relay; it zeroes the counters once the
# load has settled (valgrind's start-up, the subscriptions, a warm-up) and
# dumps them 10 s later. The epoll driver: valgrind does not follow io_uring
# reliably (the relay can sit idle under it). A 64 MiB cache starts faster.
settle=20
[ "$load" = moq ] && settle=15
cat >"$wrapper" <<WRAP
#!/usr/bin/env bash
( sleep $settle; callgrind_control -z \$\$ >/dev/null 2>&1; sleep 10; callgrind_control -d \$\$ >/dev/null 2>&1 ) &
exec valgrind --tool=callgrind --callgrind-out-file=$out/callgrind.%p "$relay" "\$@" \
  --handshake-timeout 600s --idle-timeout 600s --write-timeout 600s --driver legacy --cache-bytes 64MiB
WRAP
chmod +x "$wrapper"
case "$load" in
  skiff)
    "$bin/relay_load" --subscribers 30 --frame-bytes 65536 --fps 10 --seconds 32 \
      --threads "${THREADS:-1}" --no-baseline --relay-bin "$wrapper" >"$out/load.log" 2>&1 &
    ;;
  moq)
    "$bin/moq_load" --relay skiff --skiff-relay "$wrapper" --subscribers 10 --frame-bytes 16384 \
      --fps 30 --seconds 25 --warmup 5 >"$out/load.log" 2>&1 &
    ;;
  *) echo "LOAD must be skiff or moq" >&2; exit 2 ;;
esac
pid=$!
# The dump is all we need; then stop the load and the relay under valgrind.
for _ in $(seq 120); do
  ls "$out"/callgrind.*.1 >/dev/null 2>&1 && break
  sleep 1
done
sleep 2
kill "$pid" 2>/dev/null || true
pkill -f "callgrind-out-file=$out/" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
file="$(ls "$out"/callgrind.*.1 2>/dev/null | head -1)"
[ -n "$file" ] || { echo "no callgrind dump; the load said:" >&2; cat "$out/load.log" >&2; exit 1; }
total="$(grep -E '^summary:' "$file" | awk '{print $2}')"
echo "callgrind file: $file"
echo "relay instructions: total=$total per_delivery=$((total / 3000))"
# Calls of a few functions, summed over their callers.
python3 - "$file" <<'PY'
import re, sys, collections
names, calls, cfn = {}, collections.Counter(), None
for line in open(sys.argv[1]):
    m = re.match(r'^(c?fn)=\((\d+)\)(?: (.*))?$', line.rstrip('\n'))
    if m:
        kind, ident, name = m.groups()
        if name:
            names[ident] = name
        if kind == 'cfn':
            cfn = ident
        continue
    m = re.match(r'^calls=(\d+)', line)
    if m and cfn:
        calls[cfn] += int(m.group(1))
# The session's send step and its QMux input step (inlined callers aside),
# and the vectored writes.
steps = (
    ('Session::transmit', lambda n: n.startswith('skiff_core::session::Session') and n.endswith('::transmit')),
    ('Session::handle_input', lambda n: n.startswith('skiff_core::session::') and n.endswith('::handle_input')),
    ('writev', lambda n: n.split(' ')[0].endswith('writev')),
)
for label, wanted in steps:
    n = sum(v for k, v in calls.items() if wanted(names.get(k, '')))
    print(f"calls of {label}: {n}")
PY

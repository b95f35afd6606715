#!/usr/bin/env bash
# Instructions skiff-relay spends on moq_load's latency load with the published
# moq-net client on both ends (10 subscribers, 16 KiB frames, 30 fps: 300
# frames and 3,000 deliveries in the 10 s counted), counted by callgrind, so
# two builds compare by instructions on a noisy machine.
#
#   benches/callgrind-moq-load.sh SKIFF_RELAY_BINARY
#
# Prints the relay's total and per-delivery instruction counts, the calls of
# the session's send and input steps and of writev, and leaves the callgrind
# file in $OUT (default: a temporary directory, printed). Needs a release
# build of moq_load in $CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
relay="$(realpath "$1")"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
wrapper="$out/relay-under-callgrind.sh"
# moq_load starts the wrapper as the relay; the counters are zeroed once the
# load has settled (15 s: valgrind's start-up, the subscriptions, moq_load's
# warm-up) and dumped 10 s later. The epoll driver: valgrind does not follow
# io_uring reliably. A 64 MiB cache starts faster under valgrind.
cat >"$wrapper" <<WRAP
#!/usr/bin/env bash
( sleep 15; callgrind_control -z \$\$ >/dev/null 2>&1; sleep 10; callgrind_control -d \$\$ >/dev/null 2>&1 ) &
exec valgrind --tool=callgrind --callgrind-out-file=$out/callgrind.%p "$relay" "\$@" --driver legacy --cache-bytes 64MiB
WRAP
chmod +x "$wrapper"
timeout 120 "${CARGO_TARGET_DIR:-target}/release/moq_load" --relay skiff --skiff-relay "$wrapper" \
  --subscribers 10 --frame-bytes 16384 --fps 30 --seconds 25 --warmup 5 >"$out/moq_load.log" 2>&1 || true
file="$(ls "$out"/callgrind.*.1 2>/dev/null | head -1)"
[ -n "$file" ] || { echo "no callgrind dump; moq_load said:" >&2; cat "$out/moq_load.log" >&2; exit 1; }
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
for want in ('Session<_>::poll_transmit_gather', 'Session<_>::handle_input', 'writev'):
    n = sum(v for k, v in calls.items() if names.get(k, '').split(' ')[0].endswith(want))
    print(f"calls of {want}: {n}")
PY

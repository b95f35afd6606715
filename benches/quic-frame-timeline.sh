#!/usr/bin/env bash
# Where a frame's time goes inside skiff-relay over QUIC (C25's load: the
# published moq-tokio clients, 10 viewers x 16 KiB x 60 fps): the relay's UDP
# datagrams captured on loopback for two seconds, frames told apart by the
# gaps between the publisher's trains, and per frame the time from the
# publisher's datagrams in to the relay's acknowledgement and to its
# datagrams out to the viewers, with how many packets went back to the
# publisher. Needs tcpdump and python3; run as root.
#
#   benches/quic-frame-timeline.sh [SKIFF_RELAY_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
bin="$CARGO_TARGET_DIR/release"
cargo build -q --release -p skiff-interop --bin moq_load
[ $# -ge 1 ] || cargo build -q --release -p skiff-relay --bin skiff-relay
relay="$(realpath "${1:-$bin/skiff-relay}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin/moq_load" --relay skiff --skiff-relay "$relay" --transport quic --subscribers 10 \
  --frame-bytes 16384 --fps 60 --seconds 8 > "$work/run.txt" 2>&1 &
load=$!
sleep 5
pid="$(pgrep -f "$relay serve" | head -1)"
port="$(ss -ulnp | grep "pid=$pid," | awk '{print $4}' | sed 's/.*://' | head -1)"
timeout 2 tcpdump -i lo -n -tt -q "udp port $port" -w "$work/cap.pcap" 2>/dev/null || true
wait "$load"
grep -E '^skiff-relay' "$work/run.txt"
tcpdump -r "$work/cap.pcap" -n -tt -q 2>/dev/null > "$work/cap.txt"
python3 - "$work/cap.txt" <<'PY'
import collections, sys
ev = []
for line in open(sys.argv[1]):
    f = line.split()
    ev.append((float(f[0]), f[2], f[4].rstrip(':'), int(f[-1])))
relay = collections.Counter(e[2] for e in ev).most_common(1)[0][0]
into = collections.Counter()
for t, s, d, n in ev:
    if d == relay:
        into[s] += n
publisher = into.most_common(1)[0][0]
frames, cur = [], None
for t, s, d, n in ev:
    if s == publisher and n > 1000:
        if cur is None or t - cur['last_in'] > 0.005:
            cur = {'first_in': t, 'last_in': t, 'ack': None, 'outs': {}, 'firsts': {}, 'back': 0}
            frames.append(cur)
        cur['last_in'] = t
    elif cur is not None and s == relay and d == publisher:
        cur['back'] += 1
        if cur['ack'] is None:
            cur['ack'] = t
    elif cur is not None and s == relay and n > 1000:
        cur['outs'][d] = t
        cur['firsts'].setdefault(d, t)
full = max((len(f['outs']) for f in frames), default=0)
fr = [f for f in frames if f['ack'] and len(f['outs']) == full]
def q(name, v):
    v = sorted(v)
    print(f"{name:45} p50 {v[len(v) // 2]:7.0f}  p90 {v[int(len(v) * .9)]:7.0f}")
print(f"{len(fr)} frames to {full} viewers")
q("publisher's first datagram -> its last (us)", [(f['last_in'] - f['first_in']) * 1e6 for f in fr])
q("last in -> acknowledgement (us)", [(f['ack'] - f['last_in']) * 1e6 for f in fr])
q("acknowledgement -> first out (us)", [(min(f['firsts'].values()) - f['ack']) * 1e6 for f in fr])
q("first viewer's datagram -> last viewer's (us)", [(max(f['outs'].values()) - min(f['firsts'].values())) * 1e6 for f in fr])
q("last in -> last out (us)", [(max(f['outs'].values()) - f['last_in']) * 1e6 for f in fr])
q("packets back to the publisher", [f['back'] for f in fr])
PY

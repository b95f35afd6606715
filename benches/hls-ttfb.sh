#!/usr/bin/env bash
# Time to first byte of HLS from a long recording (BENCHMARKS.md C36).
#
# 1. Records one hang broadcast (FRAME bytes, 60-frame groups, content at
#    30 fps) through skiff-relay with `--record`, published at SPEED times
#    30 fps for SECS seconds: at SPEED 60 and 60 s, an hour of 2-second
#    segments in a minute. A short recording (SHORT_SECS at the same speed)
#    is made beside it as the anchor.
# 2. Serves each directory with a skiff-relay of its own (`--record-dir`
#    only) and asks each, in turn, REQUESTS times for the playlist
#    (`/hls/anon/load/index.m3u8`), its first segment and `/recordings`, a
#    fresh connection each time (the relay closes after each answer):
#    connect to first byte of the answer, and to its last, p50 / p99 / max
#    in ms.
#
#   benches/hls-ttfb.sh [WORKDIR]
#
# Env: FRAME (8333), SPEED (60), SECS (60), SHORT_SECS (2), REQUESTS (500),
# REUSE (skip step 1 when WORKDIR holds both recordings).
# Needs release builds of skiff-relay and moq_load in $CARGO_TARGET_DIR
# (default target).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d /tmp/hls-ttfb.XXXXXX)}"
mkdir -p "$work"
bin="${CARGO_TARGET_DIR:-target}/release"
frame="${FRAME:-8333}"
speed="${SPEED:-60}"
requests="${REQUESTS:-500}"

record() {
  local dir="$1" secs="$2"
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "## recording $dir: $secs s at $((30 * speed)) frames/s, $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$bin/moq_load" --relay skiff --hang --subscribers 1 --frame-bytes "$frame" \
    --fps $((30 * speed)) --content-fps 30 --group-frames 60 --seconds "$secs" --warmup 0.5 \
    --relay-metrics 127.0.0.1:9476 \
    --skiff-args="--max-connections-per-ip 100000 --metrics 127.0.0.1:9476 --record anon/** --record-dir $dir" \
    | grep -v '^transport:'
}

if [ -z "${REUSE:-}" ]; then
  record "$work/long" "${SECS:-60}"
  record "$work/short" "${SHORT_SECS:-2}"
fi

# A relay serving each directory.
pids=()
addrs=()
for d in long short; do
  "$bin/skiff-relay" serve --listen 127.0.0.1:0 --record-dir "$work/$d" --log error >"$work/$d.out" &
  pids+=($!)
  addr=""
  for _ in $(seq 100); do
    addr=$(sed -n 's/^listening on //p' "$work/$d.out" | head -1)
    [ -n "$addr" ] && break
    sleep 0.05
  done
  addrs+=("$addr")
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

for i in 0 1; do
  curl -s "http://${addrs[$i]}/recordings" | jq -c '.[] | {broadcast, ended, tracks: [.tracks[] | {track, segments, frames, bytes, start_us, end_us}]}'
  curl -s "http://${addrs[$i]}/hls/anon/load/index.m3u8" | awk 'NR <= 7 || /ENDLIST/ {print "    " $0} END {print "    (" NR " lines)"}'
done

python3 - "$requests" "${addrs[0]}" "${addrs[1]}" <<'EOF'
import re, socket, sys, time

requests = int(sys.argv[1])
relays = {"1 h": sys.argv[2], "short": sys.argv[3]}


def get(addr, path):
    host, port = addr.rsplit(":", 1)
    t0 = time.perf_counter()
    s = socket.create_connection((host, int(port)))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n".encode())
    first = s.recv(65536)
    t1 = time.perf_counter()
    body = [first]
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        body.append(b)
    t2 = time.perf_counter()
    s.close()
    data = b"".join(body)
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3, data


def first_segment(addr):
    _, _, data = get(addr, "/hls/anon/load/index.m3u8")
    text = data.split(b"\r\n\r\n", 1)[1].decode()
    return re.search(r"^([^#\s].*\.m4s)$", text, re.M).group(1)


paths = {}
for name, addr in relays.items():
    seg = first_segment(addr)
    paths[name] = {
        "playlist": "/hls/anon/load/index.m3u8",
        "first segment": f"/hls/anon/load/{seg}",
        "recordings": "/recordings",
    }

samples = {(n, k): ([], [], 0) for n in relays for k in paths[n]}
for _ in range(requests):
    # Alternate the relays and the requests, so both see the same host.
    for name, addr in relays.items():
        for kind, path in paths[name].items():
            ttfb, total, data = get(addr, path)
            assert data.startswith(b"HTTP/1.1 200"), data[:80]
            a, b, _ = samples[(name, kind)]
            a.append(ttfb)
            b.append(total)
            samples[(name, kind)] = (a, b, len(data))


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


print(f"{requests} requests each, a new connection each; ms")
print(f"{'recording':<7} {'request':<14} {'bytes':>9} {'ttfb p50':>9} {'p99':>7} {'max':>7} {'total p50':>10} {'p99':>7}")
for (name, kind), (a, b, size) in samples.items():
    print(f"{name:<7} {kind:<14} {size:>9} {pct(a, .5):>9.3f} {pct(a, .99):>7.3f} {max(a):>7.3f} {pct(b, .5):>10.3f} {pct(b, .99):>7.3f}")
EOF
echo "machine: load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S)"

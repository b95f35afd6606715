#!/usr/bin/env bash
# End-to-end test: the mps2-an386 firmware under QEMU publishes its camera, the hang
# broadcast mps2/cam.hang (catalog.json and I_PCM H.264 of skiff-core's test card),
# through skiff-relay on the host, and a viewer must decode E2E_FRAMES frames, each
# exact in every sample, with the drawn frame counter rising.
#
#   firmware (QEMU, LAN9118, slirp) --TCP 10.0.2.2:PORT--> skiff-relay on 127.0.0.1:PORT
#   viewer --tcp://127.0.0.1:PORT/anon--> skiff-relay; subscribes to mps2/cam.hang
#
# Env: E2E_PORT (host TCP port, default 14443; baked into the firmware via MPS2_HOST_PORT),
#      E2E_FRAMES (default 100), E2E_TIMEOUT (viewer's seconds, default 90),
#      CARGO_TARGET_DIR (honoured for the firmware and the host binaries),
#      E2E_BROWSER=1: then also headless Chromium plays the board on skiff-relay's watch
#      page over WebTransport (the page's WebSocket fallback off, the relay's metrics
#      counting the session under webtransport), then over WebSocket (WebTransport hidden
#      from the page; web/test/watch.mjs:
#      frames counted, screenshots kept as $CARGO_TARGET_DIR/qemu-board{-wt,}.png); needs chromium, node and web/dist
#      (npm --prefix web ci && npm --prefix web run build), which it does not install;
#      E2E_FAULTS=1: then also, with the board streaming, the relay is killed and restarted
#      on the same port and the board's link is cut for E2E_CUT_SECS (default 3) through
#      QEMU's monitor (on 127.0.0.1:E2E_MONITOR_PORT, default PORT+1) and restored; a viewer
#      must get intact frames again after each, and the recovery times are printed.
# Installs qemu-system-arm with apt-get and the firmware's toolchain and target (its
# rust-toolchain.toml) with rustup if they are missing. Exits 0 only if the viewer
# verified every frame it needed; QEMU and the relay are stopped by PID on every exit.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
board="$here/qemu-mps2-an386"
port="${E2E_PORT:-14443}"
frames="${E2E_FRAMES:-100}"
limit="${E2E_TIMEOUT:-90}"
monitor_port="${E2E_MONITOR_PORT:-$((port + 1))}"
metrics_port="${E2E_METRICS_PORT:-$((port + 2))}"
cut="${E2E_CUT_SECS:-3}"

work="$(mktemp -d)"
relay_pid=""
qemu_pid=""
fault_viewer=""
stop() { # stop PID: TERM, then KILL if it lingers
    local pid="$1"
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    if [[ -n "$fault_viewer" ]]; then stop "$fault_viewer"; fi
    if [[ -n "$qemu_pid" ]]; then stop "$qemu_pid"; fi
    if [[ -n "$relay_pid" ]]; then stop "$relay_pid"; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! command -v qemu-system-arm >/dev/null; then
    echo "e2e: installing qemu-system-arm"
    sudo=""; [[ "$(id -u)" -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq qemu-system-arm >/dev/null
fi

# The firmware's toolchain and target, from its rust-toolchain.toml (a no-op once there; on
# a fresh machine this installs them, whatever RUSTUP_AUTO_INSTALL says).
if command -v rustup >/dev/null; then
    (cd "$board" && rustup toolchain install >/dev/null)
fi

echo "e2e: building firmware (relay port $port), skiff-relay and viewer"
(cd "$board" && MPS2_HOST_PORT="$port" cargo build --release --quiet)
elf="${CARGO_TARGET_DIR:-$board/target}/thumbv7em-none-eabihf/release/qemu-mps2-an386"
(cd "$root" && cargo build --release --quiet -p skiff-relay --bin skiff-relay -p skiff-examples --bin viewer)
target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/release"

# The relay on loopback only; one worker thread keeps it small. Its generated certificate
# gives the browser WebTransport on the same port over UDP (the firmware's TCP stays plain).
# Started again on the same port by the fault phase; its log grows across restarts.
start_relay() {
    "$bin/skiff-relay" serve --listen "127.0.0.1:$port" --threads 1 --cache-bytes 64MiB \
        --tls-generate localhost,127.0.0.1 --metrics "127.0.0.1:$metrics_port" \
        >>"$work/relay.log" 2>&1 &
    relay_pid=$!
    local listening=0
    for _ in $(seq 100); do
        kill -0 "$relay_pid" 2>/dev/null || break
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then listening=1; break; fi
        sleep 0.1
    done
    if [[ "$listening" -ne 1 ]]; then
        echo "e2e: skiff-relay is not listening on 127.0.0.1:$port (port busy?)" >&2
        cat "$work/relay.log" >&2
        exit 1
    fi
}
start_relay
echo "e2e: skiff-relay listening on 127.0.0.1:$port (pid $relay_pid)"

# Sends one command to QEMU's monitor.
monitor() {
    exec 4<>"/dev/tcp/127.0.0.1/$monitor_port"
    printf '%s\n' "$1" >&4
    sleep 0.3
    exec 4>&-
}

# Waits up to $2 seconds for a line matching $1 in the fault viewer's log.
await_line() {
    local deadline=$((SECONDS + $2))
    until grep -q "$1" "$work/faults.log"; do
        if ((SECONDS >= deadline)) || ! kill -0 "$fault_viewer" 2>/dev/null; then
            echo "e2e: faults: no \"$1\" within $2 s" >&2
            return 1
        fi
        sleep 0.2
    done
}

# With the board streaming: the relay is killed and started again on the same port, then
# the board's link is cut for $cut s and restored. One viewer watches throughout and must
# see intact frames again after each outage (two recoveries, every frame still exact).
faults() {
    echo "e2e: faults: relay restart, then the board's link cut for ${cut} s"
    "$bin/viewer" --url "tcp://127.0.0.1:$port/anon" --broadcast mps2/cam.hang \
        --expect-ipcm-pattern --frames 30 --recoveries 2 --timeout 120 \
        >"$work/faults.log" 2>&1 &
    fault_viewer=$!
    local ok=1
    await_line "subscribed to video" 20 && sleep 2 || ok=0
    if [[ "$ok" -eq 1 ]]; then
        stop "$relay_pid"
        sleep 1
        start_relay
        echo "e2e: faults: relay restarted on 127.0.0.1:$port after 1 s down (pid $relay_pid)"
        await_line "recovery 1:" 40 || ok=0
    fi
    if [[ "$ok" -eq 1 ]]; then
        sleep 2
        monitor "set_link board off"
        sleep "$cut"
        monitor "set_link board on"
        echo "e2e: faults: link restored after ${cut} s off"
        await_line "recovery 2:" 60 || ok=0
    fi
    local rc=1
    if [[ "$ok" -eq 1 ]]; then
        wait "$fault_viewer" && rc=0 || rc=$?
    else
        stop "$fault_viewer"
    fi
    fault_viewer=""
    cat "$work/faults.log"
    if [[ "$rc" -ne 0 ]]; then
        echo "--- firmware console (tail) ---"
        tail -n 20 "$work/console"
        echo "--- relay log (tail) ---"
        tail -n 20 "$work/relay.log"
        echo "e2e: FAIL (faults: the viewer did not recover from both outages)" >&2
        exit 1
    fi
    local gaps
    gaps=$(sed -n 's/.*after a \([0-9.]*\) s gap.*/\1/p' "$work/faults.log" | tr '\n' ' ')
    read -r relay_gap link_gap <<<"$gaps"
    echo "e2e: faults: recovery times (longest pause between intact frames): relay restart" \
        "${relay_gap} s (relay down 1 s), link cut ${link_gap} s (link down ${cut} s)"
}

# The NIC's user-mode netdev is `board`; the monitor (on loopback TCP, reachable from bash)
# is how the fault phase cuts and restores the link.
qemu-system-arm -M mps2-an386 -nographic \
    -semihosting-config enable=on,target=native \
    -nic user,id=board,model=lan9118 -monitor "tcp:127.0.0.1:$monitor_port,server,nowait" \
    -kernel "$elf" </dev/null >"$work/console" 2>&1 &
qemu_pid=$!
echo "e2e: QEMU booting the firmware (pid $qemu_pid)"

set +e
"$bin/viewer" --url "tcp://127.0.0.1:$port/anon" --broadcast mps2/cam.hang \
    --expect-ipcm-pattern --frames "$frames" --timeout "$limit"
viewer_rc=$?
set -e

echo "--- firmware console ---"
cat "$work/console"
if ! kill -0 "$qemu_pid" 2>/dev/null; then
    echo "e2e: QEMU exited early" >&2
    viewer_rc=1
fi
if [[ "$viewer_rc" -ne 0 ]]; then
    echo "--- relay log ---"
    tail -n 40 "$work/relay.log"
    echo "e2e: FAIL (viewer exited with $viewer_rc)" >&2
    exit 1
fi

if [[ "${E2E_BROWSER:-0}" == 1 ]]; then
    # The board is still streaming: the player watches it through the same relay, which
    # serves the page and takes the browser's WebTransport (UDP) and WebSocket (TCP) on the
    # same port. The player dials the relay's root, where the board's broadcast (published
    # at /anon) is anon/mps2/cam.hang (docs/protocol.md §4.1). WebTransport first, so the
    # relay's WebSocket counters are still zero when its run checks them.
    echo "e2e: browser: headless Chromium plays anon/mps2/cam.hang over WebTransport"
    if ! timeout 300 node "$root/web/test/watch.mjs" --url "http://127.0.0.1:$port/" \
        --name anon/mps2/cam.hang --out "$target" --tag qemu-board-wt \
        --transport webtransport --metrics "http://127.0.0.1:$metrics_port/metrics"; then
        echo "e2e: FAIL (the browser did not play the board over WebTransport)" >&2
        exit 1
    fi
    echo "e2e: browser: headless Chromium plays anon/mps2/cam.hang over WebSocket"
    if ! timeout 300 node "$root/web/test/watch.mjs" --url "http://127.0.0.1:$port/" \
        --name anon/mps2/cam.hang --out "$target" --tag qemu-board --transport websocket; then
        echo "e2e: FAIL (the browser did not play the board)" >&2
        exit 1
    fi
    echo "e2e: browser screenshots: $target/qemu-board-wt.png, $target/qemu-board.png"
fi

if [[ "${E2E_FAULTS:-0}" == 1 ]]; then
    faults
fi
echo "e2e: PASS ($frames frames from the emulated board through skiff-relay, ${SECONDS}s)"

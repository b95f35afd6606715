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
#      page (web/test/watch.mjs: frames counted, screenshot kept as
#      $CARGO_TARGET_DIR/qemu-board.png); needs chromium, node and web/dist
#      (npm --prefix web ci && npm --prefix web run build), which it does not install.
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

work="$(mktemp -d)"
relay_pid=""
qemu_pid=""
stop() { # stop PID: TERM, then KILL if it lingers
    local pid="$1"
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
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

# The relay on loopback only; one worker thread keeps it small.
"$bin/skiff-relay" serve --listen "127.0.0.1:$port" --threads 1 --cache-bytes 64MiB \
    >"$work/relay.log" 2>&1 &
relay_pid=$!
listening=0
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
echo "e2e: skiff-relay listening on 127.0.0.1:$port (pid $relay_pid)"

qemu-system-arm -M mps2-an386 -nographic \
    -semihosting-config enable=on,target=native \
    -nic user,model=lan9118 -kernel "$elf" </dev/null >"$work/console" 2>&1 &
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
    # serves the page and takes the browser's WebSocket on the same port.
    echo "e2e: browser: headless Chromium plays mps2/cam.hang on the watch page"
    if ! timeout 300 node "$root/web/test/watch.mjs" --url "http://127.0.0.1:$port/" \
        --name mps2/cam.hang --out "$target" --tag qemu-board; then
        echo "e2e: FAIL (the browser did not play the board)" >&2
        exit 1
    fi
    echo "e2e: browser screenshot: $target/qemu-board.png"
fi
echo "e2e: PASS ($frames frames from the emulated board through skiff-relay, ${SECONDS}s)"

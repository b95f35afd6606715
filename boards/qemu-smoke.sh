#!/usr/bin/env bash
# Smoke test for the mps2-an386 firmware: a loopback echo server on the host, the firmware
# under QEMU (user networking; the guest reaches the host's 127.0.0.1 as 10.0.2.2), and a
# check that one line went out and came back.
#
# Env: SMOKE_PORT (host TCP port, default 4443), SMOKE_TIMEOUT (seconds, default 90).
# Needs: qemu-system-arm (Debian: qemu-system-arm), python3, the thumbv7em-none-eabihf target.
# Exits 0 only if the firmware printed the echoed line and exited 0, and the server saw it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
board="$here/qemu-mps2-an386"
port="${SMOKE_PORT:-4443}"      # baked into the firmware via MPS2_HOST_PORT
expect="hello from mps2-an386"
limit="${SMOKE_TIMEOUT:-90}"    # seconds for the QEMU run

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

command -v qemu-system-arm >/dev/null || { echo "smoke: qemu-system-arm not installed" >&2; exit 2; }

echo "smoke: building firmware"
(cd "$board" && MPS2_HOST_PORT="$port" cargo build --release --quiet)
elf="${CARGO_TARGET_DIR:-$board/target}/thumbv7em-none-eabihf/release/qemu-mps2-an386"

# One-shot echo server on loopback only: accept one connection, echo one line, record it.
python3 - "$port" "$work/seen" "$work/ready" <<'PY' &
import socket, sys
port, seen_path, ready_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(1)
srv.settimeout(120)
open(ready_path, "w").close()
conn, _ = srv.accept()
conn.settimeout(30)
data = b""
while b"\n" not in data:
    chunk = conn.recv(256)
    if not chunk:
        break
    data += chunk
line = data.split(b"\n", 1)[0]
conn.sendall(line + b"\n")
with open(seen_path, "wb") as f:
    f.write(line)
conn.close()
srv.close()
PY
server_pid=$!

for _ in $(seq 50); do [[ -e "$work/ready" ]] && break; sleep 0.1; done
[[ -e "$work/ready" ]] || { echo "smoke: echo server did not start (port $port busy?)" >&2; exit 1; }

echo "smoke: running QEMU (limit ${limit}s)"
set +e
timeout "$limit" qemu-system-arm -M mps2-an386 -nographic \
    -semihosting-config enable=on,target=native \
    -nic user,model=lan9118 -kernel "$elf" </dev/null | tee "$work/console"
qemu_rc=${PIPESTATUS[0]}
set -e

# The server exits by itself after echoing; give it a moment, then stop it if QEMU failed early.
for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
kill "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=""

ok=1
[[ "$qemu_rc" -eq 0 ]] || { echo "smoke: QEMU exited with $qemu_rc" >&2; ok=0; }
grep -q "reply: $expect" "$work/console" || { echo "smoke: firmware did not print the echoed line" >&2; ok=0; }
[[ -e "$work/seen" && "$(cat "$work/seen")" == "$expect" ]] || { echo "smoke: server did not receive '$expect'" >&2; ok=0; }

if [[ "$ok" -eq 1 ]]; then
    echo "smoke: PASS (round trip over LAN9118 + slirp)"
else
    echo "smoke: FAIL" >&2
    exit 1
fi

#!/usr/bin/env bash
# Adapter so benches' relay_load can drive moq-relay as if it were `skiff-relay serve`:
#   relay_load --relay-bin benches/moq-relay-as-skiff-relay.sh --no-baseline ...
# relay_load runs `<bin> serve --listen 127.0.0.1:0 --threads N --log error`, reads the first
# stdout line `listening on ADDR`, then measures /proc/<child pid>/stat. So: pick a free
# loopback port, print the line from a helper once the port accepts, and `exec` moq-relay
# so the measured pid IS moq-relay. --threads/--log are ignored (moq-relay: one tokio runtime,
# multi-threaded over all cores by default; MOQ_RELAY_EXTRA adds flags).
set -euo pipefail
BIN="${MOQ_RELAY:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff/moq-relay-0.17.10/bin/moq-relay}"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      echo "listening on 127.0.0.1:$PORT"
      exit 0
    fi
    sleep 0.05
  done
  echo "moq-relay did not listen on $PORT" >&2
) &
# shellcheck disable=SC2086
exec "$BIN" --listen-tcp-bind "127.0.0.1:$PORT" --auth-public '**' --log-level "${MOQ_RELAY_LOG:-error}" ${MOQ_RELAY_EXTRA:-}

#!/usr/bin/env bash
# Flash and RAM of a board's release ELF, per crate and by largest publisher symbols.
#
#   bash boards/size-breakdown.sh BOARD [N]     BOARD: qemu-mps2-an386 | nucleo-f767zi | rp2040-w5500
#
# Reads $CARGO_TARGET_DIR/<target>/release/BOARD (default target dir: the board's own
# target/); build it first with `cd boards/BOARD && cargo build --release`. Prints the
# section totals (llvm-size -A), then flash (text + rodata symbols) and RAM (data + bss
# symbols) per crate from `llvm-nm --size-sort --print-size --demangle`, then the N
# (default 15) largest symbols of the publisher's share.
#
# Attribution of a symbol to a crate:
#   * the first path segment of its name (`skiff_core::wire::...` -> skiff_core);
#   * `<A as B>::f`: A's crate, or B's when A is a core/alloc type (`<u8 as skiff_core::X>`);
#   * a core/alloc generic over a crate's type (`core::ptr::drop_in_place<skiff_core::..>`):
#     that crate, since the code exists only for it;
#   * `__aeabi_*`, `mem*`, float/int intrinsics: compiler_builtins; `Reset`, `__INTERRUPTS`,
#     exception handlers, `__pre_init`: cortex_m_rt; the board's own name: the board crate.
# The publisher's share is skiff_core + skiff_embassy + the board crate's camera/publisher
# glue (code under `BOARD::camera`, `::publisher_task`, `::write`; the statics holding the
# session resources, the runner future and the broadcast/track state). The block pool's
# storage, the camera's frame buffer and the network buffers are listed apart. The executor's
# `TaskStorage<F>::poll` symbols hold the bodies of the spawned async tasks (the futures of
# app, camera, publisher and net tasks inlined into them) and are listed as their own row,
# since the symbol table cannot split them.
# Needs llvm-nm and llvm-size (apt: llvm), else arm-none-eabi-nm/-size, and python3.
set -euo pipefail

board="${1:?usage: size-breakdown.sh BOARD [N]}"
top="${2:-15}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "$board" in
    rp2040-w5500) target=thumbv6m-none-eabi ;;
    qemu-mps2-an386 | nucleo-f767zi) target=thumbv7em-none-eabihf ;;
    *) echo "unknown board $board" >&2; exit 2 ;;
esac
elf="${CARGO_TARGET_DIR:-$here/$board/target}/$target/release/$board"
[ -f "$elf" ] || { echo "no ELF at $elf; build it: cd boards/$board && cargo build --release" >&2; exit 1; }

nm=llvm-nm; size=llvm-size
command -v llvm-nm >/dev/null || { nm=arm-none-eabi-nm; size=arm-none-eabi-size; }

echo "ELF: $elf"
"$size" -A "$elf" | grep -E '^\.(boot2|vector_table|text|rodata|data|bss|uninit) '
"$nm" --size-sort --print-size --demangle "$elf" |
    BOARD="${board//-/_}" TOP="$top" python3 -c '
import os, re, sys
from collections import defaultdict

board = os.environ["BOARD"]
top = int(os.environ["TOP"])
STD = {"core", "alloc", "std"}
BUILTINS = re.compile(r"^(__aeabi_|__a?eabi|mem(cpy|move|set|cmp)|__(u?div|u?mod|mul|add|sub|neg|cmp|fix|float|extend|trunc|ash|lsh|clz|ctz|pop|gt|lt|ge|le|eq|ne|un)\w*)")
RT = re.compile(r"^(Reset|__INTERRUPTS|__EXCEPTIONS|__RESET_VECTOR|__pre_init|HardFault\w*|DefaultHandler\w*|NonMaskableInt|MemoryManagement|BusFault|UsageFault|SVCall|DebugMonitor|PendSV|SysTick|__veneer\w*|_start)$")
ESC = {"$LT$": "<", "$GT$": ">", "$C$": ",", "$RF$": "&", "$BP$": "*", "$SP$": "@", "$u20$": " ",
       "$u27$": "\x27", "$u5b$": "[", "$u5d$": "]", "$u7b$": "{", "$u7d$": "}", "$u3b$": ";",
       "$u7e$": "~", "$u21$": "!", "$u22$": "\"", "$u2b$": "+", "$u3d$": "="}

def clean(name):
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    for k, v in ESC.items():
        name = name.replace(k, v)
    name = name.replace("..", "::")
    return re.sub(r"(^|::)_(?=[<{])", r"\1", name)

def crates(name):
    return re.findall(r"(?<![\w:])([A-Za-z_]\w*)::", name)

def crate_of(name):
    if BUILTINS.match(name) or name.startswith("compiler_builtins"):
        return "compiler_builtins"
    if RT.match(name):
        return "cortex_m_rt"
    m = re.match(r"^<(.+?) as ([A-Za-z_]\w*)::", name)
    if m:
        inner = crates(m.group(1))
        first = inner[0] if inner else "core"
        if first in STD:
            first = m.group(2)
        if first not in STD:
            return first
    found = crates(name)
    if not found:
        return "(other: linker/runtime symbols)" if not name.startswith(".") else "(local)"
    first = found[0]
    if first in STD:
        for c in found[1:]:
            if c not in STD:
                return c
    return first

# The board crate'"'"'s statics, by what they hold.
PUB_STATICS = {"PUBLISHER", "RESOURCES", "TRACK_STATE", "CATALOG_STATE", "BROADCAST_STATE",
               "BROADCAST_PRODUCER", "ORIGIN", "CATALOG_GROUP"}
NET_STATICS = {"NET_RESOURCES", "STACK_RESOURCES", "ETH", "ETH_STATE", "PACKETS", "STATE", "W5500_STATE"}
def board_static(name):
    last = name.rsplit("::", 1)[-1]
    if last in PUB_STATICS or name.endswith("publisher_task::POOL") or name.endswith("}}::POOL"):
        return "board: publisher state"
    if last in NET_STATICS or name.endswith("net_task::POOL") or "eth_task::POOL" in name:
        return "board: network buffers"
    if last == "POOL_STORAGE":
        return "board: block pool (application)"
    if last == "FRAME":
        return "board: camera frame buffer"
    return board

def publisher(crate, name):
    if crate == "board: publisher state":
        return True
    if crate in ("skiff_core", "skiff_embassy"):
        return True
    return crate == board and re.match(board + r"::(camera|publisher_task|write|__publisher_task)\b", name) is not None

flash = defaultdict(int); ram = defaultdict(int); pub = []
for line in sys.stdin:
    parts = line.rstrip("\n").split(None, 3)
    if len(parts) < 4:
        continue
    _, sz, kind, raw = parts
    sz = int(sz, 16)
    name = clean(raw)
    crate = crate_of(name)
    if crate == "embassy_executor" and "TaskStorage<F>::poll" in name:
        crate = "embassy_executor (task bodies)"
    if crate == "(local)":
        crate = "(anonymous constants)"
    if crate == board and kind.lower() in "db":
        crate = board_static(name)
    k = kind.lower()
    if k in "tr":
        flash[crate] += sz; region = "flash"
    elif k in "db":
        ram[crate] += sz; region = "RAM"
    else:
        continue
    if sz == 0:
        continue
    if publisher(crate, name):
        pub.append((sz, region, name))

def groups():
    return sorted(set(flash) | set(ram), key=lambda c: -(flash[c] + ram[c]))

print()
print("%-40s %10s %10s" % ("crate", "flash B", "RAM B"))
for c in groups():
    if flash[c] + ram[c] == 0:
        continue
    print("%-40s %10d %10d" % (c, flash[c], ram[c]))
print("%-40s %10d %10d" % ("total (symbols)", sum(flash.values()), sum(ram.values())))

def share(names):
    return sum(flash[c] for c in names), sum(ram[c] for c in names)
gf = sum(sz for sz, region, name in pub if region == "flash" and name.startswith(board))
gr = ram["board: publisher state"]
print()
cf, cr = share(["skiff_core"]); ef, er = share(["skiff_embassy"])
print("publisher share: skiff_core %d / %d, skiff_embassy %d / %d, board glue %d / %d" % (cf, cr, ef, er, gf, gr))
print("publisher total: flash %d B (%.1f KiB, aim 48 KiB), RAM %d B (%.1f KiB, aim 16 KiB)" % (
    cf + ef + gf, (cf + ef + gf) / 1024, cr + er + gr, (cr + er + gr) / 1024))
nf, nr = share([c for c in groups() if c.startswith(("embassy_net", "smoltcp"))])
nr += ram["board: network buffers"]
print("network stack (embassy_net* + smoltcp + the board'"'"'s net statics): flash %d B, RAM %d B" % (nf, nr))
print("camera frame buffer (board static FRAME, not in the share): %d B" % ram["board: camera frame buffer"])
print()
print("largest publisher symbols:")
for sz, region, name in sorted(pub, reverse=True)[:top]:
    print("%8d  %-5s  %s" % (sz, region, name[:150]))
'

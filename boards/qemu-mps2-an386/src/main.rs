//! Firmware for QEMU's `mps2-an386` (Cortex-M4 at 25 MHz, LAN9118 Ethernet): a skiff
//! publisher of a synthetic camera.
//!
//! Brings up embassy-net over the LAN9118 with DHCPv4 (QEMU user networking hands out
//! 10.0.2.15) and publishes the hang broadcast [`BROADCAST`] (docs/protocol.md §10)
//! through skiff-embassy to a moq-lite relay at `tcp://10.0.2.2:`[`HOST_PORT`][`RELAY_PATH`]
//! (slirp forwards 10.0.2.2 to the host's 127.0.0.1): a `catalog.json` track and the
//! H.264 video track [`TRACK`], which any H.264 decoder (a browser's included) plays. The
//! camera is skiff-core's test card ([`CARD`]: a moving pattern with the frame number
//! drawn in), written as I_PCM pictures without an encoder (docs/protocol.md §10.4), one
//! IDR picture and one group per frame. Each write is paced by the publisher, so the track
//! never runs ahead of the relay's credit. The publisher redials on its own if the relay
//! is not up yet or the connection drops; the firmware runs until QEMU is stopped.
//!
//! Console: UART0 (stdio under `-nographic`), one status line per second. No global
//! allocator: the block pool, the tracks, broadcast and origin, the publisher's buffers and
//! the frame buffer are statics.
//!
//! # Executor
//!
//! Tasks run on embassy's *interrupt-mode* executor, pended through an NVIC line no device
//! uses ([`EXECUTOR_IRQ`]), while thread mode sleeps in `WFI`. The thread-mode executor
//! would idle in `WFE`, which QEMU 7.2 implements as a plain yield for M-profile cores: QEMU
//! then burns a whole host core while the firmware waits (measured: 4.8 s of CPU for a 5 s
//! wait). `WFI` halts the emulated CPU until the next interrupt. The executor line has the
//! lowest priority, so SysTick (the time base) and the Ethernet interrupt preempt tasks.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

mod time_driver;
mod uart;

use core::fmt::Write as _;

use cortex_m::peripheral::NVIC;
use cortex_m_rt::{ExceptionFrame, exception};
use cortex_m_semihosting::debug;
use embassy_executor::{InterruptExecutor, Spawner};
use embassy_net::{IpEndpoint, Ipv4Address, StackResources};
use embassy_time::{Duration, Ticker, Timer};
use lan9118::{Lan9118, Regs};
use skiff_core::hang::{self, testcard::TestCard};
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, group, origin, track};
use skiff_core::pool::{Pool, PoolStorage};
use skiff_embassy::{Publisher, SmallResources};
use static_cell::StaticCell;

/// TCP port of the relay on the host (reached as 10.0.2.2 from inside QEMU's user
/// network); 4443 unless `MPS2_HOST_PORT` is set at build time (`qemu-e2e.sh` sets it).
const HOST_PORT: u16 = match option_env!("MPS2_HOST_PORT") {
    Some(port) => parse_port(port),
    None => 4443,
};
/// The host as seen from the guest: slirp's gateway address, aliased to the host's loopback.
const HOST_ADDR: Ipv4Address = Ipv4Address::new(10, 0, 2, 2);
/// SETUP path sent to the relay (the path of its URL).
const RELAY_PATH: &str = "/anon";
/// The broadcast the board announces (a hang broadcast: its name ends in `.hang`).
const BROADCAST: &str = "mps2/cam.hang";
/// The camera's video track within [`BROADCAST`].
const TRACK: &str = "video";
/// The camera: a 96×64 test card at 15 fps, about 9.3 KiB per frame (1.1 Mbit/s).
const CARD: TestCard = match TestCard::new(96, 64, 15) {
    Ok(card) => card,
    Err(_) => panic!("96x64 at 15 fps is a valid test card"),
};
/// Bytes of the frame buffer: the largest frame [`CARD`] can write.
const FRAME_LEN: usize = CARD.max_frame_len();
/// The publisher's moq-lite Hop ID: stable and non-zero (docs/protocol.md §4.3).
const HOP: u64 = 0x6d70_7332_0001;
/// Block pool: [`POOL_BLOCKS`] blocks of [`BLOCK_SIZE`] bytes hold both tracks' caches.
const POOL_BLOCKS: usize = 48;
/// Bytes per pool block.
const BLOCK_SIZE: usize = 1024;
/// Group slots of the video track's ring (a group is one frame).
const GROUP_SLOTS: usize = 4;
/// Group slots of the catalog track's ring (it holds one group, kept open).
const CATALOG_SLOTS: usize = 2;
/// The video track's cache budget: three frames (a frame is about 9.3 KiB), well inside
/// the pool, so older groups are evicted before the pool runs dry.
const CACHE_BYTES: u64 = 30 * 1024;
/// Locally administered unicast MAC for the board.
const MAC: [u8; 6] = [0x02, 0x00, 0x5a, 0x1f, 0x00, 0x01];
/// LAN9118 register window (hw/arm/mps2.c: `ethernet_base` for AN386).
const ETH_BASE: usize = 0x4020_0000;
/// LAN9118 interrupt line (hw/arm/mps2.c: IRQ 13 on AN385/AN386).
const ETH_IRQ: u16 = 13;
/// NVIC line that runs the executor; unused by any AN386 device (hw/arm/mps2.c wires 0-13,
/// 18-22 and 24).
const EXECUTOR_IRQ: u16 = 31;
/// Priority of the executor line: lowest, so SysTick and the Ethernet interrupt preempt it.
const EXECUTOR_PRIO: u8 = 0xe0;

/// The publisher's buffers and tables (18 KiB; the relay sends it small records only).
type Resources = SmallResources<'static, 'static>;
/// The runner of those resources (`16` is their stream table).
type Runner = skiff_embassy::Runner<'static, 'static, 'static, 'static, 16>;

/// Driver state shared with the Ethernet interrupt handler.
static ETH_STATE: lan9118::State = lan9118::State::new();
/// The executor all tasks run on (see the crate docs).
static EXECUTOR: InterruptExecutor = InterruptExecutor::new();

/// An NVIC interrupt number, for unmasking lines without a device crate.
#[derive(Clone, Copy)]
struct Irq(u16);

// SAFETY: `number` returns a plain IRQ number below the 32 lines QEMU's AN386 NVIC implements.
#[allow(unsafe_code)]
unsafe impl cortex_m::interrupt::InterruptNumber for Irq {
    fn number(self) -> u16 {
        self.0
    }
}

#[embassy_executor::task]
async fn net_task(mut runner: embassy_net::Runner<'static, &'static mut Lan9118<'static>>) -> ! {
    runner.run().await
}

#[embassy_executor::task]
async fn publisher_task(mut runner: Runner) -> ! {
    runner.run().await
}

#[cortex_m_rt::entry]
fn main() -> ! {
    uart::init();
    println!("mps2-an386: booting");

    let Some(mut core) = cortex_m::Peripherals::take() else {
        fail("core peripherals already taken");
    };
    // SAFETY: nothing runs yet, so no priority-based critical section can be in progress.
    #[allow(unsafe_code)]
    unsafe {
        core.NVIC.set_priority(Irq(EXECUTOR_IRQ), EXECUTOR_PRIO)
    };
    time_driver::start(&mut core.SYST);

    let spawner = EXECUTOR.start(Irq(EXECUTOR_IRQ));
    match boot() {
        Ok(token) => spawner.spawn(token),
        Err(_) => fail("spawn boot"),
    }
    loop {
        cortex_m::asm::wfi();
    }
}

/// Hops onto the executor so the (non-`Send`) application task can be spawned from inside it.
#[embassy_executor::task]
async fn boot() {
    // SAFETY: `boot` is an embassy task, so it is polled with the executor's own Context.
    #[allow(unsafe_code)]
    let spawner = unsafe { Spawner::for_current_executor() }.await;
    match app(spawner) {
        Ok(token) => spawner.spawn(token),
        Err(_) => fail("spawn app"),
    }
}

/// Brings up the LAN9118, the network stack and the media, then spawns the publisher and
/// runs the camera.
#[embassy_executor::task]
async fn app(spawner: Spawner) {
    // SAFETY: 0x4020_0000 is the LAN9118 window on this board (hw/arm/mps2.c) and only the
    // lan9118 crate touches it.
    #[allow(unsafe_code)]
    let regs = unsafe { Regs::new(ETH_BASE) };
    static ETH: StaticCell<Lan9118<'static>> = StaticCell::new();
    let eth = match Lan9118::new(regs, &ETH_STATE, MAC) {
        Ok(eth) => ETH.init(eth),
        Err(e) => fail_with("lan9118 init", e),
    };
    // SAFETY: the handler for this line (DefaultHandler below) only calls
    // `ETH_STATE.on_interrupt`, which is interrupt-safe; no mask-based critical section relies
    // on this line being masked.
    #[allow(unsafe_code)]
    unsafe {
        NVIC::unmask(Irq(ETH_IRQ))
    };
    println!("lan9118 up, mac {:02x?}", MAC);

    // No RNG on this board; the seed only randomises ports and sequence numbers.
    let seed = 0x5eed_0000_0000_0000 ^ u64::from(cortex_m::peripheral::SYST::get_current());
    static NET_RESOURCES: StaticCell<StackResources<3>> = StaticCell::new();
    let (stack, net_runner) = embassy_net::new(
        &mut *eth,
        embassy_net::Config::dhcpv4(Default::default()),
        NET_RESOURCES.init(StackResources::new()),
        seed,
    );
    match net_task(net_runner) {
        Ok(token) => spawner.spawn(token),
        Err(_) => fail("spawn net_task"),
    }

    // The media: a pool, two tracks in one broadcast, an origin announcing it. `StaticCell`
    // with `init_with` throughout: these types are `!Send` and too big to copy around.
    static POOL_STORAGE: StaticCell<PoolStorage<POOL_BLOCKS, BLOCK_SIZE>> = StaticCell::new();
    static POOL: StaticCell<Pool<'static>> = StaticCell::new();
    static TRACK_STATE: StaticCell<track::State<'static, GROUP_SLOTS>> = StaticCell::new();
    static CATALOG_STATE: StaticCell<track::State<'static, CATALOG_SLOTS>> = StaticCell::new();
    static BROADCAST_STATE: StaticCell<broadcast::State<'static, 'static, 2>> = StaticCell::new();
    static BROADCAST_PRODUCER: StaticCell<broadcast::Producer<'static, 'static>> =
        StaticCell::new();
    static ORIGIN: StaticCell<origin::State<'static, 'static, 1, 4>> = StaticCell::new();
    static PUBLISHER: StaticCell<Resources> = StaticCell::new();

    let pool: &'static Pool<'static> =
        POOL.init(Pool::new(POOL_STORAGE.init_with(PoolStorage::new)));
    let Ok(info) = hang::video_info(TRACK) else {
        fail("track name too long");
    };
    let limits = track::Limits {
        group_bytes: CACHE_BYTES,
        cache_bytes: CACHE_BYTES,
    };
    let track: &'static _ = TRACK_STATE.init_with(|| track::State::with_limits(pool, info, limits));
    let catalog: &'static _ =
        CATALOG_STATE.init_with(|| track::State::new(pool, hang::catalog_info()));
    let Ok(path) = Path::new(BROADCAST) else {
        fail("bad broadcast path");
    };
    let Ok(bcast) = broadcast::State::new(path) else {
        fail("bad broadcast path");
    };
    let bcast: &'static _ = BROADCAST_STATE.init(bcast);
    let Ok(tracks) = bcast.producer() else {
        fail("broadcast producer taken");
    };
    // Kept for good: dropping the producer would finish the broadcast.
    let tracks = BROADCAST_PRODUCER.init(tracks);
    if tracks.add(catalog.handle()).is_err() || tracks.add(track.handle()).is_err() {
        fail("add track");
    }
    let origin: &'static _ = ORIGIN.init_with(origin::State::new);
    if origin.handle().announce(bcast.handle()).is_err() {
        fail("announce");
    }

    let relay = IpEndpoint::new(HOST_ADDR.into(), HOST_PORT);
    let config = skiff_embassy::Config::new(relay, RELAY_PATH, HOP)
        .with_backoff(Duration::from_millis(500), Duration::from_secs(4));
    let resources = PUBLISHER.init_with(Resources::new);
    let (publisher, runner) = skiff_embassy::new(stack, config, resources, origin.handle());
    match publisher_task(runner) {
        Ok(token) => spawner.spawn(token),
        Err(_) => fail("spawn publisher_task"),
    }
    println!(
        "publishing {} (catalog.json, {}: {}x{} I_PCM H.264 at {} fps) to tcp://{}:{}{}",
        BROADCAST,
        TRACK,
        CARD.geometry().width(),
        CARD.geometry().height(),
        CARD.fps(),
        HOST_ADDR,
        HOST_PORT,
        RELAY_PATH
    );

    let Ok(catalog) = catalog.producer() else {
        fail("catalog producer taken");
    };
    // The catalog's only group stays open while the broadcast lasts, so a viewer that joins
    // later still finds it (docs/protocol.md §10.2).
    static CATALOG_GROUP: StaticCell<track::GroupProducer<'static, 'static>> = StaticCell::new();
    let mut json = [0u8; hang::testcard::CATALOG_MAX_LEN];
    let len = match CARD.catalog(TRACK, &mut json) {
        Ok(len) => len,
        Err(e) => fail_with("catalog", e),
    };
    let group = match catalog.create_group(0) {
        Ok(g) => CATALOG_GROUP.init(g),
        Err(e) => fail_with("catalog group", e),
    };
    if let Err(e) = group.write_frame(0, &json[..len]) {
        fail_with("catalog frame", e);
    }
    let Ok(producer) = track.producer() else {
        fail("track producer taken");
    };
    camera(publisher, producer).await
}

/// The synthetic camera: picture `n` of [`CARD`] every tick as group `n` (one IDR picture
/// per group), each write paced by `publisher`.
async fn camera(
    publisher: Publisher<'static, 'static, 'static>,
    producer: track::Producer<'static, 'static>,
) -> ! {
    static FRAME: StaticCell<[u8; FRAME_LEN]> = StaticCell::new();
    let buf = FRAME.init([0; FRAME_LEN]);
    let mut ticker = Ticker::every(Duration::from_hz(u64::from(CARD.fps())));
    let mut n: u32 = 0;
    let mut dropped: u32 = 0;
    loop {
        if n.is_multiple_of(CARD.fps()) {
            println!(
                "second {}: state {:?}, subscribers {}, sessions {}, frames dropped {}",
                n / CARD.fps(),
                publisher.state(),
                publisher.subscribers(),
                publisher.sessions(),
                dropped
            );
        }
        match producer.create_group(u64::from(n)) {
            Ok(mut g) => {
                let pts = CARD.pts_us(u64::from(n));
                let frame = match CARD.frame(n, pts, buf) {
                    Ok(frame) => frame,
                    Err(e) => fail_with("test card frame", e),
                };
                publisher.paced(&g).await;
                if let Err(e) = write(&mut g, pts, frame).await {
                    println!("frame {}: {}", n, e);
                    dropped = dropped.wrapping_add(1);
                }
                // Finished, not dropped: a dropped producer would abort the group. An
                // evicted or aborted group cannot be finished; nothing to do about it.
                let _ = g.finish();
            }
            Err(e) => {
                println!("group {}: not created: {}", n, e);
                dropped = dropped.wrapping_add(1);
            }
        }
        n = n.wrapping_add(1);
        ticker.next().await;
    }
}

/// Writes one frame, waiting out a full pool (the session is still sending older blocks)
/// for up to a tick.
async fn write(
    g: &mut track::GroupProducer<'static, 'static>,
    timestamp: u64,
    frame: &[u8],
) -> Result<(), group::WriteError> {
    let mut tries = 0;
    loop {
        match g.write_frame(timestamp, frame) {
            Err(group::WriteError::PoolExhausted) if tries < 60 => {
                tries += 1;
                Timer::after_millis(1).await;
            }
            other => return other,
        }
    }
}

/// Parses a decimal port number at compile time (a bad value fails the build).
const fn parse_port(s: &str) -> u16 {
    let digits = s.as_bytes();
    assert!(!digits.is_empty(), "MPS2_HOST_PORT is empty");
    let mut value: u32 = 0;
    let mut i = 0;
    while i < digits.len() {
        let d = digits[i];
        assert!(d.is_ascii_digit(), "MPS2_HOST_PORT is not a decimal number");
        value = value * 10 + (d - b'0') as u32;
        assert!(value <= 65535, "MPS2_HOST_PORT is above 65535");
        i += 1;
    }
    value as u16
}

/// Prints `what` and ends QEMU with a failure status.
fn fail(what: &str) -> ! {
    println!("FAILED: {}", what);
    exit_failure()
}

/// Prints `what` and `err` and ends QEMU with a failure status.
fn fail_with(what: &str, err: impl core::fmt::Display) -> ! {
    println!("FAILED: {}: {}", what, err);
    exit_failure()
}

fn exit_failure() -> ! {
    debug::exit(debug::EXIT_FAILURE);
    // Without semihosting (real hardware) `exit` returns: park the core.
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let _ = writeln!(uart::Console, "PANIC: {}", info);
    exit_failure()
}

#[exception]
#[allow(unsafe_code)]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    let _ = writeln!(uart::Console, "HARDFAULT at pc {:#010x}", frame.pc());
    exit_failure()
}

/// Every device interrupt lands here (no device crate provides a vector table of its own).
#[exception]
#[allow(unsafe_code)]
unsafe fn DefaultHandler(irqn: i16) {
    if irqn == ETH_IRQ as i16 {
        ETH_STATE.on_interrupt();
    } else if irqn == EXECUTOR_IRQ as i16 {
        // SAFETY: this is the executor's interrupt handler, and `start` ran before the line
        // was unmasked (it unmasks it itself).
        unsafe { EXECUTOR.on_interrupt() }
    }
}

//! Firmware for QEMU's `mps2-an386` (Cortex-M4 at 25 MHz, LAN9118 Ethernet).
//!
//! Brings up embassy-net over the LAN9118 with DHCPv4 (QEMU user networking hands out
//! 10.0.2.15), connects TCP to 10.0.2.2:[`HOST_PORT`] (slirp forwards that to the host's
//! 127.0.0.1), sends one line, prints the line that comes back and ends QEMU through
//! semihosting with status 0; any failure ends it with status 1.
//!
//! Console: UART0 (stdio under `-nographic`). No global allocator.
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
use embassy_net::tcp::TcpSocket;
use embassy_net::{Ipv4Address, Stack, StackResources};
use embassy_time::{Duration, with_timeout};
use embedded_io_async::Write as _;
use lan9118::{Lan9118, Regs};
use static_cell::StaticCell;

/// TCP port on the host (reached as 10.0.2.2 from inside QEMU's user network); 4443 unless
/// `MPS2_HOST_PORT` is set at build time (`qemu-smoke.sh` uses that to dodge busy ports).
const HOST_PORT: u16 = match option_env!("MPS2_HOST_PORT") {
    Some(port) => parse_port(port),
    None => 4443,
};
/// The host as seen from the guest: slirp's gateway address, aliased to the host's loopback.
const HOST_ADDR: Ipv4Address = Ipv4Address::new(10, 0, 2, 2);
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
/// Line sent to the host.
const HELLO: &[u8] = b"hello from mps2-an386\n";
/// How long each network step may take before the firmware gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

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

/// Brings up the LAN9118 and the network stack, then runs the demo round trip.
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
    static RESOURCES: StaticCell<StackResources<3>> = StaticCell::new();
    let (stack, runner) = embassy_net::new(
        &mut *eth,
        embassy_net::Config::dhcpv4(Default::default()),
        RESOURCES.init(StackResources::new()),
        seed,
    );
    match net_task(runner) {
        Ok(token) => spawner.spawn(token),
        Err(_) => fail("spawn net_task"),
    }

    match round_trip(stack).await {
        Ok(()) => {
            println!("round trip ok");
            debug::exit(debug::EXIT_SUCCESS);
        }
        Err(what) => fail(what),
    }
}

/// DHCP, connect, send [`HELLO`], read one line back and print it.
async fn round_trip(stack: Stack<'static>) -> Result<(), &'static str> {
    with_timeout(STEP_TIMEOUT, stack.wait_config_up())
        .await
        .map_err(|_| "dhcp timeout")?;
    if let Some(cfg) = stack.config_v4() {
        println!("dhcp: address {}, gateway {:?}", cfg.address, cfg.gateway);
    }

    let mut rx = [0u8; 1024];
    let mut tx = [0u8; 1024];
    let mut socket = TcpSocket::new(stack, &mut rx, &mut tx);
    socket.set_timeout(Some(STEP_TIMEOUT));
    println!("connecting to {}:{}", HOST_ADDR, HOST_PORT);
    socket
        .connect((HOST_ADDR, HOST_PORT))
        .await
        .map_err(|_| "tcp connect failed")?;
    println!("connected");

    socket
        .write_all(HELLO)
        .await
        .map_err(|_| "tcp write failed")?;
    socket.flush().await.map_err(|_| "tcp flush failed")?;

    let mut line = [0u8; 128];
    let mut len = 0;
    loop {
        let Some(free) = line.get_mut(len..).filter(|f| !f.is_empty()) else {
            return Err("reply line too long");
        };
        let n = socket.read(free).await.map_err(|_| "tcp read failed")?;
        if n == 0 {
            return Err("connection closed before a full line");
        }
        len += n;
        if line[..len].contains(&b'\n') {
            break;
        }
    }
    let reply = line[..len].split(|&b| b == b'\n').next().unwrap_or(&[]);
    match core::str::from_utf8(reply) {
        Ok(s) => println!("reply: {}", s),
        Err(_) => println!("reply (not UTF-8): {:02x?}", reply),
    }
    socket.close();
    // Give the FIN a moment to leave before QEMU exits; a timeout here is fine.
    let _ = with_timeout(Duration::from_millis(200), socket.flush()).await;
    Ok(())
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

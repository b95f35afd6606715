//! Firmware for WIZnet's W5500-EVB-Pico (RP2040, Cortex-M0+ at 125 MHz, with a W5500
//! hardwired-TCP/IP Ethernet controller on SPI0 used as a plain MAC in MACRAW mode).
//!
//! Brings up embassy-net through embassy-net-wiznet with DHCPv4, then publishes a synthetic
//! camera track to a relay (see [`camera`]). Logs go out over RTT with defmt (`probe-rs run`).
//! No global allocator.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

#[path = "../../shared/camera.rs"]
mod camera;

use defmt::{Debug2Format, info, unwrap};
use embassy_executor::Spawner;
use embassy_net::StackResources;
use embassy_net_wiznet::chip::W5500;
use embassy_net_wiznet::{Device, Runner, State};
use embassy_rp::clocks::RoscRng;
use embassy_rp::gpio::{Input, Level, Output, Pull};
use embassy_rp::peripherals::{DMA_CH0, DMA_CH1, SPI0};
use embassy_rp::spi::{self, Async, Spi};
use embassy_rp::{bind_interrupts, dma};
use embassy_time::Delay;
use embedded_hal_bus::spi::ExclusiveDevice;
use static_cell::StaticCell;
use {defmt_rtt as _, panic_probe as _};

/// Name of the broadcast this board publishes.
const BROADCAST: &str = "skiff/rp2040-w5500.hang";
/// Locally administered unicast MAC (set a unique one per board on a shared LAN).
const MAC: [u8; 6] = [0x02, 0x00, 0x5a, 0x1f, 0x20, 0x40];
/// SPI clock requested (the W5500 takes up to 80 MHz; the RP2040's SPI divides its
/// 125 MHz peripheral clock down to a rate at or below this).
const SPI_HZ: u32 = 50_000_000;

/// The publisher's memory: a 2 KiB input buffer instead of a full record (a relay's
/// records to a publisher are tens of bytes), 14 KiB less of the RP2040's 264 KiB.
pub type PublisherResources = skiff_embassy::SmallResources<'static, 'static>;

bind_interrupts!(struct Irqs {
    DMA_IRQ_0 => dma::InterruptHandler<DMA_CH0>, dma::InterruptHandler<DMA_CH1>;
});

/// The W5500 on SPI0 with its chip select, interrupt and reset lines.
type W5500Runner = Runner<
    'static,
    W5500,
    ExclusiveDevice<Spi<'static, SPI0, Async>, Output<'static>, Delay>,
    Input<'static>,
    Output<'static>,
>;

#[embassy_executor::task]
async fn ethernet_task(runner: W5500Runner) -> ! {
    runner.run().await
}

#[embassy_executor::task]
async fn net_task(mut runner: embassy_net::Runner<'static, Device<'static>>) -> ! {
    runner.run().await
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let p = embassy_rp::init(Default::default());
    info!("rp2040-w5500: booting");

    // W5500-EVB-Pico wiring: SPI0 with MISO GP16, CSn GP17, SCLK GP18, MOSI GP19;
    // RSTn GP20, INTn GP21 (active low, open drain: pulled up here).
    let mut spi_config = spi::Config::default();
    spi_config.frequency = SPI_HZ;
    let spi = Spi::new(
        p.SPI0, p.PIN_18, p.PIN_19, p.PIN_16, p.DMA_CH0, p.DMA_CH1, Irqs, spi_config,
    );
    let cs = Output::new(p.PIN_17, Level::High);
    let int = Input::new(p.PIN_21, Pull::Up);
    let reset = Output::new(p.PIN_20, Level::High);
    let Ok(spi_dev) = ExclusiveDevice::new(spi, cs, Delay);

    static W5500_STATE: StaticCell<State<8, 8>> = StaticCell::new();
    let state = W5500_STATE.init(State::new());
    let (device, runner) = match embassy_net_wiznet::new(MAC, state, spi_dev, int, reset).await {
        Ok(pair) => pair,
        // No W5500 answering on SPI0 (wrong board, bad wiring): nothing to do.
        Err(e) => defmt::panic!("w5500 init: {}", Debug2Format(&e)),
    };
    spawner.spawn(unwrap!(ethernet_task(runner)));
    info!("w5500 up");

    // Seed for the stack's ports and sequence numbers, from the ring oscillator's jitter.
    let seed = RoscRng.next_u64();
    static STACK_RESOURCES: StaticCell<StackResources<3>> = StaticCell::new();
    let (stack, runner) = embassy_net::new(
        device,
        embassy_net::Config::dhcpv4(Default::default()),
        STACK_RESOURCES.init(StackResources::new()),
        seed,
    );
    spawner.spawn(unwrap!(net_task(runner)));

    camera::run(spawner, stack, BROADCAST).await
}

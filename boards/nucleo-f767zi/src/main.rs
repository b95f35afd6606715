//! Firmware for ST's NUCLEO-F767ZI (STM32F767ZI, Cortex-M7 at 216 MHz, on-chip Ethernet MAC
//! with a LAN8742A PHY over RMII).
//!
//! Brings up embassy-net on the board's RJ45 port with DHCPv4, then publishes a synthetic
//! camera track to a relay (see [`camera`]). Logs go out over RTT with defmt (`probe-rs run`).
//! No global allocator.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

#[path = "../../shared/camera.rs"]
mod camera;

use defmt::{info, unwrap};
use embassy_executor::Spawner;
use embassy_net::StackResources;
use embassy_stm32::eth::{self, Ethernet, GenericPhy, PacketQueue, Sma};
use embassy_stm32::peripherals::{ETH, ETH_SMA};
use embassy_stm32::rng::{self, Rng};
use embassy_stm32::time::Hertz;
use embassy_stm32::{Config, bind_interrupts, peripherals};
use static_cell::StaticCell;
use {defmt_rtt as _, panic_probe as _};

/// Name of the broadcast this board publishes.
const BROADCAST: &str = "skiff/nucleo-f767zi.hang";
/// Locally administered unicast MAC (set a unique one per board on a shared LAN).
const MAC: [u8; 6] = [0x02, 0x00, 0x5a, 0x1f, 0x07, 0x67];

/// The publisher's memory: the full-size input buffer (any record a relay may send); the
/// F767 has 512 KiB of SRAM.
pub type PublisherResources = skiff_embassy::Resources<'static, 'static>;

bind_interrupts!(struct Irqs {
    ETH => eth::InterruptHandler;
    RNG => rng::InterruptHandler<peripherals::RNG>;
});

/// The Ethernet driver: RMII to the LAN8742A, found by the generic PHY's address scan.
type Device = Ethernet<'static, ETH, GenericPhy<Sma<'static, ETH_SMA>>>;

#[embassy_executor::task]
async fn net_task(mut runner: embassy_net::Runner<'static, Device>) -> ! {
    runner.run().await
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let p = embassy_stm32::init(clocks());
    info!("nucleo-f767zi: booting");

    // Seed for the stack's ports and sequence numbers, from the hardware RNG.
    let seed = Rng::new(p.RNG, Irqs).next_u64();

    // RMII pins of the Nucleo-144 (UM1974, Ethernet section): REF_CLK PA1, CRS_DV PA7,
    // RXD0 PC4, RXD1 PC5, TXD0 PG13, TXD1 PB13, TX_EN PG11; MDIO PA2, MDC PC1.
    static PACKETS: StaticCell<PacketQueue<4, 4>> = StaticCell::new();
    let device = Ethernet::new(
        PACKETS.init(PacketQueue::new()),
        p.ETH,
        Irqs,
        p.PA1,
        p.PA7,
        p.PC4,
        p.PC5,
        p.PG13,
        p.PB13,
        p.PG11,
        MAC,
        p.ETH_SMA,
        p.PA2,
        p.PC1,
    );

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

/// 216 MHz from the 8 MHz clock the on-board ST-LINK feeds to OSC_IN (HSE bypass):
/// PLL 8 / 4 × 216 / 2; APB1 54 MHz, APB2 108 MHz; PLL Q 48 MHz for the RNG.
fn clocks() -> Config {
    use embassy_stm32::rcc::{
        AHBPrescaler, APBPrescaler, Hse, HseMode, Pll, PllMul, PllPDiv, PllPreDiv, PllQDiv,
        PllSource, Sysclk,
    };
    let mut config = Config::default();
    config.rcc.hse = Some(Hse {
        freq: Hertz(8_000_000),
        mode: HseMode::Bypass,
    });
    config.rcc.pll_src = PllSource::HSE;
    config.rcc.pll = Some(Pll {
        prediv: PllPreDiv::DIV4,
        mul: PllMul::MUL216,
        divp: Some(PllPDiv::DIV2),
        divq: Some(PllQDiv::DIV9),
        divr: None,
    });
    config.rcc.ahb_pre = AHBPrescaler::DIV1;
    config.rcc.apb1_pre = APBPrescaler::DIV4;
    config.rcc.apb2_pre = APBPrescaler::DIV2;
    config.rcc.sys = Sysclk::PLL1_P;
    config
}

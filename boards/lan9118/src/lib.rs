//! `embassy-net-driver` implementation for the SMSC LAN9118 / LAN9220 Ethernet controller.
//!
//! Written against the controller as QEMU emulates it (`hw/net/lan9118.c`, used by the
//! `mps2-an385`/`mps2-an386`/`mps2-an500`/`mps2-an511` and `realview`/`vexpress` boards),
//! using only what that model implements and what the datasheet also requires of real
//! silicon:
//!
//! - the 32-bit register window (no 16-bit mode, no end-alignment or data offsets);
//! - one RX status FIFO entry per frame, frame data read word by word from the RX data
//!   FIFO (the CRC word is read and dropped);
//! - one TX segment per frame (`FIRST | LAST` in TX command A) pushed into the TX data FIFO,
//!   with "TX status allow overrun" set so the TX status FIFO never needs draining;
//! - MAC registers through the `MAC_CSR_CMD`/`MAC_CSR_DATA` indirect window, and the
//!   internal PHY (address 1) through `MII_ACC`/`MII_DATA`;
//! - soft reset through `HW_CFG.SRST`, then `PMT_CTRL.READY`.
//!
//! # Interrupts, not polling
//!
//! QEMU raises `INT_STS.RSFL` (RX status FIFO level above `FIFO_INT.RXSL`, set to 0, so
//! "one frame waiting") and `INT_STS.PHY_INT` (PHY link events), and drives the IRQ line
//! through `IRQ_CFG`. The driver configures the line as push-pull, active high, and the
//! board calls [`State::on_interrupt`] from the controller's interrupt handler (IRQ 13 on the
//! MPS2 AN385/AN386). The handler masks the sources it saw in `INT_EN`, acknowledges them and
//! wakes the network stack; the driver unmasks RX again once it has drained the RX FIFO
//! (the NAPI pattern), so a level-triggered source can never storm.
//!
//! Transmit needs no interrupt under QEMU: the model sends each frame as soon as its last
//! word is written, so the TX FIFO always has room. On real silicon a full TX FIFO makes
//! [`embassy_net_driver::Driver::transmit`] (and `receive`) return `None` and wake itself at
//! once, i.e. it busy-polls only while the FIFO is full (QEMU implements no FIFO-level
//! interrupt to do better).
//!
//! No heap: the driver owns two frame buffers (1536 bytes each), so place it in a static.
#![no_std]
#![deny(unsafe_code)]

mod regs;

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use core::task::Context;

use embassy_net_driver::{Capabilities, HardwareAddress, LinkState};
use embassy_sync::waitqueue::AtomicWaker;

pub use regs::Regs;
use regs::{int, mac, mii, off, phy};

/// Largest Ethernet frame the stack may hand us or receive, header included, CRC excluded.
pub const MTU: usize = 1514;

/// Size of each of the driver's frame buffers: one MTU frame plus its CRC, word aligned.
const FRAME_BUF: usize = 1536;

/// The internal PHY's address on the MII bus.
const PHY_ADDR: u32 = 1;

/// Bound on every busy-wait for the controller (reset, MAC CSR, MII), in register reads.
const SPIN_LIMIT: u32 = 100_000;

/// Errors from bringing the controller up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Error {
    /// `BYTE_TEST` did not read `0x87654321`: no controller at that address, or wrong endianness.
    NotFound(u32),
    /// The controller did not finish a soft reset, a MAC CSR or an MII access in time.
    Timeout,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::NotFound(v) => write!(f, "no LAN9118 found (BYTE_TEST read {v:#010x})"),
            Error::Timeout => f.write_str("LAN9118 did not respond in time"),
        }
    }
}

impl core::error::Error for Error {}

/// State shared between the driver and the interrupt handler; keep it in a `static`.
pub struct State {
    /// Register base of the controller once the driver is up; 0 before.
    base: AtomicUsize,
    /// Woken when a frame arrives (RX) and on PHY events.
    waker: AtomicWaker,
    /// Set by a PHY interrupt: the cached link state must be re-read.
    link_dirty: AtomicBool,
}

impl State {
    /// A state with no controller attached yet.
    pub const fn new() -> Self {
        Self {
            base: AtomicUsize::new(0),
            waker: AtomicWaker::new(),
            link_dirty: AtomicBool::new(true),
        }
    }

    /// Handles the controller's interrupt; call it from the board's interrupt handler.
    ///
    /// Masks and acknowledges the pending sources and wakes the network stack. Does nothing
    /// before [`Lan9118::new`] has succeeded with this state.
    pub fn on_interrupt(&self) {
        let base = self.base.load(Ordering::Acquire);
        if base == 0 {
            return;
        }
        let regs = Regs::from_attached(base);
        let pending = regs.read(off::INT_STS) & regs.read(off::INT_EN);
        if pending == 0 {
            return;
        }
        // Mask what fired until the driver has handled it, then acknowledge (W1C). An interrupt
        // handler is not preempted by thread mode, so this read-modify-write cannot race the
        // driver's own (which runs inside a critical section).
        regs.write(off::INT_EN, regs.read(off::INT_EN) & !pending);
        regs.write(off::INT_STS, pending);
        if pending & int::PHY != 0 {
            self.link_dirty.store(true, Ordering::Release);
        }
        self.waker.wake();
    }
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

/// A brought-up LAN9118: implements [`embassy_net_driver::Driver`].
pub struct Lan9118<'d> {
    regs: Regs,
    state: &'d State,
    mac: [u8; 6],
    link: LinkState,
    rx_buf: [u8; FRAME_BUF],
    tx_buf: [u8; FRAME_BUF],
}

impl<'d> Lan9118<'d> {
    /// Soft-resets the controller, programs `mac`, enables TX/RX and the interrupts.
    ///
    /// `mac` should be a locally administered unicast address (first byte `x2`, `x6`, `xA`
    /// or `xE`) unless you own an OUI. The board must still unmask the controller's IRQ in
    /// the NVIC and route it to [`State::on_interrupt`].
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if `BYTE_TEST` is wrong, [`Error::Timeout`] if the controller does
    /// not come out of reset or does not complete a MAC/PHY register access.
    pub fn new(regs: Regs, state: &'d State, mac: [u8; 6]) -> Result<Self, Error> {
        let test = regs.read(off::BYTE_TEST);
        if test != regs::BYTE_TEST_VALUE {
            return Err(Error::NotFound(test));
        }
        // Detach the interrupt handler while we reset.
        state.base.store(0, Ordering::Release);

        regs.write(off::HW_CFG, regs::HW_CFG_SRST);
        spin_until(|| regs.read(off::HW_CFG) & regs::HW_CFG_SRST == 0)?;
        spin_until(|| regs.read(off::PMT_CTRL) & regs::PMT_CTRL_READY != 0)?;

        // Default FIFO split (TX 5 KiB), "must be one" bit set as the datasheet asks.
        regs.write(off::HW_CFG, regs::HW_CFG_TX_FIF_SZ_5 | regs::HW_CFG_MBO);
        regs.write(off::INT_EN, 0);
        regs.write(off::INT_STS, u32::MAX);

        let lo = u32::from_le_bytes([mac[0], mac[1], mac[2], mac[3]]);
        let hi = u32::from(u16::from_le_bytes([mac[4], mac[5]]));
        regs.mac_write(mac::ADDRL, lo)?;
        regs.mac_write(mac::ADDRH, hi)?;

        // PHY: reset, then auto-negotiate; report link changes through PHY_INT.
        regs.phy_write(phy::BMCR, phy::BMCR_RESET)?;
        spin_until_res(|| Ok(regs.phy_read(phy::BMCR)? & phy::BMCR_RESET == 0))?;
        regs.phy_write(phy::BMCR, phy::BMCR_ANENABLE | phy::BMCR_ANRESTART)?;
        regs.phy_write(
            phy::INT_MASK,
            phy::INT_ENERGYON | phy::INT_AN_COMPLETE | phy::INT_LINK_DOWN,
        )?;

        // MAC: full duplex, TX and RX on; exact unicast match plus broadcast (no promiscuity).
        regs.mac_write(mac::CR, mac::CR_FDPX | mac::CR_TXEN | mac::CR_RXEN)?;
        // Transmitter on; never stall on a full TX status FIFO (we do not read it).
        regs.write(off::TX_CFG, regs::TX_CFG_TX_ON | regs::TX_CFG_TXSAO);
        // RX: no offset, no end padding. Interrupt as soon as one status word is queued.
        regs.write(off::RX_CFG, 0);
        regs.write(off::FIFO_INT, regs::FIFO_INT_DEFAULT_TDAL);
        regs.write(
            off::IRQ_CFG,
            regs::IRQ_CFG_EN | regs::IRQ_CFG_POL_HIGH | regs::IRQ_CFG_PUSH_PULL,
        );
        regs.write(off::INT_STS, u32::MAX);

        state.link_dirty.store(true, Ordering::Release);
        state.base.store(regs.base(), Ordering::Release);
        regs.write(off::INT_EN, int::RSFL | int::PHY);

        Ok(Self {
            regs,
            state,
            mac,
            link: LinkState::Down,
            rx_buf: [0; FRAME_BUF],
            tx_buf: [0; FRAME_BUF],
        })
    }

    /// The MAC address this driver programmed.
    pub fn mac_address(&self) -> [u8; 6] {
        self.mac
    }

    /// Unmasks interrupt sources in `INT_EN`, atomically with respect to the interrupt handler.
    fn unmask(&self, bits: u32) {
        critical_section::with(|_| {
            let en = self.regs.read(off::INT_EN);
            if en & bits != bits {
                self.regs.write(off::INT_EN, en | bits);
            }
        });
    }

    /// Pops the next good frame into `rx_buf` and returns its length (CRC excluded).
    ///
    /// Frames with errors, or too long for the buffer, are read out and dropped.
    fn pop_frame(&mut self) -> Option<usize> {
        loop {
            let inf = self.regs.read(off::RX_FIFO_INF);
            if regs::rx_status_used(inf) == 0 {
                return None;
            }
            let status = self.regs.read(off::RX_STATUS_FIFO);
            let words = regs::rx_words(status);
            match regs::rx_frame_len(status) {
                Some(len) if words * 4 <= FRAME_BUF => {
                    for chunk in self.rx_buf.chunks_exact_mut(4).take(words) {
                        chunk.copy_from_slice(&self.regs.read(off::RX_DATA_FIFO).to_le_bytes());
                    }
                    return Some(len);
                }
                _ => {
                    for _ in 0..words {
                        let _ = self.regs.read(off::RX_DATA_FIFO);
                    }
                }
            }
        }
    }

    /// Whether the TX data FIFO has room for one MTU frame and its two command words.
    fn tx_room(&self) -> bool {
        regs::tx_free_bytes(self.regs.read(off::TX_FIFO_INF)) >= regs::tx_fifo_bytes(MTU)
    }
}

impl embassy_net_driver::Driver for Lan9118<'_> {
    type RxToken<'a>
        = RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a>
    where
        Self: 'a;

    fn receive(&mut self, cx: &mut Context<'_>) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        self.state.waker.register(cx.waker());
        if !self.tx_room() {
            // smoltcp needs a TX token with every RX token (to answer at once); leave the frame
            // in the RX FIFO and come back. Unreachable under QEMU, whose TX FIFO is drained
            // synchronously.
            cx.waker().wake_by_ref();
            return None;
        }
        match self.pop_frame() {
            Some(len) => {
                let regs = self.regs;
                let (rx, tx) = (&mut self.rx_buf, &mut self.tx_buf);
                Some((
                    RxToken {
                        buf: &mut rx[..len],
                    },
                    TxToken { regs, buf: tx },
                ))
            }
            None => {
                // RX FIFO drained: let the next frame interrupt us. A frame that landed after
                // the check above has already set INT_STS.RSFL, so unmasking fires at once.
                self.unmask(int::RSFL);
                None
            }
        }
    }

    fn transmit(&mut self, cx: &mut Context<'_>) -> Option<Self::TxToken<'_>> {
        if self.tx_room() {
            Some(TxToken {
                regs: self.regs,
                buf: &mut self.tx_buf,
            })
        } else {
            cx.waker().wake_by_ref();
            None
        }
    }

    fn link_state(&mut self, cx: &mut Context<'_>) -> LinkState {
        self.state.waker.register(cx.waker());
        if self.state.link_dirty.swap(false, Ordering::AcqRel) {
            // Reading the PHY's interrupt source acknowledges it; then re-arm PHY_INT.
            // BMSR's link bit latches low on real PHYs, so read it twice.
            let _ = self.regs.phy_read(phy::INT_SRC);
            let _ = self.regs.phy_read(phy::BMSR);
            self.link = match self.regs.phy_read(phy::BMSR) {
                Ok(bmsr) if bmsr & phy::BMSR_LINK != 0 => LinkState::Up,
                Ok(_) => LinkState::Down,
                Err(_) => {
                    // Try again on the next poll.
                    self.state.link_dirty.store(true, Ordering::Release);
                    cx.waker().wake_by_ref();
                    self.link
                }
            };
            self.unmask(int::PHY);
        }
        self.link
    }

    fn capabilities(&self) -> Capabilities {
        // The LAN9118 has no checksum offload (the LAN9220's is not emulated): defaults
        // (software computes and checks every checksum) are right.
        let mut caps = Capabilities::default();
        caps.max_transmission_unit = MTU;
        caps
    }

    fn hardware_address(&self) -> HardwareAddress {
        HardwareAddress::Ethernet(self.mac)
    }
}

/// A received frame, already copied out of the controller.
pub struct RxToken<'a> {
    buf: &'a mut [u8],
}

impl embassy_net_driver::RxToken for RxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        f(self.buf)
    }
}

/// Permission to send one frame; the frame is pushed into the TX FIFO on `consume`.
pub struct TxToken<'a> {
    regs: Regs,
    buf: &'a mut [u8; FRAME_BUF],
}

impl embassy_net_driver::TxToken for TxToken<'_> {
    /// Builds the frame with `f` and queues it for transmission.
    ///
    /// # Panics
    ///
    /// If `len` exceeds [`MTU`]; embassy-net never asks for more than the advertised MTU.
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        assert!(len <= MTU, "frame longer than the MTU");
        let frame = &mut self.buf[..len];
        let r = f(frame);
        let (cmd_a, cmd_b) = regs::tx_commands(len);
        self.regs.write(off::TX_DATA_FIFO, cmd_a);
        self.regs.write(off::TX_DATA_FIFO, cmd_b);
        for chunk in frame.chunks(4) {
            self.regs.write(off::TX_DATA_FIFO, regs::pack_word(chunk));
        }
        r
    }
}

/// Spins until `done` holds, at most [`SPIN_LIMIT`] times.
fn spin_until(mut done: impl FnMut() -> bool) -> Result<(), Error> {
    spin_until_res(|| Ok(done()))
}

/// Spins until `done` returns `Ok(true)`, at most [`SPIN_LIMIT`] times; errors pass through.
fn spin_until_res(mut done: impl FnMut() -> Result<bool, Error>) -> Result<(), Error> {
    for _ in 0..SPIN_LIMIT {
        if done()? {
            return Ok(());
        }
    }
    Err(Error::Timeout)
}

impl Regs {
    /// Waits for the MAC CSR window to be idle.
    fn mac_wait(&self) -> Result<(), Error> {
        spin_until(|| self.read(off::MAC_CSR_CMD) & regs::MAC_CSR_BUSY == 0)
    }

    /// Writes MAC register `reg` through the indirect CSR window.
    fn mac_write(&self, reg: u32, val: u32) -> Result<(), Error> {
        self.mac_wait()?;
        self.write(off::MAC_CSR_DATA, val);
        self.write(off::MAC_CSR_CMD, regs::MAC_CSR_BUSY | reg);
        self.mac_wait()
    }

    /// Reads MAC register `reg` through the indirect CSR window.
    fn mac_read(&self, reg: u32) -> Result<u32, Error> {
        self.mac_wait()?;
        self.write(
            off::MAC_CSR_CMD,
            regs::MAC_CSR_BUSY | regs::MAC_CSR_READ | reg,
        );
        self.mac_wait()?;
        Ok(self.read(off::MAC_CSR_DATA))
    }

    /// Waits for the MII bus to be idle.
    fn mii_wait(&self) -> Result<(), Error> {
        spin_until_res(|| Ok(self.mac_read(mac::MII_ACC)? & mii::BUSY == 0))
    }

    /// Reads register `reg` of the internal PHY.
    fn phy_read(&self, reg: u32) -> Result<u16, Error> {
        self.mii_wait()?;
        self.mac_write(mac::MII_ACC, mii::acc(PHY_ADDR, reg, false))?;
        self.mii_wait()?;
        // MII_DATA holds 16 significant bits.
        Ok((self.mac_read(mac::MII_DATA)? & 0xffff) as u16)
    }

    /// Writes register `reg` of the internal PHY.
    fn phy_write(&self, reg: u32, val: u16) -> Result<(), Error> {
        self.mii_wait()?;
        self.mac_write(mac::MII_DATA, u32::from(val))?;
        self.mac_write(mac::MII_ACC, mii::acc(PHY_ADDR, reg, true))?;
        self.mii_wait()
    }
}

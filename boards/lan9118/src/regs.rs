//! Register map of the LAN9118 (32-bit mode), MMIO access, and the pure encode/decode helpers.
//!
//! Offsets and bits follow the SMSC LAN9118 datasheet; each one used here is also
//! implemented by QEMU's `hw/net/lan9118.c` (which aborts the VM on an unknown offset, so this
//! driver touches nothing else).
#![allow(unsafe_code)]

use core::ptr::{read_volatile, write_volatile};

/// Byte offsets of the system control and status registers.
pub(crate) mod off {
    /// RX data FIFO port (aliased over 0x00..0x1c).
    pub const RX_DATA_FIFO: usize = 0x00;
    /// TX data FIFO port (aliased over 0x20..0x3c).
    pub const TX_DATA_FIFO: usize = 0x20;
    /// RX status FIFO port (pops).
    pub const RX_STATUS_FIFO: usize = 0x40;
    /// Interrupt line configuration.
    pub const IRQ_CFG: usize = 0x54;
    /// Interrupt status (write 1 to clear).
    pub const INT_STS: usize = 0x58;
    /// Interrupt enable.
    pub const INT_EN: usize = 0x5c;
    /// Fixed pattern 0x87654321.
    pub const BYTE_TEST: usize = 0x64;
    /// FIFO level interrupt thresholds.
    pub const FIFO_INT: usize = 0x68;
    /// Receive configuration.
    pub const RX_CFG: usize = 0x6c;
    /// Transmit configuration.
    pub const TX_CFG: usize = 0x70;
    /// Hardware configuration (soft reset, FIFO sizes).
    pub const HW_CFG: usize = 0x74;
    /// RX FIFO usage.
    pub const RX_FIFO_INF: usize = 0x7c;
    /// TX FIFO usage.
    pub const TX_FIFO_INF: usize = 0x80;
    /// Power management control (READY bit).
    pub const PMT_CTRL: usize = 0x84;
    /// MAC CSR indirect access: command.
    pub const MAC_CSR_CMD: usize = 0xa4;
    /// MAC CSR indirect access: data.
    pub const MAC_CSR_DATA: usize = 0xa8;
}

/// `INT_STS`/`INT_EN` bits.
pub(crate) mod int {
    /// RX status FIFO level above `FIFO_INT.RXSL`.
    pub const RSFL: u32 = 1 << 3;
    /// PHY interrupt.
    pub const PHY: u32 = 1 << 18;
}

/// MAC CSR register indices and `MAC_CR` bits.
pub(crate) mod mac {
    /// MAC control register.
    pub const CR: u32 = 1;
    /// MAC address, bytes 4 and 5.
    pub const ADDRH: u32 = 2;
    /// MAC address, bytes 0 to 3.
    pub const ADDRL: u32 = 3;
    /// MII access (command) register.
    pub const MII_ACC: u32 = 6;
    /// MII data register.
    pub const MII_DATA: u32 = 7;
    /// Receiver enable.
    pub const CR_RXEN: u32 = 1 << 2;
    /// Transmitter enable.
    pub const CR_TXEN: u32 = 1 << 3;
    /// Full duplex.
    pub const CR_FDPX: u32 = 1 << 20;
}

/// `MII_ACC` encoding.
pub(crate) mod mii {
    /// Access in progress.
    pub const BUSY: u32 = 1 << 0;
    /// Write (1) or read (0).
    const WRITE: u32 = 1 << 1;

    /// The `MII_ACC` word that starts an access to `reg` of PHY `phy`.
    pub const fn acc(phy: u32, reg: u32, write: bool) -> u32 {
        ((phy & 0x1f) << 11) | ((reg & 0x1f) << 6) | if write { WRITE } else { 0 } | BUSY
    }
}

/// Internal PHY registers and bits.
pub(crate) mod phy {
    /// Basic control.
    pub const BMCR: u32 = 0;
    /// Basic status.
    pub const BMSR: u32 = 1;
    /// Interrupt source (read clears).
    pub const INT_SRC: u32 = 29;
    /// Interrupt mask.
    pub const INT_MASK: u32 = 30;
    /// BMCR: soft reset (self-clearing).
    pub const BMCR_RESET: u16 = 1 << 15;
    /// BMCR: auto-negotiation enable.
    pub const BMCR_ANENABLE: u16 = 1 << 12;
    /// BMCR: restart auto-negotiation.
    pub const BMCR_ANRESTART: u16 = 1 << 9;
    /// BMSR: link up.
    pub const BMSR_LINK: u16 = 1 << 2;
    /// Interrupt: energy detected.
    pub const INT_ENERGYON: u16 = 1 << 7;
    /// Interrupt: auto-negotiation complete.
    pub const INT_AN_COMPLETE: u16 = 1 << 6;
    /// Interrupt: link down.
    pub const INT_LINK_DOWN: u16 = 1 << 4;
}

/// What `BYTE_TEST` reads on a correctly wired controller.
pub(crate) const BYTE_TEST_VALUE: u32 = 0x8765_4321;
/// `HW_CFG`: soft reset (self-clearing).
pub(crate) const HW_CFG_SRST: u32 = 1 << 0;
/// `HW_CFG`: TX FIFO size 5 KiB (the reset default).
pub(crate) const HW_CFG_TX_FIF_SZ_5: u32 = 5 << 16;
/// `HW_CFG`: "must be one".
pub(crate) const HW_CFG_MBO: u32 = 1 << 20;
/// `PMT_CTRL`: device ready.
pub(crate) const PMT_CTRL_READY: u32 = 1 << 0;
/// `TX_CFG`: transmitter on.
pub(crate) const TX_CFG_TX_ON: u32 = 1 << 1;
/// `TX_CFG`: TX status FIFO may overrun (we never read it).
pub(crate) const TX_CFG_TXSAO: u32 = 1 << 2;
/// `FIFO_INT`: TX data available level at its default, RX status level 0.
pub(crate) const FIFO_INT_DEFAULT_TDAL: u32 = 0x48 << 24;
/// `IRQ_CFG`: master interrupt enable.
pub(crate) const IRQ_CFG_EN: u32 = 1 << 8;
/// `IRQ_CFG`: active-high polarity.
pub(crate) const IRQ_CFG_POL_HIGH: u32 = 1 << 4;
/// `IRQ_CFG`: push-pull output.
pub(crate) const IRQ_CFG_PUSH_PULL: u32 = 1 << 0;
/// `MAC_CSR_CMD`: busy (set to start, clears when done).
pub(crate) const MAC_CSR_BUSY: u32 = 1 << 31;
/// `MAC_CSR_CMD`: read (1) or write (0).
pub(crate) const MAC_CSR_READ: u32 = 1 << 30;

/// RX status word: error summary.
const RX_STS_ES: u32 = 1 << 15;
/// TX command A: first segment of a frame.
const TX_CMD_A_FIRST: u32 = 1 << 13;
/// TX command A: last segment of a frame.
const TX_CMD_A_LAST: u32 = 1 << 12;
/// Smallest valid frame on the wire: an Ethernet header plus the CRC.
const MIN_WIRE_LEN: usize = 14 + 4;

/// The register window of one controller.
///
/// Invariant: `base` is the address of a LAN9118 32-bit register window (256 bytes of
/// device memory) that stays mapped for the life of the program.
#[derive(Clone, Copy, Debug)]
pub struct Regs {
    base: usize,
}

impl Regs {
    /// Names the register window at `base` (0x4020_0000 on the MPS2 AN385/AN386).
    ///
    /// # Safety
    ///
    /// `base` must be the address of a LAN9118/LAN9220 register window in 32-bit mode, mapped
    /// as device memory for the rest of the program, and no code other than this crate may
    /// access it while a [`crate::Lan9118`] built on it exists.
    pub const unsafe fn new(base: usize) -> Self {
        Self { base }
    }

    /// Rebuilds the window from an address previously taken from [`Regs::base`].
    pub(crate) const fn from_attached(base: usize) -> Self {
        Self { base }
    }

    /// The window's base address.
    pub(crate) const fn base(&self) -> usize {
        self.base
    }

    /// Reads the 32-bit register at byte offset `off` (one of [`off`]).
    pub(crate) fn read(&self, off: usize) -> u32 {
        // SAFETY: by the type's invariant `base` is a mapped LAN9118 window of 256 bytes, `off`
        // is one of the word-aligned offsets in `off` (all < 0x100), so the address is valid,
        // aligned device memory; a volatile read has no other effect than the device's own.
        unsafe { read_volatile((self.base + off) as *const u32) }
    }

    /// Writes the 32-bit register at byte offset `off` (one of [`off`]).
    pub(crate) fn write(&self, off: usize, val: u32) {
        // SAFETY: as in `read`: valid, aligned, mapped device memory inside the window.
        unsafe { write_volatile((self.base + off) as *mut u32, val) }
    }
}

/// Number of frames waiting in the RX status FIFO, from `RX_FIFO_INF`.
pub(crate) const fn rx_status_used(rx_fifo_inf: u32) -> u32 {
    (rx_fifo_inf >> 16) & 0xff
}

/// Number of RX data FIFO words a frame occupies, from its RX status word (CRC included).
pub(crate) const fn rx_words(status: u32) -> usize {
    let wire_len = ((status >> 16) & 0x3fff) as usize;
    wire_len.div_ceil(4)
}

/// Length of a good frame without its CRC, or `None` for a frame to drop.
pub(crate) const fn rx_frame_len(status: u32) -> Option<usize> {
    let wire_len = ((status >> 16) & 0x3fff) as usize;
    if status & RX_STS_ES != 0 || wire_len < MIN_WIRE_LEN {
        None
    } else {
        Some(wire_len - 4)
    }
}

/// Free bytes in the TX data FIFO, from `TX_FIFO_INF`.
pub(crate) const fn tx_free_bytes(tx_fifo_inf: u32) -> usize {
    (tx_fifo_inf & 0xffff) as usize
}

/// Bytes of TX data FIFO one single-segment frame of `len` bytes needs (commands included).
pub(crate) const fn tx_fifo_bytes(len: usize) -> usize {
    len.div_ceil(4) * 4 + 8
}

/// TX command words A and B for a single-segment frame of `len` (≤ 2047) bytes.
pub(crate) const fn tx_commands(len: usize) -> (u32, u32) {
    let len = (len as u32) & 0x7ff;
    (TX_CMD_A_FIRST | TX_CMD_A_LAST | len, len)
}

/// Packs up to four bytes into one little-endian FIFO word, zero-padded.
pub(crate) fn pack_word(bytes: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    for (d, s) in w.iter_mut().zip(bytes) {
        *d = *s;
    }
    u32::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- RX status decoding -------------------------------------------------------------

    #[test]
    fn rx_status_good_frame() {
        // QEMU's status for a 60-byte frame: (60 + 4) << 16.
        let status = 64 << 16;
        assert_eq!(rx_frame_len(status), Some(60));
        assert_eq!(rx_words(status), 16);
    }

    #[test]
    fn rx_status_odd_length_rounds_up() {
        let status = (1514 + 4) << 16;
        assert_eq!(rx_frame_len(status), Some(1514));
        assert_eq!(rx_words(status), 380);
        assert_eq!(rx_words(63 << 16), 16);
    }

    #[test]
    fn rx_status_error_or_runt_dropped() {
        assert_eq!(rx_frame_len((64 << 16) | RX_STS_ES), None);
        assert_eq!(rx_frame_len(17 << 16), None);
        assert_eq!(rx_frame_len(0), None);
        // Still consumes its words.
        assert_eq!(rx_words((64 << 16) | RX_STS_ES), 16);
    }

    #[test]
    fn fifo_inf_fields() {
        assert_eq!(rx_status_used(0x0003_0100), 3);
        assert_eq!(tx_free_bytes(0x0012_1200), 0x1200);
    }

    // ---- TX encoding ---------------------------------------------------------------------

    #[test]
    fn tx_commands_single_segment() {
        let (a, b) = tx_commands(42);
        assert_eq!(a, (1 << 13) | (1 << 12) | 42);
        assert_eq!(b, 42);
        assert_eq!(tx_fifo_bytes(42), 44 + 8);
        assert_eq!(tx_fifo_bytes(1514), 1516 + 8);
    }

    #[test]
    fn pack_word_little_endian_padded() {
        assert_eq!(pack_word(&[1, 2, 3, 4]), 0x0403_0201);
        assert_eq!(pack_word(&[0xaa]), 0xaa);
        assert_eq!(pack_word(&[]), 0);
    }

    #[test]
    fn mii_acc_encoding() {
        assert_eq!(mii::acc(1, 1, false), (1 << 11) | (1 << 6) | 1);
        assert_eq!(mii::acc(1, 30, true), (1 << 11) | (30 << 6) | 2 | 1);
    }
}

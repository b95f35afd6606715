//! Console on UART0 (CMSDK APB UART at 0x4000_4000); QEMU's `-nographic` wires it to stdio.
//!
//! Blocking, polled transmit only. Safe to use from any context, including the panic and
//! fault handlers (bytes from concurrent writers may interleave).
#![allow(unsafe_code)]

use core::fmt;
use core::ptr::{read_volatile, write_volatile};

/// UART0 register base on the MPS2 AN385/AN386.
const BASE: usize = 0x4000_4000;
/// Data register.
const DATA: usize = 0x00;
/// State register; bit 0 = TX buffer full.
const STATE: usize = 0x04;
/// Control register; bit 0 = TX enable.
const CTRL: usize = 0x08;
/// Baud rate divider; QEMU refuses to transmit below 16.
const BAUDDIV: usize = 0x10;
const STATE_TX_FULL: u32 = 1 << 0;
const CTRL_TX_EN: u32 = 1 << 0;

fn write_reg(off: usize, val: u32) {
    // SAFETY: BASE is UART0's register window on this board (hw/arm/mps2.c); every offset used
    // is an aligned word register inside it, and these registers have no memory-safety effects.
    unsafe { write_volatile((BASE + off) as *mut u32, val) }
}

fn read_reg(off: usize) -> u32 {
    // SAFETY: as in `write_reg`.
    unsafe { read_volatile((BASE + off) as *const u32) }
}

/// Enables the transmitter at 25 MHz / 16 (the rate is irrelevant under QEMU).
pub fn init() {
    write_reg(BAUDDIV, 16);
    write_reg(CTRL, CTRL_TX_EN);
}

/// The console; a zero-sized handle implementing [`fmt::Write`].
pub struct Console;

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                put(b'\r');
            }
            put(b);
        }
        Ok(())
    }
}

fn put(b: u8) {
    while read_reg(STATE) & STATE_TX_FULL != 0 {}
    write_reg(DATA, u32::from(b));
}

/// Prints a line to the console.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($crate::uart::Console, $($arg)*);
    }};
}

//! The byte buffers of control slots: slot `i`'s receive and send FIFOs, each
//! behind its kept prefix, in bytes `i * BUF .. (i + 1) * BUF` of the session's
//! receive and send memories.

use core::cmp::min;

use super::{Control, Kind};
use crate::session::Session;
use crate::wire::qmux::{Dir, StreamId};
use crate::wire::{EncodeError, Writer};

impl<'s, 'a, 'p, const N: usize> Session<'s, 'a, 'p, N> {
    /// The control slot of stream `id`.
    pub(in crate::session) fn control_slot(&self, id: StreamId) -> Option<usize> {
        self.control.iter().position(|c| c.stream == Some(id))
    }

    /// Takes a free slot for a stream of `kind` (opened later by `open_pending`
    /// when `stream` is `None`).
    pub(in crate::session) fn alloc_control(
        &mut self,
        kind: Kind,
        dir: Dir,
        stream: Option<StreamId>,
    ) -> Option<usize> {
        let slot = self.control.first_free()?;
        self.control[slot] = Control {
            kind,
            stream,
            dir,
            ..Control::FREE
        };
        Some(slot)
    }

    /// Free control slots.
    pub(in crate::session) fn free_control(&self) -> usize {
        self.control.free_count()
    }

    /// The unparsed receive bytes of `slot`.
    pub(in crate::session) fn rx_data(&self, slot: usize) -> &[u8] {
        rx_of(self.rx, &self.control[slot], self.buf, slot)
    }

    /// The kept prefix of `slot`'s receive buffer.
    pub(in crate::session) fn rx_kept(&self, slot: usize) -> &[u8] {
        let c = &self.control[slot];
        let start = slot * self.buf;
        self.rx.get(start..start + c.rx_keep).unwrap_or(&[])
    }

    /// The kept prefix of `slot`'s send buffer.
    pub(in crate::session) fn tx_kept(&self, slot: usize) -> &[u8] {
        let c = &self.control[slot];
        let start = slot * self.buf;
        self.tx.get(start..start + c.tx_keep).unwrap_or(&[])
    }

    /// Drops `n` parsed bytes from the front of `slot`'s receive FIFO.
    pub(in crate::session) fn rx_consume(&mut self, slot: usize, n: usize) {
        let c = &mut self.control[slot];
        let n = min(n, c.rx_len);
        let start = slot * self.buf + c.rx_keep;
        if let Some(region) = self.rx.get_mut(start..start + c.rx_len) {
            region.copy_within(n.., 0);
        }
        c.rx_len -= n;
    }

    /// Replaces the kept prefix of `slot`'s receive buffer (the FIFO must be empty).
    pub(in crate::session) fn set_rx_kept(&mut self, slot: usize, bytes: &[u8]) -> bool {
        let c = &mut self.control[slot];
        if c.rx_len != 0 || bytes.len() > self.buf {
            return false;
        }
        let start = slot * self.buf;
        match self.rx.get_mut(start..start + bytes.len()) {
            Some(region) => {
                region.copy_from_slice(bytes);
                c.rx_keep = bytes.len();
                true
            }
            None => false,
        }
    }

    /// Writes `bytes` into `slot`'s receive buffer at `offset` and makes the kept
    /// prefix end after them (the FIFO must be empty).
    pub(in crate::session) fn set_rx_kept_at(
        &mut self,
        slot: usize,
        offset: usize,
        bytes: &[u8],
    ) -> bool {
        let c = &mut self.control[slot];
        let end = offset.saturating_add(bytes.len());
        if c.rx_len != 0 || end > self.buf || offset > c.rx_keep {
            return false;
        }
        let start = slot * self.buf;
        match self.rx.get_mut(start + offset..start + end) {
            Some(region) => {
                region.copy_from_slice(bytes);
                c.rx_keep = end;
                true
            }
            None => false,
        }
    }

    /// Appends to `slot`'s send FIFO whatever `f` writes, all or nothing.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] if it does not fit; [`EncodeError::ValueTooLarge`] from `f`.
    pub(in crate::session) fn tx_write(
        &mut self,
        slot: usize,
        f: impl FnOnce(&mut Writer<'_>) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        let c = self.control[slot];
        let base = slot * self.buf;
        let region = self
            .tx
            .get_mut(base + c.tx_keep + c.tx_len..base + self.buf)
            .ok_or(EncodeError::BufferTooSmall)?;
        let mut w = Writer::new(region);
        f(&mut w)?;
        self.control[slot].tx_len += w.position();
        Ok(())
    }

    /// Stores `bytes` as the kept prefix of `slot`'s send buffer (before anything is queued).
    pub(in crate::session) fn set_tx_kept(&mut self, slot: usize, bytes: &[u8]) -> bool {
        let c = &mut self.control[slot];
        if c.tx_len != 0 || bytes.len() > self.buf {
            return false;
        }
        let start = slot * self.buf;
        match self.tx.get_mut(start..start + bytes.len()) {
            Some(region) => {
                region.copy_from_slice(bytes);
                c.tx_keep = bytes.len();
                true
            }
            None => false,
        }
    }
}

/// The unparsed receive bytes of control slot `slot` (`c`) in the session's
/// receive memory `rx` of `buf`-byte buffers; a field-level borrow, so other
/// fields of the session stay usable.
pub(in crate::session) fn rx_of<'b>(
    rx: &'b [u8],
    c: &Control,
    buf: usize,
    slot: usize,
) -> &'b [u8] {
    let start = slot * buf + c.rx_keep;
    rx.get(start..start + c.rx_len).unwrap_or(&[])
}

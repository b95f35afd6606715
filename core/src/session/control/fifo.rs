//! The byte buffers of control slots: each slot's receive and send FIFOs,
//! each behind its kept prefix, in control buffers the slot borrows from the
//! session's shared set while it needs them (chunk `k` is bytes
//! `k * BUF .. (k + 1) * BUF` of the session's control memory).

use core::cmp::min;

use super::{Control, Kind, NO_CHUNK};
use crate::session::Session;
use crate::transport::Transport;
use crate::wire::qmux::{Dir, StreamId};
use crate::wire::{EncodeError, Writer};

/// Which FIFO of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    Rx,
    Tx,
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
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

    /// Control buffers no slot holds.
    pub(in crate::session) fn free_chunks(&self) -> usize {
        self.free_chunks
    }

    /// Gives back the control buffers of `slot` (it is being freed).
    pub(in crate::session) fn release_chunks(&mut self, slot: usize) {
        for half in [Half::Rx, Half::Tx] {
            self.give_chunk(slot, half);
        }
    }

    /// Gives back every control buffer a slot holds with nothing in it.
    pub(in crate::session) fn trim_chunks(&mut self) {
        for slot in 0..self.control.span() {
            self.trim_slot(slot);
        }
    }

    /// Gives back the control buffers `slot` holds with nothing in them.
    pub(in crate::session) fn trim_slot(&mut self, slot: usize) {
        let c = &self.control[slot];
        if c.rx_chunk != NO_CHUNK && c.rx_len == 0 && c.rx_keep == 0 && c.event == 0 {
            self.give_chunk(slot, Half::Rx);
        }
        let c = &self.control[slot];
        if c.tx_chunk != NO_CHUNK && c.tx_len == 0 && c.tx_keep == 0 {
            self.give_chunk(slot, Half::Tx);
        }
    }

    /// Makes sure `slot` holds a receive buffer; false if none can be had.
    /// A slot without a send buffer takes one only while another stays free,
    /// so the answer to what it receives always finds a buffer.
    pub(in crate::session) fn ensure_rx_chunk(&mut self, slot: usize) -> bool {
        let c = &self.control[slot];
        if c.rx_chunk != NO_CHUNK {
            return true;
        }
        let reserve = usize::from(c.tx_chunk == NO_CHUNK);
        self.free_chunks > reserve && self.take_chunk(slot, Half::Rx)
    }

    /// Makes sure `slot` holds a send buffer; false if none is free.
    fn ensure_tx_chunk(&mut self, slot: usize) -> bool {
        self.control[slot].tx_chunk != NO_CHUNK || self.take_chunk(slot, Half::Tx)
    }

    fn take_chunk(&mut self, slot: usize, half: Half) -> bool {
        let Some(k) = self.chunk_used.iter().position(|used| !used) else {
            self.chunk_starved = true;
            return false;
        };
        let Ok(index) = u16::try_from(k) else {
            return false;
        };
        self.chunk_used[k] = true;
        self.free_chunks -= 1;
        let c = &mut self.control[slot];
        match half {
            Half::Rx => c.rx_chunk = index,
            Half::Tx => c.tx_chunk = index,
        }
        true
    }

    fn give_chunk(&mut self, slot: usize, half: Half) {
        let c = &mut self.control[slot];
        let chunk = match half {
            Half::Rx => core::mem::replace(&mut c.rx_chunk, NO_CHUNK),
            Half::Tx => core::mem::replace(&mut c.tx_chunk, NO_CHUNK),
        };
        if let Some(used) = self.chunk_used.get_mut(usize::from(chunk))
            && *used
        {
            *used = false;
            self.free_chunks += 1;
        }
    }

    /// Where `slot`'s receive buffer starts in the control memory.
    pub(in crate::session) fn rx_base(&self, slot: usize) -> Option<usize> {
        chunk_base(self.control[slot].rx_chunk, self.buf)
    }

    /// Where `slot`'s send buffer starts in the control memory.
    pub(in crate::session) fn tx_base(&self, slot: usize) -> Option<usize> {
        chunk_base(self.control[slot].tx_chunk, self.buf)
    }

    /// The unparsed receive bytes of `slot`.
    pub(in crate::session) fn rx_data(&self, slot: usize) -> &[u8] {
        rx_of(self.chunks, &self.control[slot], self.buf)
    }

    /// The kept prefix of `slot`'s receive buffer.
    pub(in crate::session) fn rx_kept(&self, slot: usize) -> &[u8] {
        let c = &self.control[slot];
        self.rx_base(slot)
            .and_then(|start| self.chunks.get(start..start + c.rx_keep))
            .unwrap_or(&[])
    }

    /// The kept prefix of `slot`'s send buffer.
    pub(in crate::session) fn tx_kept(&self, slot: usize) -> &[u8] {
        let c = &self.control[slot];
        self.tx_base(slot)
            .and_then(|start| self.chunks.get(start..start + c.tx_keep))
            .unwrap_or(&[])
    }

    /// Drops `n` parsed bytes from the front of `slot`'s receive FIFO.
    pub(in crate::session) fn rx_consume(&mut self, slot: usize, n: usize) {
        let Some(base) = self.rx_base(slot) else {
            return;
        };
        let c = &mut self.control[slot];
        let n = min(n, c.rx_len);
        let start = base + c.rx_keep;
        if let Some(region) = self.chunks.get_mut(start..start + c.rx_len) {
            region.copy_within(n.., 0);
        }
        c.rx_len -= n;
    }

    /// Replaces the kept prefix of `slot`'s receive buffer (the FIFO must be empty).
    pub(in crate::session) fn set_rx_kept(&mut self, slot: usize, bytes: &[u8]) -> bool {
        if self.control[slot].rx_len != 0 || bytes.len() > self.buf {
            return false;
        }
        if bytes.is_empty() && self.control[slot].rx_chunk == NO_CHUNK {
            self.control[slot].rx_keep = 0;
            return true;
        }
        if !self.ensure_rx_chunk(slot) {
            return false;
        }
        let Some(start) = self.rx_base(slot) else {
            return false;
        };
        match self.chunks.get_mut(start..start + bytes.len()) {
            Some(region) => {
                region.copy_from_slice(bytes);
                self.control[slot].rx_keep = bytes.len();
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
        let c = self.control[slot];
        let end = offset.saturating_add(bytes.len());
        if c.rx_len != 0 || end > self.buf || offset > c.rx_keep {
            return false;
        }
        if !self.ensure_rx_chunk(slot) {
            return false;
        }
        let Some(start) = self.rx_base(slot) else {
            return false;
        };
        match self.chunks.get_mut(start + offset..start + end) {
            Some(region) => {
                region.copy_from_slice(bytes);
                self.control[slot].rx_keep = end;
                true
            }
            None => false,
        }
    }

    /// Appends to `slot`'s send FIFO whatever `f` writes, all or nothing.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] if it does not fit, or no control
    /// buffer is free; [`EncodeError::ValueTooLarge`] from `f`.
    pub(in crate::session) fn tx_write(
        &mut self,
        slot: usize,
        f: impl FnOnce(&mut Writer<'_>) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        if !self.ensure_tx_chunk(slot) {
            return Err(EncodeError::BufferTooSmall);
        }
        let c = self.control[slot];
        let base = self.tx_base(slot).ok_or(EncodeError::BufferTooSmall)?;
        let region = self
            .chunks
            .get_mut(base + c.tx_keep + c.tx_len..base + self.buf)
            .ok_or(EncodeError::BufferTooSmall)?;
        let mut w = Writer::new(region);
        let written = f(&mut w).map(|()| w.position());
        match written {
            Ok(n) => {
                self.control[slot].tx_len += n;
                Ok(())
            }
            Err(e) => {
                if c.tx_len == 0 && c.tx_keep == 0 {
                    self.give_chunk(slot, Half::Tx);
                }
                Err(e)
            }
        }
    }

    /// Stores `bytes` as the kept prefix of `slot`'s send buffer (before anything is queued).
    pub(in crate::session) fn set_tx_kept(&mut self, slot: usize, bytes: &[u8]) -> bool {
        if self.control[slot].tx_len != 0 || bytes.len() > self.buf {
            return false;
        }
        if !self.ensure_tx_chunk(slot) {
            return false;
        }
        let Some(start) = self.tx_base(slot) else {
            return false;
        };
        match self.chunks.get_mut(start..start + bytes.len()) {
            Some(region) => {
                region.copy_from_slice(bytes);
                self.control[slot].tx_keep = bytes.len();
                true
            }
            None => false,
        }
    }
}

/// Where control buffer `chunk` starts in a control memory of `buf`-byte
/// buffers (`None`: no buffer).
pub(in crate::session) fn chunk_base(chunk: u16, buf: usize) -> Option<usize> {
    (chunk != NO_CHUNK).then(|| usize::from(chunk) * buf)
}

/// The unparsed receive bytes of control slot `c` in the session's control
/// memory `chunks` of `buf`-byte buffers; a field-level borrow, so other
/// fields of the session stay usable.
pub(in crate::session) fn rx_of<'b>(chunks: &'b [u8], c: &Control, buf: usize) -> &'b [u8] {
    chunk_base(c.rx_chunk, buf)
        .map(|base| base + c.rx_keep)
        .and_then(|start| chunks.get(start..start + c.rx_len))
        .unwrap_or(&[])
}

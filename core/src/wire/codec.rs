//! Byte cursors shared by every wire codec.
//!
//! [`Reader`] walks a borrowed `&[u8]` and never panics: every read is bounds
//! checked and reports [`DecodeError::Incomplete`] when the input ends early.
//! [`Writer`] fills a caller-provided `&mut [u8]` and reports
//! [`EncodeError::BufferTooSmall`] instead of growing anything.

use super::varint;
use super::{DecodeError, EncodeError};

/// A bounds-checked cursor over borrowed input.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub const fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub const fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub const fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The unread bytes.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// True once every byte was read.
    pub const fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// Reads one varint.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] if the input ends inside it.
    #[inline]
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let (v, n) = varint::decode(self.rest())?;
        self.pos += n;
        Ok(v)
    }

    /// Reads a varint that must fit a `usize` and be at most `limit`.
    ///
    /// # Errors
    /// [`DecodeError::TooLarge`] over `limit`; [`DecodeError::Incomplete`] on short input.
    #[inline]
    pub fn length(&mut self, limit: usize) -> Result<usize, DecodeError> {
        let v = self.varint()?;
        if v > limit as u64 {
            return Err(DecodeError::TooLarge);
        }
        Ok(v as usize)
    }

    /// Reads one raw byte.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] at the end of input.
    #[inline]
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Incomplete)?;
        self.pos += 1;
        Ok(b)
    }

    /// Reads `n` raw bytes, borrowed from the input.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] if fewer than `n` remain.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Incomplete);
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Reads a `(s)` string: a varint length at most `limit`, then that many UTF-8 bytes.
    ///
    /// # Errors
    /// [`DecodeError::TooLarge`], [`DecodeError::Incomplete`] or [`DecodeError::InvalidUtf8`].
    #[inline]
    pub fn str(&mut self, limit: usize) -> Result<&'a str, DecodeError> {
        let n = self.length(limit)?;
        let b = self.bytes(n)?;
        core::str::from_utf8(b).map_err(|_| DecodeError::InvalidUtf8)
    }

    /// Splits off a sub-reader over the next `n` bytes (a length-delimited body).
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] if fewer than `n` remain.
    #[inline]
    pub fn sub(&mut self, n: usize) -> Result<Reader<'a>, DecodeError> {
        Ok(Reader::new(self.bytes(n)?))
    }
}

/// A bounds-checked cursor over a caller-provided output buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    /// Bytes written so far.
    pub const fn position(&self) -> usize {
        self.pos
    }

    /// Room left.
    pub const fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes written so far.
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.pos]
    }

    /// Writes `v` as a shortest-form varint.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] over 2^62 - 1; [`EncodeError::BufferTooSmall`].
    #[inline]
    pub fn varint(&mut self, v: u64) -> Result<(), EncodeError> {
        let n = varint::encode(v, &mut self.buf[self.pos..])?;
        self.pos += n;
        Ok(())
    }

    /// Writes one raw byte.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    #[inline]
    pub fn u8(&mut self, b: u8) -> Result<(), EncodeError> {
        let slot = self
            .buf
            .get_mut(self.pos)
            .ok_or(EncodeError::BufferTooSmall)?;
        *slot = b;
        self.pos += 1;
        Ok(())
    }

    /// Writes raw bytes.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    #[inline]
    pub fn bytes(&mut self, b: &[u8]) -> Result<(), EncodeError> {
        let out = self
            .buf
            .get_mut(self.pos..self.pos + b.len())
            .ok_or(EncodeError::BufferTooSmall)?;
        out.copy_from_slice(b);
        self.pos += b.len();
        Ok(())
    }

    /// Writes a `(s)` string: varint length then the bytes.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    #[inline]
    pub fn str(&mut self, s: &str) -> Result<(), EncodeError> {
        self.varint(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_never_reads_past_the_end() {
        let mut r = Reader::new(&[0x05, b'c', b'l']);
        assert_eq!(r.clone().str(64), Err(DecodeError::Incomplete));
        assert_eq!(r.length(4), Err(DecodeError::TooLarge));
        let mut r = Reader::new(&[0x02, 0xff, 0xfe]);
        assert_eq!(r.str(64), Err(DecodeError::InvalidUtf8));
    }

    #[test]
    fn writer_reports_full() {
        let mut buf = [0u8; 3];
        let mut w = Writer::new(&mut buf);
        w.str("ab").unwrap();
        assert_eq!(w.u8(1), Err(EncodeError::BufferTooSmall));
        assert_eq!(w.written(), &[2, b'a', b'b']);
    }
}

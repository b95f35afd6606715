//! One frame of a group, and the moq-lite-05 FRAME header that carries it on a group stream.
//!
//! docs/protocol.md §3.9: after the GROUP header, a group stream is a sequence of
//!
//! ```text
//! FRAME {
//!   Timestamp Delta ZZ(i)   // signed, from the previous frame of the same group (first: from 0)
//!   Payload Length  (i)
//!   Payload         (Payload Length bytes)
//! }
//! ```
//!
//! with no message-length prefix. Inside skiff a frame's timestamp is always
//! the *absolute* one (in the track's timescale units); the codec turns it into
//! a delta against the previous frame's timestamp, which the caller tracks
//! (0 before the first frame of a group).

use crate::wire::{DecodeError, EncodeError, Reader, Writer, varint};

/// The longest FRAME header: two 8-byte varints.
pub const MAX_HEADER_LEN: usize = 16;

/// The header of one frame: its absolute timestamp and its payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Header {
    /// Absolute timestamp within the group, in the track's timescale units.
    pub timestamp: u64,
    /// Payload length in bytes.
    pub len: usize,
}

impl Header {
    /// A header for a frame at `timestamp` with `len` payload bytes.
    pub const fn new(timestamp: u64, len: usize) -> Self {
        Header { timestamp, len }
    }

    /// The signed delta from `prev` (the previous frame's timestamp, or 0).
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] if the delta is outside ±2^61, where its
    /// zigzag form would not fit a varint (docs/protocol.md §0).
    pub const fn delta(&self, prev: u64) -> Result<i64, EncodeError> {
        const LIMIT: u64 = 1 << 61;
        if self.timestamp >= prev {
            let d = self.timestamp - prev;
            if d >= LIMIT {
                return Err(EncodeError::ValueTooLarge);
            }
            Ok(d as i64)
        } else {
            let d = prev - self.timestamp;
            if d > LIMIT {
                return Err(EncodeError::ValueTooLarge);
            }
            Ok(-(d as i64))
        }
    }

    /// The two varints of the header: the zigzagged delta and the length.
    fn fields(&self, prev: u64) -> Result<(u64, u64), EncodeError> {
        let delta = varint::zigzag_encode(self.delta(prev)?)?;
        let len = self.len as u64;
        if len > varint::MAX {
            return Err(EncodeError::ValueTooLarge);
        }
        Ok((delta, len))
    }

    /// The encoded size of this header after a frame at `prev` (2 to [`MAX_HEADER_LEN`] bytes).
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] as for [`Header::encode`].
    pub fn encoded_len(&self, prev: u64) -> Result<usize, EncodeError> {
        let (delta, len) = self.fields(prev)?;
        Ok(varint::len(delta) + varint::len(len))
    }

    /// Writes the header of a frame that follows one at `prev`; returns the bytes written.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] if the timestamp delta is outside ±2^61 or
    /// the length over 2^62 − 1; [`EncodeError::BufferTooSmall`] if `w` lacks
    /// room. Nothing is written on error.
    pub fn encode(&self, prev: u64, w: &mut Writer<'_>) -> Result<usize, EncodeError> {
        let (delta, len) = self.fields(prev)?;
        let n = varint::len(delta) + varint::len(len);
        if w.remaining() < n {
            return Err(EncodeError::BufferTooSmall);
        }
        w.varint(delta)?;
        w.varint(len)?;
        Ok(n)
    }

    /// Reads the header of a frame that follows one at `prev`, refusing payloads over `max_payload`.
    ///
    /// On success the reader sits on the first payload byte.
    ///
    /// # Errors
    /// * [`DecodeError::Incomplete`]: the input ends inside the header; nothing is consumed.
    /// * [`DecodeError::TooLarge`]: the payload length is over `max_payload`
    ///   (checked before any payload is read); nothing is consumed.
    /// * [`DecodeError::InvalidValue`]: the delta takes the timestamp below 0 or past `u64::MAX`.
    pub fn decode(r: &mut Reader<'_>, prev: u64, max_payload: usize) -> Result<Self, DecodeError> {
        let mut c = r.clone();
        let delta = varint::zigzag_decode(c.varint()?);
        let len = c.length(max_payload)?;
        let timestamp = prev
            .checked_add_signed(delta)
            .ok_or(DecodeError::InvalidValue)?;
        *r = c;
        Ok(Header { timestamp, len })
    }
}

/// A whole frame borrowed from contiguous bytes: absolute timestamp and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Frame<'a> {
    /// Absolute timestamp within the group, in the track's timescale units.
    pub timestamp: u64,
    /// The payload.
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// A frame at `timestamp` carrying `payload`.
    pub const fn new(timestamp: u64, payload: &'a [u8]) -> Self {
        Frame { timestamp, payload }
    }

    /// The frame's header.
    pub const fn header(&self) -> Header {
        Header::new(self.timestamp, self.payload.len())
    }

    /// The encoded size of header and payload after a frame at `prev`.
    ///
    /// # Errors
    /// As [`Header::encoded_len`].
    pub fn encoded_len(&self, prev: u64) -> Result<usize, EncodeError> {
        Ok(self.header().encoded_len(prev)? + self.payload.len())
    }

    /// Writes header and payload of a frame that follows one at `prev`; returns the bytes written.
    ///
    /// # Errors
    /// As [`Header::encode`], with room needed for the payload too. Nothing is
    /// written on error.
    pub fn encode(&self, prev: u64, w: &mut Writer<'_>) -> Result<usize, EncodeError> {
        if w.remaining() < self.encoded_len(prev)? {
            return Err(EncodeError::BufferTooSmall);
        }
        let n = self.header().encode(prev, w)?;
        w.bytes(self.payload)?;
        Ok(n + self.payload.len())
    }

    /// Reads a whole frame that follows one at `prev`, refusing payloads over `max_payload`.
    ///
    /// # Errors
    /// As [`Header::decode`]; also [`DecodeError::Incomplete`] while the payload
    /// is not all there. Nothing is consumed on error.
    pub fn decode(r: &mut Reader<'a>, prev: u64, max_payload: usize) -> Result<Self, DecodeError> {
        let mut c = r.clone();
        let h = Header::decode(&mut c, prev, max_payload)?;
        let payload = c.bytes(h.len)?;
        *r = c;
        Ok(Frame {
            timestamp: h.timestamp,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    /// docs/protocol.md §6 V12: two frames, timestamps 1000 and 1033, in one group.
    const V12: &[u8] = &[
        0x47, 0xd0, 0x05, b'h', b'e', b'l', b'l', b'o', //
        0x40, 0x42, 0x06, b'w', b'o', b'r', b'l', b'd', b'!',
    ];

    fn encode_all(frames: &[Frame<'_>]) -> Vec<u8> {
        let mut out = std::vec![0u8; 4096];
        let mut w = Writer::new(&mut out);
        let mut prev = 0;
        for f in frames {
            f.encode(prev, &mut w).unwrap();
            prev = f.timestamp;
        }
        let n = w.position();
        out.truncate(n);
        out
    }

    // --- test vectors -------------------------------------------------------

    #[test]
    fn v12_encodes_byte_for_byte() {
        let frames = [Frame::new(1000, b"hello"), Frame::new(1033, b"world!")];
        assert_eq!(encode_all(&frames), V12);
        assert_eq!(frames[0].encoded_len(0), Ok(8));
        assert_eq!(frames[1].encoded_len(1000), Ok(9));
    }

    #[test]
    fn v12_decodes() {
        let mut r = Reader::new(V12);
        let a = Frame::decode(&mut r, 0, 64).unwrap();
        assert_eq!(a, Frame::new(1000, b"hello"));
        let b = Frame::decode(&mut r, a.timestamp, 64).unwrap();
        assert_eq!(b, Frame::new(1033, b"world!"));
        assert!(r.is_empty());
    }

    #[test]
    fn other_protocol_examples() {
        // docs/protocol.md §6: group 6 restarts at 0, so timestamp 2000 is `4f a0`;
        // a delta of -33 is `40 41`.
        let mut buf = [0u8; MAX_HEADER_LEN];
        let mut w = Writer::new(&mut buf);
        Header::new(2000, 5).encode(0, &mut w).unwrap();
        assert_eq!(w.written(), &[0x4f, 0xa0, 0x05]);
        let mut w = Writer::new(&mut buf);
        Header::new(1000, 0).encode(1033, &mut w).unwrap();
        assert_eq!(w.written(), &[0x40, 0x41, 0x00]);
        let h = Header::decode(&mut Reader::new(&[0x40, 0x41, 0x00]), 1033, 0).unwrap();
        assert_eq!(h, Header::new(1000, 0));
    }

    // --- partial input and limits ------------------------------------------

    #[test]
    fn partial_input_consumes_nothing() {
        for cut in 0..V12.len() {
            let mut r = Reader::new(&V12[..cut]);
            let res = Frame::decode(&mut r, 0, 64);
            if cut < 8 {
                assert_eq!(res, Err(DecodeError::Incomplete), "cut {cut}");
                assert_eq!(r.position(), 0);
            }
            if cut < 3 {
                let mut r = Reader::new(&V12[..cut]);
                assert_eq!(Header::decode(&mut r, 0, 64), Err(DecodeError::Incomplete));
                assert_eq!(r.position(), 0);
            }
        }
        // A complete header with a partial payload: the header alone decodes.
        let mut r = Reader::new(&V12[..4]);
        assert_eq!(Header::decode(&mut r, 0, 64), Ok(Header::new(1000, 5)));
        assert_eq!(r.position(), 3);
    }

    #[test]
    fn payload_limit_is_checked_before_payload() {
        // Length 5 but no payload bytes at all: still TooLarge, not Incomplete.
        let mut r = Reader::new(&V12[..3]);
        assert_eq!(Header::decode(&mut r, 0, 4), Err(DecodeError::TooLarge));
        assert_eq!(r.position(), 0);
        let mut r = Reader::new(V12);
        assert_eq!(Frame::decode(&mut r, 0, 4), Err(DecodeError::TooLarge));
        assert_eq!(
            Header::decode(&mut Reader::new(&V12[..3]), 0, 5),
            Ok(Header::new(1000, 5))
        );
    }

    #[test]
    fn timestamps_out_of_range() {
        // delta -1 from 0 would be negative.
        assert_eq!(
            Header::decode(&mut Reader::new(&[0x01, 0x00]), 0, 0),
            Err(DecodeError::InvalidValue)
        );
        // +1 past u64::MAX.
        assert_eq!(
            Header::decode(&mut Reader::new(&[0x02, 0x00]), u64::MAX, 0),
            Err(DecodeError::InvalidValue)
        );
        let mut buf = [0u8; MAX_HEADER_LEN];
        let mut w = Writer::new(&mut buf);
        assert_eq!(
            Header::new(1 << 61, 0).encode(0, &mut w),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(
            Header::new(0, 0).encode((1 << 61) + 1, &mut w),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(w.position(), 0);
        // The extremes that do fit.
        assert_eq!(Header::new((1 << 61) - 1, 0).delta(0), Ok((1 << 61) - 1));
        assert_eq!(Header::new(0, 0).delta(1 << 61), Ok(-(1 << 61)));
        assert_eq!(
            Header::new(0, 0).encoded_len(1 << 61),
            Ok(MAX_HEADER_LEN - 7)
        );
    }

    #[test]
    fn encode_needs_room_for_everything() {
        let mut buf = [0u8; 7];
        let mut w = Writer::new(&mut buf);
        assert_eq!(
            Frame::new(1000, b"hello").encode(0, &mut w),
            Err(EncodeError::BufferTooSmall)
        );
        assert_eq!(w.position(), 0);
        let mut small = [0u8; 1];
        let mut w = Writer::new(&mut small);
        assert_eq!(
            Header::new(1000, 0).encode(0, &mut w),
            Err(EncodeError::BufferTooSmall)
        );
        assert_eq!(w.position(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 8 } else { 256 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn round_trip(frames in proptest::collection::vec(
            (0u64..(1 << 40), proptest::collection::vec(any::<u8>(), 0..40)), 0..12)
        ) {
            let frames: Vec<Frame<'_>> =
                frames.iter().map(|(t, p)| Frame::new(*t, p)).collect();
            let bytes = encode_all(&frames);
            let mut r = Reader::new(&bytes);
            let mut prev = 0;
            for f in &frames {
                let got = Frame::decode(&mut r, prev, 64).unwrap();
                prop_assert_eq!(got, *f);
                prev = got.timestamp;
            }
            prop_assert!(r.is_empty());
        }

        #[test]
        fn header_len_is_bounded(t in any::<u64>(), prev in any::<u64>(), len in any::<usize>()) {
            if let Ok(n) = Header::new(t, len).encoded_len(prev) {
                prop_assert!((2..=MAX_HEADER_LEN).contains(&n));
            }
        }
    }
}

//! The moq-lite datagram body carried in a QMux DATAGRAM frame (docs/protocol.md §3.14).
//!
//! Not length-prefixed: the payload is whatever follows the header up to the end of the
//! datagram, so a truncated header is a malformed datagram ([`DecodeError::ShortBody`]),
//! never [`DecodeError::Incomplete`].

use super::vlen;
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// A whole one-frame group delivered unreliably on an existing subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The Subscribe ID; unknown IDs are dropped silently.
    pub subscribe: u64,
    /// Absolute group sequence (deduplicate against stream-delivered groups).
    pub group: u64,
    /// Absolute timestamp in track timescale units (not a delta, not zigzag).
    pub timestamp: u64,
    /// The frame payload: the rest of the datagram.
    pub payload: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Decodes a whole datagram body; the payload borrows from `buf`.
    ///
    /// # Errors
    /// [`DecodeError::ShortBody`] if `buf` ends inside the header.
    pub fn decode(buf: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        let header = (|| Ok::<_, DecodeError>((r.varint()?, r.varint()?, r.varint()?)))();
        let (subscribe, group, timestamp) = header.map_err(|_| DecodeError::ShortBody)?;
        Ok(Datagram {
            subscribe,
            group,
            timestamp,
            payload: r.rest(),
        })
    }

    /// The header size (everything before the payload).
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] if a value exceeds 2^62 − 1.
    pub fn header_len(&self) -> Result<usize, EncodeError> {
        Ok(vlen(self.subscribe)? + vlen(self.group)? + vlen(self.timestamp)?)
    }

    /// The whole encoded size, header plus payload.
    ///
    /// # Errors
    /// As [`Datagram::header_len`].
    pub fn encoded_len(&self) -> Result<usize, EncodeError> {
        Ok(self.header_len()? + self.payload.len())
    }

    /// Writes the header only, for callers that place the payload themselves; on error
    /// nothing is written.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`]; [`EncodeError::BufferTooSmall`].
    pub fn write_header(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.header_len()? > w.remaining() {
            return Err(EncodeError::BufferTooSmall);
        }
        w.varint(self.subscribe)?;
        w.varint(self.group)?;
        w.varint(self.timestamp)
    }

    /// Writes header and payload; on error nothing is written.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`]; [`EncodeError::BufferTooSmall`].
    pub fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.encoded_len()? > w.remaining() {
            return Err(EncodeError::BufferTooSmall);
        }
        self.write_header(w)?;
        w.bytes(self.payload)
    }

    /// Encodes the body at the front of `buf`, returning the bytes written.
    ///
    /// # Errors
    /// As [`Datagram::write`].
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let mut w = Writer::new(buf);
        self.write(&mut w)?;
        Ok(w.position())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::wire::lite::test_util::{any_varint, hex};
    use proptest::prelude::*;

    // ---- docs/protocol.md §6 V13 ----

    #[test]
    fn v13_datagram_body() {
        // The vector is a whole QMux record: `09 | 31 06 | 00 07 4b b8 68 69`. Its body
        // is the last six bytes (DATAGRAM type 0x31, Length 6).
        let record = hex("09 31 06 00 07 4b b8 68 69");
        assert_eq!(record[1..3], [0x31, 0x06]);
        let body = &record[3..];
        assert_eq!(body.len(), 6);
        let dg = Datagram {
            subscribe: 0,
            group: 7,
            timestamp: 3000,
            payload: b"hi",
        };
        assert_eq!(Datagram::decode(body), Ok(dg));
        let mut buf = [0u8; 6];
        assert_eq!(dg.encode(&mut buf), Ok(6));
        assert_eq!(&buf, body);
        // NOTE: the record Size byte says 9 but only 8 bytes follow it (type, length and
        // body); docs/protocol.md §1.3 makes Size count exactly the frame bytes.
        assert_eq!(record.len() - 1, 8);
    }

    #[test]
    fn truncated_header_is_malformed_not_incomplete() {
        for cut in ["", "00", "00 07", "00 07 4b"] {
            assert_eq!(
                Datagram::decode(&hex(cut)),
                Err(DecodeError::ShortBody),
                "{cut:?}"
            );
        }
        // An empty payload is fine.
        assert_eq!(
            Datagram::decode(&hex("01 02 03")),
            Ok(Datagram {
                subscribe: 1,
                group: 2,
                timestamp: 3,
                payload: &[]
            })
        );
    }

    #[test]
    fn encode_errors_write_nothing() {
        let mut buf = [0u8; 4];
        let mut w = Writer::new(&mut buf);
        let dg = Datagram {
            subscribe: 0,
            group: 0,
            timestamp: 0,
            payload: b"hello",
        };
        assert_eq!(dg.write(&mut w), Err(EncodeError::BufferTooSmall));
        let dg = Datagram {
            subscribe: 1 << 62,
            group: 0,
            timestamp: 0,
            payload: b"",
        };
        assert_eq!(dg.write(&mut w), Err(EncodeError::ValueTooLarge));
        assert_eq!(w.position(), 0);
    }

    proptest! {
        #[test]
        fn round_trip(
            subscribe in any_varint(),
            group in any_varint(),
            timestamp in any_varint(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let dg = Datagram { subscribe, group, timestamp, payload: &payload };
            let mut buf: Vec<u8> = std::vec![0; dg.encoded_len().unwrap()];
            let n = dg.encode(&mut buf).unwrap();
            prop_assert_eq!(n, buf.len());
            prop_assert_eq!(Datagram::decode(&buf), Ok(dg));
            prop_assert_eq!(dg.header_len().unwrap() + payload.len(), n);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
            if let Ok(dg) = Datagram::decode(&bytes) {
                // Long-form varints make the received header longer than ours.
                prop_assert!(dg.header_len().unwrap() + dg.payload.len() <= bytes.len());
            }
        }
    }
}

//! The `Stream Type (i)` that opens every moq-lite stream (docs/protocol.md §3.3).
//!
//! It is not length-prefixed. An unknown type is [`DecodeError::UnknownType`]: the
//! session resets / stops that stream only, it is not a session error.

use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// The type of a bidirectional (request) stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BidiStreamType {
    /// `0x1`: ANNOUNCE_REQUEST, answered by ANNOUNCE_OK and ANNOUNCEs.
    Announce,
    /// `0x2`: SUBSCRIBE (+ SUBSCRIBE_UPDATEs), answered by typed responses.
    Subscribe,
    /// `0x3`: FETCH, answered by FRAMEs.
    Fetch,
    /// `0x4`: PROBE reports.
    Probe,
    /// `0x5`: one GOAWAY.
    Goaway,
    /// `0x6`: TRACK, answered by TRACK_INFO.
    Track,
}

impl BidiStreamType {
    /// The wire value.
    pub const fn to_code(self) -> u64 {
        match self {
            BidiStreamType::Announce => 0x1,
            BidiStreamType::Subscribe => 0x2,
            BidiStreamType::Fetch => 0x3,
            BidiStreamType::Probe => 0x4,
            BidiStreamType::Goaway => 0x5,
            BidiStreamType::Track => 0x6,
        }
    }

    /// The type for a wire value, or `None` for unknown ones (including `0x0`, the
    /// pre-lite-03 session stream, which moq-dev rejects).
    pub const fn from_code(code: u64) -> Option<Self> {
        Some(match code {
            0x1 => BidiStreamType::Announce,
            0x2 => BidiStreamType::Subscribe,
            0x3 => BidiStreamType::Fetch,
            0x4 => BidiStreamType::Probe,
            0x5 => BidiStreamType::Goaway,
            0x6 => BidiStreamType::Track,
            _ => return None,
        })
    }

    /// Decodes the stream type at the front of `buf`, returning it and the bytes it took.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] on short input; [`DecodeError::UnknownType`] with the
    /// received value for a type we do not serve (reset that stream only).
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), DecodeError> {
        let mut r = Reader::new(buf);
        let t = Self::read(&mut r)?;
        Ok((t, r.position()))
    }

    /// Reads the stream type from `r`; on error nothing is consumed.
    ///
    /// # Errors
    /// As [`BidiStreamType::decode`].
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut cur = r.clone();
        let code = cur.varint()?;
        let t = Self::from_code(code).ok_or(DecodeError::UnknownType(code))?;
        *r = cur;
        Ok(t)
    }

    /// The encoded size (always one byte).
    pub const fn encoded_len(self) -> usize {
        1
    }

    /// Writes the stream type.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn write(self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.to_code())
    }
}

/// The type of a unidirectional stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum UniStreamType {
    /// `0x0`: a GROUP header then FRAMEs, then FIN.
    Group,
    /// `0x1`: one SETUP, then FIN.
    Setup,
}

impl UniStreamType {
    /// The wire value.
    pub const fn to_code(self) -> u64 {
        match self {
            UniStreamType::Group => 0x0,
            UniStreamType::Setup => 0x1,
        }
    }

    /// The type for a wire value, or `None` for unknown ones.
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            0x0 => Some(UniStreamType::Group),
            0x1 => Some(UniStreamType::Setup),
            _ => None,
        }
    }

    /// Decodes the stream type at the front of `buf`, returning it and the bytes it took.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] on short input; [`DecodeError::UnknownType`] with the
    /// received value for an unknown type (stop that stream only).
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), DecodeError> {
        let mut r = Reader::new(buf);
        let t = Self::read(&mut r)?;
        Ok((t, r.position()))
    }

    /// Reads the stream type from `r`; on error nothing is consumed.
    ///
    /// # Errors
    /// As [`UniStreamType::decode`].
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut cur = r.clone();
        let code = cur.varint()?;
        let t = Self::from_code(code).ok_or(DecodeError::UnknownType(code))?;
        *r = cur;
        Ok(t)
    }

    /// The encoded size (always one byte).
    pub const fn encoded_len(self) -> usize {
        1
    }

    /// Writes the stream type.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn write(self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.to_code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BIDI: [BidiStreamType; 6] = [
        BidiStreamType::Announce,
        BidiStreamType::Subscribe,
        BidiStreamType::Fetch,
        BidiStreamType::Probe,
        BidiStreamType::Goaway,
        BidiStreamType::Track,
    ];

    // ---- known types (docs/protocol.md §3.3) ----

    #[test]
    fn bidi_codes() {
        for (t, code) in BIDI.into_iter().zip(1u8..) {
            let mut buf = [0u8; 1];
            t.write(&mut Writer::new(&mut buf)).unwrap();
            assert_eq!(buf, [code]);
            assert_eq!(BidiStreamType::decode(&[code, 0xff]), Ok((t, 1)));
            assert_eq!(t.encoded_len(), 1);
        }
    }

    #[test]
    fn uni_codes() {
        for (t, code) in [(UniStreamType::Group, 0u8), (UniStreamType::Setup, 1)] {
            let mut buf = [0u8; 1];
            t.write(&mut Writer::new(&mut buf)).unwrap();
            assert_eq!(buf, [code]);
            assert_eq!(UniStreamType::decode(&[code]), Ok((t, 1)));
        }
    }

    #[test]
    fn long_form_type_is_accepted() {
        assert_eq!(
            BidiStreamType::decode(&[0x40, 0x02]),
            Ok((BidiStreamType::Subscribe, 2))
        );
    }

    // ---- unknown and partial ----

    #[test]
    fn unknown_types_name_the_value() {
        // The pre-lite-03 session stream.
        assert_eq!(
            BidiStreamType::decode(&[0x00]),
            Err(DecodeError::UnknownType(0))
        );
        assert_eq!(
            BidiStreamType::decode(&[0x07]),
            Err(DecodeError::UnknownType(7))
        );
        assert_eq!(
            UniStreamType::decode(&[0x02]),
            Err(DecodeError::UnknownType(2))
        );
        assert_eq!(
            UniStreamType::decode(&[0x40, 0x40]),
            Err(DecodeError::UnknownType(64))
        );
        let mut r = Reader::new(&[0x09]);
        assert_eq!(
            UniStreamType::read(&mut r),
            Err(DecodeError::UnknownType(9))
        );
        assert_eq!(r.position(), 0);
    }

    #[test]
    fn partial_is_incomplete() {
        assert_eq!(BidiStreamType::decode(&[]), Err(DecodeError::Incomplete));
        assert_eq!(
            UniStreamType::decode(&[0x80, 0, 0]),
            Err(DecodeError::Incomplete)
        );
    }

    proptest! {
        #[test]
        fn from_code_and_to_code_agree(code in any::<u64>()) {
            if let Some(t) = BidiStreamType::from_code(code) {
                prop_assert_eq!(t.to_code(), code);
            } else {
                prop_assert!(code == 0 || code > 6);
            }
            if let Some(t) = UniStreamType::from_code(code) {
                prop_assert_eq!(t.to_code(), code);
            } else {
                prop_assert!(code > 1);
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9)) {
            let _ = BidiStreamType::decode(&bytes);
            let _ = UniStreamType::decode(&bytes);
        }
    }
}

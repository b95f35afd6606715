//! The GROUP header that opens a Group stream (docs/protocol.md §3.9); FRAMEs follow it and
//! are decoded by [`crate::model::frame`].

use super::{Message, varints, vlen};
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// GROUP: which subscription a group stream serves and which group it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Group {
    /// The Subscribe ID this group serves.
    pub subscribe: u64,
    /// Absolute group sequence.
    pub sequence: u64,
}

impl Message<'_> for Group {
    const NAME: &'static str = "GROUP";
    const MAX_BODY: usize = varints(2);

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Group {
            subscribe: r.varint()?,
            sequence: r.varint()?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(vlen(self.subscribe)? + vlen(self.sequence)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.subscribe)?;
        w.varint(self.sequence)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{UniStreamType, decode_message};
    use proptest::prelude::*;

    // ---- docs/protocol.md §6 V11 / V12 / V16 ----

    #[test]
    fn v11_group_headers() {
        let bytes = hex("00 02 00 05");
        assert_eq!(UniStreamType::decode(&bytes), Ok((UniStreamType::Group, 1)));
        assert_vector!(
            Group,
            Group {
                subscribe: 0,
                sequence: 5
            },
            bytes[1..]
        );
        assert_vector!(
            Group,
            Group {
                subscribe: 0,
                sequence: 6
            },
            hex("02 00 06")
        );
        // V16 validation run: subscription 7.
        assert_vector!(
            Group,
            Group {
                subscribe: 7,
                sequence: 9
            },
            hex("02 07 09")
        );
    }

    #[test]
    fn v12_frames_follow_the_header() {
        // The whole group stream 7: the header leaves the FRAMEs (another codec's) untouched.
        let stream = hex("00 02 00 05 47 d0 05 68 65 6c 6c 6f 40 42 06 77 6f 72 6c 64 21");
        let (t, n) = UniStreamType::decode(&stream).unwrap();
        assert_eq!(t, UniStreamType::Group);
        let (g, m) = decode_message::<Group>(&stream[n..]).unwrap();
        assert_eq!(
            g,
            Group {
                subscribe: 0,
                sequence: 5
            }
        );
        assert_eq!(stream[n + m..][..2], [0x47, 0xd0]);
    }

    #[test]
    fn header_limits() {
        assert_eq!(
            decode_message::<Group>(&hex("11")).err(),
            Some(DecodeError::TooLarge)
        );
        assert_eq!(
            decode_message::<Group>(&hex("01 00")).err(),
            Some(DecodeError::ShortBody)
        );
        assert_eq!(
            decode_message::<Group>(&hex("03 00 05 00")).err(),
            Some(DecodeError::TrailingBytes)
        );
    }

    proptest! {
        #[test]
        fn round_trip(subscribe in any_varint(), sequence in any_varint()) {
            assert_round_trip!(Group, Group { subscribe, sequence });
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            let _ = decode_message::<Group>(&bytes);
        }
    }
}

//! FETCH, the request that opens a Fetch stream (docs/protocol.md §3.10); the reply is FRAMEs
//! with no header.

use super::{MAX_CONTROL_BODY, Message, read_str, slen, vlen};
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// FETCH: the subscriber asks for one whole group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetch<'a> {
    /// Broadcast path.
    pub broadcast: &'a str,
    /// Track name.
    pub track: &'a str,
    /// Subscriber priority.
    pub priority: u8,
    /// Absolute group sequence.
    pub group: u64,
}

impl<'a> Message<'a> for Fetch<'a> {
    const NAME: &'static str = "FETCH";
    const MAX_BODY: usize = MAX_CONTROL_BODY;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Fetch {
            broadcast: read_str(r)?,
            track: read_str(r)?,
            priority: r.u8()?,
            group: r.varint()?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(slen(self.broadcast)? + slen(self.track)? + 1 + vlen(self.group)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.str(self.broadcast)?;
        w.str(self.track)?;
        w.u8(self.priority)?;
        w.varint(self.group)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{BidiStreamType, decode_message};
    use proptest::prelude::*;

    // ---- docs/protocol.md §6 V13 ----

    #[test]
    fn v13_fetch() {
        let bytes = hex("03 10 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 03 05");
        assert_eq!(
            BidiStreamType::decode(&bytes),
            Ok((BidiStreamType::Fetch, 1))
        );
        let fetch = Fetch {
            broadcast: "clock",
            track: "seconds",
            priority: 3,
            group: 5,
        };
        assert_vector!(Fetch<'_>, fetch, bytes[1..]);
    }

    #[test]
    fn lite06_frame_bounds_are_trailing_bytes() {
        // A lite-06 FETCH appends Frame Start and Frame End: not ours.
        let bytes = hex("12 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 03 05 00 00");
        assert_eq!(
            decode_message::<Fetch<'_>>(&bytes).err(),
            Some(DecodeError::TrailingBytes)
        );
    }

    proptest! {
        #[test]
        fn round_trip(broadcast in ".{0,32}", track in ".{0,32}", priority in any::<u8>(), group in any_varint()) {
            assert_round_trip!(Fetch<'_>, Fetch { broadcast: &broadcast, track: &track, priority, group });
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..48)) {
            let _ = decode_message::<Fetch<'_>>(&bytes);
        }
    }
}

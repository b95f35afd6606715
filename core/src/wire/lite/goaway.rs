//! GOAWAY, the one message on a Goaway stream (docs/protocol.md §3.12).

use super::{Message, slen};
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// Longest New Session URI accepted or sent, in bytes (docs/protocol.md §3.2).
pub const MAX_GOAWAY_URI: usize = 8192;

/// GOAWAY: the sender is draining; open no new request streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Goaway<'a> {
    /// Where to reconnect; `""` = the same place. Only a server should name one.
    pub uri: &'a str,
}

impl<'a> Message<'a> for Goaway<'a> {
    const NAME: &'static str = "GOAWAY";
    // The URI and its length varint (8192 takes two bytes).
    const MAX_BODY: usize = 2 + MAX_GOAWAY_URI;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Goaway {
            uri: r.str(MAX_GOAWAY_URI)?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        if self.uri.len() > MAX_GOAWAY_URI {
            return Err(EncodeError::ValueTooLarge);
        }
        slen(self.uri)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.str(self.uri)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::wire::lite::test_util::{assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{BidiStreamType, decode_message, message_len};
    use proptest::prelude::*;

    // ---- docs/protocol.md §6 V13 ----

    #[test]
    fn v13_goaway_empty_uri() {
        let bytes = hex("05 01 00");
        assert_eq!(
            BidiStreamType::decode(&bytes),
            Ok((BidiStreamType::Goaway, 1))
        );
        assert_vector!(Goaway<'_>, Goaway { uri: "" }, bytes[1..]);
    }

    #[test]
    fn uri_limit() {
        let max = "a".repeat(MAX_GOAWAY_URI);
        assert_round_trip!(Goaway<'_>, Goaway { uri: &max });
        let over = "a".repeat(MAX_GOAWAY_URI + 1);
        assert_eq!(
            message_len(&Goaway { uri: &over }),
            Err(EncodeError::ValueTooLarge)
        );
        // Body length 8195 is refused before it arrives.
        assert_eq!(
            decode_message::<Goaway<'_>>(&hex("60 03")).err(),
            Some(DecodeError::TooLarge)
        );
        // An 8193-byte URI inside an 8194-byte body (a long-form varint for its length would
        // fit the body limit otherwise): refused by the URI limit.
        let mut msg = hex("60 02 60 01");
        msg.extend(core::iter::repeat_n(b'a', 8192));
        assert_eq!(
            decode_message::<Goaway<'_>>(&msg).err(),
            Some(DecodeError::TooLarge)
        );
    }

    proptest! {
        #[test]
        fn round_trip(uri in ".{0,64}") {
            assert_round_trip!(Goaway<'_>, Goaway { uri: &uri });
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            let _ = decode_message::<Goaway<'_>>(&bytes);
        }
    }
}

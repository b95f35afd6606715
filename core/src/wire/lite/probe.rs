//! PROBE, the bandwidth / RTT report on a Probe stream (docs/protocol.md §3.11).

use super::{Message, varints, vlen};
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// PROBE: a target (from the opener) or an estimate (from the responder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Probe {
    /// Bits per second; 0 = unknown.
    pub bitrate: u64,
    /// Smoothed round-trip time in milliseconds; 0 = unknown.
    pub rtt: u64,
}

impl Message<'_> for Probe {
    const NAME: &'static str = "PROBE";
    const MAX_BODY: usize = varints(2);

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Probe {
            bitrate: r.varint()?,
            rtt: r.varint()?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(vlen(self.bitrate)? + vlen(self.rtt)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.bitrate)?;
        w.varint(self.rtt)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::wire::lite::decode_message;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use proptest::prelude::*;

    // ---- docs/protocol.md §6 V13 ----

    #[test]
    fn v13_probe_report() {
        assert_vector!(
            Probe,
            Probe {
                bitrate: 1_000_000,
                rtt: 40
            },
            hex("05 80 0f 42 40 28")
        );
    }

    #[test]
    fn limits() {
        assert_eq!(
            decode_message::<Probe>(&hex("11")).err(),
            Some(DecodeError::TooLarge)
        );
        // A lite-03 PROBE without RTT.
        assert_eq!(
            decode_message::<Probe>(&hex("01 05")).err(),
            Some(DecodeError::ShortBody)
        );
    }

    proptest! {
        #[test]
        fn round_trip(bitrate in any_varint(), rtt in any_varint()) {
            assert_round_trip!(Probe, Probe { bitrate, rtt });
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            let _ = decode_message::<Probe>(&bytes);
        }
    }
}

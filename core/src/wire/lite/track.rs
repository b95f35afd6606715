//! The Track stream's messages (docs/protocol.md §3.7): TRACK and TRACK_INFO.

use core::num::NonZeroU64;

use super::{
    MAX_CONTROL_BODY, Message, dur_len, read_dur, read_str, slen, varints, vlen, write_dur,
};
use crate::time::Duration;
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// TRACK: the subscriber asks for a track's properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Track<'a> {
    /// Broadcast path.
    pub broadcast: &'a str,
    /// Track name.
    pub track: &'a str,
}

impl<'a> Message<'a> for Track<'a> {
    const NAME: &'static str = "TRACK";
    const MAX_BODY: usize = MAX_CONTROL_BODY;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Track {
            broadcast: read_str(r)?,
            track: read_str(r)?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(slen(self.broadcast)? + slen(self.track)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.str(self.broadcast)?;
        w.str(self.track)
    }
}

/// TRACK_INFO: the publisher's immutable track properties, then FIN.
///
/// The retired Ordered byte is written as 0 and ignored on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackInfo {
    /// Publisher priority, a tie-break only (moq-dev default 127).
    pub priority: u8,
    /// How long non-latest groups are kept, whole milliseconds on the wire (moq-dev
    /// default 5000 ms); a received value beyond [`Duration::MAX`] saturates to it.
    pub max_age: Duration,
    /// Timestamp units per second; the wire forbids 0 (moq-dev default 1000).
    pub timescale: NonZeroU64,
}

impl Message<'_> for TrackInfo {
    const NAME: &'static str = "TRACK_INFO";
    const MAX_BODY: usize = 2 + varints(2);

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let priority = r.u8()?;
        let _ordered = r.u8()?;
        let max_age = read_dur(r)?;
        let timescale = NonZeroU64::new(r.varint()?).ok_or(DecodeError::InvalidValue)?;
        Ok(TrackInfo {
            priority,
            max_age,
            timescale,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(2 + dur_len(self.max_age) + vlen(self.timescale.get())?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u8(self.priority)?;
        w.u8(0)?;
        write_dur(w, self.max_age)?;
        w.varint(self.timescale.get())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{BidiStreamType, decode_message, message_len};
    use crate::wire::varint;
    use proptest::prelude::*;

    fn ts(v: u64) -> NonZeroU64 {
        NonZeroU64::new(v).unwrap()
    }

    // ---- docs/protocol.md §6 V10 / V16 ----

    #[test]
    fn v10_track() {
        let bytes = hex("06 0e 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73");
        assert_eq!(
            BidiStreamType::decode(&bytes),
            Ok((BidiStreamType::Track, 1))
        );
        assert_vector!(
            Track<'_>,
            Track {
                broadcast: "clock",
                track: "seconds"
            },
            bytes[1..]
        );
    }

    #[test]
    fn v10_track_info_defaults() {
        let info = TrackInfo {
            priority: 127,
            max_age: Duration::from_millis(5000),
            timescale: ts(1000),
        };
        assert_vector!(TrackInfo, info, hex("06 7f 00 53 88 43 e8"));
    }

    // ---- rules ----

    #[test]
    fn zero_timescale_is_invalid() {
        assert_eq!(
            decode_message::<TrackInfo>(&hex("04 7f 00 00 00")).err(),
            Some(DecodeError::InvalidValue)
        );
    }

    #[test]
    fn ordered_byte_is_ignored() {
        let (got, _) = decode_message::<TrackInfo>(&hex("04 01 ff 0a 01")).unwrap();
        assert_eq!(
            got,
            TrackInfo {
                priority: 1,
                max_age: Duration::from_millis(10),
                timescale: ts(1)
            }
        );
    }

    #[test]
    fn sub_millisecond_max_age_is_truncated() {
        let info = TrackInfo {
            priority: 0,
            max_age: Duration::from_micros(1_999),
            timescale: ts(1),
        };
        let mut buf = [0u8; 8];
        let n = crate::wire::lite::encode_message(&info, &mut buf).unwrap();
        assert_eq!(&buf[..n], &[4, 0, 0, 1, 1]);
    }

    #[test]
    fn limits() {
        // TRACK_INFO is at most 18 bytes.
        assert_eq!(
            decode_message::<TrackInfo>(&hex("13")).err(),
            Some(DecodeError::TooLarge)
        );
        assert_eq!(
            decode_message::<TrackInfo>(&hex("12")).err(),
            Some(DecodeError::Incomplete)
        );
        let too_big = TrackInfo {
            priority: 0,
            max_age: Duration::ZERO,
            timescale: ts(varint::MAX + 1),
        };
        assert_eq!(message_len(&too_big), Err(EncodeError::ValueTooLarge));
        // A track name running past the body.
        assert_eq!(
            decode_message::<Track<'_>>(&hex("03 00 05 61")).err(),
            Some(DecodeError::ShortBody)
        );
        assert_eq!(
            decode_message::<Track<'_>>(&hex("03 00 01 ff")).err(),
            Some(DecodeError::InvalidUtf8)
        );
    }

    // ---- properties ----

    proptest! {
        #[test]
        fn track_round_trip(broadcast in ".{0,40}", track in ".{0,40}") {
            assert_round_trip!(Track<'_>, Track { broadcast: &broadcast, track: &track });
        }

        #[test]
        fn track_info_round_trip(
            priority in any::<u8>(),
            max_age_ms in 0..=u64::MAX / 1000,
            timescale in any_varint(),
        ) {
            let info = TrackInfo {
                priority,
                max_age: Duration::from_millis(max_age_ms),
                timescale: ts(timescale.max(1)),
            };
            assert_round_trip!(TrackInfo, info);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode_message::<Track<'_>>(&bytes);
            let _ = decode_message::<TrackInfo>(&bytes);
        }
    }
}

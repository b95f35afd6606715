//! The Subscribe stream's messages (docs/protocol.md §3.8): SUBSCRIBE and SUBSCRIBE_UPDATE from
//! the subscriber, typed responses from the publisher.
//!
//! Group Start and Group End are `Opt(i)`: `0` is absent, `n + 1` is group `n`. A group of
//! 2^62 − 1 therefore cannot be sent as a bound ([`EncodeError::ValueTooLarge`]).

use super::{
    MAX_CONTROL_BODY, Message, dur_len, opt_len, read_dur, read_framed, read_opt, read_str, slen,
    varints, vlen, write_dur, write_opt,
};
use crate::time::Duration;
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// SUBSCRIBE: the subscriber asks for a range of a track's groups.
///
/// The retired Ordered byte is written as 0 and ignored on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subscribe<'a> {
    /// Chosen by the subscriber; unique for the session, never reused.
    pub id: u64,
    /// Broadcast path.
    pub broadcast: &'a str,
    /// Track name.
    pub track: &'a str,
    /// Subscriber priority; higher is more important.
    pub priority: u8,
    /// Subscriber max age / latency budget, whole milliseconds on the wire.
    pub max_age: Duration,
    /// First group to deliver; `None` = the latest group when serving starts.
    pub start_group: Option<u64>,
    /// Last group to deliver, inclusive; `None` = unbounded.
    pub end_group: Option<u64>,
}

impl<'a> Message<'a> for Subscribe<'a> {
    const NAME: &'static str = "SUBSCRIBE";
    const MAX_BODY: usize = MAX_CONTROL_BODY;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let id = r.varint()?;
        let broadcast = read_str(r)?;
        let track = read_str(r)?;
        let priority = r.u8()?;
        let _ordered = r.u8()?;
        Ok(Subscribe {
            id,
            broadcast,
            track,
            priority,
            max_age: read_dur(r)?,
            start_group: read_opt(r)?,
            end_group: read_opt(r)?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(vlen(self.id)?
            + slen(self.broadcast)?
            + slen(self.track)?
            + 2
            + dur_len(self.max_age)
            + opt_len(self.start_group)?
            + opt_len(self.end_group)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.id)?;
        w.str(self.broadcast)?;
        w.str(self.track)?;
        w.u8(self.priority)?;
        w.u8(0)?;
        write_dur(w, self.max_age)?;
        write_opt(w, self.start_group)?;
        write_opt(w, self.end_group)
    }
}

/// SUBSCRIBE_UPDATE: replaces all of a subscription's preferences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscribeUpdate {
    /// Subscriber priority.
    pub priority: u8,
    /// Subscriber max age, whole milliseconds on the wire.
    pub max_age: Duration,
    /// First group to deliver; `None` = latest.
    pub start_group: Option<u64>,
    /// Last group to deliver, inclusive; `None` = unbounded.
    pub end_group: Option<u64>,
}

impl Message<'_> for SubscribeUpdate {
    const NAME: &'static str = "SUBSCRIBE_UPDATE";
    const MAX_BODY: usize = 2 + varints(3);

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let priority = r.u8()?;
        let _ordered = r.u8()?;
        Ok(SubscribeUpdate {
            priority,
            max_age: read_dur(r)?,
            start_group: read_opt(r)?,
            end_group: read_opt(r)?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(2 + dur_len(self.max_age) + opt_len(self.start_group)? + opt_len(self.end_group)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u8(self.priority)?;
        w.u8(0)?;
        write_dur(w, self.max_age)?;
        write_opt(w, self.start_group)?;
        write_opt(w, self.end_group)
    }
}

/// A publisher's reply on a Subscribe stream: `Type (i)`, then `Message Length (i)` and
/// the body (the type is outside the length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SubscribeResponse {
    /// Type `0x0`, SUBSCRIBE_OK / SUBSCRIBE_START: the first group that will be delivered
    /// (a plain value, not `n + 1`).
    Start {
        /// Absolute sequence of the first group delivered.
        group: u64,
    },
    /// Type `0x1`, SUBSCRIBE_END: the first group that will never be delivered (exclusive;
    /// 0 = the track ended with no groups).
    End {
        /// Exclusive end sequence.
        group: u64,
    },
    /// Type `0x2`, SUBSCRIBE_DROP: groups `start..=end` will not be delivered.
    Drop {
        /// First dropped group (plain value).
        start: u64,
        /// Last dropped group, inclusive (plain value).
        end: u64,
        /// Why; 0 = simply unavailable.
        code: u64,
    },
}

const TYPE_START: u64 = 0x0;
const TYPE_END: u64 = 0x1;
const TYPE_DROP: u64 = 0x2;

impl SubscribeResponse {
    /// The wire type.
    pub const fn type_code(&self) -> u64 {
        match self {
            SubscribeResponse::Start { .. } => TYPE_START,
            SubscribeResponse::End { .. } => TYPE_END,
            SubscribeResponse::Drop { .. } => TYPE_DROP,
        }
    }

    /// Decodes one response at the front of `buf`, returning it and the bytes it took.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] on partial input (feed more and retry);
    /// [`DecodeError::UnknownType`] for a type other than 0, 1, 2 (the stream fails);
    /// [`DecodeError::TooLarge`], [`DecodeError::ShortBody`],
    /// [`DecodeError::TrailingBytes`] as for [`super::decode_message`].
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), DecodeError> {
        let mut r = Reader::new(buf);
        let msg = Self::read(&mut r)?;
        Ok((msg, r.position()))
    }

    /// Reads one response from `r`; on any error nothing is consumed.
    ///
    /// # Errors
    /// As [`SubscribeResponse::decode`].
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut cur = r.clone();
        let msg = match cur.varint()? {
            TYPE_START => read_framed(&mut cur, varints(1), |b| {
                Ok(SubscribeResponse::Start { group: b.varint()? })
            }),
            TYPE_END => read_framed(&mut cur, varints(1), |b| {
                Ok(SubscribeResponse::End { group: b.varint()? })
            }),
            TYPE_DROP => read_framed(&mut cur, varints(3), |b| {
                Ok(SubscribeResponse::Drop {
                    start: b.varint()?,
                    end: b.varint()?,
                    code: b.varint()?,
                })
            }),
            t => Err(DecodeError::UnknownType(t)),
        }
        .inspect_err(|e| {
            if *e != DecodeError::Incomplete {
                debug!("moq-lite: subscribe response failed to decode: {}", e);
            }
        })?;
        *r = cur;
        Ok(msg)
    }

    /// The body size.
    fn body_len(&self) -> Result<usize, EncodeError> {
        match *self {
            SubscribeResponse::Start { group } | SubscribeResponse::End { group } => vlen(group),
            SubscribeResponse::Drop { start, end, code } => {
                Ok(vlen(start)? + vlen(end)? + vlen(code)?)
            }
        }
    }

    /// The encoded size: type, length and body.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] if a value exceeds 2^62 − 1.
    pub fn encoded_len(&self) -> Result<usize, EncodeError> {
        let body = self.body_len()?;
        Ok(1 + vlen(body as u64)? + body)
    }

    /// Encodes the response at the front of `buf`, returning the bytes written.
    ///
    /// # Errors
    /// As [`SubscribeResponse::write`].
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let mut w = Writer::new(buf);
        self.write(&mut w)?;
        Ok(w.position())
    }

    /// Writes the response; on error nothing is written.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] if a value exceeds 2^62 − 1;
    /// [`EncodeError::BufferTooSmall`] if `w` cannot hold it all.
    pub fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.encoded_len()? > w.remaining() {
            return Err(EncodeError::BufferTooSmall);
        }
        w.varint(self.type_code())?;
        w.varint(self.body_len()? as u64)?;
        match *self {
            SubscribeResponse::Start { group } | SubscribeResponse::End { group } => {
                w.varint(group)
            }
            SubscribeResponse::Drop { start, end, code } => {
                w.varint(start)?;
                w.varint(end)?;
                w.varint(code)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{BidiStreamType, decode_message, message_len};
    use crate::wire::varint;
    use proptest::prelude::*;

    fn clock(start_group: Option<u64>, end_group: Option<u64>) -> Subscribe<'static> {
        Subscribe {
            id: 0,
            broadcast: "clock",
            track: "seconds",
            priority: 3,
            max_age: Duration::from_millis(250),
            start_group,
            end_group,
        }
    }

    fn response_vector(msg: SubscribeResponse, bytes: &[u8]) {
        let mut buf = [0u8; 32];
        let n = msg.encode(&mut buf).unwrap();
        assert_eq!(&buf[..n], bytes);
        assert_eq!(msg.encoded_len(), Ok(bytes.len()));
        assert_eq!(SubscribeResponse::decode(bytes), Ok((msg, bytes.len())));
        for cut in 0..bytes.len() {
            assert_eq!(
                SubscribeResponse::decode(&bytes[..cut]),
                Err(DecodeError::Incomplete)
            );
        }
    }

    // ---- docs/protocol.md §6 V8 / V16 ----

    #[test]
    fn v8_subscribe_groups_5_to_9() {
        let bytes = hex("02 15 00 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 03 00 40 fa 06 0a");
        assert_eq!(
            BidiStreamType::decode(&bytes),
            Ok((BidiStreamType::Subscribe, 1))
        );
        assert_vector!(Subscribe<'_>, clock(Some(5), Some(9)), bytes[1..]);
    }

    #[test]
    fn v8_subscribe_latest_unbounded() {
        let bytes = hex("15 00 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 03 00 40 fa 00 00");
        assert_vector!(Subscribe<'_>, clock(None, None), bytes);
    }

    #[test]
    fn v8_subscribe_update() {
        let update = SubscribeUpdate {
            priority: 5,
            max_age: Duration::from_millis(250),
            start_group: Some(5),
            end_group: None,
        };
        assert_vector!(SubscribeUpdate, update, hex("06 05 00 40 fa 06 00"));
    }

    #[test]
    fn v16_relay_merged_subscribe() {
        let bytes = hex("02 14 00 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 00 00 00 00 00");
        let sub = Subscribe {
            id: 0,
            broadcast: "clock",
            track: "seconds",
            priority: 0,
            max_age: Duration::ZERO,
            start_group: None,
            end_group: None,
        };
        assert_vector!(Subscribe<'_>, sub, bytes[1..]);
    }

    #[test]
    fn v9_typed_responses() {
        response_vector(SubscribeResponse::Start { group: 5 }, &hex("00 01 05"));
        response_vector(SubscribeResponse::End { group: 7 }, &hex("01 01 07"));
        response_vector(
            SubscribeResponse::Drop {
                start: 6,
                end: 6,
                code: 0,
            },
            &hex("02 03 06 06 00"),
        );
        // V16 validation run: SUBSCRIBE_OK for group 4.
        response_vector(SubscribeResponse::Start { group: 4 }, &hex("00 01 04"));
    }

    // ---- Opt(i) edges ----

    #[test]
    fn group_bounds_at_the_varint_edge() {
        // 2^62 - 2 is the largest bound: its n + 1 is the largest varint.
        let edge = varint::MAX - 1;
        assert_round_trip!(Subscribe<'_>, clock(Some(edge), Some(edge)));
        assert_eq!(
            message_len(&clock(Some(varint::MAX), None)),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(
            message_len(&clock(None, Some(u64::MAX))),
            Err(EncodeError::ValueTooLarge)
        );
        let update = SubscribeUpdate {
            priority: 0,
            max_age: Duration::ZERO,
            start_group: None,
            end_group: Some(varint::MAX),
        };
        assert_eq!(message_len(&update), Err(EncodeError::ValueTooLarge));
        // Group 0 is `01`, distinct from "latest" `00`.
        let (got, _) = decode_message::<SubscribeUpdate>(&hex("05 00 00 00 01 00")).unwrap();
        assert_eq!(got.start_group, Some(0));
        assert_eq!(got.end_group, None);
    }

    // ---- responses: types and framing ----

    #[test]
    fn unknown_response_type_fails() {
        assert_eq!(
            SubscribeResponse::decode(&hex("03 01 00")),
            Err(DecodeError::UnknownType(3))
        );
        // Reported as soon as the type is known.
        assert_eq!(
            SubscribeResponse::decode(&hex("40 40")),
            Err(DecodeError::UnknownType(64))
        );
        let mut r = Reader::new(&[0x05]);
        assert_eq!(
            SubscribeResponse::read(&mut r),
            Err(DecodeError::UnknownType(5))
        );
        assert_eq!(r.position(), 0);
    }

    #[test]
    fn response_framing() {
        assert_eq!(
            SubscribeResponse::decode(&hex("00 02 05 00")),
            Err(DecodeError::TrailingBytes)
        );
        assert_eq!(
            SubscribeResponse::decode(&hex("02 02 06 06")),
            Err(DecodeError::ShortBody)
        );
        assert_eq!(
            SubscribeResponse::decode(&hex("00 00")),
            Err(DecodeError::ShortBody)
        );
        // Bodies are small: an oversized length fails before the body arrives.
        assert_eq!(
            SubscribeResponse::decode(&hex("00 09")),
            Err(DecodeError::TooLarge)
        );
        assert_eq!(
            SubscribeResponse::decode(&hex("02 19")),
            Err(DecodeError::TooLarge)
        );
        // Long-form group.
        assert_eq!(
            SubscribeResponse::decode(&hex("01 02 40 07")),
            Ok((SubscribeResponse::End { group: 7 }, 4))
        );
        // Several in a row.
        let stream = hex("00 01 05 01 01 07");
        let (a, n) = SubscribeResponse::decode(&stream).unwrap();
        let (b, m) = SubscribeResponse::decode(&stream[n..]).unwrap();
        assert_eq!(
            (a, b, n + m),
            (
                SubscribeResponse::Start { group: 5 },
                SubscribeResponse::End { group: 7 },
                6
            )
        );
    }

    #[test]
    fn response_encode_errors_write_nothing() {
        let mut buf = [0u8; 4];
        let mut w = Writer::new(&mut buf);
        assert_eq!(
            SubscribeResponse::Start { group: 1 << 62 }.write(&mut w),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(
            SubscribeResponse::Drop {
                start: 1,
                end: 2,
                code: 3
            }
            .write(&mut w),
            Err(EncodeError::BufferTooSmall)
        );
        assert_eq!(w.position(), 0);
    }

    // ---- properties ----

    proptest! {
        #[test]
        fn subscribe_round_trip(
            id in any_varint(),
            broadcast in ".{0,32}",
            track in ".{0,32}",
            priority in any::<u8>(),
            max_age_ms in 0..=u64::MAX / 1000,
            start_group in proptest::option::of(0..varint::MAX),
            end_group in proptest::option::of(0..varint::MAX),
        ) {
            let sub = Subscribe {
                id,
                broadcast: &broadcast,
                track: &track,
                priority,
                max_age: Duration::from_millis(max_age_ms),
                start_group,
                end_group,
            };
            assert_round_trip!(Subscribe<'_>, sub);
        }

        #[test]
        fn update_round_trip(
            priority in any::<u8>(),
            max_age_ms in 0..=u64::MAX / 1000,
            start_group in proptest::option::of(0..varint::MAX),
            end_group in proptest::option::of(0..varint::MAX),
        ) {
            let update = SubscribeUpdate { priority, max_age: Duration::from_millis(max_age_ms), start_group, end_group };
            assert_round_trip!(SubscribeUpdate, update);
        }

        #[test]
        fn response_round_trip(kind in 0u8..3, a in any_varint(), b in any_varint(), c in any_varint()) {
            let msg = match kind {
                0 => SubscribeResponse::Start { group: a },
                1 => SubscribeResponse::End { group: a },
                _ => SubscribeResponse::Drop { start: a, end: b, code: c },
            };
            let len = msg.encoded_len().unwrap();
            let mut buf: Vec<u8> = std::vec![0; len];
            prop_assert_eq!(msg.encode(&mut buf), Ok(len));
            prop_assert_eq!(SubscribeResponse::decode(&buf), Ok((msg, len)));
            for cut in 0..len {
                prop_assert_eq!(SubscribeResponse::decode(&buf[..cut]), Err(DecodeError::Incomplete));
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..48)) {
            let _ = decode_message::<Subscribe<'_>>(&bytes);
            let _ = decode_message::<SubscribeUpdate>(&bytes);
            let _ = SubscribeResponse::decode(&bytes);
        }
    }
}

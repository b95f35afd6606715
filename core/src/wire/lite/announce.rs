//! The Announce stream's messages (docs/protocol.md §3.6): ANNOUNCE_REQUEST, ANNOUNCE_OK and
//! ANNOUNCE, plus the hop list ANNOUNCE carries.

use core::fmt;

use super::{MAX_CONTROL_BODY, Message, read_str, slen, varints, vlen};
use crate::wire::{DecodeError, EncodeError, Reader, Writer};

/// Most entries a hop list may hold (docs/protocol.md §3.2).
pub const MAX_HOPS: usize = 32;

/// ANNOUNCE_REQUEST: the subscriber asks for the broadcasts under a prefix (lite-05).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnounceRequest<'a> {
    /// Broadcast path prefix; `""` means everything.
    pub prefix: &'a str,
    /// Skip routes whose hop list contains this Hop ID; 0 = none (lite-04/05 only).
    pub exclude_hop: u64,
}

impl<'a> Message<'a> for AnnounceRequest<'a> {
    const NAME: &'static str = "ANNOUNCE_REQUEST";
    const MAX_BODY: usize = MAX_CONTROL_BODY;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(AnnounceRequest {
            prefix: read_str(r)?,
            exclude_hop: r.varint()?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(slen(self.prefix)? + vlen(self.exclude_hop)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.str(self.prefix)?;
        w.varint(self.exclude_hop)
    }
}

/// ANNOUNCE_OK: the publisher's first reply, naming itself and the size of the initial set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnounceOk {
    /// The publisher's own Hop ID (0 = unknown / withheld); the receiver appends it to
    /// every hop list it receives on this stream.
    pub hop: u64,
    /// Number of ANNOUNCEs that immediately follow as the initial set.
    pub active: u64,
}

impl Message<'_> for AnnounceOk {
    const NAME: &'static str = "ANNOUNCE_OK";
    const MAX_BODY: usize = varints(2);

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(AnnounceOk {
            hop: r.varint()?,
            active: r.varint()?,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(vlen(self.hop)? + vlen(self.active)?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.hop)?;
        w.varint(self.active)
    }
}

/// The status byte of an ANNOUNCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AnnounceStatus {
    /// `0`: the broadcast is gone (matched on path only).
    Ended,
    /// `1`: the broadcast is available; a second Active for a live path is a restart.
    Active,
    /// `2`: explicit restart; accept and treat as [`AnnounceStatus::Active`] (moq-dev never
    /// sends it).
    Restart,
}

impl AnnounceStatus {
    /// The wire byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            AnnounceStatus::Ended => 0,
            AnnounceStatus::Active => 1,
            AnnounceStatus::Restart => 2,
        }
    }

    /// The status for a wire byte, or `None` for values other than 0, 1, 2.
    pub const fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(AnnounceStatus::Ended),
            1 => Some(AnnounceStatus::Active),
            2 => Some(AnnounceStatus::Restart),
            _ => None,
        }
    }

    /// True for [`AnnounceStatus::Active`] and [`AnnounceStatus::Restart`].
    pub const fn is_active(self) -> bool {
        !matches!(self, AnnounceStatus::Ended)
    }
}

/// ANNOUNCE ("ANNOUNCE_BROADCAST"): one broadcast became available, restarted or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announce<'a> {
    /// Active, ended or restart.
    pub status: AnnounceStatus,
    /// Path relative to the request's prefix (`""` = the prefix itself).
    pub suffix: &'a str,
    /// Hops the broadcast travelled before the responding publisher, origin first.
    pub hops: Hops<'a>,
}

impl<'a> Message<'a> for Announce<'a> {
    const NAME: &'static str = "ANNOUNCE";
    const MAX_BODY: usize = MAX_CONTROL_BODY;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let status = AnnounceStatus::from_byte(r.u8()?).ok_or(DecodeError::InvalidValue)?;
        let suffix = read_str(r)?;
        let hops = Hops::read(r)?;
        Ok(Announce {
            status,
            suffix,
            hops,
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        Ok(1 + slen(self.suffix)? + self.hops.encoded_len()?)
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u8(self.status.to_byte())?;
        w.str(self.suffix)?;
        self.hops.write(w)
    }
}

#[derive(Clone, Copy)]
enum HopsInner<'a> {
    /// Validated wire bytes (the IDs after Hop Count) and the count.
    Wire { bytes: &'a [u8], count: usize },
    /// A caller's list.
    List(&'a [u64]),
}

/// A hop list, `Hop Count (i)` then that many `Hop ID (i)` (docs/protocol.md §3.2), borrowed
/// either from received bytes or from a caller's slice.
///
/// Decoding rejects more than [`MAX_HOPS`] entries ([`DecodeError::TooLarge`]) and a
/// non-zero ID that repeats ([`DecodeError::Duplicate`]; 0 means "unknown" and may
/// repeat). Encoding refuses more than [`MAX_HOPS`] entries but does not look for
/// repeats. Equality compares the IDs in order.
#[derive(Clone, Copy)]
pub struct Hops<'a>(HopsInner<'a>);

impl<'a> Hops<'a> {
    /// The empty list (a broadcast published by the responder itself).
    pub const EMPTY: Hops<'static> = Hops(HopsInner::List(&[]));

    /// A list that encodes `ids` in order.
    pub const fn new(ids: &'a [u64]) -> Self {
        Hops(HopsInner::List(ids))
    }

    /// Number of entries.
    pub const fn len(&self) -> usize {
        match self.0 {
            HopsInner::Wire { count, .. } => count,
            HopsInner::List(ids) => ids.len(),
        }
    }

    /// True for the empty list.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The IDs, origin first.
    pub fn iter(&self) -> HopIter<'a> {
        match self.0 {
            HopsInner::Wire { bytes, count } => HopIter(HopIterInner::Wire {
                r: Reader::new(bytes),
                left: count,
            }),
            HopsInner::List(ids) => HopIter(HopIterInner::List(ids.iter())),
        }
    }

    /// True if `id` is in the list (used for loop prevention and Exclude Hop).
    pub fn contains(&self, id: u64) -> bool {
        self.iter().any(|h| h == id)
    }

    /// Reads a hop list.
    fn read(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let count = r.length(MAX_HOPS)?;
        let all = r.rest();
        let start = r.position();
        let mut seen = [0u64; MAX_HOPS];
        for i in 0..count {
            let id = r.varint()?;
            // docs/protocol.md §3.2: a non-zero ID may not repeat; 0 ("unknown") may.
            if id != 0 && seen.iter().take(i).any(|&s| s == id) {
                return Err(DecodeError::Duplicate);
            }
            if let Some(slot) = seen.get_mut(i) {
                *slot = id;
            }
        }
        let bytes = all.get(..r.position() - start).unwrap_or(all);
        Ok(Hops(HopsInner::Wire { bytes, count }))
    }

    /// The encoded size.
    fn encoded_len(&self) -> Result<usize, EncodeError> {
        match self.0 {
            HopsInner::Wire { bytes, count } => Ok(vlen(count as u64)? + bytes.len()),
            HopsInner::List(ids) => {
                if ids.len() > MAX_HOPS {
                    return Err(EncodeError::ValueTooLarge);
                }
                ids.iter()
                    .try_fold(vlen(ids.len() as u64)?, |n, &id| Ok(n + vlen(id)?))
            }
        }
    }

    /// Writes the list.
    fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self.0 {
            HopsInner::Wire { bytes, count } => {
                w.varint(count as u64)?;
                w.bytes(bytes)
            }
            HopsInner::List(ids) => {
                w.varint(ids.len() as u64)?;
                ids.iter().try_for_each(|&id| w.varint(id))
            }
        }
    }
}

impl PartialEq for Hops<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Hops<'_> {}

impl fmt::Debug for Hops<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for Hops<'a> {
    type Item = u64;
    type IntoIter = HopIter<'a>;
    fn into_iter(self) -> HopIter<'a> {
        self.iter()
    }
}

/// Iterator over the IDs of a [`Hops`] list, origin first.
#[derive(Debug, Clone)]
pub struct HopIter<'a>(HopIterInner<'a>);

#[derive(Debug, Clone)]
enum HopIterInner<'a> {
    Wire { r: Reader<'a>, left: usize },
    List(core::slice::Iter<'a, u64>),
}

impl Iterator for HopIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match &mut self.0 {
            HopIterInner::List(it) => it.next().copied(),
            HopIterInner::Wire { r, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // Validated when decoded; a failure here cannot happen but ends the walk.
                let id = r.varint().ok();
                if id.is_none() {
                    *left = 0;
                }
                id
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            HopIterInner::List(it) => it.size_hint(),
            HopIterInner::Wire { left, .. } => (0, Some(*left)),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{BidiStreamType, decode_message, encode_message, message_len};
    use proptest::prelude::*;

    // ---- docs/protocol.md §6 V6 / V7 / V16 ----

    #[test]
    fn v6_announce_request() {
        let bytes = hex("01 03 00 62 22");
        assert_eq!(
            BidiStreamType::decode(&bytes),
            Ok((BidiStreamType::Announce, 1))
        );
        assert_vector!(
            AnnounceRequest<'_>,
            AnnounceRequest {
                prefix: "",
                exclude_hop: 0x2222
            },
            bytes[1..]
        );
    }

    #[test]
    fn v7_announce_ok_then_announce() {
        let stream = hex("03 51 11 01 08 01 05 63 6c 6f 63 6b 00");
        assert_vector!(
            AnnounceOk,
            AnnounceOk {
                hop: 0x1111,
                active: 1
            },
            stream[..4]
        );
        let announce = Announce {
            status: AnnounceStatus::Active,
            suffix: "clock",
            hops: Hops::EMPTY,
        };
        assert_vector!(Announce<'_>, announce, stream[4..]);
        // Decoded back to back from one buffer.
        let (ok, n) = decode_message::<AnnounceOk>(&stream).unwrap();
        assert_eq!(ok.active, 1);
        let (a, m) = decode_message::<Announce<'_>>(&stream[n..]).unwrap();
        assert_eq!(n + m, stream.len());
        assert!(a.status.is_active());
    }

    #[test]
    fn v7_hand_lines() {
        let ids = [0x2222, 0x1111];
        assert_vector!(
            Announce<'_>,
            Announce {
                status: AnnounceStatus::Active,
                suffix: "clock",
                hops: Hops::new(&ids)
            },
            hex("0c 01 05 63 6c 6f 63 6b 02 62 22 51 11")
        );
        let bytes = hex("0c 01 05 63 6c 6f 63 6b 02 62 22 51 11");
        let (got, _) = decode_message::<Announce<'_>>(&bytes).unwrap();
        assert_eq!(got.hops.iter().collect::<Vec<_>>(), ids);
        assert!(got.hops.contains(0x1111));
        assert!(!got.hops.contains(0x3333));
        assert_vector!(
            Announce<'_>,
            Announce {
                status: AnnounceStatus::Ended,
                suffix: "clock",
                hops: Hops::EMPTY
            },
            hex("08 00 05 63 6c 6f 63 6b 00")
        );
    }

    #[test]
    fn v16_relay_announce_lines() {
        let relay = 0x0009_5ea8_220c_5f03;
        let req = hex("01 09 00 c0 09 5e a8 22 0c 5f 03");
        assert_eq!(
            BidiStreamType::decode(&req),
            Ok((BidiStreamType::Announce, 1))
        );
        assert_vector!(
            AnnounceRequest<'_>,
            AnnounceRequest {
                prefix: "",
                exclude_hop: relay
            },
            req[1..]
        );
        assert_vector!(
            AnnounceOk,
            AnnounceOk {
                hop: relay,
                active: 0
            },
            hex("09 c0 09 5e a8 22 0c 5f 03 00")
        );
        assert_vector!(
            Announce<'_>,
            Announce {
                status: AnnounceStatus::Active,
                suffix: "clock",
                hops: Hops::new(&[0x3333])
            },
            hex("0a 01 05 63 6c 6f 63 6b 01 73 33")
        );
    }

    // ---- rules ----

    #[test]
    fn status_bytes() {
        let bytes = hex("03 02 00 00");
        let (got, _) = decode_message::<Announce<'_>>(&bytes).unwrap();
        assert_eq!(got.status, AnnounceStatus::Restart);
        assert!(got.status.is_active());
        assert_eq!(
            decode_message::<Announce<'_>>(&hex("03 03 00 00")).err(),
            Some(DecodeError::InvalidValue)
        );
    }

    #[test]
    fn hop_list_limits() {
        // 33 entries refused from the count alone.
        assert_eq!(
            decode_message::<Announce<'_>>(&hex("03 01 00 21")).err(),
            Some(DecodeError::TooLarge)
        );
        // 32 distinct entries are fine.
        let mut msg = std::vec![35u8, 1, 0, 32];
        msg.extend(1..=32u8);
        let (got, _) = decode_message::<Announce<'_>>(&msg).unwrap();
        assert_eq!(got.hops.len(), 32);
        assert_eq!(got.hops.iter().count(), 32);
        let many = [7u64; 33];
        let a = Announce {
            status: AnnounceStatus::Active,
            suffix: "",
            hops: Hops::new(&many),
        };
        assert_eq!(message_len(&a), Err(EncodeError::ValueTooLarge));
    }

    #[test]
    fn repeated_hops() {
        // A non-zero repeat is a loop.
        assert_eq!(
            decode_message::<Announce<'_>>(&hex("06 01 00 03 05 06 05")).err(),
            Some(DecodeError::Duplicate)
        );
        // Zero ("unknown") may repeat.
        let bytes = hex("06 01 00 03 00 05 00");
        let (got, _) = decode_message::<Announce<'_>>(&bytes).unwrap();
        assert_eq!(got.hops.iter().collect::<Vec<_>>(), [0, 5, 0]);
    }

    #[test]
    fn short_and_long_bodies() {
        // Hop count promises two, the body holds one.
        assert_eq!(
            decode_message::<Announce<'_>>(&hex("04 01 00 02 05")).err(),
            Some(DecodeError::ShortBody)
        );
        // Missing Exclude Hop (a lite-06 ANNOUNCE_REQUEST on a lite-05 stream).
        assert_eq!(
            decode_message::<AnnounceRequest<'_>>(&hex("01 00")).err(),
            Some(DecodeError::ShortBody)
        );
        assert_eq!(
            decode_message::<AnnounceOk>(&hex("03 01 02 03")).err(),
            Some(DecodeError::TrailingBytes)
        );
        // ANNOUNCE_OK is small: a longer length is refused up front.
        assert_eq!(
            decode_message::<AnnounceOk>(&hex("11")).err(),
            Some(DecodeError::TooLarge)
        );
    }

    #[test]
    fn decoded_hops_re_encode_verbatim() {
        // A long-form hop ID is kept as received.
        let msg = hex("05 01 00 01 40 05");
        let (got, _) = decode_message::<Announce<'_>>(&msg).unwrap();
        let mut buf = [0u8; 8];
        let n = encode_message(&got, &mut buf).unwrap();
        assert_eq!(&buf[..n], &msg[..]);
        assert_eq!(got.hops, Hops::new(&[5]));
    }

    // ---- properties ----

    proptest! {
        #[test]
        fn announce_request_round_trip(prefix in ".{0,40}", exclude_hop in any_varint()) {
            assert_round_trip!(AnnounceRequest<'_>, AnnounceRequest { prefix: &prefix, exclude_hop });
        }

        #[test]
        fn announce_ok_round_trip(hop in any_varint(), active in any_varint()) {
            assert_round_trip!(AnnounceOk, AnnounceOk { hop, active });
        }

        #[test]
        fn announce_round_trip(
            status in 0u8..3,
            suffix in ".{0,40}",
            ids in proptest::collection::btree_set(any_varint(), 0..=MAX_HOPS),
            zeros in 0usize..3,
        ) {
            let mut ids: Vec<u64> = ids.into_iter().collect();
            ids.truncate(MAX_HOPS - zeros.min(MAX_HOPS));
            ids.extend(core::iter::repeat_n(0, zeros));
            let status = AnnounceStatus::from_byte(status).unwrap();
            let a = Announce { status, suffix: &suffix, hops: Hops::new(&ids) };
            assert_round_trip!(Announce<'_>, a);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok((a, _)) = decode_message::<Announce<'_>>(&bytes) {
                prop_assert_eq!(a.hops.iter().count(), a.hops.len());
            }
            let _ = decode_message::<AnnounceRequest<'_>>(&bytes);
            let _ = decode_message::<AnnounceOk>(&bytes);
        }

        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..60)) {
            let mut msg = std::vec![body.len() as u8];
            msg.extend_from_slice(&body);
            let _ = decode_message::<Announce<'_>>(&msg);
            let _ = decode_message::<AnnounceRequest<'_>>(&msg);
        }
    }
}

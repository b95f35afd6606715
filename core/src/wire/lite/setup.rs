//! SETUP, the one message on each direction's Setup stream (docs/protocol.md §3.5).
//!
//! ```text
//! SETUP { Message Length (i), Parameter Count (i), { ID (i), Length (i), Value }… }
//! ```
//!
//! A decoded [`Setup`] keeps the parameter bytes it was decoded from (validated once)
//! and re-encodes them verbatim; a [`Setup`] built with [`Setup::new`] writes the
//! [`Param`]s it was given, in the order given. Either way [`Setup::params`] walks the
//! parameters in wire order and the accessors ([`Setup::probe`], [`Setup::path`], …)
//! read the known ones.

use core::fmt;

use super::{MAX_SETUP_BODY, Message, vlen};
use crate::wire::{DecodeError, EncodeError, Reader, Writer, varint};

/// Most parameters a SETUP may carry (docs/protocol.md §3.2).
pub const MAX_SETUP_PARAMS: usize = 64;

const ID_PROBE: u64 = 0x1;
const ID_PATH: u64 = 0x2;
const ID_ROLE: u64 = 0x3;
const ID_COST: u64 = 0x4;
const ID_HOP: u64 = 0x5;

/// The probing capability an endpoint advertises (SETUP parameter `0x1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ProbeLevel {
    /// `0`: no probing (the same as omitting the parameter).
    #[default]
    None,
    /// `1`: the endpoint reports bitrate / RTT estimates on Probe streams.
    Report,
    /// `2`: the endpoint can also pad to probe upwards.
    Increase,
}

impl ProbeLevel {
    /// The wire value.
    pub const fn to_code(self) -> u64 {
        match self {
            ProbeLevel::None => 0,
            ProbeLevel::Report => 1,
            ProbeLevel::Increase => 2,
        }
    }

    /// The level for a wire value; docs/protocol.md §3.5: unknown values ≥ 2 read as 2.
    pub const fn from_code(code: u64) -> Self {
        match code {
            0 => ProbeLevel::None,
            1 => ProbeLevel::Report,
            _ => ProbeLevel::Increase,
        }
    }
}

/// The direction a client intends to use the session for (SETUP parameter `0x3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Role {
    /// `0`, absent or unknown: both publish and subscribe.
    #[default]
    Both,
    /// `1`: publisher only.
    Publisher,
    /// `2`: subscriber only.
    Subscriber,
}

impl Role {
    /// The wire value.
    pub const fn to_code(self) -> u64 {
        match self {
            Role::Both => 0,
            Role::Publisher => 1,
            Role::Subscriber => 2,
        }
    }

    /// The role for a wire value; docs/protocol.md §3.5: unknown values mean both.
    pub const fn from_code(code: u64) -> Self {
        match code {
            1 => Role::Publisher,
            2 => Role::Subscriber,
            _ => Role::Both,
        }
    }
}

/// One SETUP parameter (docs/protocol.md §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param<'a> {
    /// `0x1` Probe: varint level.
    Probe(ProbeLevel),
    /// `0x2` Path: request path (+ `?query`), raw UTF-8 without inner length; client only.
    /// Never send it empty.
    Path(&'a str),
    /// `0x3` Role: varint; client only.
    Role(Role),
    /// `0x4` Cost: varint link cost.
    Cost(u64),
    /// `0x5` Hop: varint Hop ID of the sender; 0 = none.
    Hop(u64),
    /// Any other ID, kept as raw bytes (ignored by the accessors).
    Unknown {
        /// Parameter ID.
        id: u64,
        /// Raw value bytes.
        value: &'a [u8],
    },
}

impl<'a> Param<'a> {
    /// The parameter ID.
    pub const fn id(&self) -> u64 {
        match self {
            Param::Probe(_) => ID_PROBE,
            Param::Path(_) => ID_PATH,
            Param::Role(_) => ID_ROLE,
            Param::Cost(_) => ID_COST,
            Param::Hop(_) => ID_HOP,
            Param::Unknown { id, .. } => *id,
        }
    }

    /// The parameter for a received `id` and `value`.
    fn from_wire(id: u64, value: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match id {
            ID_PROBE => Param::Probe(ProbeLevel::from_code(varint_value(value)?)),
            ID_PATH => {
                Param::Path(core::str::from_utf8(value).map_err(|_| DecodeError::InvalidUtf8)?)
            }
            ID_ROLE => Param::Role(Role::from_code(varint_value(value)?)),
            ID_COST => Param::Cost(varint_value(value)?),
            ID_HOP => Param::Hop(varint_value(value)?),
            id => Param::Unknown { id, value },
        })
    }

    /// The value's size in bytes.
    fn value_len(&self) -> Result<usize, EncodeError> {
        match self {
            Param::Probe(l) => vlen(l.to_code()),
            Param::Path(p) => Ok(p.len()),
            Param::Role(r) => vlen(r.to_code()),
            Param::Cost(v) | Param::Hop(v) => vlen(*v),
            Param::Unknown { value, .. } => Ok(value.len()),
        }
    }

    /// The encoded size: ID, Length, Value.
    fn encoded_len(&self) -> Result<usize, EncodeError> {
        let value = self.value_len()?;
        Ok(vlen(self.id())? + vlen(value as u64)? + value)
    }

    /// Writes ID, Length, Value.
    fn write(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.varint(self.id())?;
        w.varint(self.value_len()? as u64)?;
        match self {
            Param::Probe(l) => w.varint(l.to_code()),
            Param::Path(p) => w.bytes(p.as_bytes()),
            Param::Role(r) => w.varint(r.to_code()),
            Param::Cost(v) | Param::Hop(v) => w.varint(*v),
            Param::Unknown { value, .. } => w.bytes(value),
        }
    }
}

/// A varint parameter value, which must fill its value exactly.
fn varint_value(value: &[u8]) -> Result<u64, DecodeError> {
    match varint::decode(value) {
        Ok((v, n)) if n == value.len() => Ok(v),
        _ => Err(DecodeError::InvalidValue),
    }
}

/// Where a [`Setup`]'s parameters come from.
#[derive(Clone, Copy)]
enum Params<'a> {
    /// Validated wire bytes (everything after Parameter Count) and the count.
    Wire { bytes: &'a [u8], count: usize },
    /// A caller's list, written in order.
    List(&'a [Param<'a>]),
}

/// The SETUP message (docs/protocol.md §3.5).
///
/// Decoding rejects more than [`MAX_SETUP_PARAMS`] parameters ([`DecodeError::TooLarge`]),
/// a repeated ID, known or not ([`DecodeError::Duplicate`]), a known varint parameter
/// whose value is not exactly one varint ([`DecodeError::InvalidValue`]) and a non-UTF-8
/// Path ([`DecodeError::InvalidUtf8`]). Unknown IDs are kept but otherwise ignored.
/// Equality compares the parameters in order.
#[derive(Clone, Copy)]
pub struct Setup<'a> {
    params: Params<'a>,
}

impl<'a> Setup<'a> {
    /// A SETUP with no parameters (no capabilities): `01 00` after the stream type.
    pub const EMPTY: Setup<'static> = Setup {
        params: Params::List(&[]),
    };

    /// A SETUP that will encode `params` in this order.
    ///
    /// The encoder does not check for repeated IDs (the peer would close the session);
    /// more than [`MAX_SETUP_PARAMS`] is refused with [`EncodeError::ValueTooLarge`].
    pub const fn new(params: &'a [Param<'a>]) -> Self {
        Setup {
            params: Params::List(params),
        }
    }

    /// Number of parameters.
    pub const fn len(&self) -> usize {
        match self.params {
            Params::Wire { count, .. } => count,
            Params::List(list) => list.len(),
        }
    }

    /// True if there are no parameters.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parameters in wire order.
    pub fn params(&self) -> ParamIter<'a> {
        match self.params {
            Params::Wire { bytes, count } => ParamIter {
                inner: IterInner::Wire {
                    r: Reader::new(bytes),
                    left: count,
                },
            },
            Params::List(list) => ParamIter {
                inner: IterInner::List(list.iter()),
            },
        }
    }

    /// The advertised probe level; [`ProbeLevel::None`] when absent.
    pub fn probe(&self) -> ProbeLevel {
        self.params()
            .find_map(|p| {
                if let Param::Probe(l) = p {
                    Some(l)
                } else {
                    None
                }
            })
            .unwrap_or_default()
    }

    /// The request path (+ `?query`); `None` when absent or empty (moq-dev treats both alike).
    pub fn path(&self) -> Option<&'a str> {
        self.params()
            .find_map(|p| {
                if let Param::Path(s) = p {
                    Some(s)
                } else {
                    None
                }
            })
            .filter(|s| !s.is_empty())
    }

    /// The client's role; [`Role::Both`] when absent.
    pub fn role(&self) -> Role {
        self.params()
            .find_map(|p| {
                if let Param::Role(r) = p {
                    Some(r)
                } else {
                    None
                }
            })
            .unwrap_or_default()
    }

    /// The advertised link cost, if any.
    pub fn cost(&self) -> Option<u64> {
        self.params().find_map(|p| {
            if let Param::Cost(c) = p {
                Some(c)
            } else {
                None
            }
        })
    }

    /// The sender's Hop ID; 0 when absent or sent as 0 (both mean "none").
    pub fn hop(&self) -> u64 {
        self.params()
            .find_map(|p| if let Param::Hop(h) = p { Some(h) } else { None })
            .unwrap_or(0)
    }
}

impl PartialEq for Setup<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.params().eq(other.params())
    }
}

impl Eq for Setup<'_> {}

impl fmt::Debug for Setup<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Setup ")?;
        f.debug_list().entries(self.params()).finish()
    }
}

impl<'a> Message<'a> for Setup<'a> {
    const NAME: &'static str = "SETUP";
    const MAX_BODY: usize = MAX_SETUP_BODY;

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let count = r.length(MAX_SETUP_PARAMS)?;
        let all = r.rest();
        let start = r.position();
        let mut ids = [0u64; MAX_SETUP_PARAMS];
        for i in 0..count {
            let id = r.varint()?;
            // docs/protocol.md §3.5: parameter IDs must not repeat, known or not.
            if ids.iter().take(i).any(|&seen| seen == id) {
                return Err(DecodeError::Duplicate);
            }
            if let Some(slot) = ids.get_mut(i) {
                *slot = id;
            }
            let len = r.length(MAX_SETUP_BODY)?;
            let value = r.bytes(len)?;
            // Validate known values now, so the accessors never meet a bad one.
            Param::from_wire(id, value)?;
        }
        let bytes = all.get(..r.position() - start).unwrap_or(all);
        Ok(Setup {
            params: Params::Wire { bytes, count },
        })
    }

    fn body_len(&self) -> Result<usize, EncodeError> {
        match self.params {
            Params::Wire { bytes, count } => Ok(vlen(count as u64)? + bytes.len()),
            Params::List(list) => {
                if list.len() > MAX_SETUP_PARAMS {
                    return Err(EncodeError::ValueTooLarge);
                }
                list.iter()
                    .try_fold(vlen(list.len() as u64)?, |n, p| Ok(n + p.encoded_len()?))
            }
        }
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self.params {
            Params::Wire { bytes, count } => {
                w.varint(count as u64)?;
                w.bytes(bytes)
            }
            Params::List(list) => {
                w.varint(list.len() as u64)?;
                list.iter().try_for_each(|p| p.write(w))
            }
        }
    }
}

/// Iterator over a [`Setup`]'s parameters, in wire order.
#[derive(Debug, Clone)]
pub struct ParamIter<'a> {
    inner: IterInner<'a>,
}

#[derive(Debug, Clone)]
enum IterInner<'a> {
    Wire { r: Reader<'a>, left: usize },
    List(core::slice::Iter<'a, Param<'a>>),
}

impl<'a> Iterator for ParamIter<'a> {
    type Item = Param<'a>;

    fn next(&mut self) -> Option<Param<'a>> {
        match &mut self.inner {
            IterInner::List(it) => it.next().copied(),
            IterInner::Wire { r, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // Validated when decoded; a failure here cannot happen but ends the walk.
                let param = (|| {
                    let id = r.varint()?;
                    let len = r.length(usize::MAX)?;
                    Param::from_wire(id, r.bytes(len)?)
                })();
                if param.is_err() {
                    *left = 0;
                }
                param.ok()
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.inner {
            IterInner::List(it) => it.size_hint(),
            IterInner::Wire { left, .. } => (0, Some(*left)),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::BTreeMap;
    use std::string::String;
    use std::vec::Vec;

    use super::*;
    use crate::wire::lite::test_util::{any_varint, assert_round_trip, assert_vector, hex};
    use crate::wire::lite::{UniStreamType, decode_message, encode_message};
    use proptest::prelude::*;

    /// Splits a whole Setup stream into (type, message bytes).
    fn setup_stream(s: &str) -> Vec<u8> {
        let bytes = hex(s);
        assert_eq!(UniStreamType::decode(&bytes), Ok((UniStreamType::Setup, 1)));
        bytes[1..].to_vec()
    }

    // ---- docs/protocol.md §6 V5 ----

    #[test]
    fn v5_minimal_client_path_only() {
        let msg = setup_stream("01 08 01 02 05 2f 72 6f 6f 6d");
        let params = [Param::Path("/room")];
        assert_vector!(Setup<'_>, Setup::new(&params), msg);
        let (got, _) = decode_message::<Setup<'_>>(&msg).unwrap();
        assert_eq!(got.path(), Some("/room"));
        assert_eq!(got.probe(), ProbeLevel::None);
        assert_eq!(got.role(), Role::Both);
        assert_eq!(got.hop(), 0);
        assert_eq!(got.cost(), None);
    }

    #[test]
    fn v5_captured_client_keeps_parameter_order() {
        let msg = setup_stream("01 12 04 03 01 02 05 02 62 22 02 05 2f 72 6f 6f 6d 01 01 01");
        let params = [
            Param::Role(Role::Subscriber),
            Param::Hop(0x2222),
            Param::Path("/room"),
            Param::Probe(ProbeLevel::Report),
        ];
        assert_vector!(Setup<'_>, Setup::new(&params), msg);
        let (got, _) = decode_message::<Setup<'_>>(&msg).unwrap();
        assert_eq!(got.params().collect::<Vec<_>>(), params);
        assert_eq!(got.role(), Role::Subscriber);
        assert_eq!(got.hop(), 0x2222);
        assert_eq!(got.path(), Some("/room"));
        assert_eq!(got.probe(), ProbeLevel::Report);
        // A decoded SETUP re-encodes its own bytes.
        let mut buf = [0u8; 32];
        let n = encode_message(&got, &mut buf).unwrap();
        assert_eq!(&buf[..n], &msg[..]);
    }

    #[test]
    fn v5_captured_server() {
        let msg = setup_stream("01 08 02 01 01 01 05 02 51 11");
        let params = [Param::Probe(ProbeLevel::Report), Param::Hop(0x1111)];
        assert_vector!(Setup<'_>, Setup::new(&params), msg);
        let (got, _) = decode_message::<Setup<'_>>(&msg).unwrap();
        assert_eq!(got.hop(), 0x1111);
        assert_eq!(got.path(), None);
    }

    #[test]
    fn v5_empty() {
        let msg = setup_stream("01 01 00");
        assert_vector!(Setup<'_>, Setup::EMPTY, msg);
        assert!(decode_message::<Setup<'_>>(&msg).unwrap().0.is_empty());
    }

    #[test]
    fn v16_relay_setup_with_eight_byte_hop() {
        let msg = setup_stream("01 0e 02 01 01 01 05 08 c0 09 5e a8 22 0c 5f 03");
        let params = [
            Param::Probe(ProbeLevel::Report),
            Param::Hop(2637351009148675),
        ];
        assert_vector!(Setup<'_>, Setup::new(&params), msg);
        assert_eq!(
            decode_message::<Setup<'_>>(&msg).unwrap().0.hop(),
            0x0009_5ea8_220c_5f03
        );
    }

    // ---- parameter rules ----

    #[test]
    fn unknown_ids_are_ignored_but_kept() {
        // count 3: unknown 0x40 with 3 raw bytes, Probe 1, unknown 0x3f with nothing.
        let msg = hex("0c 03 40 40 03 ff fe fd 01 01 01 3f 00");
        let (got, n) = decode_message::<Setup<'_>>(&msg).unwrap();
        assert_eq!(n, msg.len());
        assert_eq!(got.probe(), ProbeLevel::Report);
        assert_eq!(
            got.params().collect::<Vec<_>>(),
            [
                Param::Unknown {
                    id: 0x40,
                    value: &[0xff, 0xfe, 0xfd]
                },
                Param::Probe(ProbeLevel::Report),
                Param::Unknown {
                    id: 0x3f,
                    value: &[]
                },
            ]
        );
        let mut buf = [0u8; 16];
        let n = encode_message(&got, &mut buf).unwrap();
        assert_eq!(&buf[..n], &msg[..]);
    }

    #[test]
    fn duplicate_ids_are_rejected() {
        // Probe twice.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("07 02 01 01 01 01 01 00")).err(),
            Some(DecodeError::Duplicate)
        );
        // An unknown ID twice.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("05 02 09 00 09 00")).err(),
            Some(DecodeError::Duplicate)
        );
    }

    #[test]
    fn parameter_count_limit() {
        let mut body = std::vec![0x40, 0x40]; // count 64
        for id in 0..64u8 {
            body.extend_from_slice(&[0x40, 0x40 + id, 0]); // unknown IDs 0x40..0x7f, empty
        }
        let mut msg = std::vec![0x40 | (body.len() >> 8) as u8, body.len() as u8];
        msg.extend_from_slice(&body);
        let (got, _) = decode_message::<Setup<'_>>(&msg).unwrap();
        assert_eq!(got.len(), 64);
        assert_eq!(got.params().count(), 64);
        // 65 is refused from the count alone.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("02 40 41")).err(),
            Some(DecodeError::TooLarge)
        );
        // And never encoded.
        let many = [Param::Cost(1); 65];
        assert_eq!(
            crate::wire::lite::message_len(&Setup::new(&many)),
            Err(EncodeError::ValueTooLarge)
        );
    }

    #[test]
    fn setup_size_limit_is_checked_first() {
        // 64 KiB is fine to wait for; 64 KiB + 1 is refused with no body in hand.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("80 01 00 00")).err(),
            Some(DecodeError::Incomplete)
        );
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("80 01 00 01")).err(),
            Some(DecodeError::TooLarge)
        );
        let big = [0u8; MAX_SETUP_BODY];
        let params = [Param::Unknown { id: 9, value: &big }];
        assert_eq!(
            crate::wire::lite::message_len(&Setup::new(&params)),
            Err(EncodeError::ValueTooLarge)
        );
    }

    #[test]
    fn malformed_known_values() {
        // Probe with an empty value, with two varints, and with a cut varint.
        for msg in ["03 01 01 00", "05 01 01 02 01 01", "04 01 01 01 40"] {
            assert_eq!(
                decode_message::<Setup<'_>>(&hex(msg)).err(),
                Some(DecodeError::InvalidValue),
                "{msg}"
            );
        }
        // Path that is not UTF-8.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("05 01 02 02 ff fe")).err(),
            Some(DecodeError::InvalidUtf8)
        );
        // A value running past the body.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("04 01 09 05 00")).err(),
            Some(DecodeError::ShortBody)
        );
        // Fewer parameters than counted.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("04 02 09 01 00")).err(),
            Some(DecodeError::ShortBody)
        );
        // More bytes than the counted parameters.
        assert_eq!(
            decode_message::<Setup<'_>>(&hex("04 01 09 00 00")).err(),
            Some(DecodeError::TrailingBytes)
        );
    }

    #[test]
    fn value_mappings() {
        // Probe 7 reads as Increase; Role 9 as Both; Hop 0 as none; empty Path as none.
        let msg = hex("0c 04 01 01 07 03 01 09 05 01 00 02 00");
        let (got, _) = decode_message::<Setup<'_>>(&msg).unwrap();
        assert_eq!(got.probe(), ProbeLevel::Increase);
        assert_eq!(got.role(), Role::Both);
        assert_eq!(got.hop(), 0);
        assert_eq!(got.path(), None);
        // A long-form varint value is accepted.
        let bytes = hex("05 01 04 02 40 07");
        let (got, _) = decode_message::<Setup<'_>>(&bytes).unwrap();
        assert_eq!(got.cost(), Some(7));
    }

    #[test]
    fn level_and_role_codes() {
        for l in [ProbeLevel::None, ProbeLevel::Report, ProbeLevel::Increase] {
            assert_eq!(ProbeLevel::from_code(l.to_code()), l);
        }
        for r in [Role::Both, Role::Publisher, Role::Subscriber] {
            assert_eq!(Role::from_code(r.to_code()), r);
        }
    }

    // ---- properties ----

    prop_compose! {
        fn any_params()(
            probe in proptest::option::of(0u64..3),
            path in proptest::option::of(".{0,24}"),
            role in proptest::option::of(0u64..3),
            cost in proptest::option::of(any_varint()),
            hop in proptest::option::of(any_varint()),
            unknown in proptest::collection::btree_map(6..=crate::wire::varint::MAX,
                proptest::collection::vec(any::<u8>(), 0..12), 0..8),
            order in proptest::collection::vec(any::<u32>(), 13),
        ) -> (Option<u64>, Option<String>, Option<u64>, Option<u64>, Option<u64>,
              BTreeMap<u64, Vec<u8>>, Vec<u32>) {
            (probe, path, role, cost, hop, unknown, order)
        }
    }

    proptest! {
        #[test]
        fn round_trip((probe, path, role, cost, hop, unknown, order) in any_params()) {
            let mut params: Vec<Param<'_>> = Vec::new();
            params.extend(probe.map(|l| Param::Probe(ProbeLevel::from_code(l))));
            params.extend(path.as_deref().map(Param::Path));
            params.extend(role.map(|r| Param::Role(Role::from_code(r))));
            params.extend(cost.map(Param::Cost));
            params.extend(hop.map(Param::Hop));
            params.extend(unknown.iter().map(|(&id, v)| Param::Unknown { id, value: v }));
            // Any order must be preserved.
            let mut keyed: Vec<_> = params.into_iter().zip(order).collect();
            keyed.sort_by_key(|(_, k)| *k);
            let params: Vec<Param<'_>> = keyed.into_iter().map(|(p, _)| p).collect();
            let setup = Setup::new(&params);
            assert_round_trip!(Setup<'_>, setup);
            let mut buf = std::vec![0u8; 4096];
            let n = encode_message(&setup, &mut buf).unwrap();
            let (got, _) = decode_message::<Setup<'_>>(&buf[..n]).unwrap();
            prop_assert_eq!(got.params().collect::<Vec<_>>(), params);
            prop_assert_eq!(got.hop(), hop.unwrap_or(0));
            prop_assert_eq!(got.cost(), cost);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok((s, _)) = decode_message::<Setup<'_>>(&bytes) {
                let _ = (s.probe(), s.path(), s.role(), s.cost(), s.hop(), s.params().count());
            }
        }

        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..60)) {
            let mut msg = std::vec![body.len() as u8];
            msg.extend_from_slice(&body);
            if let Ok((s, _)) = decode_message::<Setup<'_>>(&msg) {
                prop_assert_eq!(s.params().count(), s.len());
            }
        }
    }
}

//! QMux transport parameters and in-band protocol negotiation (docs/protocol.md §1.4, §1.5).
//!
//! [`TransportParams`] is the value of a `QX_TRANSPORT_PARAMETERS` frame: a
//! sequence of `ID (i), Len (i), Value` triples. Decoding borrows the input
//! (the application protocol names stay in the received bytes) and applies
//! moq-dev's validation; encoding writes the byte-identical layout moq-dev
//! produces.

use core::fmt;

use crate::wire::{DecodeError, EncodeError, Reader, Writer, varint};

/// `max_idle_timeout` (milliseconds, 0 = disabled).
pub const MAX_IDLE_TIMEOUT: u64 = 0x01;
/// `initial_max_data` (connection-wide byte credit).
pub const INITIAL_MAX_DATA: u64 = 0x04;
/// `initial_max_stream_data_bidi_local`.
pub const INITIAL_MAX_STREAM_DATA_BIDI_LOCAL: u64 = 0x05;
/// `initial_max_stream_data_bidi_remote`.
pub const INITIAL_MAX_STREAM_DATA_BIDI_REMOTE: u64 = 0x06;
/// `initial_max_stream_data_uni`.
pub const INITIAL_MAX_STREAM_DATA_UNI: u64 = 0x07;
/// `initial_max_streams_bidi`.
pub const INITIAL_MAX_STREAMS_BIDI: u64 = 0x08;
/// `initial_max_streams_uni`.
pub const INITIAL_MAX_STREAMS_UNI: u64 = 0x09;
/// `reset_stream_at` (empty value; presence flag).
pub const RESET_STREAM_AT: u64 = 0x1d;
/// `max_datagram_frame_size` (0 = no datagrams).
pub const MAX_DATAGRAM_FRAME_SIZE: u64 = 0x20;
/// `max_record_size` (QMux; 8-byte varint `c5 71 c5 94 29 cd 08 45`).
pub const MAX_RECORD_SIZE: u64 = 0x0571_c594_29cd_0845;
/// `application_protocols` (QMux; 8-byte varint `fd 4f 9c 2a 8b 1e 60 75`).
pub const APPLICATION_PROTOCOLS: u64 = 0x3d4f_9c2a_8b1e_6075;

/// `max_record_size` when the parameter is absent, and the smallest value a peer may advertise.
// docs/protocol.md §1.3: "If absent it is 16382. A peer that advertises a value below 16382 is rejected."
pub const DEFAULT_MAX_RECORD_SIZE: u64 = 16382;

/// The values of a `QX_TRANSPORT_PARAMETERS` frame; absent integers are 0.
///
/// Integer fields that are 0 are omitted on encode, exactly as moq-dev does,
/// so the defaults of an absent parameter and of a zero value coincide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TransportParams<'a> {
    /// `0x01`: idle timeout in milliseconds; 0 = none.
    pub max_idle_timeout: u64,
    /// `0x04`: bytes the peer may send summed over all streams.
    pub initial_max_data: u64,
    /// `0x05`: per-stream limit on bidi streams the sender of these parameters opened.
    pub initial_max_stream_data_bidi_local: u64,
    /// `0x06`: per-stream limit on bidi streams the receiver of these parameters opens.
    pub initial_max_stream_data_bidi_remote: u64,
    /// `0x07`: per-stream limit on uni streams the receiver of these parameters opens.
    pub initial_max_stream_data_uni: u64,
    /// `0x08`: how many bidi streams the peer may open.
    pub initial_max_streams_bidi: u64,
    /// `0x09`: how many uni streams the peer may open.
    pub initial_max_streams_uni: u64,
    /// `0x20`: largest DATAGRAM frame accepted (type + length + data); 0 = none.
    pub max_datagram_frame_size: u64,
    /// `0x1d`: RESET_STREAM_AT accepted (qmux-02 only; never set it on qmux-01).
    pub reset_stream_at: bool,
    /// `max_record_size`; `None` = absent, meaning [`DEFAULT_MAX_RECORD_SIZE`].
    ///
    /// moq-dev always sends it (`Some(16382)`); a decoded value is never below 16382.
    pub max_record_size: Option<u64>,
    /// `application_protocols`, most preferred first; `None` = absent.
    pub application_protocols: Option<Protocols<'a>>,
}

impl<'a> TransportParams<'a> {
    /// The effective record size limit: `max_record_size` or its default.
    #[must_use]
    pub fn record_size_limit(&self) -> u64 {
        self.max_record_size.unwrap_or(DEFAULT_MAX_RECORD_SIZE)
    }

    /// Decodes a parameter block (the `Parameters` bytes of the frame, without type and length).
    ///
    /// Rules (docs/protocol.md §1.4, as the qmux crate applies them): an integer
    /// value must fill its `Len` exactly; a known ID may appear once; the
    /// QUIC-v1-only IDs `0x00`, `0x02`, `0x03`, `0x0a`–`0x10` are forbidden; any
    /// other unknown ID is skipped (repeats of an unknown ID are not tracked,
    /// as in qmux 0.5.3); `reset_stream_at` must be empty; `max_record_size`
    /// must be at least 16382; `application_protocols` must be a non-empty
    /// list of UTF-8 names that fills its value.
    ///
    /// # Errors
    /// [`DecodeError::ShortBody`] if a parameter runs past the block or an
    /// integer value past its `Len`; [`DecodeError::TrailingBytes`] if an
    /// integer does not fill its `Len`; [`DecodeError::Duplicate`];
    /// [`DecodeError::InvalidValue`] for a forbidden ID, a small
    /// `max_record_size`, a non-empty `reset_stream_at` or an empty protocol
    /// list; [`DecodeError::InvalidUtf8`] for a protocol name.
    pub fn decode(block: &'a [u8]) -> Result<Self, DecodeError> {
        let mut params = TransportParams::default();
        let mut seen: u16 = 0;
        let mut r = Reader::new(block);
        while !r.is_empty() {
            let id = r.varint().map_err(short)?;
            let len = r.varint().map_err(short)?;
            // Bounded before use: the value must lie inside the block.
            if len > r.remaining() as u64 {
                return Err(DecodeError::ShortBody);
            }
            let value = r.bytes(len as usize).map_err(short)?;
            let Some(bit) = known_bit(id) else {
                if is_forbidden(id) {
                    return Err(DecodeError::InvalidValue);
                }
                continue;
            };
            if seen & (1 << bit) != 0 {
                return Err(DecodeError::Duplicate);
            }
            seen |= 1 << bit;
            match id {
                MAX_IDLE_TIMEOUT => params.max_idle_timeout = int_value(value)?,
                INITIAL_MAX_DATA => params.initial_max_data = int_value(value)?,
                INITIAL_MAX_STREAM_DATA_BIDI_LOCAL => {
                    params.initial_max_stream_data_bidi_local = int_value(value)?;
                }
                INITIAL_MAX_STREAM_DATA_BIDI_REMOTE => {
                    params.initial_max_stream_data_bidi_remote = int_value(value)?;
                }
                INITIAL_MAX_STREAM_DATA_UNI => {
                    params.initial_max_stream_data_uni = int_value(value)?
                }
                INITIAL_MAX_STREAMS_BIDI => params.initial_max_streams_bidi = int_value(value)?,
                INITIAL_MAX_STREAMS_UNI => params.initial_max_streams_uni = int_value(value)?,
                MAX_DATAGRAM_FRAME_SIZE => params.max_datagram_frame_size = int_value(value)?,
                RESET_STREAM_AT => {
                    if !value.is_empty() {
                        return Err(DecodeError::InvalidValue);
                    }
                    params.reset_stream_at = true;
                }
                MAX_RECORD_SIZE => {
                    let v = int_value(value)?;
                    // docs/protocol.md §1.3: below 16382 is a transport-parameter error.
                    if v < DEFAULT_MAX_RECORD_SIZE {
                        return Err(DecodeError::InvalidValue);
                    }
                    params.max_record_size = Some(v);
                }
                _ => params.application_protocols = Some(Protocols::decode(value)?),
            }
        }
        Ok(params)
    }

    /// Bytes [`encode`](Self::encode) writes (the frame's `Length` value).
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        let mut n = 0;
        for (id, v) in self.integers() {
            if v != 0 {
                n += varint::len(id) + 1 + varint::len(v);
            }
        }
        if self.reset_stream_at {
            n += 2;
        }
        if let Some(p) = self.application_protocols.filter(|p| !p.is_empty()) {
            let len = p.encoded_len();
            n += varint::len(APPLICATION_PROTOCOLS) + varint::len(len as u64) + len;
        }
        n
    }

    /// Writes the parameter block in moq-dev's order, omitting zero integers.
    ///
    /// Order: `0x01`, `0x04`…`0x09`, `0x20`, `max_record_size`, `0x1d`,
    /// `application_protocols` (omitted when `None` or empty).
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`]; [`EncodeError::ValueTooLarge`] if a
    /// value exceeds 2^62 - 1. The writer may hold a partial block on error.
    pub fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if w.remaining() < self.encoded_len() {
            return Err(EncodeError::BufferTooSmall);
        }
        for (id, v) in self.integers() {
            if v != 0 {
                w.varint(id)?;
                w.varint(varint::len(v) as u64)?;
                w.varint(v)?;
            }
        }
        if self.reset_stream_at {
            w.varint(RESET_STREAM_AT)?;
            w.varint(0)?;
        }
        if let Some(p) = self.application_protocols.filter(|p| !p.is_empty()) {
            w.varint(APPLICATION_PROTOCOLS)?;
            w.varint(p.encoded_len() as u64)?;
            p.encode(w)?;
        }
        Ok(())
    }

    /// The integer parameters in encoding order (`max_record_size` absent = 0, omitted).
    fn integers(&self) -> [(u64, u64); 9] {
        [
            (MAX_IDLE_TIMEOUT, self.max_idle_timeout),
            (INITIAL_MAX_DATA, self.initial_max_data),
            (
                INITIAL_MAX_STREAM_DATA_BIDI_LOCAL,
                self.initial_max_stream_data_bidi_local,
            ),
            (
                INITIAL_MAX_STREAM_DATA_BIDI_REMOTE,
                self.initial_max_stream_data_bidi_remote,
            ),
            (
                INITIAL_MAX_STREAM_DATA_UNI,
                self.initial_max_stream_data_uni,
            ),
            (INITIAL_MAX_STREAMS_BIDI, self.initial_max_streams_bidi),
            (INITIAL_MAX_STREAMS_UNI, self.initial_max_streams_uni),
            (MAX_DATAGRAM_FRAME_SIZE, self.max_datagram_frame_size),
            (MAX_RECORD_SIZE, self.max_record_size.unwrap_or(0)),
        ]
    }
}

/// Inside a complete block, running out of bytes means the block is malformed.
fn short(e: DecodeError) -> DecodeError {
    match e {
        DecodeError::Incomplete => DecodeError::ShortBody,
        e => e,
    }
}

/// A bit per known parameter, for duplicate detection without storage.
fn known_bit(id: u64) -> Option<u32> {
    Some(match id {
        MAX_IDLE_TIMEOUT => 0,
        INITIAL_MAX_DATA..=INITIAL_MAX_STREAMS_UNI => (id - INITIAL_MAX_DATA) as u32 + 1,
        RESET_STREAM_AT => 7,
        MAX_DATAGRAM_FRAME_SIZE => 8,
        MAX_RECORD_SIZE => 9,
        APPLICATION_PROTOCOLS => 10,
        _ => return None,
    })
}

/// QUIC v1 parameters QMux forbids (docs/protocol.md §1.4).
fn is_forbidden(id: u64) -> bool {
    matches!(id, 0x00 | 0x02 | 0x03 | 0x0a..=0x10)
}

/// An integer parameter: one varint that fills the value exactly.
fn int_value(value: &[u8]) -> Result<u64, DecodeError> {
    let (v, n) = varint::decode(value).map_err(short)?;
    if n != value.len() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(v)
}

/// An `application_protocols` list: borrowed wire bytes or a caller's `&[&str]`.
///
/// Both forms iterate names in preference order and compare equal when their
/// names are equal. Wire bytes only come from [`Protocols::decode`], which has
/// already validated them.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Protocols<'a>(Repr<'a>);

#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
enum Repr<'a> {
    /// Validated wire bytes: `(Name Length (i), Name)*`, at least one name.
    Wire(&'a [u8]),
    /// A list to encode.
    List(&'a [&'a str]),
}

impl<'a> Protocols<'a> {
    /// A list to advertise, most preferred first (e.g. `&["moq-lite-05"]`).
    #[must_use]
    pub const fn from_list(list: &'a [&'a str]) -> Self {
        Protocols(Repr::List(list))
    }

    /// Validates and borrows a received `application_protocols` value.
    ///
    /// # Errors
    /// [`DecodeError::ShortBody`] if a name runs past the value;
    /// [`DecodeError::InvalidUtf8`]; [`DecodeError::InvalidValue`] for an empty list.
    pub fn decode(value: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(value);
        while !r.is_empty() {
            let n = r.varint().map_err(short)?;
            if n > r.remaining() as u64 {
                return Err(DecodeError::ShortBody);
            }
            let name = r.bytes(n as usize).map_err(short)?;
            core::str::from_utf8(name).map_err(|_| DecodeError::InvalidUtf8)?;
        }
        // docs/protocol.md §1.4: the parameter must not be present with an empty list.
        if value.is_empty() {
            return Err(DecodeError::InvalidValue);
        }
        Ok(Protocols(Repr::Wire(value)))
    }

    /// The names, most preferred first.
    #[must_use]
    pub fn iter(&self) -> ProtocolIter<'a> {
        match self.0 {
            Repr::Wire(b) => ProtocolIter(IterRepr::Wire(Reader::new(b))),
            Repr::List(l) => ProtocolIter(IterRepr::List(l.iter())),
        }
    }

    /// True if there is no name.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// True if `name` is in the list.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.iter().any(|n| n == name)
    }

    /// Bytes of the encoded value (without parameter ID and `Len`).
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        match self.0 {
            Repr::Wire(b) => b.len(),
            Repr::List(l) => l
                .iter()
                .map(|n| varint::len(n.len() as u64) + n.len())
                .sum(),
        }
    }

    /// Writes the value: each name as `Name Length (i)` + bytes, no leading count.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self.0 {
            Repr::Wire(b) => w.bytes(b),
            Repr::List(l) => l.iter().try_for_each(|n| w.str(n)),
        }
    }
}

impl PartialEq for Protocols<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Protocols<'_> {}

impl<'a> IntoIterator for Protocols<'a> {
    type Item = &'a str;
    type IntoIter = ProtocolIter<'a>;
    fn into_iter(self) -> ProtocolIter<'a> {
        self.iter()
    }
}

impl fmt::Display for Protocols<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(n)?;
        }
        Ok(())
    }
}

/// Iterator over the names of a [`Protocols`] list.
#[derive(Debug, Clone)]
pub struct ProtocolIter<'a>(IterRepr<'a>);

#[derive(Debug, Clone)]
enum IterRepr<'a> {
    Wire(Reader<'a>),
    List(core::slice::Iter<'a, &'a str>),
}

impl<'a> Iterator for ProtocolIter<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        match &mut self.0 {
            IterRepr::List(it) => it.next().copied(),
            IterRepr::Wire(r) => {
                // Validated by `Protocols::decode`; stop quietly if not.
                let n = r.length(r.remaining()).ok()?;
                core::str::from_utf8(r.bytes(n).ok()?).ok()
            }
        }
    }
}

/// The negotiated application protocol: the first name in the server's list that the client also offers.
///
/// docs/protocol.md §1.5: server preference wins, as with TLS ALPN. `None` means
/// no overlap, which a moq-lite endpoint treats as failure.
#[must_use]
pub fn select_protocol<'s>(server: Protocols<'s>, client: Protocols<'_>) -> Option<&'s str> {
    server.iter().find(|name| client.contains(name))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use proptest::prelude::*;

    fn enc(p: &TransportParams<'_>) -> Vec<u8> {
        let mut buf = [0u8; 1024];
        let mut w = Writer::new(&mut buf);
        p.encode(&mut w).unwrap();
        assert_eq!(w.position(), p.encoded_len());
        w.written().to_vec()
    }

    fn param(id: u64, value: &[u8]) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        w.varint(id).unwrap();
        w.varint(value.len() as u64).unwrap();
        w.bytes(value).unwrap();
        w.written().to_vec()
    }

    // ---- decode rules ----

    #[test]
    fn absent_means_defaults() {
        let p = TransportParams::decode(&[]).unwrap();
        assert_eq!(p, TransportParams::default());
        assert_eq!(p.record_size_limit(), 16382);
        assert_eq!(p.application_protocols, None);
    }

    #[test]
    fn duplicate_known_id_is_an_error() {
        let mut b = param(0x04, &[0x01]);
        b.extend(param(0x04, &[0x02]));
        assert_eq!(TransportParams::decode(&b), Err(DecodeError::Duplicate));
        let mut b = param(RESET_STREAM_AT, &[]);
        b.extend(param(RESET_STREAM_AT, &[]));
        assert_eq!(TransportParams::decode(&b), Err(DecodeError::Duplicate));
    }

    #[test]
    fn forbidden_ids_are_errors() {
        for id in [0x00, 0x02, 0x03, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10] {
            assert_eq!(
                TransportParams::decode(&param(id, &[0x01])),
                Err(DecodeError::InvalidValue),
                "id {id:#x}"
            );
        }
    }

    #[test]
    fn unknown_ids_are_skipped() {
        let mut b = param(0x11, &[0xde, 0xad]);
        b.extend(param(0x4000, &[]));
        b.extend(param(0x01, &[0x05]));
        b.extend(param(0x11, &[0xbe, 0xef])); // repeats of unknown IDs are not tracked (qmux 0.5.3)
        let p = TransportParams::decode(&b).unwrap();
        assert_eq!(p.max_idle_timeout, 5);
    }

    #[test]
    fn integer_must_fill_len() {
        assert_eq!(
            TransportParams::decode(&param(0x04, &[0x01, 0x00])),
            Err(DecodeError::TrailingBytes)
        );
        assert_eq!(
            TransportParams::decode(&param(0x04, &[0x40])),
            Err(DecodeError::ShortBody)
        );
        assert_eq!(
            TransportParams::decode(&param(0x04, &[])),
            Err(DecodeError::ShortBody)
        );
        // A longer-than-needed varint that fills Len is fine.
        assert_eq!(
            TransportParams::decode(&param(0x04, &[0x40, 0x07]))
                .unwrap()
                .initial_max_data,
            7
        );
    }

    #[test]
    fn value_past_the_block_is_short() {
        assert_eq!(
            TransportParams::decode(&[0x04, 0x04, 0x80]),
            Err(DecodeError::ShortBody)
        );
        assert_eq!(
            TransportParams::decode(&[0x04]),
            Err(DecodeError::ShortBody)
        );
        assert_eq!(
            TransportParams::decode(&[0x04, 0xc0]),
            Err(DecodeError::ShortBody)
        );
        // A huge Len must not be trusted.
        let b = [0x11, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(TransportParams::decode(&b), Err(DecodeError::ShortBody));
    }

    #[test]
    fn max_record_size_minimum() {
        let id = MAX_RECORD_SIZE;
        assert_eq!(
            TransportParams::decode(&param(id, &[0x7f, 0xfd])),
            Err(DecodeError::InvalidValue)
        );
        assert_eq!(
            TransportParams::decode(&param(id, &[0x7f, 0xfe]))
                .unwrap()
                .max_record_size,
            Some(16382)
        );
        let b = param(id, &[0x80, 0x01, 0x00, 0x00]);
        let p = TransportParams::decode(&b).unwrap();
        assert_eq!(p.record_size_limit(), 65536);
    }

    #[test]
    fn reset_stream_at_flag() {
        assert!(
            TransportParams::decode(&param(RESET_STREAM_AT, &[]))
                .unwrap()
                .reset_stream_at
        );
        assert_eq!(
            TransportParams::decode(&param(RESET_STREAM_AT, &[0])),
            Err(DecodeError::InvalidValue)
        );
    }

    #[test]
    fn protocols_rules() {
        assert_eq!(
            TransportParams::decode(&param(APPLICATION_PROTOCOLS, &[])),
            Err(DecodeError::InvalidValue)
        );
        assert_eq!(
            TransportParams::decode(&param(APPLICATION_PROTOCOLS, &[0x03, b'a'])),
            Err(DecodeError::ShortBody)
        );
        assert_eq!(
            TransportParams::decode(&param(APPLICATION_PROTOCOLS, &[0x01, 0xff])),
            Err(DecodeError::InvalidUtf8)
        );
        let b = param(APPLICATION_PROTOCOLS, &[0x01, b'a', 0x00, 0x02, b'b', b'c']);
        let p = TransportParams::decode(&b).unwrap();
        let names: Vec<&str> = p.application_protocols.unwrap().iter().collect();
        assert_eq!(names, ["a", "", "bc"]);
    }

    // ---- encode rules ----

    #[test]
    fn encode_omits_zero_and_keeps_order() {
        let p = TransportParams {
            max_idle_timeout: 0,
            initial_max_data: 1,
            initial_max_streams_uni: 2,
            max_datagram_frame_size: 3,
            reset_stream_at: true,
            max_record_size: Some(16382),
            application_protocols: Some(Protocols::from_list(&["x"])),
            ..Default::default()
        };
        let mut want = param(0x04, &[1]);
        want.extend(param(0x09, &[2]));
        want.extend(param(0x20, &[3]));
        want.extend(param(MAX_RECORD_SIZE, &[0x7f, 0xfe]));
        want.extend(param(RESET_STREAM_AT, &[]));
        want.extend(param(APPLICATION_PROTOCOLS, &[1, b'x']));
        assert_eq!(enc(&p), want);
        // An empty list is omitted, like moq-dev.
        let empty = TransportParams {
            application_protocols: Some(Protocols::from_list(&[])),
            ..Default::default()
        };
        assert_eq!(enc(&empty), Vec::<u8>::new());
    }

    #[test]
    fn encode_reports_small_buffer_and_large_values() {
        let p = TransportParams {
            initial_max_data: 1 << 20,
            ..Default::default()
        };
        let mut buf = [0u8; 5];
        assert_eq!(
            p.encode(&mut Writer::new(&mut buf)),
            Err(EncodeError::BufferTooSmall)
        );
        let p = TransportParams {
            initial_max_data: u64::MAX,
            ..Default::default()
        };
        let mut buf = [0u8; 32];
        assert_eq!(
            p.encode(&mut Writer::new(&mut buf)),
            Err(EncodeError::ValueTooLarge)
        );
    }

    // ---- negotiation (docs/protocol.md §1.5) ----

    #[test]
    fn server_preference_wins() {
        let relay = ["moq-lite-06", "moq-lite-05", "moq-lite-04"];
        let ours = ["moq-lite-05"];
        assert_eq!(
            select_protocol(Protocols::from_list(&relay), Protocols::from_list(&ours)),
            Some("moq-lite-05")
        );
        // A stock client offering 06 first against our server advertising only 05.
        assert_eq!(
            select_protocol(Protocols::from_list(&ours), Protocols::from_list(&relay)),
            Some("moq-lite-05")
        );
        // Both offer both: the server's order decides.
        let a = ["moq-lite-05", "moq-lite-06"];
        let b = ["moq-lite-06", "moq-lite-05"];
        assert_eq!(
            select_protocol(Protocols::from_list(&a), Protocols::from_list(&b)),
            Some("moq-lite-05")
        );
        assert_eq!(
            select_protocol(Protocols::from_list(&b), Protocols::from_list(&a)),
            Some("moq-lite-06")
        );
        assert_eq!(
            select_protocol(
                Protocols::from_list(&["moqt-16"]),
                Protocols::from_list(&ours)
            ),
            None
        );
    }

    #[test]
    fn wire_and_list_forms_agree() {
        let wire = [
            0x0b, b'm', b'o', b'q', b'-', b'l', b'i', b't', b'e', b'-', b'0', b'5', 0x04, b'm',
            b'o', b'q', b'l',
        ];
        let w = Protocols::decode(&wire).unwrap();
        let l = Protocols::from_list(&["moq-lite-05", "moql"]);
        assert_eq!(w, l);
        assert_eq!(w.encoded_len(), l.encoded_len());
        assert!(w.contains("moql") && !w.contains("moq"));
        assert_eq!(
            select_protocol(w, Protocols::from_list(&["moql"])),
            Some("moql")
        );
    }

    // ---- properties ----

    fn name() -> impl Strategy<Value = std::string::String> {
        "[a-z0-9.-]{0,20}"
    }

    proptest! {
        #[test]
        fn round_trip(
            ints in proptest::collection::vec(prop_oneof![Just(0u64), 0..=varint::MAX], 8),
            reset_stream_at in any::<bool>(),
            record in proptest::option::of(DEFAULT_MAX_RECORD_SIZE..=varint::MAX),
            names in proptest::option::of(proptest::collection::vec(name(), 1..6)),
        ) {
            let owned: Option<Vec<&str>> = names.as_ref().map(|v| v.iter().map(|s| s.as_str()).collect());
            let p = TransportParams {
                max_idle_timeout: ints[0],
                initial_max_data: ints[1],
                initial_max_stream_data_bidi_local: ints[2],
                initial_max_stream_data_bidi_remote: ints[3],
                initial_max_stream_data_uni: ints[4],
                initial_max_streams_bidi: ints[5],
                initial_max_streams_uni: ints[6],
                max_datagram_frame_size: ints[7],
                reset_stream_at,
                max_record_size: record,
                application_protocols: owned.as_deref().map(Protocols::from_list),
            };
            let bytes = enc(&p);
            prop_assert_eq!(TransportParams::decode(&bytes).unwrap(), p);
        }

        #[test]
        fn random_blocks_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Ok(p) = TransportParams::decode(&b) {
                // Whatever decodes re-encodes to something that decodes the same.
                let again = enc(&p);
                prop_assert_eq!(TransportParams::decode(&again).unwrap(), p);
            }
            if let Ok(p) = Protocols::decode(&b) {
                prop_assert!(!p.is_empty());
                let _ = p.iter().count();
            }
        }
    }
}

//! QUIC-numbered stream identifiers as QMux uses them (docs/protocol.md §1.6).
//!
//! The two low bits of an ID say who opened the stream (bit 0: 0 client,
//! 1 server) and whether it is bidirectional (bit 1: 0 bidi, 1 uni); the rest
//! is the per-kind index: `id = index << 2 | dir << 1 | initiator`.

use core::fmt;

use crate::wire::varint;

/// Which end of the TCP connection an endpoint or stream belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Side {
    /// The side that made the TCP connection.
    Client,
    /// The side that accepted the TCP connection.
    Server,
}

impl Side {
    /// The other side.
    #[must_use]
    #[cfg(test)]
    pub const fn peer(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// Whether a stream carries data both ways or only from its initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Dir {
    /// Bidirectional: both sides send and receive.
    Bidi,
    /// Unidirectional: only the initiator sends.
    Uni,
}

/// A QMux stream ID: a varint whose low two bits give initiator and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StreamId(pub u64);

impl StreamId {
    /// The largest index a stream ID can carry (the ID itself must fit a varint).
    pub const MAX_INDEX: u64 = varint::MAX >> 2;

    /// The ID of the `index`-th stream of this kind, or `None` if `index > MAX_INDEX`.
    #[must_use]
    pub const fn new(initiator: Side, dir: Dir, index: u64) -> Option<StreamId> {
        if index > Self::MAX_INDEX {
            return None;
        }
        let server = match initiator {
            Side::Client => 0,
            Side::Server => 1,
        };
        let uni = match dir {
            Dir::Bidi => 0,
            Dir::Uni => 2,
        };
        Some(StreamId((index << 2) | uni | server))
    }

    /// The raw varint value.
    #[must_use]
    pub const fn value(self) -> u64 {
        self.0
    }

    /// Who opened the stream (bit 0).
    #[must_use]
    pub const fn initiator(self) -> Side {
        if self.0 & 0x01 == 0 {
            Side::Client
        } else {
            Side::Server
        }
    }

    /// Bidirectional or unidirectional (bit 1).
    #[must_use]
    pub const fn dir(self) -> Dir {
        if self.0 & 0x02 == 0 {
            Dir::Bidi
        } else {
            Dir::Uni
        }
    }

    /// The 0-based index among streams of the same initiator and direction.
    #[must_use]
    pub const fn index(self) -> u64 {
        self.0 >> 2
    }

    /// True if the endpoint on `local` opened this stream.
    #[must_use]
    pub const fn is_local(self, local: Side) -> bool {
        matches!(
            (self.initiator(), local),
            (Side::Client, Side::Client) | (Side::Server, Side::Server)
        )
    }

    /// True if the endpoint on `local` may send STREAM data on this stream.
    #[must_use]
    pub const fn can_send(self, local: Side) -> bool {
        match self.dir() {
            Dir::Bidi => true,
            Dir::Uni => self.is_local(local),
        }
    }

    /// True if the endpoint on `local` may receive STREAM data on this stream.
    ///
    /// docs/protocol.md §1.6: a STREAM frame on a uni stream only the receiver may
    /// send on is an invalid-stream error.
    #[must_use]
    pub const fn can_recv(self, local: Side) -> bool {
        match self.dir() {
            Dir::Bidi => true,
            Dir::Uni => !self.is_local(local),
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // ---- docs/protocol.md §1.6 table ----

    #[test]
    fn numbering_matches_the_table() {
        let kinds = [
            (Side::Client, Dir::Bidi, [0u64, 4, 8, 12]),
            (Side::Server, Dir::Bidi, [1, 5, 9, 13]),
            (Side::Client, Dir::Uni, [2, 6, 10, 14]),
            (Side::Server, Dir::Uni, [3, 7, 11, 15]),
        ];
        for (side, dir, ids) in kinds {
            for (index, id) in ids.into_iter().enumerate() {
                let s = StreamId::new(side, dir, index as u64).unwrap();
                assert_eq!(s.value(), id);
                assert_eq!(s.initiator(), side);
                assert_eq!(s.dir(), dir);
                assert_eq!(s.index(), index as u64);
            }
        }
    }

    #[test]
    fn direction_rights() {
        let client_uni = StreamId(2);
        assert!(client_uni.can_send(Side::Client));
        assert!(!client_uni.can_recv(Side::Client));
        assert!(client_uni.can_recv(Side::Server));
        assert!(!client_uni.can_send(Side::Server));
        let server_bidi = StreamId(1);
        for side in [Side::Client, Side::Server] {
            assert!(server_bidi.can_send(side) && server_bidi.can_recv(side));
        }
        assert!(server_bidi.is_local(Side::Server));
        assert!(!server_bidi.is_local(Side::Server.peer()));
    }

    #[test]
    fn index_limit() {
        assert!(StreamId::new(Side::Server, Dir::Uni, StreamId::MAX_INDEX).is_some());
        assert_eq!(
            StreamId::new(Side::Server, Dir::Uni, StreamId::MAX_INDEX)
                .unwrap()
                .0,
            varint::MAX
        );
        assert!(StreamId::new(Side::Client, Dir::Bidi, StreamId::MAX_INDEX + 1).is_none());
    }

    proptest! {
        #[test]
        fn parts_round_trip(id in 0..=varint::MAX) {
            let s = StreamId(id);
            prop_assert_eq!(StreamId::new(s.initiator(), s.dir(), s.index()), Some(s));
        }
    }
}

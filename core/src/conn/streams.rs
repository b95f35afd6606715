//! The fixed-capacity stream table: per-stream send and receive state, keyed by [`StreamId`].
//!
//! A stream lives in the table from its opening until both halves are finished
//! and nothing about it is left to transmit; then [`StreamTable::sweep`] retires
//! it. IDs are never reused, so a frame naming a retired stream is recognised
//! by the connection (index below the opened count, not in the table) and
//! ignored (docs/protocol.md §2.2).

use heapless::Vec;

use super::flow::{RecvWindow, SendCredit};
use crate::wire::qmux::{Dir, Side, StreamId};

/// Where our sending half stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) enum SendState {
    /// Data may still be written.
    Open,
    /// FIN was written; nothing more may be.
    Finished,
    /// We reset it (the RESET_STREAM may still be pending).
    Reset,
}

/// Our sending half of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) struct SendHalf {
    /// Stream credit from the peer; `used` is the send offset.
    pub credit: SendCredit,
    /// Open, finished or reset.
    pub state: SendState,
    /// A RESET_STREAM with this code waits for `poll_transmit`.
    pub reset_pending: Option<u64>,
    /// The peer sent STOP_SENDING (reported once).
    pub stop_seen: bool,
}

impl SendHalf {
    /// An open half with `max` bytes of credit.
    pub const fn new(max: u64) -> Self {
        SendHalf {
            credit: SendCredit::new(max),
            state: SendState::Open,
            reset_pending: None,
            stop_seen: false,
        }
    }

    /// True once nothing more will be sent on this half.
    pub const fn is_done(&self) -> bool {
        !matches!(self.state, SendState::Open) && self.reset_pending.is_none()
    }
}

/// Where the peer's sending half (our receiving half) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) enum RecvState {
    /// Data may still arrive.
    Open,
    /// FIN arrived; the final size is `window.received()`.
    Finished,
    /// The peer reset it; every byte up to the final size counts as released.
    Reset,
    /// We asked the peer to stop; late data is charged and released at once.
    Stopped,
}

/// Our receiving half of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) struct RecvHalf {
    /// The window we grant on this stream.
    pub window: RecvWindow,
    /// Open, finished, reset or stopped.
    pub state: RecvState,
    /// A STOP_SENDING with this code waits for `poll_transmit`.
    pub stop_pending: Option<u64>,
    /// A MAX_STREAM_DATA with `window.max()` waits for `poll_transmit`.
    pub update_pending: bool,
}

impl RecvHalf {
    /// An open half with a window of `max` bytes.
    pub const fn new(max: u64) -> Self {
        RecvHalf {
            window: RecvWindow::new(max),
            state: RecvState::Open,
            stop_pending: None,
            update_pending: false,
        }
    }

    /// True once the peer will send nothing more that the application needs, and
    /// the application released everything it was given.
    pub const fn is_done(&self) -> bool {
        let ended = match self.state {
            RecvState::Open => false,
            RecvState::Finished => self.window.unreleased() == 0,
            RecvState::Reset | RecvState::Stopped => true,
        };
        ended && self.stop_pending.is_none()
    }
}

/// One entry of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) struct Stream {
    /// The stream's ID.
    pub id: StreamId,
    /// Our sending half; `None` on a uni stream the peer opened.
    pub send: Option<SendHalf>,
    /// Our receiving half; `None` on a uni stream we opened.
    pub recv: Option<RecvHalf>,
}

impl Stream {
    /// A new stream seen from `local`, with the send and receive limits that apply to it.
    pub fn new(id: StreamId, local: Side, send_max: u64, recv_max: u64) -> Self {
        Stream {
            id,
            send: id.can_send(local).then(|| SendHalf::new(send_max)),
            recv: id.can_recv(local).then(|| RecvHalf::new(recv_max)),
        }
    }

    /// True when both halves are done and the stream can be retired.
    pub fn is_done(&self) -> bool {
        self.send.is_none_or(|s| s.is_done()) && self.recv.is_none_or(|r| r.is_done())
    }
}

/// How many peer-initiated streams of each direction a [`StreamTable::sweep`] retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) struct Retired {
    /// Peer-initiated bidirectional streams.
    pub bidi: u64,
    /// Peer-initiated unidirectional streams.
    pub uni: u64,
}

/// At most `N` live streams, looked up by a linear scan (tables are small).
#[derive(Debug, Clone)]
pub(crate) struct StreamTable<const N: usize> {
    streams: Vec<Stream, N>,
}

impl<const N: usize> StreamTable<N> {
    /// An empty table.
    pub const fn new() -> Self {
        StreamTable {
            streams: Vec::new(),
        }
    }

    /// Live streams.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// The stream with this ID, if live.
    pub fn get(&self, id: StreamId) -> Option<&Stream> {
        self.streams.iter().find(|s| s.id == id)
    }

    /// The stream with this ID, if live, for update.
    pub fn get_mut(&mut self, id: StreamId) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|s| s.id == id)
    }

    /// Adds a stream.
    ///
    /// # Errors
    /// Gives the stream back if the table is full.
    pub fn insert(&mut self, stream: Stream) -> Result<(), Stream> {
        debug_assert!(self.get(stream.id).is_none());
        self.streams.push(stream)
    }

    /// All live streams, for update.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Stream> {
        self.streams.iter_mut()
    }

    /// Removes every finished stream and counts the peer-initiated ones per direction.
    pub fn sweep(&mut self, local: Side) -> Retired {
        let mut retired = Retired::default();
        let mut i = 0;
        while let Some(s) = self.streams.get(i) {
            if !s.is_done() {
                i += 1;
                continue;
            }
            let s = self.streams.swap_remove(i);
            trace!("stream {} retired", s.id.value());
            if !s.id.is_local(local) {
                match s.id.dir() {
                    Dir::Bidi => retired.bidi += 1,
                    Dir::Uni => retired.uni += 1,
                }
            }
        }
        retired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(side: Side, dir: Dir, index: u64) -> StreamId {
        StreamId::new(side, dir, index).unwrap()
    }

    // ---- halves by kind ----

    #[test]
    fn halves_follow_the_direction_bits() {
        let local = Side::Client;
        let ours_uni = Stream::new(id(Side::Client, Dir::Uni, 0), local, 5, 6);
        assert!(ours_uni.send.is_some() && ours_uni.recv.is_none());
        let theirs_uni = Stream::new(id(Side::Server, Dir::Uni, 0), local, 5, 6);
        assert!(theirs_uni.send.is_none() && theirs_uni.recv.is_some());
        let bidi = Stream::new(id(Side::Server, Dir::Bidi, 0), local, 5, 6);
        assert_eq!(bidi.send.unwrap().credit.max(), 5);
        assert_eq!(bidi.recv.unwrap().window.max(), 6);
    }

    // ---- retirement ----

    #[test]
    fn retires_only_when_both_halves_are_done() {
        let local = Side::Server;
        let mut t = StreamTable::<4>::new();
        let sid = id(Side::Client, Dir::Bidi, 0);
        t.insert(Stream::new(sid, local, 10, 10)).unwrap();
        let s = t.get_mut(sid).unwrap();
        let recv = s.recv.as_mut().unwrap();
        recv.window.receive(3).unwrap();
        recv.state = RecvState::Finished;
        assert_eq!(t.sweep(local), Retired::default());
        let s = t.get_mut(sid).unwrap();
        s.recv.as_mut().unwrap().window.release(3);
        assert_eq!(t.sweep(local), Retired::default(), "send half still open");
        let send = t.get_mut(sid).unwrap().send.as_mut().unwrap();
        send.state = SendState::Reset;
        send.reset_pending = Some(1);
        assert_eq!(t.sweep(local), Retired::default(), "reset not yet sent");
        t.get_mut(sid).unwrap().send.as_mut().unwrap().reset_pending = None;
        assert_eq!(t.sweep(local), Retired { bidi: 1, uni: 0 });
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn own_streams_do_not_count_as_peer_retirements() {
        let local = Side::Client;
        let mut t = StreamTable::<2>::new();
        let sid = id(Side::Client, Dir::Uni, 0);
        t.insert(Stream::new(sid, local, 10, 10)).unwrap();
        t.get_mut(sid).unwrap().send.as_mut().unwrap().state = SendState::Finished;
        assert_eq!(t.sweep(local), Retired::default());
        assert!(t.get(sid).is_none());
    }

    #[test]
    fn full_table_gives_the_stream_back() {
        let local = Side::Client;
        let mut t = StreamTable::<1>::new();
        t.insert(Stream::new(id(Side::Client, Dir::Uni, 0), local, 1, 1))
            .unwrap();
        assert!(
            t.insert(Stream::new(id(Side::Client, Dir::Uni, 1), local, 1, 1))
                .is_err()
        );
    }
}

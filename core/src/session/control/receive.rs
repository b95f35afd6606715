//! Receiving on control streams: stream bytes into the receive FIFO, complete
//! messages at its front to the handler of the slot's kind, the type of a
//! stream the peer opened, and the peer's FIN.

use core::cmp::min;

use super::decode::Too;
use super::{AnnounceState, FetchState, Kind, Step, SubState};
use crate::session::Session;
use crate::time::Instant;
use crate::transport::Transport;
use crate::wire::lite::{BidiStreamType, SessionCode, StreamCode};
use crate::wire::qmux::{Dir, StreamId};
use crate::wire::varint;

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// A new stream opened by the peer: its first bytes.
    pub(in crate::session) fn new_peer_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
    ) -> usize {
        match id.dir() {
            Dir::Bidi => match self.alloc_control(Kind::Peer, Dir::Bidi, Some(id)) {
                Some(slot) => {
                    // Our answers go before any group's bytes.
                    self.conn.set_priority(id, i32::MAX);
                    self.control_data(now, slot, data, fin)
                }
                None => {
                    debug!(
                        "session: control table full, refusing stream {}",
                        id.value()
                    );
                    let _ = self.conn.reset_stream(id, StreamCode::Internal.to_code());
                    let _ = self.conn.stop_sending(id, StreamCode::Internal.to_code());
                    data.len()
                }
            },
            Dir::Uni => self.new_uni_stream(now, id, data, fin),
        }
    }

    /// Bytes for control slot `slot`; returns how many were taken (fewer only
    /// when the stream's buffer is full of a message held for `poll_event`).
    pub(in crate::session) fn control_data(
        &mut self,
        _now: Instant,
        slot: usize,
        data: &[u8],
        fin: bool,
    ) -> usize {
        let Some(id) = self.control[slot].stream else {
            return data.len();
        };
        if let Kind::FetchOut { sub } = self.control[slot].kind {
            return self.fetch_answer_data(_now, slot, sub, data, fin);
        }
        let mut used = 0;
        loop {
            if self.is_closed() || self.control[slot].stream != Some(id) {
                return data.len();
            }
            let c = self.control[slot];
            if c.rx_done {
                self.conn.release(id, (data.len() - used) as u64);
                return data.len();
            }
            let room = self.buf.saturating_sub(c.rx_keep + c.rx_len);
            let n = min(room, data.len() - used);
            if n > 0 && !self.ensure_rx_chunk(slot) {
                // No control buffer free: the bytes wait for one (another
                // slot's answer going out gives one back).
                return used;
            }
            if let Some(base) = self.rx_base(slot)
                && n > 0
            {
                let start = base + c.rx_keep + c.rx_len;
                if let (Some(dst), Some(src)) = (
                    self.chunks.get_mut(start..start + n),
                    data.get(used..used + n),
                ) {
                    dst.copy_from_slice(src);
                }
            }
            self.control[slot].rx_len += n;
            used += n;
            // Control streams are not paced: the bytes are ours now.
            self.conn.release(id, n as u64);
            if used == data.len() && fin {
                self.control[slot].rx_fin = true;
            }
            self.process_rx(slot);
            if self.control[slot].stream == Some(id) {
                self.trim_slot(slot);
            }
            if used == data.len() {
                return used;
            }
            if self.control[slot].stream != Some(id) {
                return data.len();
            }
            let c = self.control[slot];
            if c.rx_keep + c.rx_len < self.buf {
                continue;
            }
            if c.event > 0 || !self.has_event_room() {
                // Waiting for the application: backpressure.
                return used;
            }
            // A full buffer and no complete message: it can never fit.
            self.too_large(slot);
            return data.len();
        }
    }

    /// A message longer than the buffer: refuse the stream (or close the session
    /// for the streams it cannot do without).
    fn too_large(&mut self, slot: usize) {
        match self.control[slot].kind {
            Kind::SetupIn { .. } | Kind::GoawayIn { .. } => {
                self.fail(SessionCode::Internal, "control message too large")
            }
            Kind::AnnounceOut { id, .. } => {
                self.announce_ended(slot, id, Some(StreamCode::Internal.to_code()));
                if self.control[slot].ended.is_some() {
                    // The end waits in the slot: stop both halves, keep it.
                    self.reset_tx(slot, StreamCode::Internal);
                    self.stop_rx(slot, StreamCode::Internal);
                } else {
                    self.refuse(slot, StreamCode::Internal);
                }
            }
            Kind::SubscribeOut { sub } => {
                self.refuse(slot, StreamCode::Internal);
                self.subscription_closed(sub, Some(StreamCode::Internal.to_code()));
            }
            _ => self.refuse(slot, StreamCode::Internal),
        }
    }

    /// Handles complete messages at the front of `slot`'s receive buffer, then a FIN.
    pub(in crate::session) fn process_rx(&mut self, slot: usize) {
        loop {
            if self.is_closed() {
                return;
            }
            let c = self.control[slot];
            if c.kind == Kind::Free || c.event > 0 || c.rx_done {
                return;
            }
            if c.rx_len == 0 {
                if c.rx_fin {
                    self.control[slot].rx_fin = false;
                    self.control[slot].rx_done = true;
                    self.on_control_fin(slot);
                }
                return;
            }
            if !self.has_event_room() {
                return;
            }
            let limit = self.buf - c.rx_keep;
            let step = match c.kind {
                Kind::Free => return,
                Kind::Peer => self.parse_stream_type(slot),
                Kind::SetupIn { done } => self.parse_setup(slot, done, limit),
                Kind::AnnounceIn { state } => self.parse_announce_request(slot, state, limit),
                Kind::TrackIn { done, deferred } => self.parse_track(slot, done, deferred, limit),
                Kind::SubscribeIn { served } => self.parse_subscribe(slot, served, limit),
                Kind::GoawayIn { done } => self.parse_goaway(slot, done, limit),
                Kind::FetchIn { state } => self.parse_fetch(slot, state, limit),
                // Its bytes never reach the FIFO (see `fetch_answer_data`).
                Kind::FetchOut { .. } => Step::Consumed(c.rx_len),
                Kind::AnnounceOut { id, publisher } => {
                    self.parse_announce(slot, id, publisher, limit)
                }
                Kind::TrackOut { sub, done } => self.parse_track_info(slot, sub, done, limit),
                Kind::SubscribeOut { sub } => self.parse_response(slot, sub),
                Kind::SetupOut | Kind::GoawayOut => Step::Consumed(c.rx_len),
            };
            if !matches!(step, Step::Wait) {
                self.control[slot].partial_since = None;
            }
            if matches!(step, Step::Defer) {
                self.deferred = true;
                return;
            }
            match step {
                Step::Consumed(n) => self.rx_consume(slot, n),
                Step::Held(n) => {
                    self.control[slot].event = n;
                    return;
                }
                Step::Wait => {
                    if self.control[slot].partial_since.is_none() {
                        self.control[slot].partial_since = Some(self.now);
                    }
                    if self.control[slot].rx_fin {
                        // The stream ended inside a message.
                        self.fail(SessionCode::ProtocolViolation, "truncated control message");
                    }
                    return;
                }
                Step::Stop | Step::Defer => return,
            }
        }
    }

    /// Maps a decode failure to the step to take.
    pub(in crate::session) fn on_decode_error(&mut self, slot: usize, e: Too) -> Step {
        match e {
            Too::Incomplete => Step::Wait,
            Too::Large => {
                // Let the caller see the full buffer first: only then is it too large.
                let c = self.control[slot];
                if c.rx_keep + c.rx_len >= self.buf {
                    self.too_large(slot);
                    Step::Stop
                } else {
                    Step::Wait
                }
            }
            Too::Malformed => {
                self.fail(SessionCode::ProtocolViolation, "malformed control message");
                Step::Stop
            }
        }
    }

    /// A peer bidi stream's type (docs/protocol.md §3.3); read only after the peer's SETUP (§3.4).
    fn parse_stream_type(&mut self, slot: usize) -> Step {
        if self.peer.is_none() {
            return Step::Wait;
        }
        let (code, n) = match varint::decode(self.rx_data(slot)) {
            Ok(v) => v,
            Err(_) => return Step::Wait,
        };
        let kind = match BidiStreamType::from_code(code) {
            Some(BidiStreamType::Announce) => Kind::AnnounceIn {
                state: AnnounceState::Request,
            },
            Some(BidiStreamType::Track) => Kind::TrackIn {
                done: false,
                deferred: false,
            },
            Some(BidiStreamType::Subscribe) => Kind::SubscribeIn {
                served: SubState::Waiting,
            },
            Some(BidiStreamType::Goaway) => {
                // docs/protocol.md §3.12: at most one per direction.
                if self.goaway_received {
                    self.fail(SessionCode::ProtocolViolation, "second GOAWAY");
                    return Step::Stop;
                }
                self.goaway_received = true;
                Kind::GoawayIn { done: false }
            }
            Some(BidiStreamType::Fetch) => Kind::FetchIn {
                state: FetchState::Waiting,
            },
            // §3.11: we advertise no Probe level and do not implement probing.
            // Unknown types (§3.3): refuse the stream only.
            Some(BidiStreamType::Probe) | None => {
                debug!("session: refusing bidi stream type {}", code);
                self.refuse(slot, StreamCode::Internal);
                return Step::Stop;
            }
        };
        self.control[slot].kind = kind;
        Step::Consumed(n)
    }

    /// The peer's FIN on a control stream, after everything before it was handled.
    fn on_control_fin(&mut self, slot: usize) {
        match self.control[slot].kind {
            Kind::Free => {}
            Kind::SetupIn { done } => {
                if !done {
                    self.fail(SessionCode::ProtocolViolation, "SETUP stream ended early");
                }
            }
            Kind::AnnounceOut { id, .. } => {
                self.announce_ended(slot, id, None);
                self.control[slot].fin = true;
            }
            Kind::TrackOut { sub, done } => {
                if !done {
                    // Finished without TRACK_INFO.
                    self.control[slot].fin = true;
                    self.track_failed(sub, StreamCode::Internal.to_code());
                }
            }
            Kind::SubscribeOut { sub } => {
                self.control[slot].fin = true;
                self.subscription_ended(sub);
            }
            Kind::SubscribeIn { served } => {
                // docs/protocol.md §3.8: the subscriber's FIN cancels; answer with FIN.
                if let SubState::Serving(i) = served {
                    self.end_served(i, StreamCode::Cancel);
                }
                self.control[slot].kind = Kind::SubscribeIn {
                    served: SubState::Done,
                };
                self.control[slot].fin = true;
            }
            Kind::FetchIn { state } => match state {
                // Ended before its FETCH.
                FetchState::Waiting => self.refuse(slot, StreamCode::Internal),
                // The requester's FIN cancels (§3.10): an answer cut short is
                // reset, never finished.
                FetchState::Serving | FetchState::Missed { .. } => {
                    self.cancel_fetch(slot, StreamCode::Cancel);
                    self.reset_tx(slot, StreamCode::Cancel);
                }
                FetchState::Done => {}
            },
            Kind::AnnounceIn { .. } | Kind::Peer | Kind::GoawayIn { .. } => {
                self.control[slot].fin = true;
            }
            Kind::TrackIn { .. } | Kind::SetupOut | Kind::GoawayOut | Kind::FetchOut { .. } => {}
        }
    }
}

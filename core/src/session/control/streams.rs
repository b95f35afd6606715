//! The life of a control stream: opening it (stream credit permitting),
//! flushing its send FIFO, refusing, resetting and stopping it, the peer's
//! resets and STOP_SENDINGs, and freeing the slot once both halves are over.

use super::{Control, Kind, SubState};
use crate::session::publisher::Flushed;
use crate::session::{Error, Session};
use crate::time::Instant;
use crate::transport::Transport;
use crate::wire::lite::{SessionCode, StreamCode};
use crate::wire::qmux::{Side, StreamId};

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Refuses a peer request: reset our half and stop reading, both with `code`,
    /// and free the slot (docs/protocol.md §3.3, §3.8).
    pub(in crate::session) fn refuse(&mut self, slot: usize, code: StreamCode) {
        debug!("session: refusing control stream, code {}", code.to_code());
        self.detach_control(slot, code);
        if let Some(id) = self.control[slot].stream {
            if id.can_send(self.side) {
                let _ = self.conn.reset_stream(id, code.to_code());
            }
            if id.can_recv(self.side) {
                let _ = self.conn.stop_sending(id, code.to_code());
            }
        }
        self.free_slot(slot);
    }

    /// Resets our sending half of `slot` with `code` (pending bytes are dropped).
    pub(in crate::session) fn reset_tx(&mut self, slot: usize, code: StreamCode) {
        let c = &mut self.control[slot];
        if c.tx_done {
            return;
        }
        c.tx_len = 0;
        c.fin = false;
        c.tx_done = true;
        match c.stream {
            Some(id) => {
                let _ = self.conn.reset_stream(id, code.to_code());
            }
            // Never opened: nothing was sent, nothing to say.
            None => c.rx_done = true,
        }
    }

    /// Stops reading `slot` (the peer's further bytes are discarded).
    pub(in crate::session) fn stop_rx(&mut self, slot: usize, code: StreamCode) {
        let c = &mut self.control[slot];
        if c.rx_done {
            return;
        }
        c.rx_done = true;
        c.rx_len = 0;
        c.rx_fin = false;
        if let Some(id) = c.stream {
            let _ = self.conn.stop_sending(id, code.to_code());
        }
    }

    /// Marks a slot unused.
    pub(in crate::session) fn free_slot(&mut self, slot: usize) {
        debug_assert!(
            self.control[slot].ended.is_none(),
            "a waiting end is never freed"
        );
        if self.surfaced == Some(slot) {
            self.surfaced = None;
        }
        self.release_chunks(slot);
        self.control[slot] = Control::FREE;
    }

    /// Frees slots whose both halves are over.
    pub(in crate::session) fn sweep_control(&mut self) {
        for slot in 0..self.control.span() {
            let c = &self.control[slot];
            if c.kind != Kind::Free
                && c.tx_done
                && c.rx_done
                && c.event == 0
                && c.ended.is_none()
                && self.surfaced != Some(slot)
            {
                self.detach_control(slot, StreamCode::Cancel);
                self.free_slot(slot);
            }
        }
    }

    /// Lets go of what a slot refers to before it is freed (served subscriptions
    /// and their group streams; our subscriptions' pending SUBSCRIBE).
    fn detach_control(&mut self, slot: usize, code: StreamCode) {
        match self.control[slot].kind {
            Kind::SubscribeIn {
                served: SubState::Serving(i),
            } => self.end_served(i, code),
            Kind::TrackOut { sub, done: false } => self.track_failed(sub, code.to_code()),
            Kind::FetchIn { .. } => self.cancel_fetch(slot, code),
            _ => {}
        }
    }

    /// Opens the streams of slots that wait for one (stream credit permitting).
    pub(in crate::session) fn open_pending(&mut self) {
        for slot in 0..self.control.span() {
            let c = self.control[slot];
            if c.kind == Kind::Free || c.stream.is_some() || c.held || c.tx_done {
                continue;
            }
            match self.conn.open_stream(c.dir) {
                Ok(id) => {
                    // Requests and their answers go before any group's bytes.
                    self.conn.set_priority(id, i32::MAX);
                    self.control[slot].stream = Some(id);
                }
                Err(_) => return,
            }
        }
    }

    /// Writes pending control bytes into `out`; returns the bytes written and
    /// whether the transport took any.
    pub(in crate::session) fn flush_control(&mut self, now: Instant, out: &mut [u8]) -> Flushed {
        let mut pos = 0;
        let mut moved = false;
        for slot in 0..self.control.span() {
            while self.control[slot].wants_flush() {
                let c = self.control[slot];
                let Some(id) = c.stream else { break };
                let base = self.tx_base(slot).unwrap_or(0) + c.tx_keep;
                let data = if c.tx_len == 0 {
                    &[][..]
                } else {
                    self.chunks.get(base..base + c.tx_len).unwrap_or(&[])
                };
                let Some(room) = out.get_mut(pos..) else {
                    return Flushed::control(pos, moved);
                };
                match self.conn.write_stream(now, id, data, c.fin, room) {
                    Ok(w) => {
                        pos += w.out;
                        moved = true;
                        let c = &mut self.control[slot];
                        let rest = c.tx_len - w.data;
                        if let Some(region) = self.chunks.get_mut(base..base + c.tx_len) {
                            region.copy_within(w.data.., 0);
                        }
                        c.tx_len = rest;
                        if c.fin && rest == 0 {
                            c.tx_done = true;
                            c.fin = false;
                        }
                    }
                    Err(crate::conn::WriteError::Blocked) => break,
                    Err(crate::conn::WriteError::BufferTooSmall) => {
                        return Flushed::control(pos, moved);
                    }
                    Err(_) => {
                        // Reset, finished or gone underneath: nothing more to send.
                        let c = &mut self.control[slot];
                        c.tx_len = 0;
                        c.fin = false;
                        c.tx_done = true;
                    }
                }
            }
        }
        Flushed::control(pos, moved)
    }

    /// The peer reset its half of a stream.
    pub(in crate::session) fn on_stream_reset(&mut self, id: StreamId, code: u64) {
        if let Some(slot) = self.control_slot(id) {
            let c = &mut self.control[slot];
            c.rx_done = true;
            c.rx_len = 0;
            c.rx_fin = false;
            match c.kind {
                Kind::SetupIn { done: false } => {
                    self.fail(SessionCode::ProtocolViolation, "SETUP stream reset");
                }
                Kind::AnnounceOut { id, .. } => {
                    self.announce_ended(slot, id, Some(code));
                    self.reset_tx(slot, StreamCode::Cancel);
                }
                Kind::TrackOut { sub, done } => {
                    self.reset_tx(slot, StreamCode::Cancel);
                    if !done {
                        self.track_failed(sub, code);
                    }
                }
                Kind::SubscribeOut { sub } => {
                    self.reset_tx(slot, StreamCode::Cancel);
                    self.subscription_closed(sub, Some(code));
                }
                Kind::SubscribeIn { served } => {
                    if let SubState::Serving(i) = served {
                        self.end_served(i, StreamCode::Cancel);
                    }
                    self.control[slot].kind = Kind::SubscribeIn {
                        served: SubState::Done,
                    };
                    self.reset_tx(slot, StreamCode::Cancel);
                }
                Kind::FetchIn { .. } => {
                    self.cancel_fetch(slot, StreamCode::Cancel);
                    self.reset_tx(slot, StreamCode::Cancel);
                }
                Kind::FetchOut { sub } => {
                    // The publisher refused (or cut short) the fetch.
                    self.group_reset(id, code);
                    self.reset_tx(slot, StreamCode::Cancel);
                    self.subscription_closed(sub, Some(code));
                }
                Kind::AnnounceIn { .. } | Kind::Peer => self.reset_tx(slot, StreamCode::Cancel),
                _ => {}
            }
            return;
        }
        self.group_reset(id, code);
    }

    /// The peer will not read what we send on a stream.
    pub(in crate::session) fn on_stop_sending(&mut self, id: StreamId, code: u64) {
        if let Some(slot) = self.control_slot(id) {
            let code = StreamCode::from_code(code);
            self.cancel_fetch(slot, code);
            if let Kind::SubscribeIn { served } = self.control[slot].kind {
                if let SubState::Serving(i) = served {
                    self.end_served(i, StreamCode::Cancel);
                }
                self.control[slot].kind = Kind::SubscribeIn {
                    served: SubState::Done,
                };
            }
            self.reset_tx(slot, code);
            return;
        }
        self.group_stopped(id, code);
    }

    /// Fails unless requests may be made now.
    pub(in crate::session) fn check_ready(&self) -> Result<(), Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if !self.conn.is_established() {
            return Err(Error::NotReady);
        }
        // docs/protocol.md §4.1: a server's names are relative to the root
        // the client's SETUP gives.
        if self.side == Side::Server && self.peer.is_none() {
            return Err(Error::NotReady);
        }
        Ok(())
    }
}

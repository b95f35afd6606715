//! TRACK requests: the peer's, answered with the local track's TRACK_INFO
//! (deferred while a relay track still waits for its upstream's), and the
//! TRACK_INFO on ours.

use super::decode::decode_within;
use super::fifo::rx_of;
use super::paths::rooted;
use super::{Kind, Step};
use crate::model::track;
use crate::session::Session;
use crate::session::resolve::{lookup, lookup_or_resolve};
use crate::transport::Transport;
use crate::wire::lite::{SessionCode, StreamCode, Track, TrackInfo, write_message};

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// The peer's TRACK requests waiting for TRACK_INFO now.
    fn waiting_tracks(&self) -> usize {
        self.control
            .iter()
            .filter(|c| matches!(c.kind, Kind::TrackIn { deferred: true, .. }))
            .count()
    }

    /// Parses the peer's TRACK request and answers it (docs/protocol.md §3.7).
    pub(super) fn parse_track(
        &mut self,
        slot: usize,
        done: bool,
        deferred: bool,
        limit: usize,
    ) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after TRACK");
            return Step::Stop;
        }
        let origin = self.origin;
        let resolver = self.resolver;
        let requester = self.peer_hop();
        // Over the limit of waiting requests, a new one is not resolved:
        // only a track whose values are known can answer it.
        let over = !deferred && self.waiting_tracks() >= self.max_waiting_tracks;
        let data = rx_of(self.chunks, &self.control[slot], self.buf);
        let answer = match decode_within::<Track<'_>>(data, limit) {
            Ok((t, n)) => {
                let found = match rooted(&self.root, t.broadcast, &mut self.scratch) {
                    // docs/protocol.md §4.10: outside the peer's scope.
                    Some(path) if !Self::visible(self.scope, path.as_str()) => {
                        Err(StreamCode::Unroutable)
                    }
                    Some(path) if over => match lookup(origin, path, t.track, requester) {
                        Err(StreamCode::NotFound) => Err(StreamCode::Evicted),
                        found => found,
                    },
                    // Asked again while waiting for TRACK_INFO: only the
                    // track resolved then (or a newer one of its name), or,
                    // while its broadcast waits for a new source, that one.
                    Some(path) if deferred => match lookup(origin, path, t.track, requester) {
                        Err(StreamCode::Unroutable) => resolver
                            .and_then(|r| r.waiting(path, t.track))
                            .ok_or(StreamCode::Unroutable),
                        found => found,
                    },
                    Some(path) => lookup_or_resolve(origin, resolver, path, t.track, requester),
                    None => Err(StreamCode::NotFound),
                };
                Ok((n, found))
            }
            Err(e) => Err(e),
        };
        // A relay track re-serves its upstream's TRACK_INFO (docs/protocol.md
        // §3.7): wait for it, unless the track ended without it.
        let answer = match answer {
            Ok((n, Ok(track))) if !track.info_known() => match track.status() {
                track::Status::Open if over => Ok((n, Err(StreamCode::Evicted))),
                track::Status::Open => {
                    self.control[slot].kind = Kind::TrackIn {
                        done: false,
                        deferred: true,
                    };
                    return Step::Defer;
                }
                track::Status::Aborted(code) => Ok((n, Err(StreamCode::from_code(code)))),
                track::Status::Finished => Ok((n, Err(StreamCode::NotFound))),
            },
            Ok((n, Ok(track))) => Ok((n, Ok(track.info().to_wire()))),
            Ok((n, Err(code))) => Ok((n, Err(code))),
            Err(e) => Err(e),
        };
        if over && matches!(answer, Ok((_, Err(StreamCode::Evicted)))) {
            debug!("session: too many TRACK requests waiting, refusing one");
            self.refused_tracks += 1;
        }
        match answer {
            Ok((n, Ok(info))) => {
                self.control[slot].kind = Kind::TrackIn {
                    done: true,
                    deferred: false,
                };
                // The request is parsed: its buffer goes back before the
                // answer takes one, so an answer always finds a buffer even
                // when every other one holds a request still waiting.
                self.rx_consume(slot, n);
                self.trim_slot(slot);
                if self.tx_write(slot, |w| write_message(&info, w)).is_err() {
                    self.refuse(slot, StreamCode::Internal);
                    return Step::Stop;
                }
                self.control[slot].fin = true;
                Step::Consumed(0)
            }
            Ok((_, Err(code))) => {
                self.refuse(slot, code);
                Step::Stop
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }

    /// TRACK_INFO on our TRACK request (docs/protocol.md §3.7).
    pub(super) fn parse_track_info(
        &mut self,
        slot: usize,
        sub: u64,
        done: bool,
        limit: usize,
    ) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after TRACK_INFO");
            return Step::Stop;
        }
        match decode_within::<TrackInfo>(self.rx_data(slot), limit) {
            Ok((info, n)) => {
                self.rx_consume(slot, n);
                if self.control[slot].rx_len > 0 {
                    self.fail(SessionCode::ProtocolViolation, "data after TRACK_INFO");
                    return Step::Stop;
                }
                // moq-dev FINs its side after reading TRACK_INFO.
                self.control[slot].fin = true;
                self.control[slot].kind = Kind::TrackOut { sub, done: true };
                self.on_track_info(sub, info);
                Step::Consumed(0)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }
}

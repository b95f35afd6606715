//! Fetch streams the peer opens (docs/protocol.md §3.10): one FETCH names a
//! group; the answer is the group's stored bytes (its FRAMEs, timestamps from
//! 0, exactly what follows a GROUP header) on the same stream, then FIN.
//!
//! A whole group held by a local track (finished, not trimmed) is answered
//! at once by a group-stream entry of the publisher side (see
//! `publisher::serve_fetch`), which shares the group's pool blocks like any
//! group stream and is paced by the stream's credit. A group still being
//! written is not held whole, nor is one older than the track keeps.
//! Anything else is refused with a stream code, or, with
//! [`Config::fetch_misses`](crate::session::Config::fetch_misses), handed to
//! the application as [`Event::Fetch`](crate::session::Event::Fetch)(crate::session::Event::Fetch), which
//! answers it later with a group of its own ([`Session::answer_fetch`]) or
//! refuses it ([`Session::refuse_fetch`]).
//!
//! Refusals reset our half and stop the peer's, never the session: a FETCH
//! that does not decode or ends early is INTERNAL (0x0, moq-lite has no
//! stream-level protocol violation), an unknown broadcast UNROUTABLE (0x36),
//! an unknown track or group NOT_FOUND (0x33), a FETCH over
//! [`Config::max_fetches`](crate::session::Config::max_fetches) EVICTED
//! (0x35). The requester's FIN, reset or STOP_SENDING cancels the fetch
//! (moq-lite-05 has no message after FETCH, and an answer cut short would
//! read as whole, so a cancelled answer is reset, never finished).

use super::decode::Too;
use super::{FetchState, Kind, Step, decode_within, rooted, rx_of};
use crate::model::group;
use crate::session::event::FetchId;
use crate::session::resolve::lookup;
use crate::session::{Error, Session};
use crate::transport::Transport;
use crate::wire::lite::{Fetch, StreamCode};
use crate::wire::qmux::StreamId;

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// FETCH on a Fetch stream the peer opened; nothing may follow it.
    pub(in crate::session) fn parse_fetch(
        &mut self,
        slot: usize,
        state: FetchState,
        limit: usize,
    ) -> Step {
        if state != FetchState::Waiting {
            // moq-lite-05 defines no message after FETCH.
            debug!("session: bytes after FETCH, refusing the stream");
            // Refusing detaches the slot, which cancels its answer.
            self.refuse(slot, StreamCode::Internal);
            return Step::Stop;
        }
        let origin = self.origin;
        let requester = self.peer_hop();
        let decoded = match decode_within::<Fetch<'_>>(
            rx_of(self.chunks, &self.control[slot], self.buf),
            limit,
        ) {
            Ok((f, n)) => {
                let (found, visible) = match rooted(&self.root, f.broadcast, &mut self.scratch) {
                    // docs/protocol.md §4.10: outside the peer's scope.
                    Some(path) if !Self::visible(self.scope, path.as_str()) => {
                        (Err(StreamCode::Unroutable), false)
                    }
                    Some(path) => (lookup(origin, path, f.track, requester), true),
                    None => (Err(StreamCode::NotFound), false),
                };
                Ok((n, f.group, f.priority, found, visible))
            }
            Err(e) => Err(e),
        };
        let (n, seq, priority, found, visible) = match decoded {
            Ok(v) => v,
            Err(Too::Incomplete) if !self.control[slot].rx_fin => return Step::Wait,
            Err(Too::Large) => return self.on_decode_error(slot, Too::Large),
            Err(_) => {
                debug!("session: malformed or truncated FETCH, refusing the stream");
                self.refuse(slot, StreamCode::Internal);
                return Step::Stop;
            }
        };
        if self.active_fetches() >= self.max_fetches {
            debug!("session: fetch limit reached, refusing");
            self.refuse(slot, StreamCode::Evicted);
            return Step::Stop;
        }
        let Some(id) = self.control[slot].stream else {
            return Step::Stop;
        };
        // Only a whole group is answered: the answer has no header, so a
        // group still being written could be followed only by holding the
        // stream for as long as its producer takes.
        let group = found.and_then(|t| {
            t.group(seq)
                .filter(|g| !g.is_trimmed() && g.is_finished())
                .ok_or(StreamCode::NotFound)
        });
        match group {
            Ok(consumer) => {
                if !self.serve_fetch(slot, id, priority, consumer) {
                    debug!("session: group-stream table full, refusing fetch");
                    self.refuse(slot, StreamCode::Evicted);
                    return Step::Stop;
                }
                let c = &mut self.control[slot];
                c.kind = Kind::FetchIn {
                    state: FetchState::Serving,
                };
                // The group-stream entry sends on the stream from now on.
                c.tx_done = true;
                Step::Consumed(n)
            }
            // Only a path the peer may see goes to the application.
            Err(code) if self.fetch_misses && visible => {
                let fetch = self.next_fetch;
                self.next_fetch += 1;
                self.control[slot].kind = Kind::FetchIn {
                    state: FetchState::Missed {
                        id: fetch,
                        code,
                        priority,
                    },
                };
                // Held for `poll_event`, which reports it as `Event::Fetch`.
                Step::Held(n)
            }
            Err(code) => {
                self.refuse(slot, code);
                Step::Stop
            }
        }
    }

    /// FETCHes answered or waiting for an answer.
    pub(in crate::session) fn active_fetches(&self) -> usize {
        self.control
            .iter()
            .filter(|c| matches!(c.kind, Kind::FetchIn { state } if state.is_active()))
            .count()
    }

    /// The control slot of the missed fetch `fetch`, still waiting.
    fn missed_slot(&self, fetch: FetchId) -> Option<usize> {
        self.control.iter().position(|c| {
            c.stream.is_some()
                && matches!(c.kind, Kind::FetchIn { state: FetchState::Missed { id, .. } } if id == fetch.0)
        })
    }

    /// Answers the fetch [`Event::Fetch`](crate::session::Event::Fetch) reported as `fetch` with the whole
    /// group `group` reads from its start (a finished group of a local track
    /// the application filled): its stored bytes go out on the Fetch stream
    /// as they would from a held group. With no group-stream entry free, the
    /// fetch is refused with EVICTED (0x35) instead.
    ///
    /// # Errors
    /// [`Error::Closed`] once the session is over, [`Error::Unknown`] if no
    /// such fetch waits (already answered, or cancelled by the peer),
    /// [`Error::Invalid`] for a group not finished or trimmed (the fetch
    /// is refused with INTERNAL 0x0).
    pub fn answer_fetch(
        &mut self,
        fetch: FetchId,
        group: group::Consumer<'a, 'p>,
    ) -> Result<(), Error> {
        self.dirty = true;
        if self.is_closed() {
            return Err(Error::Closed);
        }
        let slot = self.missed_slot(fetch).ok_or(Error::Unknown)?;
        if self.surfaced == Some(slot) {
            self.release_surfaced();
        }
        let (
            Some(id),
            Kind::FetchIn {
                state: FetchState::Missed { priority, .. },
            },
        ) = (self.control[slot].stream, self.control[slot].kind)
        else {
            return Err(Error::Unknown);
        };
        if group.is_trimmed() || !group.is_finished() {
            self.refuse(slot, StreamCode::Internal);
            return Err(Error::Invalid);
        }
        if !self.serve_fetch(slot, id, priority, group) {
            self.refuse(slot, StreamCode::Evicted);
            return Ok(());
        }
        let c = &mut self.control[slot];
        c.kind = Kind::FetchIn {
            state: FetchState::Serving,
        };
        c.tx_done = true;
        Ok(())
    }

    /// Refuses the fetch [`Event::Fetch`](crate::session::Event::Fetch) reported as `fetch` with `code`
    /// (NOT_FOUND 0x33 for a group nobody has).
    ///
    /// # Errors
    /// [`Error::Closed`] once the session is over, [`Error::Unknown`] if no
    /// such fetch waits.
    pub fn refuse_fetch(&mut self, fetch: FetchId, code: StreamCode) -> Result<(), Error> {
        self.dirty = true;
        if self.is_closed() {
            return Err(Error::Closed);
        }
        let slot = self.missed_slot(fetch).ok_or(Error::Unknown)?;
        if self.surfaced == Some(slot) {
            self.release_surfaced();
        }
        if self.control[slot].kind != Kind::Free {
            self.refuse(slot, code);
        }
        Ok(())
    }

    /// Cancels whatever answers the fetch on `slot` (the requester went
    /// away): its group-stream entry is dropped and the stream reset with
    /// `code`; the slot's fetch is over.
    pub(in crate::session) fn cancel_fetch(&mut self, slot: usize, code: StreamCode) {
        let Kind::FetchIn { state } = self.control[slot].kind else {
            return;
        };
        if state == FetchState::Serving
            && let Some(id) = self.control[slot].stream
        {
            self.group_stopped(id, code.to_code());
        }
        // A miss still held for `poll_event` is not reported.
        let held = self.control[slot].event;
        if held > 0 && self.surfaced != Some(slot) {
            self.control[slot].event = 0;
            self.rx_consume(slot, held);
        }
        self.control[slot].kind = Kind::FetchIn {
            state: FetchState::Done,
        };
    }

    /// The group-stream entry answering the fetch on `slot` (stream `id`) ended.
    pub(in crate::session) fn fetch_over(&mut self, slot: usize, id: StreamId) {
        if let Some(c) = self.control.get_mut(slot)
            && c.stream == Some(id)
            && c.kind
                == (Kind::FetchIn {
                    state: FetchState::Serving,
                })
        {
            c.kind = Kind::FetchIn {
                state: FetchState::Done,
            };
        }
    }
}

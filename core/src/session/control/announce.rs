//! Our announce requests: the peer's ANNOUNCE_OK and ANNOUNCEs on them
//! (held for [`Session::poll_event`] unless discarded), and their end.
//!
//! An Active whose route loops (docs/protocol.md §4.3) is reported as the
//! path's withdrawal: if it restarts a path announced before on the request,
//! the route it replaces is gone (as moq-net does), and otherwise the
//! withdrawal names a path the application never saw, which changes nothing.

use super::decode::decode_within;
use super::paths::join;
use super::{Kind, Step};
use crate::session::Session;
use crate::session::event::{AnnounceId, Queued};
use crate::transport::Transport;
use crate::wire::lite::{Announce, AnnounceOk, MAX_HOPS};

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Our announce request `id` on `slot` ended: queue
    /// [`Event::AnnounceEnded`], or keep it in the slot until the queue has room.
    pub(in crate::session) fn announce_ended(&mut self, slot: usize, id: u64, code: Option<u64>) {
        if let Some(end) = self.queue_end(Queued::AnnounceEnded(AnnounceId(id), code)) {
            self.control[slot].ended = Some(end);
        }
    }

    /// ANNOUNCE_OK, then ANNOUNCEs, on our announce request (docs/protocol.md §3.6).
    pub(super) fn parse_announce(
        &mut self,
        slot: usize,
        id: u64,
        publisher: Option<u64>,
        limit: usize,
    ) -> Step {
        if publisher.is_none() {
            return match decode_within::<AnnounceOk>(self.rx_data(slot), limit) {
                Ok((ok, n)) => {
                    self.control[slot].kind = Kind::AnnounceOut {
                        id,
                        publisher: Some(ok.hop),
                    };
                    Step::Consumed(n)
                }
                Err(e) => self.on_decode_error(slot, e),
            };
        }
        let joined = match decode_within::<Announce<'_>>(self.rx_data(slot), limit) {
            Ok((a, n)) => {
                let prefix = core::str::from_utf8(self.tx_kept(slot)).unwrap_or("");
                Ok((n, join(prefix, a.suffix).is_ok()))
            }
            Err(e) => Err(e),
        };
        match joined {
            Ok((n, true)) => Step::Held(n),
            Ok((n, false)) => {
                debug!("session: announced path too long, ignored");
                Step::Consumed(n)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }

    /// Whether announcement `a` from the publisher named `publisher` loops
    /// (docs/protocol.md §4.3): its route (hops + the publisher) contains us,
    /// already contains the publisher (a reflection), or would exceed 32
    /// entries. Ended ones carry no hops.
    pub(in crate::session) fn loops(&self, a: &Announce<'_>, publisher: u64) -> bool {
        let (hop, via) = (self.hop, publisher);
        let looped = (hop != 0 && a.hops.contains(hop))
            || (via != 0 && a.hops.contains(via))
            || a.hops.len() >= MAX_HOPS;
        if looped {
            debug!("session: looping announcement, its path withdrawn");
        }
        looped
    }
}

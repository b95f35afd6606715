//! Our announce requests: the peer's ANNOUNCE_OK and ANNOUNCEs on them
//! (held for [`Session::poll_event`] unless discarded), and their end.

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
        let (hop, via) = (self.hop, publisher.unwrap_or(0));
        let joined = match decode_within::<Announce<'_>>(self.rx_data(slot), limit) {
            Ok((a, n)) => {
                let prefix = core::str::from_utf8(self.tx_kept(slot)).unwrap_or("");
                // docs/protocol.md §4.3: the receiver discards an announcement whose route
                // (hops + the publisher) contains us, already contains the publisher
                // (a reflection), or would exceed 32 entries. Ended ones carry no hops.
                let looped = (hop != 0 && a.hops.contains(hop))
                    || (via != 0 && a.hops.contains(via))
                    || a.hops.len() >= MAX_HOPS;
                Ok((n, join(prefix, a.suffix).is_ok(), looped))
            }
            Err(e) => Err(e),
        };
        match joined {
            Ok((n, true, false)) => Step::Held(n),
            Ok((n, false, _)) => {
                debug!("session: announced path too long, ignored");
                Step::Consumed(n)
            }
            Ok((n, _, true)) => {
                debug!("session: looping announcement discarded");
                Step::Consumed(n)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }
}

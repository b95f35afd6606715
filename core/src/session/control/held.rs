//! Events for the application: messages held at the front of a receive FIFO
//! until [`Session::poll_event`] returns them, and the public form of queued
//! events.

use super::Kind;
use super::paths::join;
use crate::session::Session;
use crate::session::event::{AnnounceId, Event, FetchId, Queued};
use crate::transport::Transport;
use crate::wire::lite::{Announce, Fetch, Goaway, Setup, decode_message};
use crate::wire::qmux::Side;

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Releases the message the last `poll_event` returned and goes on parsing.
    pub(in crate::session) fn release_surfaced(&mut self) {
        let Some(slot) = self.surfaced.take() else {
            return;
        };
        let n = self.control[slot].event;
        self.control[slot].event = 0;
        self.rx_consume(slot, n);
        self.process_rx(slot);
        if self.control[slot].kind != super::Kind::Free {
            self.trim_slot(slot);
        }
    }

    /// A slot with a message waiting for `poll_event`.
    pub(in crate::session) fn next_held(&self) -> Option<usize> {
        self.control.iter().position(|c| c.event > 0)
    }

    /// The event for the message held in `slot` (validated when it was parsed).
    pub(in crate::session) fn held_event(&mut self, slot: usize) -> Option<Event<'_>> {
        let c = self.control[slot];
        let start = self.rx_base(slot)? + c.rx_keep;
        let msg = self.chunks.get(start..start + c.event)?;
        match c.kind {
            Kind::SetupIn { .. } => {
                // The application sees the SETUP now: input goes on (with
                // whatever tables it attaches before the next call).
                self.awaiting_tables = false;
                let (setup, _) = decode_message::<Setup<'_>>(msg).ok()?;
                // docs/protocol.md §9.3: a path the transport carried wins over
                // (and stands in for) SETUP's.
                let path = match self.side {
                    Side::Server => self.path.or(setup.path()),
                    Side::Client => None,
                };
                Some(Event::Setup {
                    hop: setup.hop(),
                    role: self.peer.map_or(crate::wire::lite::Role::Both, |p| p.role),
                    path,
                })
            }
            Kind::GoawayIn { .. } => {
                let (g, _) = decode_message::<Goaway<'_>>(msg).ok()?;
                Some(Event::Goaway { uri: g.uri })
            }
            Kind::AnnounceOut { id, publisher } => {
                let (a, _) = decode_message::<Announce<'_>>(msg).ok()?;
                let publisher = publisher.unwrap_or(0);
                let active = a.status.is_active() && !self.loops(&a, publisher);
                let prefix = core::str::from_utf8(self.tx_kept(slot)).ok()?;
                self.scratch = join(prefix, a.suffix).ok()?;
                let path = self.scratch.as_str();
                let request = AnnounceId(id);
                Some(if active {
                    Event::Announced {
                        request,
                        path,
                        hops: a.hops,
                        publisher,
                    }
                } else {
                    Event::Unannounced { request, path }
                })
            }
            Kind::FetchIn {
                state: super::FetchState::Missed { id, code, .. },
            } => {
                let (f, _) = decode_message::<Fetch<'_>>(msg).ok()?;
                let path = super::rooted(&self.root, f.broadcast, &mut self.scratch)?;
                Some(Event::Fetch {
                    fetch: FetchId(id),
                    broadcast: path.as_str(),
                    track: f.track,
                    group: f.group,
                    priority: f.priority,
                    code: code.to_code(),
                })
            }
            _ => None,
        }
    }

    /// The public form of a queued event.
    pub(in crate::session) fn queued_event(&self, q: Queued) -> Event<'_> {
        match q {
            Queued::Connected(protocol) => Event::Connected { protocol },
            Queued::AnnounceEnded(request, code) => Event::AnnounceEnded { request, code },
            Queued::TrackInfo(subscription, info) => Event::TrackInfo { subscription, info },
            Queued::Started(subscription, group) => Event::Started {
                subscription,
                group,
            },
            Queued::Group(subscription, sequence) => Event::Group {
                subscription,
                sequence,
            },
            Queued::Dropped(subscription, start, end, code) => Event::Dropped {
                subscription,
                start,
                end,
                code,
            },
            Queued::Ended(subscription, end) => Event::Ended { subscription, end },
            Queued::SubscriptionClosed(subscription, code) => {
                Event::SubscriptionClosed { subscription, code }
            }
            Queued::Closed {
                code,
                application,
                local,
            } => Event::Closed {
                code,
                reason: self.close_reason.as_str(),
                application,
                local,
            },
        }
    }
}

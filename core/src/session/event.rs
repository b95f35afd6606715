//! What the session tells the application: [`Event`]s and the ids they carry.

use crate::wire::lite::{Hops, Role, TrackInfo};

/// Our handle on an announce request we made ([`Session::announce_request`](super::Session::announce_request)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AnnounceId(pub(crate) u64);

impl AnnounceId {
    /// The request's number within its session (0, 1, 2, ...).
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Our handle on a subscription we made ([`Session::subscribe`](super::Session::subscribe)):
/// the Subscribe ID on the wire (docs/protocol.md §3.8: 0, 1, 2, ..., never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SubscriptionId(pub(crate) u64);

impl SubscriptionId {
    /// The Subscribe ID on the wire.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A FETCH of the peer's that the session could not answer from local media
/// ([`Event::Fetch`]): the application answers it with
/// [`Session::answer_fetch`](super::Session::answer_fetch) or refuses it with
/// [`Session::refuse_fetch`](super::Session::refuse_fetch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FetchId(pub(crate) u64);

impl FetchId {
    /// The request's number within its session (0, 1, 2, ...).
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Something the application must learn about, from [`Session::poll_event`](super::Session::poll_event).
///
/// Events with borrowed text borrow the session until the next call on it.
///
/// No event is lost. The session stops taking input while its event queue
/// is nearly full, so what input reports always fits. The ends a caller's
/// bookkeeping depends on ([`Event::SubscriptionClosed`],
/// [`Event::AnnounceEnded`], [`Event::Closed`]) may also come from calls such
/// as [`Session::unsubscribe`](super::Session::unsubscribe) or from
/// timers, with the queue full: such an end waits in what it ends (a
/// subscription keeps its table entry until its end is queued), ends are
/// queued in the order they happened, and each is reported exactly once;
/// [`Event::Closed`] comes after every other event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// The QMux connection is up (docs/protocol.md §1.5): requests may be made now.
    Connected {
        /// The negotiated application protocol (`moq-lite-05`).
        protocol: &'static str,
    },
    /// The peer's SETUP arrived (docs/protocol.md §3.5); its requests are served from now on.
    Setup {
        /// The peer's Hop ID (0 = none).
        hop: u64,
        /// The role the peer declared (clients only; [`Role::Both`] when absent).
        role: Role,
        /// The client's Path parameter (path and query), if any: what a server
        /// authorizes and roots the session at (docs/protocol.md §4.1).
        path: Option<&'a str>,
    },
    /// A broadcast became available through one of our announce requests
    /// (docs/protocol.md §3.6); also reported again when its route changed (restart).
    Announced {
        /// The request it answers.
        request: AnnounceId,
        /// The full broadcast path (the request's prefix joined with the suffix).
        path: &'a str,
        /// The hops before the responding publisher, origin first.
        hops: Hops<'a>,
        /// The responding publisher's Hop ID from ANNOUNCE_OK (append it to `hops`
        /// for the full route; docs/protocol.md §4.3).
        publisher: u64,
    },
    /// A broadcast announced through one of our requests is gone; also
    /// reported for an announcement whose route loops through us (docs/protocol.md
    /// §4.3), which withdraws a route it would have replaced.
    Unannounced {
        /// The request it answers.
        request: AnnounceId,
        /// The full broadcast path.
        path: &'a str,
    },
    /// An announce request ended: treat every broadcast it announced as gone
    /// through it (docs/protocol.md §3.6).
    AnnounceEnded {
        /// The request.
        request: AnnounceId,
        /// `None` if the publisher finished the stream, else the reset code.
        code: Option<u64>,
    },
    /// TRACK_INFO arrived for a subscription (docs/protocol.md §3.7); the SUBSCRIBE follows.
    TrackInfo {
        /// The subscription.
        subscription: SubscriptionId,
        /// The track's properties (timescale of frame timestamps, ...).
        info: TrackInfo,
    },
    /// SUBSCRIBE_START: the first group that will be delivered (docs/protocol.md §3.8).
    Started {
        /// The subscription.
        subscription: SubscriptionId,
        /// Its absolute sequence.
        group: u64,
    },
    /// A group stream arrived and its group was created in the subscription's
    /// sink; its frames fill in as bytes arrive.
    Group {
        /// The subscription.
        subscription: SubscriptionId,
        /// The group's sequence.
        sequence: u64,
    },
    /// SUBSCRIBE_DROP: groups `start..=end` will not be delivered.
    Dropped {
        /// The subscription.
        subscription: SubscriptionId,
        /// First group dropped.
        start: u64,
        /// Last group dropped (inclusive).
        end: u64,
        /// Stream error code (0 = simply unavailable).
        code: u64,
    },
    /// SUBSCRIBE_END: no group at or after `end` will be delivered (exclusive, docs/protocol.md §3.8).
    Ended {
        /// The subscription.
        subscription: SubscriptionId,
        /// The first sequence that will never be delivered.
        end: u64,
    },
    /// A subscription is over (reported exactly once per subscription).
    SubscriptionClosed {
        /// The subscription.
        subscription: SubscriptionId,
        /// `None` after the publisher finished it, else the reset code (e.g.
        /// NOT_FOUND 0x33, UNROUTABLE 0x36).
        code: Option<u64>,
    },
    /// The peer fetched a group the session does not hold (docs/protocol.md
    /// §3.10), with [`Config::fetch_misses`](super::Config::fetch_misses) on:
    /// answer it with [`Session::answer_fetch`](super::Session::answer_fetch)
    /// or refuse it with [`Session::refuse_fetch`](super::Session::refuse_fetch)
    /// (the peer waits until one of them, or until it cancels).
    Fetch {
        /// The request, for the answer.
        fetch: FetchId,
        /// The full broadcast path (rooted at the path the peer dialed).
        broadcast: &'a str,
        /// The track name.
        track: &'a str,
        /// The group's absolute sequence.
        group: u64,
        /// The peer's priority for it.
        priority: u8,
        /// The stream code the session refuses it with when nothing else
        /// answers: UNROUTABLE (0x36) for a broadcast not in the origin,
        /// NOT_FOUND (0x33) for a track or group not held.
        code: u64,
    },
    /// The peer sent GOAWAY (docs/protocol.md §3.12): make no new requests and close when done.
    Goaway {
        /// Where to reconnect ("" = the same place).
        uri: &'a str,
    },
    /// The session is over; nothing more is received. Not reported for a close
    /// the application asked for with [`Session::close`](super::Session::close).
    Closed {
        /// The close code: a moq-lite session code for an application close
        /// (docs/protocol.md §3.15), a QMux code for a transport close.
        code: u64,
        /// The reason, as sent or received.
        reason: &'a str,
        /// True for an application close (`0x1d`), false for a transport close or a timeout.
        application: bool,
        /// True if we closed (the peer broke a rule or a timer ran out), false if the peer did.
        local: bool,
    },
}

/// An end that found the event queue full, waiting in what it ends: its
/// place among the ends that waited, and its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiting {
    /// Ends that found the queue full are queued in this order.
    pub(super) order: u64,
    /// The end's code (`None`: finished normally).
    pub(super) code: Option<u64>,
}

/// An event without borrowed data, queued until [`Session::poll_event`](super::Session::poll_event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queued {
    Connected(&'static str),
    AnnounceEnded(AnnounceId, Option<u64>),
    TrackInfo(SubscriptionId, TrackInfo),
    Started(SubscriptionId, u64),
    Group(SubscriptionId, u64),
    Dropped(SubscriptionId, u64, u64, u64),
    Ended(SubscriptionId, u64),
    SubscriptionClosed(SubscriptionId, Option<u64>),
    Closed {
        code: u64,
        application: bool,
        local: bool,
    },
}

#[cfg(any(test, feature = "alloc"))]
mod owned {
    use alloc::borrow::ToOwned;
    use alloc::string::String;
    use alloc::vec::Vec;

    use super::{AnnounceId, Event, FetchId, SubscriptionId};
    use crate::wire::lite::{Role, TrackInfo};

    /// An [`Event`] with its borrowed text copied out, for applications and tests
    /// that keep events past the next call on the session (needs an allocator).
    #[derive(Clone, Debug, PartialEq, Eq)]
    #[allow(missing_docs)] // Fields mirror `Event` one for one.
    pub enum OwnedEvent {
        /// [`Event::Connected`].
        Connected { protocol: String },
        /// [`Event::Setup`].
        Setup {
            hop: u64,
            role: Role,
            path: Option<String>,
        },
        /// [`Event::Announced`].
        Announced {
            request: AnnounceId,
            path: String,
            hops: Vec<u64>,
            publisher: u64,
        },
        /// [`Event::Unannounced`].
        Unannounced { request: AnnounceId, path: String },
        /// [`Event::AnnounceEnded`].
        AnnounceEnded {
            request: AnnounceId,
            code: Option<u64>,
        },
        /// [`Event::TrackInfo`].
        TrackInfo {
            subscription: SubscriptionId,
            info: TrackInfo,
        },
        /// [`Event::Started`].
        Started {
            subscription: SubscriptionId,
            group: u64,
        },
        /// [`Event::Group`].
        Group {
            subscription: SubscriptionId,
            sequence: u64,
        },
        /// [`Event::Dropped`].
        Dropped {
            subscription: SubscriptionId,
            start: u64,
            end: u64,
            code: u64,
        },
        /// [`Event::Ended`].
        Ended {
            subscription: SubscriptionId,
            end: u64,
        },
        /// [`Event::SubscriptionClosed`].
        SubscriptionClosed {
            subscription: SubscriptionId,
            code: Option<u64>,
        },
        /// [`Event::Fetch`].
        Fetch {
            fetch: FetchId,
            broadcast: String,
            track: String,
            group: u64,
            priority: u8,
            code: u64,
        },
        /// [`Event::Goaway`].
        Goaway { uri: String },
        /// [`Event::Closed`].
        Closed {
            code: u64,
            reason: String,
            application: bool,
            local: bool,
        },
    }

    impl From<Event<'_>> for OwnedEvent {
        fn from(event: Event<'_>) -> Self {
            match event {
                Event::Connected { protocol } => OwnedEvent::Connected {
                    protocol: protocol.to_owned(),
                },
                Event::Setup { hop, role, path } => OwnedEvent::Setup {
                    hop,
                    role,
                    path: path.map(str::to_owned),
                },
                Event::Announced {
                    request,
                    path,
                    hops,
                    publisher,
                } => OwnedEvent::Announced {
                    request,
                    path: path.to_owned(),
                    hops: hops.iter().collect(),
                    publisher,
                },
                Event::Unannounced { request, path } => OwnedEvent::Unannounced {
                    request,
                    path: path.to_owned(),
                },
                Event::AnnounceEnded { request, code } => {
                    OwnedEvent::AnnounceEnded { request, code }
                }
                Event::TrackInfo { subscription, info } => {
                    OwnedEvent::TrackInfo { subscription, info }
                }
                Event::Started {
                    subscription,
                    group,
                } => OwnedEvent::Started {
                    subscription,
                    group,
                },
                Event::Group {
                    subscription,
                    sequence,
                } => OwnedEvent::Group {
                    subscription,
                    sequence,
                },
                Event::Dropped {
                    subscription,
                    start,
                    end,
                    code,
                } => OwnedEvent::Dropped {
                    subscription,
                    start,
                    end,
                    code,
                },
                Event::Ended { subscription, end } => OwnedEvent::Ended { subscription, end },
                Event::SubscriptionClosed { subscription, code } => {
                    OwnedEvent::SubscriptionClosed { subscription, code }
                }
                Event::Fetch {
                    fetch,
                    broadcast,
                    track,
                    group,
                    priority,
                    code,
                } => OwnedEvent::Fetch {
                    fetch,
                    broadcast: broadcast.to_owned(),
                    track: track.to_owned(),
                    group,
                    priority,
                    code,
                },
                Event::Goaway { uri } => OwnedEvent::Goaway {
                    uri: uri.to_owned(),
                },
                Event::Closed {
                    code,
                    reason,
                    application,
                    local,
                } => OwnedEvent::Closed {
                    code,
                    reason: reason.to_owned(),
                    application,
                    local,
                },
            }
        }
    }
}

#[cfg(any(test, feature = "alloc"))]
pub use owned::OwnedEvent;

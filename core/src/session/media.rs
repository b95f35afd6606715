//! What a session needs from local media: the seam between the wire and the model.
//!
//! A session never owns media. On the publisher side it reads groups that
//! someone else produced ([`Source`]), found through a [`Catalog`] of local
//! broadcasts; on the subscriber side it writes the groups it receives into a
//! local track the application handed it ([`Sink`]). All three are object-safe
//! traits borrowed for the session's lifetime `'a` (`&'a dyn Source<'p>`), so
//! a session works over the model's tracks and origin, over a relay's cache, or
//! over a few test fixtures, without generics on [`Session`](super::Session).
//!
//! Groups are always the model's [`group::State`]: the session forwards their
//! stored wire bytes verbatim ([`group::Consumer::chunk`]) and fills them frame
//! by frame ([`group::Producer::begin_frame`]); the furthest-read position of a
//! group is what paces both ends (see [`crate::pacing`]).

use core::fmt;

use crate::model::group;
use crate::model::path::Path;
use crate::time::Instant;
use crate::wire::lite::{StreamCode, TrackInfo};

/// A local track the session serves to subscribers (publisher side).
///
/// Every method is a cheap query; the session calls them each time it is
/// driven ([`Session::poll_transmit`](super::Session::poll_transmit)) to learn
/// about new groups, so an implementation needs no callbacks.
pub trait Source<'p> {
    /// The values sent in TRACK_INFO (PROTOCOL.md §3.7); immutable for the track's life.
    fn info(&self) -> TrackInfo;

    /// The newest group's sequence (the live edge), or `None` while the track has none.
    fn latest(&self) -> Option<u64>;

    /// The group with this sequence, if the track still holds it.
    ///
    /// The returned state must stay valid for as long as `self` is borrowed; a
    /// group that is later evicted from a ring slot is noticed through its
    /// generation (readers get [`group::ReadError::Evicted`]).
    fn group(&self, sequence: u64) -> Option<&group::State<'p>>;

    /// Once the track has finished: the exclusive end, the first sequence that
    /// will never exist (0 for a track that ended without groups; PROTOCOL.md §3.8).
    fn end(&self) -> Option<u64>;

    /// If the track was abandoned (its publisher went away): the stream code to
    /// reset subscriptions with (PROTOCOL.md §4.4).
    fn error(&self) -> Option<StreamCode> {
        None
    }

    /// When the newest frame of the latest group was produced, on the clock
    /// group ages are measured in (PROTOCOL.md §4.7; see [`crate::window::Timeline`]).
    fn newest(&self) -> Instant {
        Instant::ZERO
    }

    /// For a group older than the latest: when its successor began. `None`
    /// makes the group undeliverable to subscribers that are behind.
    ///
    /// The default keeps no history, so only the latest group is served to a
    /// subscriber with a non-zero max age.
    fn superseded_at(&self, sequence: u64) -> Option<Instant> {
        let _ = sequence;
        None
    }
}

/// Why a [`Sink`] refused a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SinkError {
    /// The track already has (or had) this group: a duplicate (PROTOCOL.md §3.9: dedupe by sequence).
    Duplicate,
    /// The group is older than anything the track keeps.
    Old,
    /// The track cannot take a group now (no free slot or no memory).
    Full,
    /// The track is closed.
    Closed,
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SinkError::Duplicate => "duplicate group",
            SinkError::Old => "group too old",
            SinkError::Full => "no room for the group",
            SinkError::Closed => "track closed",
        })
    }
}

impl core::error::Error for SinkError {}

impl SinkError {
    /// The stream code a group stream is stopped with when the sink refuses it.
    pub const fn code(self) -> StreamCode {
        match self {
            SinkError::Duplicate | SinkError::Closed => StreamCode::Cancel,
            SinkError::Old => StreamCode::Old,
            SinkError::Full => StreamCode::Evicted,
        }
    }
}

/// A local track a subscription fills (subscriber side).
pub trait Sink<'p> {
    /// TRACK_INFO arrived (before any group; PROTOCOL.md §3.7).
    fn info(&self, info: TrackInfo);

    /// A group stream for `sequence` arrived: start the group and hand back its
    /// one producer. Groups arrive newest first and may repeat.
    ///
    /// # Errors
    /// [`SinkError`]; the session then stops the group stream
    /// ([`SinkError::code`]).
    fn group(&self, sequence: u64) -> Result<group::Producer<'_, 'p>, SinkError>;

    /// SUBSCRIBE_END arrived: no group at or after `end` will be delivered.
    fn end(&self, end: u64);

    /// The subscription is over: `None` after a clean finish (FIN), or the
    /// stream code it was reset with (also [`StreamCode::SessionClosed`] when
    /// the session ended).
    fn close(&self, code: Option<StreamCode>);
}

/// One broadcast as a [`Catalog`] reports it for announcements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement<'c> {
    /// The broadcast's full path.
    pub path: Path<'c>,
    /// Available (true) or gone (false).
    pub active: bool,
    /// The hops the broadcast travelled before reaching us, origin first; empty
    /// for a broadcast published locally (PROTOCOL.md §3.6, §4.3).
    pub hops: &'c [u64],
}

/// Why a [`Catalog`] cannot continue a change-log read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Lagged;

impl fmt::Display for Lagged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("announcement log position no longer held")
    }
}

impl core::error::Error for Lagged {}

/// The local broadcasts a session serves (publisher side): track lookup and announcements.
pub trait Catalog<'p> {
    /// The track `track` of broadcast `broadcast`.
    ///
    /// # Errors
    /// The stream code to refuse the request with: [`StreamCode::Unroutable`]
    /// for an unknown broadcast, [`StreamCode::NotFound`] for an unknown track
    /// (PROTOCOL.md §4.4).
    fn track(&self, broadcast: Path<'_>, track: &str) -> Result<&dyn Source<'p>, StreamCode>;

    /// The first active broadcast under `prefix` whose path sorts strictly after
    /// `after` (from the first when `None`), in a stable order (normally by path).
    ///
    /// Used to send the initial set of an announce stream a few at a time
    /// without copying the catalog.
    fn next_active(&self, prefix: Path<'_>, after: Option<Path<'_>>) -> Option<Announcement<'_>>;

    /// The current position of the change log: changes from here on are reported
    /// by [`Catalog::next_change`].
    fn version(&self) -> u64 {
        0
    }

    /// The first change under `prefix` at or after log position `since`, with
    /// the position just after it; `Ok(None)` when there is none yet.
    ///
    /// # Errors
    /// [`Lagged`] if `since` is no longer held; the session then resets the
    /// announce stream so the subscriber can ask again.
    fn next_change(
        &self,
        prefix: Path<'_>,
        since: u64,
    ) -> Result<Option<(Announcement<'_>, u64)>, Lagged> {
        let _ = (prefix, since);
        Ok(None)
    }
}

/// A catalog with nothing in it: every track request is unroutable and no
/// broadcast is announced (what a pure subscriber serves).
#[derive(Debug, Clone, Copy, Default)]
pub struct Empty;

impl<'p> Catalog<'p> for Empty {
    fn track(&self, _broadcast: Path<'_>, _track: &str) -> Result<&dyn Source<'p>, StreamCode> {
        Err(StreamCode::Unroutable)
    }

    fn next_active(
        &self,
        _prefix: Path<'_>,
        _after: Option<Path<'_>>,
    ) -> Option<Announcement<'_>> {
        None
    }
}

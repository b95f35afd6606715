//! Subscriber side: announce requests, subscriptions, and the group streams
//! that fill local tracks (docs/protocol.md §3.6–3.9).
//!
//! [`Session::subscribe`] sends TRACK first and SUBSCRIBE only once TRACK_INFO
//! arrived, as moq-dev does (§3.7): the SUBSCRIBE waits, encoded, in a control
//! slot that is opened then. Each incoming Group stream names its subscription
//! in the GROUP header; the group is created in that subscription's local
//! [`track`] (which deduplicates by sequence: groups arrive newest first,
//! §3.9) with the track's one producer, and the stream
//! bytes are copied into it frame by frame, keeping frame boundaries and
//! absolute timestamps.
//!
//! Credit for a group stream goes back to the peer only as local readers of
//! the group advance (its furthest-read position), so a parked reader holds
//! the peer at one stream window; once the group's FIN is stored, the rest is
//! released at once (the data is all here, and holding the connection window
//! for a finished group would stall every other stream).

use core::cmp::min;

use super::control::{Kind, unrooted};
use super::event::{AnnounceId, Queued, SubscriptionId, Waiting};
use super::{Error, Session};
use crate::model::frame::{Header, MAX_HEADER_LEN};
use crate::model::group::WriteError;
use crate::model::path::PathBuf;
use crate::model::track;
use crate::pool::Block;
use crate::time::{Duration, Instant};
use crate::transport::Transport;
use crate::window::Request;
use crate::wire::lite::{
    AnnounceRequest, BidiStreamType, Fetch, Group, SessionCode, StreamCode, Subscribe,
    SubscribeResponse, SubscribeUpdate, Track, TrackInfo, UniStreamType, read_message,
    write_message,
};
use crate::wire::qmux::{Dir, StreamId};
use crate::wire::{DecodeError, Reader};

/// Room for a uni stream's type and GROUP header, even in long varint forms.
const HEADER_BUF: usize = 32;

/// A subscription we hold on one of the peer's tracks.
pub(crate) struct Subscription<'a, 'p> {
    /// The Subscribe ID on the wire.
    pub(super) id: u64,
    /// The local track's one producer: groups are created with it.
    pub(super) producer: track::Producer<'a, 'p>,
    /// The control slot of the SUBSCRIBE (held until TRACK_INFO), while we hold one.
    pub(super) slot: Option<usize>,
    /// The control slot of the TRACK request, until TRACK_INFO.
    pub(super) track: Option<usize>,
    pub(super) info: Option<TrackInfo>,
    /// The local track's version when [`super::Session::poll_changed`] last looked.
    pub(super) seen: u64,
    /// The peer ended the subscription (FIN) on a transport that does not
    /// order streams: group streams that started before the end may still
    /// arrive until this instant, when the subscription closes
    /// (docs/protocol.md §11.7).
    pub(super) ending: Option<Instant>,
    /// The END the publisher sent (the first group it will not send).
    pub(super) end: Option<u64>,
    /// The first group the publisher said it sends (its START).
    pub(super) start: Option<u64>,
    /// A fetch of this group rather than a subscription.
    pub(super) fetch: Option<u64>,
}

/// The first id of our fetches ([`super::Session::fetch`]), above every
/// Subscribe ID a session uses: they share the subscription table but no
/// GROUP header names them.
pub(super) const FETCH_IDS: u64 = 1 << 62;

/// How many groups before a subscription's END must each have come for it
/// to close before its grace runs out.
const OWED_GROUPS: u64 = 8;

/// How long a subscription the peer ended stays open for group streams
/// that the transport delivered after the end (docs/protocol.md §11.7).
pub(super) const LATE_GROUP_GRACE: Duration = Duration::from_secs(1);

/// An entry of our subscription table.
pub(crate) enum SubEntry<'a, 'p> {
    /// A subscription still open.
    Open(Subscription<'a, 'p>),
    /// A subscription that closed while the event queue was full: its track
    /// was let go, and the entry stays taken until its
    /// [`Event::SubscriptionClosed`](super::Event::SubscriptionClosed) is queued.
    Closed {
        /// The Subscribe ID.
        id: u64,
        /// Its place in line and its code.
        end: Waiting,
    },
}

impl<'a, 'p> SubEntry<'a, 'p> {
    /// The subscription, if still open.
    pub(super) fn open(&self) -> Option<&Subscription<'a, 'p>> {
        match self {
            SubEntry::Open(s) => Some(s),
            SubEntry::Closed { .. } => None,
        }
    }

    /// The subscription, writable, if still open.
    pub(super) fn open_mut(&mut self) -> Option<&mut Subscription<'a, 'p>> {
        match self {
            SubEntry::Open(s) => Some(s),
            SubEntry::Closed { .. } => None,
        }
    }
}

/// Where an incoming uni stream's parse stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Reading the stream type and GROUP header.
    Header,
    /// Reading FRAMEs.
    Frames,
}

/// One group stream we receive.
pub(crate) struct GroupIn<'a, 'p> {
    pub(super) id: StreamId,
    stage: Stage,
    /// Partial header bytes (stream type + GROUP, or a FRAME header) from earlier data.
    hdr: [u8; HEADER_BUF],
    hdr_len: usize,
    pub(super) sub: u64,
    pub(super) producer: Option<track::GroupProducer<'a, 'p>>,
    /// The group's generation when it was created (a change means it was evicted).
    generation: u64,
    /// Timestamp of the previous frame (docs/protocol.md §3.9: deltas, first from 0).
    prev: u64,
    /// Payload bytes the current frame still needs.
    frame_left: u64,
    /// Stream bytes taken so far.
    received: u64,
    /// Stream bytes whose credit went back to the peer.
    released: u64,
    /// Stream bytes before the first FRAME (type and GROUP header).
    preamble: u64,
}

impl<'a, 'p> GroupIn<'a, 'p> {
    fn new(id: StreamId) -> Self {
        GroupIn {
            id,
            stage: Stage::Header,
            hdr: [0; HEADER_BUF],
            hdr_len: 0,
            sub: 0,
            producer: None,
            generation: 0,
            prev: 0,
            frame_left: 0,
            received: 0,
            released: 0,
            preamble: 0,
        }
    }
}

/// The front of `hdr[..len]` followed by `data`, in a scratch buffer of `N` bytes.
fn joined<const N: usize>(hdr: &[u8], data: &[u8]) -> ([u8; N], usize) {
    let mut buf = [0u8; N];
    let a = min(hdr.len(), N);
    buf[..a].copy_from_slice(&hdr[..a]);
    let b = min(data.len(), N - a);
    buf[a..a + b].copy_from_slice(&data[..b]);
    (buf, a + b)
}

/// What the header stage found.
enum HeaderStep {
    /// More bytes are needed; all of the data offered was stored.
    More,
    /// The stream is a Setup stream; this many data bytes were the type.
    Setup(usize),
    /// A GROUP header; this many data bytes completed it.
    Group(Group, usize),
    /// Refuse the stream with this code.
    Refuse(StreamCode),
    /// Close the session: the header is malformed.
    Malformed,
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    // ---- requests ----

    /// Asks the peer for the broadcasts under `prefix` ("" = everything) on a new
    /// Announce stream (docs/protocol.md §3.6), with our Hop ID as Exclude Hop.
    ///
    /// Results arrive as [`Event::Announced`](super::Event::Announced) /
    /// [`Event::Unannounced`](super::Event::Unannounced), and
    /// [`Event::AnnounceEnded`](super::Event::AnnounceEnded) when the stream ends.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a malformed prefix, or one that neither contains
    /// nor lies under the session's root (docs/protocol.md §4.1); [`Error::TooLarge`] if the
    /// prefix does not fit a control buffer twice (it is kept to build paths);
    /// [`Error::GoingAway`], [`Error::ControlFull`], [`Error::NotReady`], [`Error::Closed`].
    pub fn announce_request(&mut self, prefix: &str) -> Result<AnnounceId, Error> {
        self.release_surfaced();
        self.dirty = true;
        self.check_ready()?;
        if self.goaway_received {
            return Err(Error::GoingAway);
        }
        let asked =
            PathBuf::<{ super::MAX_PATH }>::normalize(prefix).map_err(|_| Error::Invalid)?;
        // docs/protocol.md §4.1: the peer names paths under our root. We ask
        // for the part of the prefix below the root (all of it when the
        // prefix is above the root) and keep the prefix its answers join.
        let (wire, prefix) = match unrooted(&self.root, asked.as_path()) {
            Some(below) => (
                PathBuf::<{ super::MAX_PATH }>::from_path(below).map_err(|_| Error::Invalid)?,
                asked,
            ),
            None if self.root.as_path().has_prefix(asked.as_path()) => {
                (PathBuf::new(), self.root.clone())
            }
            None => return Err(Error::Invalid),
        };
        let id = self.next_announce;
        // Its buffer is kept for the prefix: two stay free for the rest.
        if self.free_chunks() < 3 {
            return Err(Error::ControlFull);
        }
        let slot = self
            .alloc_control(
                Kind::AnnounceOut {
                    id,
                    publisher: None,
                },
                Dir::Bidi,
                None,
            )
            .ok_or(Error::ControlFull)?;
        let hop = self.hop;
        let req = AnnounceRequest {
            prefix: wire.as_str(),
            exclude_hop: hop,
        };
        let ok = self.set_tx_kept(slot, prefix.as_str().as_bytes())
            && self
                .tx_write(slot, |w| {
                    BidiStreamType::Announce.write(w)?;
                    write_message(&req, w)
                })
                .is_ok();
        if !ok {
            self.free_slot(slot);
            return Err(Error::TooLarge);
        }
        self.next_announce += 1;
        self.open_pending();
        Ok(AnnounceId(id))
    }

    /// Cancels an announce request (resets our side and stops reading); no
    /// further events are reported for it.
    ///
    /// # Errors
    /// [`Error::Unknown`] if no live request has this id.
    #[cfg(test)]
    pub fn cancel_announce(&mut self, request: AnnounceId) -> Result<(), Error> {
        self.release_surfaced();
        self.dirty = true;
        let slot = self
            .control
            .iter()
            .position(|c| matches!(c.kind, Kind::AnnounceOut { id, .. } if id == request.0))
            .ok_or(Error::Unknown)?;
        self.reset_tx(slot, StreamCode::Cancel);
        self.stop_rx(slot, StreamCode::Cancel);
        Ok(())
    }

    /// Subscribes to the peer's track named like `track` (its [`track::Info`]
    /// name) in broadcast `broadcast`, with the preferences of `request`, and
    /// fills `track` with the groups that arrive.
    ///
    /// The session takes the track's one producer for the subscription's
    /// life: it creates each group as its stream arrives, finishes the track
    /// when the publisher finishes the subscription, and aborts it with the
    /// stream code when the subscription fails. It sends TRACK first and the
    /// SUBSCRIBE once TRACK_INFO arrived (docs/protocol.md §3.7, §3.8); the
    /// TRACK_INFO values are reported ([`Event::TrackInfo`](super::Event::TrackInfo))
    /// but not applied to `track`, whose info the application chose. Progress
    /// is reported with [`Event::Started`](super::Event::Started),
    /// [`Event::Group`](super::Event::Group), [`Event::Ended`](super::Event::Ended)
    /// and finally [`Event::SubscriptionClosed`](super::Event::SubscriptionClosed).
    ///
    /// # Errors
    /// [`Error::TrackBusy`] if `track` already has a producer; [`Error::Invalid`]
    /// for a malformed broadcast path or one outside the session's root
    /// (docs/protocol.md §4.1); [`Error::TooLarge`] if the request does
    /// not fit a control buffer; [`Error::ControlFull`] (it needs two free
    /// slots); [`Error::SubscriptionsFull`] (a closed subscription whose
    /// [`Event::SubscriptionClosed`](super::Event::SubscriptionClosed) waits
    /// for room in the event queue still holds its entry); [`Error::GoingAway`];
    /// [`Error::NotReady`]; [`Error::Closed`]. Nothing is taken on error.
    pub fn subscribe(
        &mut self,
        broadcast: &str,
        track: track::Ref<'a, 'p>,
        request: Request,
    ) -> Result<SubscriptionId, Error> {
        let id = self.next_subscribe;
        let name = track.info().name;
        let sub = self.request_track(broadcast, track, id, None, |path, w| {
            let msg = Subscribe {
                id,
                broadcast: path,
                track: name.as_str(),
                priority: request.priority,
                max_age: request.max_latency,
                start_group: request.start.into(),
                end_group: request.end.into(),
            };
            BidiStreamType::Subscribe.write(w)?;
            write_message(&msg, w)
        })?;
        self.next_subscribe += 1;
        Ok(sub)
    }

    /// Fetches group `group` of the peer's track of `track`'s name in
    /// `broadcast` into the local `track` (docs/protocol.md §3.10), with
    /// `priority`: a TRACK request first, for the track's TRACK_INFO (the
    /// timescale of its timestamps, reported as
    /// [`Event::TrackInfo`](super::Event::TrackInfo)), then FETCH on a
    /// stream of its own. The group is created in `track` when its first
    /// bytes arrive ([`Event::Group`](super::Event::Group)) and fills in as
    /// the rest does. The fetch ends with
    /// [`Event::SubscriptionClosed`](super::Event::SubscriptionClosed):
    /// `code: None` once the whole group came (the track is then finished),
    /// else the publisher's refusal (NOT_FOUND 0x33 for a group it does not
    /// have, ...; the track is aborted with it).
    /// [`unsubscribe`](Self::unsubscribe) cancels it.
    ///
    /// The returned id shares the space of subscriptions but never appears
    /// on the wire (FETCH names no ID).
    ///
    /// # Errors
    /// As [`subscribe`](Self::subscribe).
    pub fn fetch(
        &mut self,
        broadcast: &str,
        track: track::Ref<'a, 'p>,
        group: u64,
        priority: u8,
    ) -> Result<SubscriptionId, Error> {
        let id = FETCH_IDS + self.next_fetch_out;
        let name = track.info().name;
        let sub = self.request_track(broadcast, track, id, Some(group), |path, w| {
            let msg = Fetch {
                broadcast: path,
                track: name.as_str(),
                priority,
                group,
            };
            BidiStreamType::Fetch.write(w)?;
            write_message(&msg, w)
        })?;
        self.next_fetch_out += 1;
        Ok(sub)
    }

    /// TRACK for `track`, then the request `second` writes (held until
    /// TRACK_INFO), as subscription `id`; `fetch` names the group of a fetch.
    fn request_track(
        &mut self,
        broadcast: &str,
        track: track::Ref<'a, 'p>,
        id: u64,
        fetch: Option<u64>,
        second: impl FnOnce(&str, &mut crate::wire::Writer<'_>) -> Result<(), crate::wire::EncodeError>,
    ) -> Result<SubscriptionId, Error> {
        self.release_surfaced();
        self.dirty = true;
        self.check_ready()?;
        if self.goaway_received {
            return Err(Error::GoingAway);
        }
        let full =
            PathBuf::<{ super::MAX_PATH }>::normalize(broadcast).map_err(|_| Error::Invalid)?;
        // docs/protocol.md §4.1: the peer names it relative to our root.
        let path = unrooted(&self.root, full.as_path()).ok_or(Error::Invalid)?;
        if self.free_control() < 2 {
            return Err(Error::ControlFull);
        }
        let entry = self.subs.first_free().ok_or(Error::SubscriptionsFull)?;
        let info = track.info();
        let name = info.name.as_str();
        let track_msg = Track {
            broadcast: path.as_str(),
            track: name,
        };
        // Both requests take a control buffer, and the second keeps its
        // own until TRACK_INFO arrives, which needs one more to be read in:
        // taken only while two stay free after them, or held requests
        // could keep every buffer from the answers they wait for.
        if self.free_chunks() < 4 {
            return Err(Error::ControlFull);
        }
        let t = self
            .alloc_control(
                Kind::TrackOut {
                    sub: id,
                    done: false,
                },
                Dir::Bidi,
                None,
            )
            .ok_or(Error::ControlFull)?;
        let kind = match fetch {
            Some(_) => Kind::FetchOut { sub: id },
            None => Kind::SubscribeOut { sub: id },
        };
        let s = match self.alloc_control(kind, Dir::Bidi, None) {
            Some(s) => s,
            None => {
                self.free_slot(t);
                return Err(Error::ControlFull);
            }
        };
        self.control[s].held = true;
        let ok = self
            .tx_write(t, |w| {
                BidiStreamType::Track.write(w)?;
                write_message(&track_msg, w)
            })
            .is_ok()
            && self.tx_write(s, |w| second(path.as_str(), w)).is_ok();
        if !ok {
            self.free_slot(t);
            self.free_slot(s);
            return Err(Error::TooLarge);
        }
        let Ok(producer) = track.producer() else {
            self.free_slot(t);
            self.free_slot(s);
            return Err(Error::TrackBusy);
        };
        self.filled_changes += 1;
        self.subs[entry] = Some(SubEntry::Open(Subscription {
            id,
            producer,
            slot: Some(s),
            track: Some(t),
            info: None,
            seen: 0,
            ending: None,
            end: None,
            start: None,
            fetch,
        }));
        self.open_pending();
        Ok(SubscriptionId(id))
    }

    /// Changes a subscription's preferences with SUBSCRIBE_UPDATE (docs/protocol.md §3.8).
    ///
    /// # Errors
    /// [`Error::Unknown`] if the subscription is over; [`Error::TooLarge`] if the
    /// send buffer has no room now (retry after `poll_transmit`).
    pub fn update(&mut self, subscription: SubscriptionId, request: Request) -> Result<(), Error> {
        self.release_surfaced();
        self.dirty = true;
        let slot = self
            .subs
            .iter()
            .flatten()
            .filter_map(SubEntry::open)
            .find(|s| s.id == subscription.0)
            .and_then(|s| s.slot)
            .ok_or(Error::Unknown)?;
        let msg = SubscribeUpdate {
            priority: request.priority,
            max_age: request.max_latency,
            start_group: request.start.into(),
            end_group: request.end.into(),
        };
        self.tx_write(slot, |w| write_message(&msg, w))
            .map_err(|_| Error::TooLarge)
    }

    /// Cancels a subscription gracefully: FIN on our Subscribe stream (docs/protocol.md
    /// §3.8). The publisher answers with FIN, reported as
    /// [`Event::SubscriptionClosed`](super::Event::SubscriptionClosed) (the
    /// track is then finished); before TRACK_INFO the request is simply
    /// abandoned and reported at once, with CANCEL.
    ///
    /// # Errors
    /// [`Error::Unknown`] if the subscription is over.
    pub fn unsubscribe(&mut self, subscription: SubscriptionId) -> Result<(), Error> {
        self.release_surfaced();
        self.dirty = true;
        let sub = self
            .subs
            .iter()
            .flatten()
            .filter_map(SubEntry::open)
            .find(|s| s.id == subscription.0)
            .ok_or(Error::Unknown)?;
        let (slot, track) = (sub.slot, sub.track);
        match slot {
            Some(s) if !self.control[s].held => self.control[s].fin = true,
            _ => {
                if let Some(t) = track {
                    // Detach first so the reset does not report a failure twice.
                    self.control[t].kind = Kind::TrackOut {
                        sub: subscription.0,
                        done: true,
                    };
                    self.reset_tx(t, StreamCode::Cancel);
                    self.stop_rx(t, StreamCode::Cancel);
                }
                if let Some(s) = slot {
                    self.free_slot(s);
                }
                self.subscription_closed(subscription.0, Some(StreamCode::Cancel.to_code()));
            }
        }
        Ok(())
    }

    // ---- responses ----

    fn sub_index(&self, id: u64) -> Option<usize> {
        self.subs.iter().position(|s| {
            s.as_ref()
                .and_then(SubEntry::open)
                .is_some_and(|s| s.id == id)
        })
    }

    /// TRACK_INFO arrived: report it, then release the SUBSCRIBE.
    pub(super) fn on_track_info(&mut self, sub: u64, info: TrackInfo) {
        let Some(i) = self.sub_index(sub) else { return };
        let Some(s) = self.subs[i].as_mut().and_then(SubEntry::open_mut) else {
            return;
        };
        s.info = Some(info);
        s.track = None;
        if let Some(slot) = s.slot {
            self.control[slot].held = false;
        }
        self.queue(Queued::TrackInfo(SubscriptionId(sub), info));
        self.open_pending();
    }

    /// The TRACK request failed (reset with `code`, or finished without an answer).
    pub(super) fn track_failed(&mut self, sub: u64, code: u64) {
        let Some(i) = self.sub_index(sub) else { return };
        let Some(s) = self.subs[i].as_mut().and_then(SubEntry::open_mut) else {
            return;
        };
        s.track = None;
        if let Some(slot) = s.slot.take()
            && self.control[slot].held
        {
            self.free_slot(slot);
        }
        self.subscription_closed(sub, Some(code));
    }

    /// A typed response on our Subscribe stream (docs/protocol.md §3.8).
    pub(super) fn on_response(&mut self, sub: u64, r: SubscribeResponse) {
        let Some(i) = self.sub_index(sub) else {
            return;
        };
        let id = SubscriptionId(sub);
        match r {
            SubscribeResponse::Start { group } => {
                // Groups from here on that are older than the first one held
                // may still come (the publisher sends newest first).
                if let Some(s) = self.subs[i].as_mut().and_then(SubEntry::open_mut) {
                    s.producer.track().set_upstream_first(group);
                    s.start = Some(group);
                }
                self.queue(Queued::Started(id, group))
            }
            SubscribeResponse::End { group } => {
                if let Some(s) = self.subs[i].as_mut().and_then(SubEntry::open_mut) {
                    s.end = Some(group);
                }
                self.queue(Queued::Ended(id, group))
            }
            SubscribeResponse::Drop { start, end, code } => {
                self.queue(Queued::Dropped(id, start, end, code))
            }
        }
    }

    /// The subscription is over (`None`: finished by the publisher): finish or
    /// abort the local track, free the entry, report it.
    ///
    /// Group streams already under way complete; later ones name an unknown
    /// subscription and are stopped (docs/protocol.md §3.9).
    ///
    /// The event is reported exactly once: if the event queue is full (calls
    /// such as `unsubscribe` add to it without limit), it waits in the entry,
    /// which stays taken until the event is queued.
    /// The peer ended subscription `sub` (its FIN): closed at once when the
    /// transport orders streams, else after [`LATE_GROUP_GRACE`], so group
    /// streams the transport delivers after the end still reach the track
    /// (docs/protocol.md §11.7).
    pub(super) fn subscription_ended(&mut self, sub: u64) {
        if T::ORDERED {
            self.subscription_closed(sub, None);
            return;
        }
        let now = self.now;
        let Some(i) = self.sub_index(sub) else { return };
        if let Some(Some(SubEntry::Open(s))) = self.subs.get_mut(i) {
            s.ending = Some(now.saturating_add(LATE_GROUP_GRACE));
        }
        // The drive that follows every input and timer closes it at once
        // if nothing is owed ([`Self::close_ended`]).
    }

    /// Whether ended subscription `s` has nothing more to wait for: each of
    /// the last [`OWED_GROUPS`] groups from its START to its END was created
    /// and no group stream of it is still receiving (the common end of a
    /// finished track, whose groups all came before their END).
    fn settled(&self, s: &Subscription<'a, 'p>) -> bool {
        let Some(end) = s.end else { return false };
        let from = end.saturating_sub(OWED_GROUPS).max(s.start.unwrap_or(0));
        let track = s.producer.track();
        (from..end).all(|seq| track.group(seq).is_some())
            && !self
                .inc
                .iter()
                .flatten()
                .any(|g| g.sub == s.id && g.producer.is_some())
    }

    /// When the first ended subscription's grace runs out, if one waits.
    pub(super) fn ending_deadline(&self) -> Option<Instant> {
        if T::ORDERED {
            return None;
        }
        self.subs
            .iter()
            .flatten()
            .filter_map(SubEntry::open)
            .filter_map(|s| s.ending)
            .min()
    }

    /// Closes the ended subscriptions whose grace ran out by `now`, or that
    /// have nothing more to wait for.
    pub(super) fn close_ended(&mut self, now: Instant) {
        if T::ORDERED {
            return;
        }
        while let Some(sub) = self
            .subs
            .iter()
            .flatten()
            .filter_map(SubEntry::open)
            .find(|s| s.ending.is_some_and(|t| now >= t || self.settled(s)))
            .map(|s| s.id)
        {
            self.subscription_closed(sub, None);
        }
    }

    pub(super) fn subscription_closed(&mut self, sub: u64, code: Option<u64>) {
        let Some(i) = self.sub_index(sub) else { return };
        let Some(SubEntry::Open(mut s)) = self.subs[i].take() else {
            return;
        };
        self.filled_changes += 1;
        match code {
            None => {
                s.producer.finish();
            }
            Some(code) => {
                s.producer.abort(code);
            }
        }
        self.note(super::Change::Media(s.producer.track().key()));
        drop(s);
        if let Some(end) = self.queue_end(Queued::SubscriptionClosed(SubscriptionId(sub), code)) {
            self.subs[i] = Some(SubEntry::Closed { id: sub, end });
        }
    }

    // ---- group streams (docs/protocol.md §3.9) ----

    /// The group stream slot of `id`.
    pub(super) fn group_in(&self, id: StreamId) -> Option<usize> {
        self.inc
            .iter()
            .position(|g| g.as_ref().is_some_and(|g| g.id == id))
    }

    /// A uni stream the peer opened: Group or Setup (docs/protocol.md §3.3).
    pub(super) fn new_uni_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
    ) -> usize {
        let Some(i) = self.inc.first_free() else {
            debug!("session: group table full, stopping stream {}", id.value());
            let _ = self.conn.stop_sending(id, StreamCode::Evicted.to_code());
            return data.len();
        };
        self.inc[i] = Some(GroupIn::new(id));
        self.group_data(now, i, data, None, fin)
    }

    /// Stream bytes for incoming group stream `i`; returns how many were taken
    /// (fewer when the pool has no block free: backpressure).
    /// `src`: `data` lies in this foreign block from this byte on.
    pub(super) fn group_data(
        &mut self,
        now: Instant,
        i: usize,
        data: &[u8],
        src: Option<(&Block<'p>, usize)>,
        fin: bool,
    ) -> usize {
        let mut used = 0;
        loop {
            let Some(Some(g)) = self.inc.get_mut(i) else {
                return data.len();
            };
            let id = g.id;
            let rest = data.get(used..).unwrap_or(&[]);
            match g.stage {
                Stage::Header => match Self::header_step(g, rest) {
                    HeaderStep::More => {
                        g.received += rest.len() as u64;
                        used = data.len();
                    }
                    HeaderStep::Setup(n) => {
                        // The peer's SETUP stream (docs/protocol.md §3.5): exactly one.
                        self.inc[i] = None;
                        self.conn.release(id, n as u64);
                        if self.setup_seen {
                            self.fail(SessionCode::ProtocolViolation, "duplicate SETUP");
                            return data.len();
                        }
                        self.setup_seen = true;
                        let Some(slot) =
                            self.alloc_control(Kind::SetupIn { done: false }, Dir::Uni, Some(id))
                        else {
                            self.fail(SessionCode::Internal, "no control slot for SETUP");
                            return data.len();
                        };
                        self.control[slot].tx_done = true;
                        let rest = data.get(used + n..).unwrap_or(&[]);
                        return used + n + self.control_data(now, slot, rest, fin);
                    }
                    HeaderStep::Group(header, n) => {
                        g.received += n as u64;
                        g.preamble = g.received;
                        g.stage = Stage::Frames;
                        used += n;
                        if !self.start_group(i, header, false) {
                            return data.len();
                        }
                    }
                    HeaderStep::Refuse(code) => {
                        debug!("session: refusing uni stream {}", id.value());
                        let _ = self.conn.stop_sending(id, code.to_code());
                        self.inc[i] = None;
                        return data.len();
                    }
                    HeaderStep::Malformed => {
                        self.fail(SessionCode::ProtocolViolation, "malformed GROUP header");
                        return data.len();
                    }
                },
                Stage::Frames => {
                    if used == data.len() {
                        break;
                    }
                    let from = src.map(|(b, at)| (b, at + used));
                    match self.frame_step(i, rest, from) {
                        Ok(0) => return used, // pool exhausted: backpressure
                        Ok(n) => used += n,
                        Err(code) => {
                            self.drop_group_in(i, code);
                            return data.len();
                        }
                    }
                }
            }
            if used == data.len() {
                break;
            }
        }
        if fin {
            self.group_fin(i);
        }
        used
    }

    /// Reads the stream type and GROUP header from stored bytes plus `data`.
    fn header_step(g: &mut GroupIn<'a, 'p>, data: &[u8]) -> HeaderStep {
        let (buf, len) = joined::<HEADER_BUF>(g.hdr.get(..g.hdr_len).unwrap_or(&[]), data);
        let bytes = buf.get(..len).unwrap_or(&[]);
        let mut r = Reader::new(bytes);
        let stored = g.hdr_len;
        let more = |g: &mut GroupIn<'a, 'p>| {
            // Keep what we have; a header never exceeds the buffer.
            if len >= HEADER_BUF {
                return HeaderStep::Malformed;
            }
            if let Some(dst) = g.hdr.get_mut(..len) {
                dst.copy_from_slice(bytes);
            }
            g.hdr_len = len;
            HeaderStep::More
        };
        let code = match r.varint() {
            Ok(c) => c,
            Err(_) => return more(g),
        };
        match UniStreamType::from_code(code) {
            Some(UniStreamType::Setup) => {
                if stored > 0 {
                    // A type split across frames: rare enough to refuse rather than
                    // move stored bytes into a control slot.
                    return HeaderStep::Refuse(StreamCode::Internal);
                }
                HeaderStep::Setup(r.position())
            }
            Some(UniStreamType::Group) => match read_message::<Group>(&mut r) {
                Ok(header) => {
                    let n = r.position() - stored;
                    g.hdr_len = 0;
                    HeaderStep::Group(header, n)
                }
                Err(DecodeError::Incomplete) => more(g),
                Err(_) => HeaderStep::Malformed,
            },
            // docs/protocol.md §3.3: an unknown type is refused on that stream only.
            None => HeaderStep::Refuse(StreamCode::Internal),
        }
    }

    /// The GROUP header of incoming stream `i` arrived: find the subscription and
    /// create the group in its track. False if the stream was refused.
    fn start_group(&mut self, i: usize, header: Group, fetch: bool) -> bool {
        let Some(Some(g)) = self.inc.get(i) else {
            return false;
        };
        let id = g.id;
        // docs/protocol.md §3.9: an unknown Subscribe ID is stopped with CANCEL.
        let Some(sub) = self
            .subs
            .iter()
            .flatten()
            .filter_map(SubEntry::open)
            .find(|s| s.id == header.subscribe && s.fetch.is_some() == fetch)
        else {
            debug!(
                "session: group for unknown subscription {}",
                header.subscribe
            );
            let _ = self.conn.stop_sending(id, StreamCode::Cancel.to_code());
            self.inc[i] = None;
            return false;
        };
        match sub.producer.create_group(header.sequence) {
            Ok(mut producer) => {
                producer.set_announce_step(self.announce_step);
                let generation = producer.state().generation();
                if let Some(Some(g)) = self.inc.get_mut(i) {
                    g.sub = header.subscribe;
                    g.generation = generation;
                    g.producer = Some(producer);
                }
                self.queue(Queued::Group(
                    SubscriptionId(header.subscribe),
                    header.sequence,
                ));
                true
            }
            Err(e) => {
                debug!("session: group {} refused by the track", header.sequence);
                // Duplicates and finished tracks: not wanted; too old: OLD (§4.8).
                let code = match e {
                    track::CreateError::TooOld => StreamCode::Old,
                    _ => StreamCode::Cancel,
                };
                let _ = self.conn.stop_sending(id, code.to_code());
                self.inc[i] = None;
                false
            }
        }
    }

    /// Copies FRAME bytes into the group; returns the bytes taken (0 = the pool
    /// is exhausted; retry later).
    ///
    /// # Errors
    /// The stream code to stop the stream with when the frame cannot be stored.
    fn frame_step(
        &mut self,
        i: usize,
        data: &[u8],
        src: Option<(&Block<'p>, usize)>,
    ) -> Result<usize, StreamCode> {
        let max_frame = self.max_frame;
        let Some(Some(g)) = self.inc.get_mut(i) else {
            return Ok(data.len());
        };
        let Some(producer) = g.producer.as_mut() else {
            return Err(StreamCode::Cancel);
        };
        if g.frame_left > 0 {
            let n = usize::try_from(g.frame_left)
                .unwrap_or(usize::MAX)
                .min(data.len());
            let written = match src {
                // Payload in a foreign block joins the group without a copy.
                Some((block, at)) => producer.write_payload_from(block, at, at + n),
                None => producer.write_payload(data.get(..n).unwrap_or(&[])),
            };
            return match written {
                Ok(k) => {
                    g.frame_left -= k as u64;
                    g.received += k as u64;
                    announce_if_starved(
                        producer,
                        || self.conn.recv_credit(g.id),
                        self.announce_step,
                    );
                    Ok(k)
                }
                Err(WriteError::PoolExhausted) => Ok(0),
                Err(e) => Err(write_code(e)),
            };
        }
        let stored = g.hdr_len;
        let (buf, len) = joined::<MAX_HEADER_LEN>(g.hdr.get(..stored).unwrap_or(&[]), data);
        let bytes = buf.get(..len).unwrap_or(&[]);
        let mut r = Reader::new(bytes);
        let max = usize::try_from(producer.state().max_bytes()).unwrap_or(usize::MAX);
        match Header::decode(&mut r, g.prev, max) {
            // docs/protocol.md §3.15: FRAME_TOO_LARGE for a frame over our limit.
            Ok(h) if h.len as u64 > max_frame => Err(StreamCode::FrameTooLarge),
            Ok(h) => match begin_frame(producer, h, src.filter(|_| stored == 0), r.position()) {
                Ok(()) => {
                    let n = r.position() - stored;
                    g.prev = h.timestamp;
                    g.frame_left = h.len as u64;
                    g.hdr_len = 0;
                    g.received += n as u64;
                    // `n >= 1`: stored bytes alone never complete a header (they
                    // would have been decoded when they arrived).
                    Ok(n)
                }
                Err(WriteError::PoolExhausted) => Ok(0),
                Err(e) => Err(write_code(e)),
            },
            Err(DecodeError::Incomplete) => {
                if len >= MAX_HEADER_LEN {
                    return Err(StreamCode::MalformedTrack);
                }
                if let Some(dst) = g.hdr.get_mut(..len) {
                    dst.copy_from_slice(bytes);
                }
                g.hdr_len = len;
                let n = len - stored;
                g.received += n as u64;
                Ok(n)
            }
            Err(DecodeError::TooLarge) => Err(StreamCode::GroupTooLarge),
            Err(_) => Err(StreamCode::MalformedTrack),
        }
    }

    /// Bytes of the answer to our fetch `sub` on control slot `slot`: the
    /// group's FRAMEs with no header (docs/protocol.md §3.10), stored in the
    /// fetch's track like a group stream's, credit released as readers
    /// advance. Returns how many were taken (fewer: backpressure).
    pub(super) fn fetch_answer_data(
        &mut self,
        now: Instant,
        slot: usize,
        sub: u64,
        data: &[u8],
        fin: bool,
    ) -> usize {
        let Some(id) = self.control[slot].stream else {
            return data.len();
        };
        if self.control[slot].rx_done {
            self.conn.release(id, data.len() as u64);
            return data.len();
        }
        let i = match self.group_in(id) {
            Some(i) => i,
            None => {
                let seq = self
                    .subs
                    .iter()
                    .flatten()
                    .filter_map(SubEntry::open)
                    .find(|s| s.id == sub)
                    .and_then(|s| s.fetch);
                let (Some(seq), Some(i)) = (seq, self.inc.first_free()) else {
                    debug!("session: no group-stream entry for a fetch answer");
                    self.conn.release(id, data.len() as u64);
                    self.fetch_failed(slot, sub, StreamCode::Evicted);
                    return data.len();
                };
                let mut g = GroupIn::new(id);
                g.stage = Stage::Frames;
                self.inc[i] = Some(g);
                let header = Group {
                    subscribe: sub,
                    sequence: seq,
                };
                if !self.start_group(i, header, true) {
                    self.conn.release(id, data.len() as u64);
                    self.fetch_failed(slot, sub, StreamCode::Cancel);
                    return data.len();
                }
                i
            }
        };
        let used = self.group_data(now, i, data, None, false);
        if self.group_in(id) != Some(i) {
            // Dropped: a frame the track could not take (the stream is stopped).
            self.fetch_failed(slot, sub, StreamCode::Cancel);
            return data.len();
        }
        if used == data.len() && fin {
            let clean =
                self.inc.get(i).and_then(Option::as_ref).is_some_and(|g| {
                    g.stage == Stage::Frames && g.frame_left == 0 && g.hdr_len == 0
                });
            self.group_fin(i);
            let c = &mut self.control[slot];
            c.rx_done = true;
            // Our half ends too: the fetch is over.
            c.fin = true;
            let code = (!clean).then_some(StreamCode::WrongSize.to_code());
            self.subscription_closed(sub, code);
        }
        used
    }

    /// Our fetch `sub` on `slot` failed locally: stop and reset its stream
    /// with `code` and close it.
    fn fetch_failed(&mut self, slot: usize, sub: u64, code: StreamCode) {
        self.stop_rx(slot, code);
        self.reset_tx(slot, code);
        self.subscription_closed(sub, Some(code.to_code()));
    }

    /// The group stream's FIN arrived after all its bytes were stored.
    fn group_fin(&mut self, i: usize) {
        let Some(Some(g)) = self.inc.get_mut(i) else {
            return;
        };
        let id = g.id;
        // docs/protocol.md §3.9: FIN exactly on a frame boundary.
        let clean = g.stage == Stage::Frames && g.frame_left == 0 && g.hdr_len == 0;
        if let Some(mut p) = g.producer.take() {
            if clean {
                if p.finish().is_err() {
                    p.abort(StreamCode::Cancel.to_code());
                }
            } else {
                p.abort(StreamCode::WrongSize.to_code());
            }
        }
        // Everything is stored: give all the credit back; the stream retires.
        let unreleased = g.received.saturating_sub(g.released);
        self.conn.release(id, unreleased);
        self.inc[i] = None;
    }

    /// Gives up on incoming group stream `i`: abort the group and stop the stream.
    fn drop_group_in(&mut self, i: usize, code: StreamCode) {
        let Some(Some(g)) = self.inc.get_mut(i) else {
            return;
        };
        debug!("session: dropping group stream, code {}", code.to_code());
        if let Some(mut p) = g.producer.take() {
            p.abort(code.to_code());
        }
        let _ = self.conn.stop_sending(g.id, code.to_code());
        self.inc[i] = None;
    }

    /// The peer reset an incoming group stream: abandon the group with its code.
    pub(super) fn group_reset(&mut self, id: StreamId, code: u64) {
        if let Some(i) = self.group_in(id)
            && let Some(Some(g)) = self.inc.get_mut(i)
        {
            if let Some(mut p) = g.producer.take() {
                p.abort(code);
            }
            self.inc[i] = None;
        }
    }

    /// Releases credit for group bytes local readers consumed, and drops streams
    /// whose group was evicted or aborted locally.
    pub(super) fn release_credit(&mut self) {
        for i in 0..self.inc.span() {
            let Some(Some(g)) = self.inc.get_mut(i) else {
                continue;
            };
            let Some(producer) = g.producer.as_mut() else {
                continue;
            };
            // Other streams may have used connection credit since the write.
            announce_if_starved(producer, || self.conn.recv_credit(g.id), self.announce_step);
            let state = producer.state();
            if state.generation() != g.generation || !state.is_open() {
                // Evicted from the track, or aborted: nobody will read the rest.
                self.drop_group_in(i, StreamCode::Cancel);
                continue;
            }
            // Stream bytes past the preamble map onto group bytes, except that the
            // peer's FRAME headers may be longer than ours (non-shortest varints)
            // and a partial header is held back: that slack is released as read.
            let taken = g.received.saturating_sub(g.preamble);
            let slack = taken.saturating_sub(state.bytes_written());
            let target = min(
                g.received,
                g.preamble
                    .saturating_add(state.furthest_read())
                    .saturating_add(slack),
            );
            if target > g.released {
                self.conn.release(g.id, target - g.released);
                g.released = target;
            }
        }
    }
}

/// Wakes the group's readers for its unannounced payload if the sender, with
/// `credit()` bytes left, cannot complete an announce step: it would wait for
/// credit that only those readers give back. (`credit` looks the stream up:
/// asked only when something is unannounced.)
fn announce_if_starved(
    producer: &mut track::GroupProducer<'_, '_>,
    credit: impl FnOnce() -> u64,
    step: u64,
) {
    let unannounced = producer.unannounced();
    if unannounced > 0 && unannounced.saturating_add(credit()) < step {
        producer.announce();
    }
}

/// Starts frame `h`, whose header is the first `len` bytes of the data: taken
/// from the foreign block when the data lies in one (`src`), else written.
fn begin_frame<'p>(
    producer: &mut track::GroupProducer<'_, 'p>,
    h: Header,
    src: Option<(&Block<'p>, usize)>,
    len: usize,
) -> Result<(), WriteError> {
    match src {
        Some((block, at)) => producer.begin_frame_from(h.timestamp, h.len, block, at, at + len),
        None => producer.begin_frame(h.timestamp, h.len),
    }
}

/// The stream code for a group write that failed for good.
fn write_code(e: WriteError) -> StreamCode {
    match e {
        WriteError::GroupTooLarge => StreamCode::GroupTooLarge,
        WriteError::TimestampRange => StreamCode::TimestampMismatch,
        WriteError::Aborted(code) => StreamCode::from_code(code),
        _ => StreamCode::Cancel,
    }
}

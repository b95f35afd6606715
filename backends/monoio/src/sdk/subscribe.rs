//! Subscribing: a track's groups in arrival order, their frames as pool blocks.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use skiff_core::model::group::{self, Next};
use skiff_core::model::track;
use skiff_core::pool::Slice;
use skiff_core::session::SubscriptionId;
use skiff_core::window::Request;
use smallvec::SmallVec;

use super::fetch::Fetched;
use super::{Error, Shared, check_path, track_info};

/// Where a subscription stands with the current session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the broadcast's announcement (or a session).
    Waiting,
    /// SUBSCRIBE sent in the current session; no answer yet.
    Requested(SubscriptionId),
    /// The relay accepted it (TRACK_INFO or SUBSCRIBE_START arrived).
    Active(SubscriptionId),
    /// The publisher finished the track: final.
    Finished,
    /// The relay refused it before it was ever accepted: final.
    Refused(u64),
    /// Every subscription slot of the session held another subscription
    /// of this client when it was first asked for: final.
    Full,
}

/// A subscription the application holds, as the runner sees it.
pub(crate) struct Wanted {
    pub(super) broadcast: String,
    pub(super) request: Request,
    /// The local track the session fills; replaced by a reopened handle for
    /// each new subscription after the first.
    local: Cell<track::Ref<'static, 'static>>,
    pub(super) phase: Cell<Phase>,
    /// Accepted at least once: a later refusal waits for the next announcement.
    pub(super) accepted: Cell<bool>,
    /// The local track was filled by an earlier subscription.
    used: Cell<bool>,
    /// The consumer is gone: unsubscribe and give the track back.
    pub(super) dropped: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl std::fmt::Debug for Wanted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wanted")
            .field("broadcast", &self.broadcast)
            .field("phase", &self.phase.get())
            .finish_non_exhaustive()
    }
}

impl Wanted {
    /// The local track now.
    pub(crate) fn local(&self) -> track::Ref<'static, 'static> {
        self.local.get()
    }

    /// The local track for a new subscription: the same one the first time,
    /// a reopened handle after (readers of the old one move over).
    pub(super) fn fresh_local(&self) -> track::Ref<'static, 'static> {
        let t = self.local.get();
        if !self.used.replace(true) {
            return t;
        }
        let t = t.reopen(t.info());
        self.local.set(t);
        t
    }

    /// Wakes the consumer.
    pub(crate) fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn register(&self, waker: &Waker) {
        let mut w = self.waker.borrow_mut();
        if !w.as_ref().is_some_and(|x| x.will_wake(waker)) {
            *w = Some(waker.clone());
        }
    }
}

/// A subscribed track: its groups as they arrive.
#[derive(Debug)]
pub struct TrackConsumer {
    wanted: Rc<Wanted>,
    consumer: track::Consumer<'static, 'static>,
    key: track::Key,
    /// Groups skipped since the last group handed out.
    skipped: u64,
    /// What the handle borrows from (the client's tables and pool): the
    /// last field, so it drops after the core handles above.
    shared: Rc<Shared>,
}

impl TrackConsumer {
    pub(super) async fn subscribe(
        shared: Rc<Shared>,
        path: &str,
        name: &str,
        request: Request,
    ) -> Result<TrackConsumer, Error> {
        check_path(path)?;
        let info = track_info(name)?;
        let local = shared.ctx.claim_track(info).ok_or(Error::Full("track"))?;
        let wanted = Rc::new(Wanted {
            broadcast: path.to_owned(),
            request,
            local: Cell::new(local),
            phase: Cell::new(Phase::Waiting),
            accepted: Cell::new(false),
            used: Cell::new(false),
            dropped: Cell::new(false),
            waker: RefCell::new(None),
        });
        shared.wanted.borrow_mut().push(wanted.clone());
        shared.kick();
        let outcome = poll_fn(|cx| {
            if shared.closed.get() {
                return Poll::Ready(Err(Error::Closed));
            }
            match wanted.phase.get() {
                Phase::Active(_) | Phase::Finished => Poll::Ready(Ok(())),
                Phase::Refused(code) => Poll::Ready(Err(Error::Refused(code))),
                Phase::Full => Poll::Ready(Err(Error::Full("subscriptions of the session"))),
                Phase::Waiting | Phase::Requested(_) => {
                    wanted.register(cx.waker());
                    Poll::Pending
                }
            }
        })
        .await;
        if let Err(e) = outcome {
            wanted.dropped.set(true);
            shared.kick();
            return Err(e);
        }
        let local = wanted.local();
        Ok(TrackConsumer {
            consumer: local.consumer(request.start),
            key: local.key(),
            shared,
            wanted,
            skipped: 0,
        })
    }

    /// The track's name and properties (from the publisher's TRACK_INFO).
    pub fn info(&self) -> track::Info {
        self.wanted.local().info()
    }

    /// The next group in arrival order; `None` once the publisher finished
    /// the track. Groups the consumer fell behind on are skipped, and the
    /// group says how many ([`GroupConsumer::skipped`]).
    ///
    /// # Errors
    /// [`Error::Closed`] if the client closed.
    pub async fn next_group(&mut self) -> Result<Option<GroupConsumer>, Error> {
        loop {
            if self.shared.closed.get() {
                return Err(Error::Closed);
            }
            let local = self.wanted.local();
            if local.key() != self.key {
                // A new subscription fills a reopened track: follow it.
                self.consumer = local.consumer(self.wanted.request.start);
                self.key = local.key();
            }
            let seen = local.version();
            match self.consumer.next_group() {
                Ok(track::Next::Ready(group)) => {
                    return Ok(Some(GroupConsumer {
                        shared: self.shared.clone(),
                        track: local,
                        group,
                        skipped: std::mem::take(&mut self.skipped),
                        header: None,
                        parts: SmallVec::new(),
                        have: 0,
                        fetched: None,
                    }));
                }
                Ok(track::Next::Lagged(n)) => {
                    self.skipped += n;
                    continue;
                }
                Ok(track::Next::Finished) => return Ok(None),
                // Pending, or the track ended with its subscription (the
                // session or the source went away): wait for the track to
                // change or a new subscription to replace it.
                Ok(_) | Err(_) => {
                    let wanted = &self.wanted;
                    let shared = &self.shared;
                    let key = self.key;
                    poll_fn(|cx| {
                        if shared.closed.get() || wanted.local().key() != key {
                            return Poll::Ready(());
                        }
                        wanted.register(cx.waker());
                        local.poll_changed(cx, seen).map(|_| ())
                    })
                    .await;
                }
            }
        }
    }
}

impl Drop for TrackConsumer {
    fn drop(&mut self) {
        self.wanted.dropped.set(true);
        self.shared.kick();
    }
}

/// One group of a subscribed track, or a fetched group
/// ([`super::Client::fetch`]): its frames in order.
#[derive(Debug)]
pub struct GroupConsumer {
    track: track::Ref<'static, 'static>,
    group: group::Consumer<'static, 'static>,
    skipped: u64,
    /// The frame being read: timestamp and length.
    header: Option<(u64, usize)>,
    parts: SmallVec<[Slice<'static>; 2]>,
    have: usize,
    /// The fetch that fills the group's track, which ends with this reader.
    fetched: Option<Rc<Fetched>>,
    /// What the handle borrows from (the client's tables and pool): the
    /// last field, so it drops after the core handles above.
    shared: Rc<Shared>,
}

/// One frame: its timestamp and its payload.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The timestamp, in the track's timescale.
    pub timestamp: u64,
    /// The payload, in pool blocks.
    pub payload: Payload,
}

/// A frame's payload as the pool blocks it lives in (no copy): read it with
/// [`Payload::chunks`], [`bytes::Buf`] or [`Payload::to_vec`]. Holding it
/// holds its blocks.
#[derive(Debug, Clone, Default)]
pub struct Payload {
    parts: SmallVec<[Slice<'static>; 2]>,
    /// Bytes of the first part already consumed through [`bytes::Buf`].
    front: usize,
    remaining: usize,
}

impl Payload {
    /// Its length in bytes (what is left of it after [`bytes::Buf::advance`]).
    pub fn len(&self) -> usize {
        self.remaining
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }

    /// The bytes, block by block.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().enumerate().map(|(i, s)| {
            let b = s.as_bytes();
            if i == 0 {
                b.get(self.front..).unwrap_or(&[])
            } else {
                b
            }
        })
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.remaining);
        for c in self.chunks() {
            v.extend_from_slice(c);
        }
        v
    }
}

impl bytes::Buf for Payload {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks().next().unwrap_or(&[])
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advance past the end of the payload");
        self.remaining -= cnt;
        while cnt > 0 {
            let Some(first) = self.parts.first() else {
                return;
            };
            let left = first.len() - self.front;
            if cnt < left {
                self.front += cnt;
                return;
            }
            cnt -= left;
            self.parts.remove(0);
            self.front = 0;
        }
    }
}

/// What one reading step found.
enum Step {
    Frame(Frame),
    Pending,
    End,
}

impl GroupConsumer {
    /// The reader of a fetched group, which ends the fetch when dropped.
    pub(super) fn fetched(
        shared: Rc<Shared>,
        track: track::Ref<'static, 'static>,
        group: group::Consumer<'static, 'static>,
        fetched: Rc<Fetched>,
    ) -> Self {
        GroupConsumer {
            track,
            group,
            skipped: 0,
            header: None,
            parts: SmallVec::new(),
            have: 0,
            fetched: Some(fetched),
            shared,
        }
    }

    /// The track's name and properties: for a fetched group, the
    /// publisher's TRACK_INFO (the timescale of [`Frame::timestamp`]).
    pub fn info(&self) -> track::Info {
        self.track.info()
    }

    /// The group's sequence number.
    pub fn sequence(&self) -> u64 {
        self.group.sequence()
    }

    /// How many groups the track consumer skipped just before this one
    /// because it fell behind (lag, as data).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The next frame; `None` after the group's last one.
    ///
    /// # Errors
    /// [`Error::Aborted`] if the publisher abandoned the group, [`Error::Evicted`]
    /// if the reader fell so far behind that the group left the cache (read
    /// on with the track's next group for both), [`Error::Closed`] if the client closed.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, Error> {
        loop {
            if self.shared.closed.get() {
                return Err(Error::Closed);
            }
            let seen = self.track.version();
            match self.step() {
                Ok(Step::Frame(f)) => return Ok(Some(f)),
                Ok(Step::End) => return Ok(None),
                Ok(Step::Pending) => {
                    let track = self.track;
                    let shared = &self.shared;
                    poll_fn(|cx| {
                        if shared.closed.get() {
                            return Poll::Ready(());
                        }
                        track.poll_changed(cx, seen).map(|_| ())
                    })
                    .await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads as far as the group's bytes go now.
    fn step(&mut self) -> Result<Step, Error> {
        let out = self.read_now();
        // Reading frees credit for the session filling the track.
        if !matches!(out, Ok(Step::Pending)) || self.have > 0 {
            self.shared
                .ctx
                .notify()
                .bump_consumed_tracks([self.track.key()]);
        }
        out
    }

    fn read_now(&mut self) -> Result<Step, Error> {
        let (timestamp, len) = match self.header {
            Some(h) => h,
            None => match self.group.read_frame_header() {
                Ok(Next::Ready(h)) => {
                    self.header = Some((h.timestamp, h.len));
                    self.parts.clear();
                    self.have = 0;
                    (h.timestamp, h.len)
                }
                Ok(Next::Pending) => return Ok(Step::Pending),
                Ok(Next::Finished) => return Ok(Step::End),
                Err(e) => return Err(read_error(e)),
            },
        };
        while self.have < len {
            match self.group.chunk_slice() {
                Ok(Next::Ready(mut slice)) => {
                    let n = slice.len().min(len - self.have);
                    slice.truncate(n);
                    self.group.advance(n);
                    self.have += n;
                    self.parts.push(slice);
                }
                Ok(Next::Pending) => return Ok(Step::Pending),
                // The group ended inside a frame: its source cut it short.
                Ok(Next::Finished) => return Err(Error::Aborted(0)),
                Err(e) => return Err(read_error(e)),
            }
        }
        self.header = None;
        let payload = Payload {
            parts: std::mem::take(&mut self.parts),
            front: 0,
            remaining: len,
        };
        self.have = 0;
        Ok(Step::Frame(Frame { timestamp, payload }))
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        if let Some(f) = &self.fetched {
            f.dropped.set(true);
            self.shared.kick();
        }
    }
}

/// A group read error as the SDK reports it.
fn read_error(e: group::ReadError) -> Error {
    match e {
        group::ReadError::Aborted(code) => Error::Aborted(code),
        // Evicted or trimmed under the reader: the rest of it is gone.
        _ => Error::Evicted,
    }
}

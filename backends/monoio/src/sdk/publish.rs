//! Publishing: a broadcast, its tracks, their groups and frames.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, group, track};

use super::{Error, Shared, check_path};

/// A broadcast this client publishes; dropping it (or [`BroadcastProducer::finish`])
/// unannounces it.
#[derive(Debug)]
pub struct BroadcastProducer {
    producer: Option<broadcast::Producer<'static, 'static>>,
    /// What the handle borrows from (the client's tables and pool): the
    /// last field, so it drops after the core handles above.
    shared: Rc<Shared>,
}

/// The longest a write waits for a group's first reader before it goes on
/// and lets the group be trimmed ([`GroupProducer::write_frame`]): a few
/// passes of a session, with room for a busy host.
const FIRST_READER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A published track as the runner and [`super::Client::flushed`] see it.
pub(crate) struct Published {
    track: track::Ref<'static, 'static>,
    /// The newest group's state and generation (for [`Published::is_flushed`]).
    newest: Cell<Option<(&'static group::State<'static>, u64)>>,
    /// A writer waiting for its group's pacing, woken also when the client closes.
    waker: RefCell<Option<Waker>>,
    /// Its producer is gone: the entry stays only until its last group was
    /// read ([`Shared::forget_flushed`]).
    dropped: Cell<bool>,
}

impl Published {
    /// True for the entry of a dropped producer whose last group was read.
    pub(crate) fn is_forgettable(&self) -> bool {
        self.dropped.get() && self.is_flushed()
    }

    /// Wakes a writer waiting for its group's pacing.
    pub(crate) fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// True once nobody subscribes to the track, or its newest group was read
    /// to its end.
    pub(crate) fn is_flushed(&self) -> bool {
        if self.track.subscribers() == 0 {
            return true;
        }
        match self.newest.get() {
            Some((state, generation)) if state.generation() == generation => {
                state.furthest_read() >= state.bytes_written()
            }
            _ => true,
        }
    }
}

impl BroadcastProducer {
    pub(super) fn new(shared: Rc<Shared>, path: &str) -> Result<Self, Error> {
        check_path(path)?;
        let p = Path::new(path).map_err(|_| Error::InvalidName(path.to_owned()))?;
        if shared.origin.get(p).is_some() {
            return Err(Error::Duplicate(path.to_owned()));
        }
        let b = shared
            .ctx
            .claim_broadcast(p)
            .ok_or(Error::Full("broadcast"))?;
        let producer = match b.producer() {
            Ok(producer) => producer,
            Err(_) => {
                shared.ctx.retire_broadcast(b);
                return Err(Error::Duplicate(path.to_owned()));
            }
        };
        if shared.origin.announce(b).is_err() {
            drop(producer);
            shared.ctx.retire_broadcast(b);
            return Err(Error::Full("broadcast"));
        }
        shared.kick();
        Ok(BroadcastProducer {
            shared,
            producer: Some(producer),
        })
    }

    /// The broadcast's path.
    pub fn path(&self) -> String {
        self.producer
            .as_ref()
            .map(|p| p.broadcast().path().as_str().to_owned())
            .unwrap_or_default()
    }

    /// Adds a track described by `info` (name, priority, timescale, max age).
    ///
    /// # Errors
    /// [`Error::Duplicate`] for a name the broadcast has, [`Error::Full`]
    /// past the client's track limit or the broadcast's track places.
    pub fn create_track(&self, info: track::Info) -> Result<TrackProducer, Error> {
        let producer = self.producer.as_ref().ok_or(Error::Closed)?;
        if producer.broadcast().track(info.name.as_str()).is_some() {
            return Err(Error::Duplicate(info.name.as_str().to_owned()));
        }
        let t = self
            .shared
            .ctx
            .claim_track(info)
            .ok_or(Error::Full("track"))?;
        if producer.add(t).is_err() {
            self.shared.ctx.release(t);
            return Err(Error::Full("broadcast track"));
        }
        // The track keeps at most a quarter of the pool cached, so a full
        // pool frees up as readers move on, connected or not.
        t.set_budget(self.shared.config.pool_bytes / 4);
        let Ok(track_producer) = t.producer() else {
            producer.remove(info.name.as_str());
            self.shared.ctx.release(t);
            return Err(Error::Full("track"));
        };
        let published = Rc::new(Published {
            track: t,
            newest: Cell::new(None),
            waker: RefCell::new(None),
            dropped: Cell::new(false),
        });
        self.shared.forget_flushed();
        self.shared.published.borrow_mut().push(published.clone());
        self.shared.kick();
        Ok(TrackProducer {
            shared: self.shared.clone(),
            published,
            producer: Some(track_producer),
        })
    }

    /// Unannounces the broadcast; its tracks end as their producers do.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        let Some(mut producer) = self.producer.take() else {
            return;
        };
        let b = producer.broadcast();
        self.shared.origin.unannounce(b.path().as_path());
        producer.finish();
        drop(producer);
        self.shared.ctx.retire_broadcast(b);
        self.shared.kick();
    }
}

impl Drop for BroadcastProducer {
    fn drop(&mut self) {
        self.end();
    }
}

/// A published track: append groups to it; dropping it unfinished aborts it.
#[derive(Debug)]
pub struct TrackProducer {
    published: Rc<Published>,
    producer: Option<track::Producer<'static, 'static>>,
    /// What the handle borrows from (the client's tables and pool): the
    /// last field, so it drops after the core handles above.
    shared: Rc<Shared>,
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("track", &self.track.info().name)
            .finish_non_exhaustive()
    }
}

impl TrackProducer {
    /// Starts the next group (sequence one past the newest); the previous
    /// group should be finished first.
    ///
    /// # Errors
    /// [`Error::Closed`] after the track ended.
    pub fn append_group(&mut self) -> Result<GroupProducer, Error> {
        let producer = self.producer.as_ref().ok_or(Error::Closed)?;
        let group = producer
            .append_group()
            .map_err(|_| Error::Write(group::WriteError::Finished))?;
        Ok(self.started(group))
    }

    /// Starts group `sequence`: for a source that continues a sequence (a
    /// restarted camera resuming after the groups a relay still holds).
    ///
    /// # Errors
    /// [`Error::Closed`] after the track ended; [`Error::Duplicate`] for a
    /// sequence the track holds or is past keeping.
    pub fn create_group(&mut self, sequence: u64) -> Result<GroupProducer, Error> {
        let producer = self.producer.as_ref().ok_or(Error::Closed)?;
        let group = producer
            .create_group(sequence)
            .map_err(|_| Error::Duplicate(format!("group {sequence}")))?;
        Ok(self.started(group))
    }

    fn started(&self, group: track::GroupProducer<'static, 'static>) -> GroupProducer {
        let state = group.state();
        self.published.newest.set(Some((state, state.generation())));
        GroupProducer {
            published: self.published.clone(),
            group: Some(group),
            first_reader_by: None,
            shared: self.shared.clone(),
        }
    }

    /// The track's name and properties.
    pub fn info(&self) -> track::Info {
        self.published.track.info()
    }

    /// How many subscriptions the client's sessions serve from the track.
    pub fn subscribers(&self) -> u32 {
        self.published.track.subscribers()
    }

    /// Ends the track: subscribers get its end after the last group.
    pub fn finish(mut self) {
        if let Some(mut p) = self.producer.take() {
            p.finish();
        }
    }
}

impl Drop for TrackProducer {
    fn drop(&mut self) {
        // An unfinished producer aborts its track as it drops.
        drop(self.producer.take());
        // A finished track's last group may still be on its way:
        // `Client::flushed` waits for it until it was read.
        self.published.dropped.set(true);
        self.shared.forget_flushed();
        self.shared.ctx.release(self.published.track);
    }
}

/// A group being written: frames in order, then [`GroupProducer::finish`];
/// dropping it unfinished aborts the group.
#[derive(Debug)]
pub struct GroupProducer {
    published: Rc<Published>,
    group: Option<track::GroupProducer<'static, 'static>>,
    /// When the wait for the group's first reader ends, once a write began
    /// it ([`GroupProducer::write_frame`]): once per group, not per write.
    first_reader_by: Option<std::time::Instant>,
    /// What the handle borrows from (the client's tables and pool): the
    /// last field, so it drops after the core handles above.
    shared: Rc<Shared>,
}

impl GroupProducer {
    /// The group's sequence number.
    pub fn sequence(&self) -> u64 {
        self.group.as_ref().map_or(0, |g| g.sequence())
    }

    /// Appends a frame with `timestamp` (in the track's timescale) and
    /// `payload`. Waits while the group is a credit window ahead of its
    /// fastest reader, while the block pool has no room, and (at most a
    /// second) for the first reader of a group about to outgrow the track's
    /// budget while the track has subscribers.
    ///
    /// # Errors
    /// [`Error::GroupTooLarge`] past the group size limit, [`Error::Write`]
    /// after the group ended or for a timestamp too far from the previous
    /// one, [`Error::Closed`] if the client closed.
    pub async fn write_frame(&mut self, timestamp: u64, payload: &[u8]) -> Result<(), Error> {
        loop {
            if self.waits_for_first_reader(payload.len()) {
                self.shared.wait_room().await;
                continue;
            }
            let paced = self
                .group
                .as_ref()
                .ok_or(Error::Write(group::WriteError::Finished))?;
            // Pacing: wait while the group is a window ahead of its fastest
            // reader (the session serving it reports the window to the group).
            let published = &self.published;
            let shared = &self.shared;
            poll_fn(|cx| {
                if shared.closed.get() {
                    return Poll::Ready(());
                }
                let ready = paced.poll_paced(cx);
                if ready.is_pending() {
                    *published.waker.borrow_mut() = Some(cx.waker().clone());
                }
                ready
            })
            .await;
            if self.shared.closed.get() {
                return Err(Error::Closed);
            }
            let group = self
                .group
                .as_mut()
                .ok_or(Error::Write(group::WriteError::Finished))?;
            match group.write_frame(timestamp, payload) {
                Ok(()) => return Ok(()),
                // Backpressure: blocks come back as sessions send and readers move on.
                Err(group::WriteError::PoolExhausted) => self.shared.wait_room().await,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// True while a write of `len` bytes should wait for the group's first
    /// reader: the track has subscribers, no session paces the group yet
    /// (one opens its stream on its next pass), and the write would take
    /// the group past the track's budget, past which a group's head is
    /// trimmed (`skiff_core::model::track`): written now, the group would
    /// lose its start before any session sent it. The wait ends when a
    /// reader paces the group, the subscribers go, or [`FIRST_READER_WAIT`]
    /// after the group's first wait began.
    fn waits_for_first_reader(&mut self, len: usize) -> bool {
        let Some(group) = self.group.as_ref() else {
            return false;
        };
        let state = group.state();
        let past_budget = state.bytes_written().saturating_add(len as u64) > state.retain();
        if !past_budget
            || state.is_trimmed()
            || group.allowance() != u64::MAX
            || self.published.track.subscribers() == 0
            || self.shared.closed.get()
        {
            return false;
        }
        let now = std::time::Instant::now();
        let until = *self.first_reader_by.get_or_insert(now + FIRST_READER_WAIT);
        now < until
    }

    /// Ends the group after its last frame.
    ///
    /// # Errors
    /// [`Error::Write`] if it already ended.
    pub fn finish(mut self) -> Result<(), Error> {
        let mut group = self
            .group
            .take()
            .ok_or(Error::Write(group::WriteError::Finished))?;
        let res = group.finish();
        drop(group);
        res.map_err(Error::from)
    }
}

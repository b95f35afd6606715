//! Fetching one past group of a track (docs/protocol.md §3.10): TRACK for
//! the track's TRACK_INFO (its timescale), then FETCH; the group fills a
//! local track of its own, read like a subscribed group.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use skiff_core::model::track;
use skiff_core::session::SubscriptionId;
use skiff_core::wire::lite::StreamCode;

use super::subscribe::GroupConsumer;
use super::{Error, Shared, check_path, track_info};

/// Where a fetch stands with the current session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FetchPhase {
    /// Waiting for a session to send it on.
    Waiting,
    /// TRACK and FETCH sent; no byte of the group yet.
    Requested(SubscriptionId),
    /// The group's first bytes arrived: it exists in the local track.
    Arrived(SubscriptionId),
    /// The whole group arrived, or the fetch ended after it started.
    Done,
    /// Refused before any byte of the group came, with this stream code: final.
    Refused(u64),
}

/// A fetch the application waits for or reads, as the runner sees it.
pub(crate) struct Fetched {
    pub(super) broadcast: String,
    pub(super) group: u64,
    pub(super) priority: u8,
    /// The local track the group fills (the fetch's own).
    local: track::Ref<'static, 'static>,
    pub(super) phase: Cell<FetchPhase>,
    /// The group's reader is gone: cancel and give the track back.
    pub(super) dropped: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetched")
            .field("broadcast", &self.broadcast)
            .field("group", &self.group)
            .field("phase", &self.phase.get())
            .finish_non_exhaustive()
    }
}

impl Fetched {
    /// The local track the group fills.
    pub(crate) fn local(&self) -> track::Ref<'static, 'static> {
        self.local
    }

    /// The session's id of the fetch, while one is under way.
    pub(super) fn id(&self) -> Option<SubscriptionId> {
        match self.phase.get() {
            FetchPhase::Requested(id) | FetchPhase::Arrived(id) => Some(id),
            _ => None,
        }
    }

    /// Wakes the caller waiting for the fetch's answer.
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

/// The error of a fetch refused with `code`.
fn refused(code: u64) -> Error {
    match StreamCode::from_code(code) {
        StreamCode::NotFound | StreamCode::Unroutable => Error::NotFound,
        _ => Error::Refused(code),
    }
}

/// Fetches group `group` of track `name` of broadcast `path`; see
/// [`super::Client::fetch`].
pub(super) async fn fetch(
    shared: Rc<Shared>,
    path: &str,
    name: &str,
    group: u64,
) -> Result<GroupConsumer, Error> {
    check_path(path)?;
    let info = track_info(name)?;
    let local = shared.ctx.claim_track(info).ok_or(Error::Full("track"))?;
    let fetched = Rc::new(Fetched {
        broadcast: path.to_owned(),
        group,
        priority: 0,
        local,
        phase: Cell::new(FetchPhase::Waiting),
        dropped: Cell::new(false),
        waker: RefCell::new(None),
    });
    shared.fetches.borrow_mut().push(fetched.clone());
    shared.kick();
    let outcome = poll_fn(|cx| {
        if shared.closed.get() {
            return Poll::Ready(Err(Error::Closed));
        }
        match fetched.phase.get() {
            FetchPhase::Arrived(_) | FetchPhase::Done => Poll::Ready(Ok(())),
            FetchPhase::Refused(code) => Poll::Ready(Err(refused(code))),
            FetchPhase::Waiting | FetchPhase::Requested(_) => {
                fetched.register(cx.waker());
                Poll::Pending
            }
        }
    })
    .await;
    let consumer = outcome.and_then(|()| local.group(group).ok_or(Error::Evicted));
    match consumer {
        Ok(consumer) => Ok(GroupConsumer::fetched(shared, local, consumer, fetched)),
        Err(e) => {
            fetched.dropped.set(true);
            shared.kick();
            Err(e)
        }
    }
}

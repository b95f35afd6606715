//! The storage of a track: [`State`], a ring of group slots over a pool.

use core::cell::Cell;
use core::fmt;

use super::demand::Demand;
use super::{Consumer, Core, Info, Limits, Producer, ProducerTaken, Ref, Slot, Status, Wakers};
use crate::model::group;
use crate::pool::Pool;
use crate::time::Instant;
use crate::window::{Start, Timeline};

/// The storage of one track: a ring of `G` group slots over a pool, plus its bookkeeping.
///
/// Put it where it outlives every handle (a `static`, the stack of the task
/// that runs the node, a relay's table of tracks) and share it through
/// [`State::handle`]. See the module docs for the model.
pub struct State<'p, const G: usize> {
    core: Core,
    slots: [Slot<'p>; G],
}

impl<'p, const G: usize> State<'p, G> {
    const RING_OK: () = assert!(G > 0, "track::State needs at least one group slot");

    /// A track described by `info`, without limits but the pool's.
    pub fn new(pool: &'p Pool<'p>, info: Info) -> Self {
        Self::with_limits(pool, info, Limits::NONE)
    }

    /// A track described by `info`, with `limits`.
    pub fn with_limits(pool: &'p Pool<'p>, info: Info, limits: Limits) -> Self {
        let () = Self::RING_OK;
        State {
            core: Core {
                info: Cell::new(info),
                info_known: Cell::new(true),
                status: Cell::new(Status::Open),
                epoch: Cell::new(0),
                latest: Cell::new(None),
                evicted_max: Cell::new(None),
                upstream_first: Cell::new(None),
                evicted: Cell::new(0),
                version: Cell::new(0),
                budget: Cell::new(limits.cache_bytes),
                has_producer: Cell::new(false),
                producer_id: Cell::new(0),
                failover: Cell::new(false),
                demand: Cell::new(Demand::NONE),
                wakers: Wakers::new(),
            },
            slots: core::array::from_fn(|_| {
                let group = group::State::new(pool, limits.group_bytes);
                group.set_retain(limits.cache_bytes);
                Slot {
                    group,
                    begin: Cell::new(None),
                }
            }),
        }
    }

    /// The size-erased handle every producer, consumer and broadcast uses.
    pub fn handle(&self) -> Ref<'_, 'p> {
        Ref {
            core: &self.core,
            slots: &self.slots,
            epoch: self.core.epoch.get(),
        }
    }

    /// The track's one producer; see [`Ref::producer`].
    ///
    /// # Errors
    /// [`ProducerTaken`] while another producer of this track is alive.
    pub fn producer(&self) -> Result<Producer<'_, 'p>, ProducerTaken> {
        self.handle().producer()
    }

    /// A new reader; see [`Ref::consumer`].
    pub fn consumer(&self, start: Start) -> Consumer<'_, 'p> {
        self.handle().consumer(start)
    }
}

impl<'t, 'p, const G: usize> From<&'t State<'p, G>> for Ref<'t, 'p> {
    fn from(state: &'t State<'p, G>) -> Self {
        state.handle()
    }
}

impl<const G: usize> Timeline for State<'_, G> {
    fn latest(&self) -> Option<u64> {
        self.handle().latest()
    }

    fn newest(&self) -> Instant {
        Timeline::newest(&self.handle())
    }

    fn superseded_at(&self, seq: u64) -> Option<Instant> {
        self.handle().superseded_at(seq)
    }
}

impl<const G: usize> fmt::Debug for State<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.handle(), f)
    }
}

//! The allocation audit: how many heap allocations each hot-path operation
//! makes once warm, per operation.
//!
//! Every [`Case`] builds its state for one audience size (this may allocate:
//! it is start-up), runs a warm-up of `n` operations, then counts the
//! allocations of a run of `n` operations and of a run of `2n` more. The
//! difference of the two, divided by `n`, is what one operation costs in
//! steady state, free of anything done once:
//!
//! ```text
//! allocs_per_op = (count(2n) - count(n)) / n
//! ```
//!
//! Counting needs [`Counting`](crate::counting::Counting) as the binary's
//! `#[global_allocator]`; [`run`] refuses to report without it (every count
//! would read 0). The `alloc_audit` bench prints one [`Report`] line per case
//! and audience, and `tests/alloc_audit.rs` runs the same cases with a small
//! `n` and fails on any allocation.
//!
//! Adding a case is one entry in [`CASES`]: a name, its audiences, and a
//! function that builds an [`Op`] for an audience size.
//!
//! A case may leave part of its operation out of its count
//! ([`Op::excluded`]): `camera_frame` runs capture, encode and publish but
//! counts capture and publish only; `camera_encode` runs the same pipeline
//! and counts the encoder only (a real codec may allocate; the test requires
//! zero of every case but [`ENCODER_CASES`]).

use std::fmt;
use std::hint::black_box;

use skiff_core::model::group;
use skiff_core::model::path::Path;
use skiff_core::model::track::{self, GroupProducer};
use skiff_core::model::{broadcast, origin};
use skiff_core::pool::{BlockMeta, Pool};
use skiff_core::session::{Config, Session, Storage};
use skiff_core::time::Instant;
use skiff_core::window::{Request, Start};
use skiff_core::wire::qmux::Side;

use skiff_media::h264::{EncodeOptions, Encoder, Payload};
use skiff_media::pattern::{self, Stamp};
use skiff_media::picture::Picture;

use crate::counting::{Allocs, measure, snapshot};
use crate::fixture::{self, Audience, Drained, Follower, GroupEnd, Node};

/// One operation under audit, with its state built for one audience size.
pub trait Op {
    /// Runs the operation once.
    fn run(&mut self);

    /// Checks what the runs must have done (called after the measured runs).
    ///
    /// # Errors
    /// A description of the first broken expectation.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// Allocations made so far inside the operations that the case does not
    /// count (a running total; [`run`] subtracts its growth over each run).
    fn excluded(&self) -> Allocs {
        Allocs::default()
    }
}

/// One audited operation: its name, the audiences it runs with, and its builder.
#[derive(Clone, Copy)]
pub struct Case {
    /// The `case=` name printed in the report.
    pub name: &'static str,
    /// The audience sizes it is run with.
    pub audiences: &'static [usize],
    /// Builds the operation's state for an audience size.
    pub build: fn(audience: usize) -> Box<dyn Op>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("audiences", &self.audiences)
            .finish()
    }
}

/// Every audited case, in report order.
pub const CASES: &[Case] = &[
    Case {
        name: "join_leave",
        audiences: &[1, 100, 1_000, 10_000],
        build: JoinLeave::build,
    },
    Case {
        name: "frame_write",
        audiences: &[0],
        build: FrameWrite::build,
    },
    Case {
        name: "frame_fanout",
        audiences: &[1, 100, 1_000],
        build: FrameFanout::build,
    },
    Case {
        name: "group_cycle",
        audiences: &[1, 100],
        build: GroupCycle::build,
    },
    Case {
        name: "relay_frame",
        audiences: &[1, 100],
        build: RelayFrame::build,
    },
    Case {
        name: "camera_frame",
        audiences: &[0, 1],
        build: CameraFrame::pipeline,
    },
    Case {
        name: "camera_encode",
        audiences: &[0],
        build: CameraFrame::encoder,
    },
];

/// The cases that count an encoder alone: reported, but allowed to allocate.
pub const ENCODER_CASES: &[&str] = &["camera_encode"];

/// The result of auditing one case at one audience size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The case name.
    pub case: &'static str,
    /// The audience size.
    pub audience: usize,
    /// `n`: operations in the first measured run (the second runs `2n`).
    pub ops: usize,
    /// Allocations of the run of `n` operations.
    pub first: Allocs,
    /// Allocations of the run of `2n` operations.
    pub second: Allocs,
}

impl Report {
    /// Allocations per operation in steady state: `(count(2n) - count(n)) / n`.
    pub fn allocs_per_op(&self) -> f64 {
        (self.second.count as f64 - self.first.count as f64) / self.ops as f64
    }

    /// Bytes requested per operation in steady state, the same way.
    pub fn bytes_per_op(&self) -> f64 {
        (self.second.bytes as f64 - self.first.bytes as f64) / self.ops as f64
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "alloc-audit case={} audience={} allocs_per_op={:.3} bytes_per_op={:.3}",
            self.case,
            self.audience,
            self.allocs_per_op(),
            self.bytes_per_op()
        )
    }
}

/// True if this binary's global allocator is [`Counting`](crate::counting::Counting).
pub fn counting_installed() -> bool {
    let (_, allocs) = measure(|| black_box(Box::new(black_box(7u64))));
    allocs.count > 0
}

/// Audits `case` at `audience` with runs of `n` and `2n` operations after `n` of warm-up.
///
/// # Panics
/// If the global allocator is not counting, `n` is 0, or the case's
/// [`Op::check`] fails.
pub fn run(case: &Case, audience: usize, n: usize) -> Report {
    assert!(
        counting_installed(),
        "the global allocator must be skiff_benches::counting::Counting"
    );
    assert!(n > 0, "the audit needs at least one operation per run");
    let mut op = (case.build)(audience);
    batch(op.as_mut(), n);
    let first = counted(op.as_mut(), n);
    let second = counted(op.as_mut(), 2 * n);
    if let Err(e) = op.check() {
        panic!("alloc-audit {} audience {audience}: {e}", case.name);
    }
    Report {
        case: case.name,
        audience,
        ops: n,
        first,
        second,
    }
}

/// Audits every case of [`CASES`] at every audience, calling `each` with each report.
///
/// # Panics
/// As [`run`].
pub fn run_all(n: usize, mut each: impl FnMut(&Report)) -> Vec<Report> {
    let mut reports = Vec::new();
    for case in CASES {
        for &audience in case.audiences {
            let r = run(case, audience, n);
            each(&r);
            reports.push(r);
        }
    }
    reports
}

/// The allocations of `n` operations, less what the case excludes.
fn counted(op: &mut dyn Op, n: usize) -> Allocs {
    let before = op.excluded();
    let ((), all) = measure(|| batch(op, n));
    let after = op.excluded();
    Allocs {
        count: all.count - (after.count - before.count),
        bytes: all.bytes - (after.bytes - before.bytes),
    }
}

#[inline(never)]
fn batch(op: &mut dyn Op, n: usize) {
    for _ in 0..n {
        op.run();
    }
}

/// Frames per group in the write and fan-out cases (one second of 30 fps video).
pub const GROUP_FRAMES: u64 = 30;

/// Payload bytes per frame in the write and fan-out cases.
pub const FRAME_LEN: usize = 1024;

/// Timestamp step between frames (33 ms at the default millisecond timescale).
const FRAME_STEP: u64 = 33;

// ---------------------------------------------------------------------------
// join_leave
// ---------------------------------------------------------------------------

/// `join_leave`: one subscriber joins a track with a steady audience (its
/// request resolved into a window, a reader at its first group, registered in
/// the audience table) and leaves.
struct JoinLeave {
    node: Node,
    table: Audience,
    audience: usize,
}

impl JoinLeave {
    fn build(audience: usize) -> Box<dyn Op> {
        let node = Node::new(256, 4096);
        for _ in 0..3 {
            node.write_group(GROUP_FRAMES as usize, 1000);
        }
        let table = fixture::audience(&node, audience);
        Box::new(JoinLeave {
            node,
            table,
            audience,
        })
    }
}

impl Op for JoinLeave {
    fn run(&mut self) {
        let id = fixture::join(&mut self.table, &self.node, black_box(Request::LIVE));
        let left = id.is_ok_and(|id| fixture::leave(&mut self.table, id));
        assert!(left, "join + leave");
    }

    fn check(&self) -> Result<(), String> {
        if self.table.len() == self.audience {
            Ok(())
        } else {
            Err(format!(
                "audience {} after join+leave cycles",
                self.table.len()
            ))
        }
    }
}

// ---------------------------------------------------------------------------
// Frame writing (shared by frame_write and frame_fanout)
// ---------------------------------------------------------------------------

/// The track's writer: one 1 KiB frame per call, a new group every
/// [`GROUP_FRAMES`] frames (the track's ring evicts the oldest group).
struct Writer {
    node: Node,
    group: Option<GroupProducer<'static, 'static>>,
    payload: Vec<u8>,
    timestamp: u64,
    frames: u64,
}

impl Writer {
    fn new(node: Node) -> Writer {
        let group = node.producer.append_group().expect("first group");
        Writer {
            node,
            group: Some(group),
            payload: vec![0x5a; FRAME_LEN],
            timestamp: 0,
            frames: 0,
        }
    }

    /// The sequence of the group being written.
    fn sequence(&self) -> u64 {
        self.group.as_ref().map_or(0, |g| g.sequence())
    }

    #[inline]
    fn write(&mut self) {
        if self.frames == GROUP_FRAMES {
            if let Some(mut done) = self.group.take() {
                done.finish().expect("finish group");
            }
            self.group = Some(self.node.producer.append_group().expect("next group"));
            self.frames = 0;
        }
        let group = self.group.as_mut().expect("an open group");
        group
            .write_frame(self.timestamp, &self.payload)
            .expect("room in the pool");
        self.timestamp += FRAME_STEP;
        self.frames += 1;
    }
}

// ---------------------------------------------------------------------------
// frame_write
// ---------------------------------------------------------------------------

/// `frame_write`, audience 0: the publisher's side alone. One 1 KiB frame is
/// stored in the open group of a track nobody reads; every 30th write also
/// finishes the group and starts the next one, which evicts the oldest group
/// of the ring (its blocks go back to the pool).
struct FrameWrite {
    writer: Writer,
}

impl FrameWrite {
    fn build(_audience: usize) -> Box<dyn Op> {
        Box::new(FrameWrite {
            writer: Writer::new(Node::new(256, 4096)),
        })
    }
}

impl Op for FrameWrite {
    fn run(&mut self) {
        self.writer.write();
    }

    fn check(&self) -> Result<(), String> {
        let pool = self.writer.node.pool;
        if pool.exhausted_count() == 0 {
            Ok(())
        } else {
            Err(format!("pool exhausted {} times", pool.exhausted_count()))
        }
    }
}

// ---------------------------------------------------------------------------
// frame_fanout
// ---------------------------------------------------------------------------

/// `frame_fanout`: one 1 KiB frame is written, then every subscriber of the
/// audience reads it (FRAME header, then its payload as zero-copy chunks),
/// moving on to the next group when one finishes.
struct FrameFanout {
    writer: Writer,
    followers: Vec<Follower>,
    read: Drained,
    ops: u64,
}

impl FrameFanout {
    fn build(audience: usize) -> Box<dyn Op> {
        let writer = Writer::new(Node::new(256, 4096));
        let start = Start::Group(writer.sequence());
        let followers = (0..audience).map(|_| writer.node.follower(start)).collect();
        Box::new(FrameFanout {
            writer,
            followers,
            read: Drained::default(),
            ops: 0,
        })
    }
}

impl Op for FrameFanout {
    fn run(&mut self) {
        self.writer.write();
        for f in &mut self.followers {
            self.read += f.drain(|chunk| {
                black_box(chunk);
            });
        }
        self.ops += 1;
    }

    fn check(&self) -> Result<(), String> {
        let want = self.ops * self.followers.len() as u64;
        if self.read.frames == want && self.read.bytes == want * FRAME_LEN as u64 {
            Ok(())
        } else {
            Err(format!(
                "read {:?}, want {want} frames of {FRAME_LEN} bytes",
                self.read
            ))
        }
    }
}

// ---------------------------------------------------------------------------
// group_cycle
// ---------------------------------------------------------------------------

/// `group_cycle`: a whole group's life in one slot. The slot is reset for a
/// new group, the audience's readers are created, 30 frames of 1 KiB are
/// written and the group finished, every reader reads it to the end, the
/// readers are dropped and the slot cleared. Afterwards every block is back
/// in the pool: `in_use` equals its value before the first cycle (asserted
/// after each cycle).
struct GroupCycle {
    slot: &'static group::State<'static>,
    node: Node,
    readers: Vec<group::Consumer<'static, 'static>>,
    payload: Vec<u8>,
    audience: usize,
    sequence: u64,
    baseline: usize,
    read: Drained,
}

impl GroupCycle {
    fn build(audience: usize) -> Box<dyn Op> {
        let node = Node::new(64, 4096);
        let slot = node.group_slot(u64::MAX);
        let baseline = node.pool.in_use();
        Box::new(GroupCycle {
            slot,
            node,
            readers: Vec::with_capacity(audience),
            payload: vec![0x5a; FRAME_LEN],
            audience,
            sequence: 0,
            baseline,
            read: Drained::default(),
        })
    }
}

impl Op for GroupCycle {
    fn run(&mut self) {
        let slot = self.slot;
        slot.reset(self.sequence);
        self.sequence += 1;
        self.readers
            .extend((0..self.audience).map(|_| slot.consumer()));
        let mut writer = slot.producer().expect("a fresh group has no producer");
        for i in 0..GROUP_FRAMES {
            writer
                .write_frame(i * FRAME_STEP, &self.payload)
                .expect("room in the pool");
        }
        writer.finish().expect("finish");
        drop(writer);
        for r in &mut self.readers {
            let end = fixture::read_group(r, &mut self.read, |chunk| {
                black_box(chunk);
            });
            assert_eq!(end, GroupEnd::Finished);
        }
        self.readers.clear();
        slot.clear();
        assert_eq!(
            self.node.pool.in_use(),
            self.baseline,
            "every block is back in the pool"
        );
    }

    fn check(&self) -> Result<(), String> {
        let cycles = self.sequence;
        let want = cycles * GROUP_FRAMES * self.audience as u64;
        if self.read.frames != want {
            return Err(format!("read {} frames, want {want}", self.read.frames));
        }
        if self.node.pool.in_use() != self.baseline {
            return Err(format!(
                "{} blocks in use, {} before",
                self.node.pool.in_use(),
                self.baseline
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// relay_frame
// ---------------------------------------------------------------------------

/// Session tables of the `relay_frame` case: 16 control streams of 2 KiB
/// buffers, 4 subscriptions each way, 8 group streams each way.
type RelayStorage = Storage<'static, 'static, 16, 2048, 4, 4, 8, 8, 32>;

/// A session of the `relay_frame` case (64 QMux stream slots).
type RelaySession = Session<'static, 'static, 'static, 64>;

/// Group slots of the relay's cache track and of each subscriber's track.
const RELAY_GROUPS: usize = 8;

/// Bytes of one direction's in-memory wire buffer (one `poll_transmit`).
const WIRE_BYTES: usize = 64 * 1024;

/// A block pool leaked for the life of the process.
fn leaked_pool(blocks: usize, block_size: usize) -> &'static Pool<'static> {
    let bytes: &'static mut [u8] = Box::leak(vec![0u8; blocks * block_size].into_boxed_slice());
    let meta: &'static mut [BlockMeta] = Box::leak(
        (0..blocks)
            .map(|_| BlockMeta::new())
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    Box::leak(Box::new(
        Pool::from_parts(bytes, meta).expect("pool layout"),
    ))
}

/// A new track `video` over `pool`, leaked.
fn leaked_track(pool: &'static Pool<'static>) -> &'static track::State<'static, RELAY_GROUPS> {
    let info = track::Info::new("video").expect("short name");
    Box::leak(Box::new(track::State::new(pool, info)))
}

/// An origin announcing broadcast `relay` with `track`, leaked.
fn leaked_origin(
    track: &'static track::State<'static, RELAY_GROUPS>,
) -> origin::Ref<'static, 'static> {
    let b: &'static broadcast::State<'static, 'static, 4> = Box::leak(Box::new(
        broadcast::State::new(Path::new("relay").expect("path")).expect("path"),
    ));
    let o: &'static origin::State<'static, 'static, 4, 8> =
        Box::leak(Box::new(origin::State::new()));
    let bp = b.producer().expect("fresh broadcast");
    bp.add(track.handle()).expect("track fits");
    // The broadcast stays live for the process (its producer is never dropped).
    std::mem::forget(bp);
    o.handle().announce(b.handle()).expect("fresh origin");
    o.handle()
}

/// A session over leaked tables.
fn leaked_session(side: Side, origin: Option<origin::Ref<'static, 'static>>) -> RelaySession {
    let storage: &'static mut RelayStorage = Box::leak(Box::new(RelayStorage::new()));
    Session::new(side, Config::new(), Instant::ZERO, storage, origin).expect("session config")
}

/// One direction of an in-memory connection: what the sender's last
/// `poll_transmit` wrote and how much of it the receiver took.
struct Wire {
    buf: Vec<u8>,
    len: usize,
    taken: usize,
}

impl Wire {
    fn new() -> Wire {
        Wire {
            buf: vec![0; WIRE_BYTES],
            len: 0,
            taken: 0,
        }
    }

    /// Moves bytes from `from` to `to`; true if any moved.
    fn carry(&mut self, now: Instant, from: &mut RelaySession, to: &mut RelaySession) -> bool {
        let mut moved = false;
        if self.taken == self.len {
            self.len = from.poll_transmit(now, &mut self.buf);
            self.taken = 0;
            moved = self.len > 0;
        }
        if self.taken < self.len {
            let n = to
                .handle_input(now, &self.buf[self.taken..self.len])
                .expect("a well-formed peer");
            self.taken += n;
            moved |= n > 0;
        }
        moved
    }
}

/// Two sessions wired in memory: `a` is the client, `b` the server.
struct Link {
    a: RelaySession,
    b: RelaySession,
    a_to_b: Wire,
    b_to_a: Wire,
}

impl Link {
    fn new(a: RelaySession, b: RelaySession) -> Link {
        Link {
            a,
            b,
            a_to_b: Wire::new(),
            b_to_a: Wire::new(),
        }
    }

    /// Runs the link until neither side has anything to send (events are discarded).
    fn pump(&mut self, now: Instant) {
        for _ in 0..10_000 {
            for s in [&mut self.a, &mut self.b] {
                if s.poll_timeout().is_some_and(|t| t <= now) {
                    s.handle_timeout(now);
                }
            }
            let ab = self.a_to_b.carry(now, &mut self.a, &mut self.b);
            let ba = self.b_to_a.carry(now, &mut self.b, &mut self.a);
            while self.a.poll_event().is_some() {}
            while self.b.poll_event().is_some() {}
            if !ab && !ba {
                return;
            }
        }
        panic!("link did not settle");
    }
}

/// `relay_frame`: one 1 KiB frame through a relay, in memory. A publisher
/// session serves a track; the relay's upstream session (subscribed to it)
/// fills the relay's cache track; one relay session per subscriber serves
/// that cache track to its subscriber session, whose local track receives the
/// frame and whose reader reads it. Every session is a real
/// [`Session`] (QMux + moq-lite); the transport is a buffer per direction.
struct RelayFrame {
    writer: Writer,
    now: Instant,
    upstream: Link,
    downstream: Vec<Link>,
    readers: Vec<Follower>,
    read: Drained,
    ops: u64,
}

impl RelayFrame {
    fn build(audience: usize) -> Box<dyn Op> {
        // The publisher: the fixture's track, served by a server session.
        let writer = Writer::new(Node::new(256, 4096));
        let pub_origin = {
            let b: &'static broadcast::State<'static, 'static, 4> = Box::leak(Box::new(
                broadcast::State::new(Path::new("relay").expect("path")).expect("path"),
            ));
            let o: &'static origin::State<'static, 'static, 4, 8> =
                Box::leak(Box::new(origin::State::new()));
            let bp = b.producer().expect("fresh broadcast");
            bp.add(writer.node.track.handle()).expect("track fits");
            std::mem::forget(bp);
            o.handle().announce(b.handle()).expect("fresh origin");
            o.handle()
        };
        // The relay: a cache track on its own pool, announced in its origin.
        let relay_pool = leaked_pool(512, 4096);
        let cache = leaked_track(relay_pool);
        let relay_origin = leaked_origin(cache);
        let mut now = Instant::ZERO;
        let mut upstream = Link::new(
            leaked_session(Side::Client, None),
            leaked_session(Side::Server, Some(pub_origin)),
        );
        upstream.pump(now);
        upstream
            .a
            .subscribe("relay", cache.handle(), Request::LIVE)
            .expect("upstream subscribe");
        upstream.pump(now);
        // The subscribers: a local track each, on one shared pool.
        let sub_pool = leaked_pool(64 * audience.max(1) + 64, 4096);
        let mut downstream = Vec::with_capacity(audience);
        let mut readers = Vec::with_capacity(audience);
        for _ in 0..audience {
            let local = leaked_track(sub_pool);
            let mut link = Link::new(
                leaked_session(Side::Client, None),
                leaked_session(Side::Server, Some(relay_origin)),
            );
            link.pump(now);
            link.a
                .subscribe("relay", local.handle(), Request::LIVE)
                .expect("downstream subscribe");
            link.pump(now);
            downstream.push(link);
            readers.push(Follower {
                reader: local.consumer(Start::Latest),
                group: None,
            });
        }
        now = now.saturating_add(skiff_core::time::Duration::from_millis(1));
        Box::new(RelayFrame {
            writer,
            now,
            upstream,
            downstream,
            readers,
            read: Drained::default(),
            ops: 0,
        })
    }
}

impl Op for RelayFrame {
    fn run(&mut self) {
        self.writer.write();
        let now = self.now;
        self.upstream.pump(now);
        for link in &mut self.downstream {
            link.pump(now);
        }
        for f in &mut self.readers {
            self.read += f.drain(|chunk| {
                black_box(chunk);
            });
        }
        self.now = now.saturating_add(skiff_core::time::Duration::from_millis(1));
        self.ops += 1;
    }

    fn check(&self) -> Result<(), String> {
        // Every subscriber joined at the first group, before any frame: it
        // reads every frame written since.
        let want = self.ops * self.readers.len() as u64;
        if self.read.frames == want && self.read.bytes == want * FRAME_LEN as u64 {
            Ok(())
        } else {
            Err(format!(
                "read {:?}, want {want} frames of {FRAME_LEN} bytes",
                self.read
            ))
        }
    }
}

// ---------------------------------------------------------------------------
// camera_frame and camera_encode
// ---------------------------------------------------------------------------

/// What a camera case counts of its pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CameraPart {
    /// Capture and publish (`camera_frame`).
    Pipeline,
    /// The encoder alone (`camera_encode`).
    Encoder,
}

/// The growth of the counters from `a` to `b`.
fn since(a: Allocs, b: Allocs) -> Allocs {
    Allocs {
        count: b.count - a.count,
        bytes: b.bytes - a.bytes,
    }
}

/// `camera_frame` / `camera_encode`: one frame of the host camera node
/// (`skiff_media::node`: the stamped test pattern, 320x240 at 30 fps,
/// H.264 through openh264 with a keyframe every 30 frames) is drawn into its
/// reusable picture, encoded into the reusable hang payload, given its
/// legacy prefix and written to a core track (µs timestamps); a keyframe also
/// finishes the group before and starts a new one. Audience 0: the track alone. Audience 1: the
/// track is served by a publisher session to a subscriber session (real
/// [`Session`]s wired in memory, as in `relay_frame`) whose local track's
/// reader reads the frame. `camera_frame` counts all but the encoder,
/// `camera_encode` only the encoder.
struct CameraFrame {
    part: CameraPart,
    picture: Picture,
    encoder: Encoder,
    payload: Payload,
    groups: u64,
    node: Node,
    group: Option<GroupProducer<'static, 'static>>,
    /// The session pair and the subscriber's reader (audience 1).
    link: Option<(Link, Follower)>,
    now: Instant,
    excluded: Allocs,
    frames: u64,
    /// Frames written (the encoder may skip a picture).
    written: u64,
    bytes: u64,
    read: Drained,
}

impl CameraFrame {
    fn pipeline(audience: usize) -> Box<dyn Op> {
        Box::new(CameraFrame::new(CameraPart::Pipeline, audience))
    }

    fn encoder(audience: usize) -> Box<dyn Op> {
        Box::new(CameraFrame::new(CameraPart::Encoder, audience))
    }

    fn new(part: CameraPart, audience: usize) -> CameraFrame {
        assert!(audience <= 1, "camera cases have audiences 0 and 1");
        let node = Node::new(512, 4096);
        let now = Instant::ZERO;
        let link = (audience == 1).then(|| {
            let mut link = Link::new(
                leaked_session(Side::Client, None),
                leaked_session(Side::Server, Some(leaked_origin(node.track))),
            );
            link.pump(now);
            let local = leaked_track(leaked_pool(512, 4096));
            link.a
                .subscribe("relay", local.handle(), Request::LIVE)
                .expect("subscribe");
            link.pump(now);
            let reader = Follower {
                reader: local.consumer(Start::Latest),
                group: None,
            };
            (link, reader)
        });
        CameraFrame {
            part,
            picture: Picture::new(320, 240),
            encoder: Encoder::new(EncodeOptions {
                width: 320,
                height: 240,
                fps: 30.0,
                gop: 30,
                bitrate: 1_000_000,
            })
            .expect("openh264 starts"),
            payload: Payload::with_capacity(256 << 10),
            groups: 0,
            node,
            group: None,
            link,
            now: now.saturating_add(skiff_core::time::Duration::from_millis(1)),
            excluded: Allocs::default(),
            frames: 0,
            written: 0,
            bytes: 0,
            read: Drained::default(),
        }
    }
}

impl Op for CameraFrame {
    fn run(&mut self) {
        let t0 = snapshot();
        let n = self.frames;
        let stamp = Stamp {
            frame: n as u32,
            time_us: std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        };
        pattern::draw(&mut self.picture, stamp);
        let t1 = snapshot();
        let made = self
            .encoder
            .encode(black_box(&self.picture), &mut self.payload)
            .expect("openh264 encodes");
        let t2 = snapshot();
        if self.payload.is_keyframe() {
            if let Some(mut done) = self.group.take() {
                done.finish().expect("finish group");
            }
            self.group = Some(self.node.producer.create_group(self.groups).expect("group"));
            self.groups += 1;
        }
        // A picture the encoder skipped to hold its bitrate publishes nothing.
        let pts_us = n * 1_000_000 / 30;
        let payload = self.payload.frame(pts_us).expect("timestamp in range");
        if made {
            let group = self.group.as_mut().expect("an open group");
            group
                .write_frame(pts_us, payload)
                .expect("room in the pool");
        }
        self.frames += 1;
        if made {
            self.bytes += payload.len() as u64;
            self.written += 1;
        }
        if let Some((link, reader)) = &mut self.link {
            link.pump(self.now);
            self.read += reader.drain(|chunk| {
                black_box(chunk);
            });
            self.now = self
                .now
                .saturating_add(skiff_core::time::Duration::from_millis(1));
        }
        let t3 = snapshot();
        let (capture, encoder, publish) = (since(t0, t1), since(t1, t2), since(t2, t3));
        let left_out = match self.part {
            CameraPart::Pipeline => encoder,
            CameraPart::Encoder => Allocs {
                count: capture.count + publish.count,
                bytes: capture.bytes + publish.bytes,
            },
        };
        self.excluded.count += left_out.count;
        self.excluded.bytes += left_out.bytes;
    }

    fn check(&self) -> Result<(), String> {
        let pool = self.node.pool;
        if pool.exhausted_count() > 0 {
            return Err(format!("pool exhausted {} times", pool.exhausted_count()));
        }
        // The subscriber joined before the first frame: it read every one.
        if self.link.is_some() && (self.read.frames, self.read.bytes) != (self.written, self.bytes)
        {
            return Err(format!(
                "read {:?}, want {} frames of {} bytes in all",
                self.read, self.written, self.bytes
            ));
        }
        Ok(())
    }

    fn excluded(&self) -> Allocs {
        self.excluded
    }
}

//! Peers of a relay for the tests that run one: a `skiff-relay` process, a
//! raw peer driven by skiff's sans-IO session over a blocking socket, and a
//! steady audience (one publisher, ten subscribers checking every frame).
#![allow(dead_code)]

use std::cell::RefCell;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as StdInstant};

use crate::common::*;
use skiff_core::model::track;
use skiff_core::session::{Config, Event, Session, Storage};
use skiff_core::time::Instant;
use skiff_core::wire::qmux::Side;
use skiff_monoio::session_driver::MoqSession;
use skiff_testkit::client::{self, ClientCtx, Publisher, ReadState};
pub use skiff_testkit::relay_process::RelayProcess;

/// A raw client's tables: room for bursts of requests (the relay's side is
/// what the tests measure).
type RawStorage = Storage<'static, 'static, 64, 1024, 64, 64, 64, 64, 128>;
use skiff_testkit::client::process_pool as leak_pool;

// ---------------------------------------------------------------------------
// A skiff-relay process and raw peers
// ---------------------------------------------------------------------------

/// The `skiff-relay` binary Cargo built for these tests.
pub fn relay_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_skiff-relay"))
}

/// Starts this package's `skiff-relay` with `extra` flags
/// ([`RelayProcess::start`]).
pub fn start_relay(extra: &[&str]) -> RelayProcess {
    RelayProcess::start(relay_binary(), extra)
}

/// The metrics of a relay process.
pub trait RelayMetrics {
    /// One series of the relay's metrics.
    fn metric(&self, series: &str) -> u64;
}

impl RelayMetrics for RelayProcess {
    fn metric(&self, series: &str) -> u64 {
        let (_, body) = http_get(self.metrics, "/metrics");
        sample(&body, series).unwrap_or_else(|| panic!("no {series} in the metrics"))
    }
}

// ---------------------------------------------------------------------------
// A raw peer: a blocking socket driven by skiff's sans-IO session
// ---------------------------------------------------------------------------

/// A blocking client whose bytes come from (and whose input goes to) a
/// sans-IO session, so it can send valid records at any pace and decode the
/// relay's close.
pub struct Raw {
    pub s: TcpStream,
    pub session: MoqSession<'static>,
    t0: StdInstant,
    inbox: Vec<u8>,
    /// `(code, application)` of the close the relay sent.
    pub close: Option<(u64, bool)>,
    pub started: Vec<u64>,
    pub refused: Vec<Option<u64>>,
}

impl Raw {
    pub fn connect(addr: SocketAddr, config: Config<'static>, rcvbuf: Option<usize>) -> Raw {
        Raw::connect_with(addr, config, rcvbuf, None)
    }

    /// [`Raw::connect`], publishing the broadcasts of `origin`.
    pub fn connect_with(
        addr: SocketAddr,
        config: Config<'static>,
        rcvbuf: Option<usize>,
        origin: Option<skiff_core::model::origin::Ref<'static, 'static>>,
    ) -> Raw {
        let s = match rcvbuf {
            None => connect(addr),
            Some(n) => {
                let sock = socket2::Socket::new(
                    socket2::Domain::IPV4,
                    socket2::Type::STREAM,
                    Some(socket2::Protocol::TCP),
                )
                .unwrap();
                sock.set_recv_buffer_size(n).unwrap();
                sock.connect_timeout(&addr.into(), IO_TIMEOUT).unwrap();
                sock.into()
            }
        };
        Raw::over(s, config, origin)
    }

    /// A raw peer on the connected stream `s` (bytes may already have been
    /// written on it, a PROXY header say), publishing the broadcasts of
    /// `origin`.
    pub fn over(
        s: TcpStream,
        config: Config<'static>,
        origin: Option<skiff_core::model::origin::Ref<'static, 'static>>,
    ) -> Raw {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let storage: &'static mut RawStorage = Box::leak(Box::new(RawStorage::new()));
        let session = Session::new(
            Side::Client,
            config,
            Instant::from_micros(0),
            storage,
            origin,
        )
        .expect("client session");
        Raw {
            s,
            session,
            t0: StdInstant::now(),
            inbox: Vec::new(),
            close: None,
            started: Vec::new(),
            refused: Vec::new(),
        }
    }

    pub fn now(&self) -> Instant {
        Instant::from_micros(self.t0.elapsed().as_micros() as u64)
    }

    /// Everything the session wants to send now.
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let now = self.now();
            let n = self.session.poll_transmit(now, &mut buf);
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    pub fn send_output(&mut self) {
        let out = self.take_output();
        let _ = self.s.write_all(&out);
    }

    /// Feeds received bytes to the session and records its events.
    pub fn feed(&mut self, data: &[u8]) {
        self.inbox.extend_from_slice(data);
        let now = self.now();
        if let Ok(n) = self.session.handle_input(now, &self.inbox) {
            self.inbox.drain(..n.min(self.inbox.len()));
        }
        while let Some(ev) = self.session.poll_event() {
            match ev {
                Event::Closed {
                    code, application, ..
                } => self.close = Some((code, application)),
                Event::Started { group, .. } => self.started.push(group),
                Event::SubscriptionClosed { code, .. } => self.refused.push(code),
                _ => {}
            }
        }
    }

    /// One read (up to the 50 ms socket timeout); false at EOF or reset.
    pub fn read_once(&mut self) -> bool {
        let mut buf = [0u8; 16 * 1024];
        match self.s.read(&mut buf) {
            Ok(0) => false,
            Ok(n) => {
                self.feed(&buf[..n]);
                true
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => true,
            Err(_) => false,
        }
    }

    /// Reads (answering what the session must answer) until `done` holds;
    /// false if the connection ended or `limit` passed first.
    pub fn pump_until(&mut self, limit: Duration, mut done: impl FnMut(&Raw) -> bool) -> bool {
        let deadline = StdInstant::now() + limit;
        while StdInstant::now() < deadline {
            if done(self) {
                return true;
            }
            let open = self.read_once();
            self.send_output();
            if !open {
                return done(self);
            }
        }
        done(self)
    }

    /// QMux parameters both ways and SETUP both ways.
    pub fn handshake(&mut self) {
        self.send_output();
        let ok = self.pump_until(IO_TIMEOUT, |r| {
            r.session.is_established() && r.session.is_setup()
        });
        assert!(ok, "handshake with the relay did not complete");
    }

    /// Reads until the relay closes the connection; returns how long that
    /// took (`None`: still open after `limit`).
    pub fn wait_closed(&mut self, limit: Duration) -> Option<Duration> {
        let t = StdInstant::now();
        while t.elapsed() < limit {
            if !self.read_once() {
                return Some(t.elapsed());
            }
        }
        None
    }
}

/// A throwaway local track for a raw peer's subscription.
pub fn scratch_track() -> track::Ref<'static, 'static> {
    let pool = leak_pool(1 << 20);
    let state: &'static track::State<'static, 8> = Box::leak(Box::new(track::State::new(
        pool,
        track::Info::new("video").unwrap(),
    )));
    state.handle()
}

// ---------------------------------------------------------------------------
// A steady audience: one publisher, ten subscribers checking every frame
// ---------------------------------------------------------------------------

/// Subscribers that must receive every frame.
pub const GOOD: usize = 10;
/// Frames per group the steady publisher writes.
pub const FRAMES_PER_GROUP: u64 = 25;
/// Bytes per frame.
pub const FRAME_BYTES: usize = 8 * 1024;
/// Pause between frames: about 1 MiB/s per subscriber.
pub const FRAME_GAP: Duration = Duration::from_millis(8);

pub fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(FRAME_BYTES);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    for k in p.len()..FRAME_BYTES {
        p.push((g as usize * 7 + i as usize * 3 + k) as u8);
    }
    p
}

/// What one good subscriber saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub next: (u64, u64),
    pub frames: u64,
    pub errors: Vec<String>,
    pub end: Option<ReadState>,
}

impl Seen {
    pub fn frame(&mut self, f: client::Frame<'_>) {
        let payload = payload(f.group, f.index);
        check_in_order(
            &mut self.next,
            &mut self.errors,
            &f,
            FRAMES_PER_GROUP,
            &payload,
            None,
        );
        self.frames += 1;
    }
}

/// Publishes until `stop` is set (and at least `min_groups`), with `GOOD`
/// subscribers checking every frame; returns what each saw.
pub async fn good_clients(url: String, stop: Arc<AtomicBool>, min_groups: u64) -> Vec<Seen> {
    let ctx = Rc::new(ClientCtx::new(256 << 20));
    let notify = ctx.notify().clone();
    let (origin, mut producer) = ctx.publication("demo", "video");
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let mut g0 = producer.create_group(0).unwrap();
    g0.write_frame(0, &payload(0, 0)).unwrap();
    notify.bump();

    let mut states = Vec::new();
    let mut seen_all = Vec::new();
    for _ in 0..GOOD {
        let local = ctx.track("video");
        local.set_budget(16 << 20);
        let seen = Rc::new(RefCell::new(Seen::default()));
        seen_all.push(seen.clone());
        let ended = seen.clone();
        states.push(spawn_subscriber(
            &ctx,
            &url,
            "demo",
            local,
            move |f| seen.borrow_mut().frame(f),
            move |end| ended.borrow_mut().end = Some(end),
        ));
    }
    skiff_testkit::wait::until(&notify, || {
        states.iter().all(|s| s.started.get() == Some(0))
    })
    .await;
    // The bad peers may start now.
    stop.store(false, Ordering::SeqCst);

    let mut g = 0u64;
    let mut current = Some(g0);
    loop {
        let mut w = match current.take() {
            Some(w) => w,
            None => producer.create_group(g).unwrap(),
        };
        let first = if g == 0 { 1 } else { 0 };
        for i in first..FRAMES_PER_GROUP {
            w.write_frame(g * 1000 + i, &payload(g, i)).unwrap();
            notify.bump();
            monoio::time::sleep(FRAME_GAP).await;
        }
        w.finish().unwrap();
        notify.bump();
        g += 1;
        if g >= min_groups && stop.load(Ordering::SeqCst) {
            break;
        }
    }
    producer.finish();
    notify.bump();
    let groups = g;
    skiff_testkit::wait::until(&notify, || {
        seen_all.iter().all(|s| s.borrow().end.is_some())
    })
    .await;
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    seen_all
        .into_iter()
        .map(|s| {
            let mut s = Rc::try_unwrap(s)
                .map(RefCell::into_inner)
                .unwrap_or_default();
            if s.next != (groups, 0) {
                s.errors
                    .push(format!("ended at {:?}, published {groups} groups", s.next));
            }
            s
        })
        .collect()
}

pub fn check_good(seen: &[Seen]) {
    for (i, s) in seen.iter().enumerate() {
        assert!(
            s.errors.is_empty(),
            "subscriber {i}: {:?}",
            &s.errors[..s.errors.len().min(5)]
        );
        assert_eq!(
            s.end,
            Some(ReadState::Finished),
            "subscriber {i} did not finish"
        );
    }
}

pub fn eventually_within(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = StdInstant::now() + limit;
    while !cond() {
        assert!(StdInstant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A subscription to the live edge: latest group on, priority 0, the
/// publisher's default max age.
pub fn live_request() -> skiff_core::window::Request {
    skiff_core::window::Request {
        start: skiff_core::window::Start::Latest,
        end: skiff_core::window::End::Open,
        ordered: false,
        priority: 0,
        max_latency: track::DEFAULT_MAX_AGE,
    }
}

/// The steady audience ([`good_clients`]) on a thread of its own, through the
/// relay at `addr`, once every subscriber receives.
pub struct SteadyAudience {
    flag: Arc<AtomicBool>,
    clients: std::thread::JoinHandle<Vec<Seen>>,
}

impl SteadyAudience {
    /// Starts it and waits until all ten subscribers receive.
    pub fn start(addr: SocketAddr) -> SteadyAudience {
        let url = format!("tcp://{addr}/");
        let flag = Arc::new(AtomicBool::new(true));
        let clients = {
            let flag = flag.clone();
            std::thread::spawn(move || {
                skiff_monoio::driver::block_on(
                    skiff_monoio::driver::DriverKind::Legacy,
                    move |_| good_clients(url, flag, 8),
                )
                .expect("client runtime")
            })
        };
        eventually_within(Duration::from_secs(20), "good subscribers started", || {
            !flag.load(Ordering::SeqCst)
        });
        SteadyAudience { flag, clients }
    }

    /// Stops the publisher (after its current group) and returns what each
    /// subscriber saw.
    pub fn finish(self) -> Vec<Seen> {
        self.flag.store(true, Ordering::SeqCst);
        self.clients.join().expect("clients")
    }
}

//! Two-hop pacing on real loopback sockets: a publisher, relay A, relay B
//! (a leaf of A through `--upstream`) and one subscriber that parks.
//!
//! One 64 MiB group crosses both relays with 1 MiB of QMux stream credit per
//! hop. While the subscriber does not read, each relay holds about one
//! credit window of the group past its fastest reader (B within ~1.1 MiB, A
//! within ~2.2 MiB: guarantee 2, pacing) and the publisher is held back
//! through credit; once the subscriber reads again, all 64 MiB arrive intact.

mod common;

use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_core::conn;
use skiff_core::model::track;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::{RelayConfig, Upstream};
use skiff_relay::metrics::Snapshot;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};
use skiff_testkit::client::{self, ClientCtx, FrameReader, Publisher, ReadState, Subscriber};
use skiff_testkit::wait::Changes;

const MIB: u64 = 1 << 20;
/// QMux stream credit on every hop.
const CREDIT: u64 = MIB;
const FRAME: usize = 64 * 1024;
const GROUP_BYTES: u64 = 64 * MIB;
const FRAMES: u64 = GROUP_BYTES / FRAME as u64;

/// Byte `k` of frame `i`: its coordinates make any loss or reordering show.
fn fill(i: u64, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = (i as usize * 131 + k * 7 + (k >> 11)) as u8;
    }
}

fn relay_config(kind: DriverKind, upstream: Option<Upstream>) -> RelayConfig {
    let mut cfg = config(1, kind);
    // A cache much smaller than the group: a relay cannot keep it whole.
    cfg.cache_bytes = 8 * MIB;
    cfg.stream_credit = CREDIT;
    cfg.limits.max_group_bytes = 2 * GROUP_BYTES;
    cfg.upstream = upstream;
    cfg
}

fn cache(h: &ServerHandle) -> Snapshot {
    h.metrics().thread(0).snapshot()
}

/// The publisher's side: writes frames `next..FRAMES` of the group as far as
/// the pacing window allows.
struct Writer {
    next: u64,
    /// Bytes of frame `next` written so far.
    offset: usize,
    frame: Vec<u8>,
}

impl Writer {
    /// Writes what the window allows of the current frame; returns the bytes
    /// written. Writes nothing until the session's stream paces the group
    /// (no paced reader: an unbounded allowance).
    fn step(&mut self, group: &mut track::GroupProducer<'_, '_>) -> usize {
        let allow = group.allowance();
        if allow == 0 || allow == u64::MAX || self.next >= FRAMES {
            return 0;
        }
        let allow = usize::try_from(allow).unwrap_or(usize::MAX);
        if self.offset == 0 {
            fill(self.next, &mut self.frame);
            group
                .begin_frame(self.next * 33, FRAME)
                .expect("frame fits the group");
        }
        let n = allow.min(FRAME - self.offset);
        let wrote = group
            .write_payload(&self.frame[self.offset..self.offset + n])
            .unwrap_or(0);
        self.offset += wrote;
        if self.offset == FRAME {
            self.offset = 0;
            self.next += 1;
        }
        wrote
    }
}

/// What the client side saw.
struct Seen {
    written_while_parked: u64,
    frames: u64,
    bad: Vec<String>,
}

async fn scenario(url_a: String, url_b: String, parked: impl Fn() + 'static) -> Seen {
    let ctx = Rc::new(ClientCtx::new(256 * MIB));
    ctx.set_transport(conn::Config {
        max_stream_data_uni: CREDIT,
        max_stream_data_bidi_local: CREDIT,
        max_stream_data_bidi_remote: CREDIT,
        max_data: 4 * CREDIT,
        ..conn::Config::new()
    });
    let notify = ctx.notify().clone();
    let changes = Changes::new(&notify);

    let (origin, producer) = ctx.publication("big", "video");
    {
        let app = Publisher::default();
        let (ctx, url) = (ctx.clone(), url_a);
        monoio::spawn(async move {
            let mut app = app;
            let r = client::run(&url, Some(origin), &mut app, &ctx).await;
            eprintln!("publisher session ended: {r:?}");
        });
    }
    let mut group = producer.create_group(0).expect("group 0");
    let mut frame = vec![0u8; FRAME];
    fill(0, &mut frame);
    group.write_frame(0, &frame).expect("first frame");
    notify.bump();

    // The subscriber, through relay B.
    let local = ctx.track("video");
    let app = Subscriber::new("big", local);
    let state = app.state.clone();
    {
        let (ctx, url) = (ctx.clone(), url_b);
        monoio::spawn(async move {
            let mut app = app;
            let r = client::run(&url, None, &mut app, &ctx).await;
            eprintln!("subscriber session ended: {r:?}");
        });
    }
    let t0 = Instant::now();
    while state.started.get().is_none() {
        assert!(
            state.closed.get().is_none(),
            "subscription closed: {:?}",
            state.closed.get()
        );
        assert!(t0.elapsed() < Duration::from_secs(20), "never started");
        monoio::select! {
            _ = changes.next() => {}
            _ = monoio::time::sleep(Duration::from_millis(20)) => {}
        }
    }

    // Write the group as fast as pacing allows while the subscriber parks.
    let mut writer = Writer {
        next: 1,
        offset: 0,
        frame,
    };
    let mut idle_since = Instant::now();
    let written_while_parked = loop {
        if writer.step(&mut group) > 0 {
            idle_since = Instant::now();
            notify.bump();
            continue;
        }
        if writer.next == FRAMES {
            panic!("the whole group was written while the subscriber parked");
        }
        if idle_since.elapsed() > Duration::from_millis(800) {
            break group.state().bytes_written();
        }
        monoio::select! {
            _ = changes.next() => {}
            _ = monoio::time::sleep(Duration::from_millis(20)) => {}
        }
    };
    parked();

    // Resume: read every frame while the publisher writes the rest.
    let mut reader = FrameReader::sequential(local, 0);
    let mut frames = 0u64;
    let mut bad = Vec::new();
    let mut expect = vec![0u8; FRAME];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let was_open = writer.next < FRAMES;
        let mut progressed = writer.step(&mut group) > 0;
        if was_open && writer.next == FRAMES {
            group.finish().expect("finish");
        }
        let st = reader.poll(|f| {
            progressed = true;
            fill(frames, &mut expect);
            if f.group != 0 || f.index != frames {
                bad.push(format!("frame {}/{} out of order", f.group, f.index));
            } else if f.payload != expect.as_slice() {
                bad.push(format!("frame {} differs", f.index));
            } else if f.timestamp != frames * 33 {
                bad.push(format!("frame {} timestamp {}", f.index, f.timestamp));
            }
            frames += 1;
        });
        if frames == FRAMES {
            break;
        }
        match st {
            ReadState::Pending => {}
            other => panic!("reader stopped early after {frames} frames: {other:?}"),
        }
        assert!(Instant::now() < deadline, "only {frames} frames arrived");
        if progressed {
            notify.bump();
            continue;
        }
        monoio::select! {
            _ = changes.next() => {}
            _ = monoio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    Seen {
        written_while_parked,
        frames,
        bad,
    }
}

#[test]
fn two_hop_pacing_holds_one_window_per_relay() {
    for kind in drivers() {
        within(300, move || {
            let a = server::start(relay_config(kind, None), RelayHandler::factory(1).unwrap())
                .expect("relay A");
            let up: Upstream = format!("tcp://{}/", a.local_addr()).parse().unwrap();
            let b = server::start(
                relay_config(kind, Some(up)),
                RelayHandler::factory(1).unwrap(),
            )
            .expect("relay B");
            let url_a = format!("tcp://{}/", a.local_addr());
            let url_b = format!("tcp://{}/", b.local_addr());
            let (ma, mb) = (a.metrics().clone(), b.metrics().clone());
            let seen = driver::block_on(kind, move |_| {
                let parked = move || {
                    let (sa, sb) = (ma.thread(0).snapshot(), mb.thread(0).snapshot());
                    eprintln!(
                        "parked: relay A holds {} bytes ({:.2} MiB), relay B holds {} bytes ({:.2} MiB)",
                        sa.cache_bytes,
                        sa.cache_bytes as f64 / MIB as f64,
                        sb.cache_bytes,
                        sb.cache_bytes as f64 / MIB as f64
                    );
                    assert!(
                        sb.cache_bytes <= 11 * MIB / 10,
                        "relay B holds {} bytes while parked",
                        sb.cache_bytes
                    );
                    assert!(
                        sa.cache_bytes <= 22 * MIB / 10,
                        "relay A holds {} bytes while parked",
                        sa.cache_bytes
                    );
                    assert!(sb.cache_bytes > 0 && sa.cache_bytes > 0, "nothing crossed");
                };
                scenario(url_a, url_b, parked)
            })
            .expect("client runtime");
            eprintln!(
                "publisher wrote {} bytes ({:.2} MiB) while parked; {} frames read after",
                seen.written_while_parked,
                seen.written_while_parked as f64 / MIB as f64,
                seen.frames
            );
            assert!(
                seen.bad.is_empty(),
                "{:?}",
                &seen.bad[..seen.bad.len().min(5)]
            );
            assert_eq!(seen.frames, FRAMES);
            assert!(
                seen.written_while_parked < 8 * MIB,
                "the publisher was not held back: {} bytes",
                seen.written_while_parked
            );
            let (sa, sb) = (cache(&a), cache(&b));
            eprintln!(
                "high water: relay A {:.2} MiB, relay B {:.2} MiB",
                sa.cache_high_water as f64 / MIB as f64,
                sb.cache_high_water as f64 / MIB as f64
            );
            b.shutdown().expect("relay B stops");
            a.shutdown().expect("relay A stops");
        });
    }
}

//! Many tracks cross the link between two workers: eight publishers of 16
//! tracks each and sixteen subscribers of 16 tracks each, spread over two
//! workers by the kernel. About 96 of the 128 tracks have a subscriber on the
//! worker without their publisher, so the link between the workers carries
//! about 96 subscriptions at once (a client session's table takes 16): every
//! subscriber must still get every track's group.

mod common;

use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_core::model::group::Next;
use skiff_core::model::track;
use skiff_core::session::{Event, Session};
use skiff_core::window::Request;
use skiff_monoio::driver;
use skiff_monoio::session_driver::App;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, ClientLimits, Publisher};

const PUBLISHERS: usize = 8;
const TRACKS: usize = 16;
const SUBSCRIBERS: usize = 16;
const PER_SUBSCRIBER: usize = 16;

/// The one frame of group 0 of track `t` of publisher `p`.
fn payload(p: usize, t: usize) -> Vec<u8> {
    format!("pub{p}/t{t}:").repeat(40).into_bytes()
}

/// A subscriber of several tracks in one session: asks for announcements,
/// then subscribes to each `(broadcast, track)` once its broadcast is announced.
struct Many {
    wanted: Vec<(String, track::Ref<'static, 'static>)>,
    announced: Vec<String>,
    subscribed: usize,
    asked: bool,
}

impl<const N: usize> App<N> for Many {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Event::Announced { path, .. } = *event {
            self.announced.push(path.to_owned());
        }
    }

    fn act<X: skiff_core::transport::Transport>(
        &mut self,
        session: &mut Session<'_, 'static, 'static, N, X>,
    ) {
        if !session.is_established() || !session.is_setup() {
            return;
        }
        if !self.asked {
            self.asked = session.announce_request("").is_ok();
        }
        while let Some((broadcast, local)) = self.wanted.get(self.subscribed) {
            if !self.announced.contains(broadcast) {
                return;
            }
            match session.subscribe(broadcast, *local, Request::LIVE) {
                Ok(_) => self.subscribed += 1,
                // Control buffers come back once the requests so far are sent.
                Err(skiff_core::session::Error::ControlFull) => return,
                Err(e) => panic!("subscribe: {e:?}"),
            }
        }
    }
}

/// The payload of group 0's first frame of `local`, once it is all here.
fn first_frame(local: track::Ref<'static, 'static>) -> Option<Vec<u8>> {
    let mut c = local.group(0)?;
    let Ok(Next::Ready(h)) = c.read_frame_header() else {
        return None;
    };
    let mut buf = vec![0; h.len];
    let mut got = 0;
    while got < h.len {
        match c.read_payload(&mut buf[got..]) {
            Ok(Next::Ready(n)) => got += n,
            _ => return None,
        }
    }
    Some(buf)
}

#[test]
fn a_hundred_tracks_cross_the_worker_link() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = config(2, kind);
            cfg.cache_bytes = 64 << 20;
            let handle =
                server::start(cfg, RelayHandler::factory(2).unwrap()).expect("start relay");
            let url = format!("tcp://{}/", handle.local_addr());
            let missing = driver::block_on(kind, move |_| async move {
                let base = Rc::new(ClientCtx::with_limits(
                    64 << 20,
                    ClientLimits {
                        tracks: 1024,
                        ..ClientLimits::default()
                    },
                ));
                // The publishers: one group of one frame per track, kept live.
                for p in 0..PUBLISHERS {
                    let names: Vec<String> = (0..TRACKS).map(|t| format!("t{t}")).collect();
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    let (origin, producers) = base.publication_tracks(&format!("pub{p}"), &names);
                    for (t, producer) in producers.iter().enumerate() {
                        let mut g = producer.create_group(0).unwrap();
                        g.write_frame(0, &payload(p, t)).unwrap();
                        g.finish().unwrap();
                    }
                    let (ctx, url) = (base.clone(), url.clone());
                    monoio::spawn(async move {
                        let _keep = producers;
                        let mut app = Publisher::default();
                        let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
                    });
                }
                // The subscribers: subscriber k takes 16 tracks of the 128,
                // one of each publisher's in turn, so each track has two.
                let mut expected = Vec::new();
                for k in 0..SUBSCRIBERS {
                    let ctx = Rc::new(base.sibling());
                    let mut wanted = Vec::new();
                    for i in 0..PER_SUBSCRIBER {
                        let n = (k * PER_SUBSCRIBER + i) % (PUBLISHERS * TRACKS);
                        let (p, t) = (n % PUBLISHERS, n / PUBLISHERS);
                        let local = ctx.track(&format!("t{t}"));
                        wanted.push((format!("pub{p}"), local));
                        expected.push((k, p, t, local));
                    }
                    let mut app = Many {
                        wanted,
                        announced: Vec::new(),
                        subscribed: 0,
                        asked: false,
                    };
                    let url = url.clone();
                    monoio::spawn(async move {
                        let _ = client::run(&url, None, &mut app, &ctx).await;
                    });
                }
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let missing: Vec<_> = expected
                        .iter()
                        .filter(|(_, p, t, local)| first_frame(*local) != Some(payload(*p, *t)))
                        .map(|(k, p, t, _)| (*k, *p, *t))
                        .collect();
                    if missing.is_empty() || Instant::now() > deadline {
                        base.close_all();
                        return missing;
                    }
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .expect("client runtime");
            assert!(
                missing.is_empty(),
                "{kind:?}: {} of {} subscriptions got nothing, e.g. (subscriber, publisher, track) {:?}",
                missing.len(),
                SUBSCRIBERS * PER_SUBSCRIBER,
                &missing[..missing.len().min(8)]
            );
            for t in 0..2 {
                let accepted = handle.metrics().thread(t).snapshot().accepted;
                assert!(accepted > 0, "worker {t} got no connection");
            }
            handle.shutdown().expect("relay stops");
        });
    }
}

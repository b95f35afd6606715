//! A relay re-serves its source's TRACK_INFO (docs/protocol.md §3.7): a
//! publisher's track with its own priority, max age and timescale reaches
//! subscribers through skiff-relay (two workers, so through a worker link
//! too) with exactly those values, not the defaults the relay track was made
//! with when the first request arrived.

mod common;

use std::cell::RefCell;
use std::num::NonZeroU64;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::session::{Event, Session};
use skiff_core::time::Duration as CoreDuration;
use skiff_core::window::Request;
use skiff_core::wire::lite::TrackInfo;
use skiff_monoio::driver;
use skiff_monoio::session_driver::App;
use skiff_monoio::tables::{GROUPS, TRACKS};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, Publisher};

/// Subscribes to `cam/video` once announced and keeps the TRACK_INFO it gets.
struct InfoSub {
    local: track::Ref<'static, 'static>,
    asked: bool,
    announced: bool,
    subscribed: bool,
    info: Rc<RefCell<Option<TrackInfo>>>,
}

impl<const N: usize> App<N> for InfoSub {
    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Announced { path: "cam", .. } => self.announced = true,
            Event::TrackInfo { info, .. } => *self.info.borrow_mut() = Some(info),
            _ => {}
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
        if self.announced && !self.subscribed {
            self.subscribed = session.subscribe("cam", self.local, Request::LIVE).is_ok();
        }
    }
}

#[test]
fn subscribers_get_the_publishers_track_info_through_the_relay() {
    let expected = TrackInfo {
        priority: 9,
        max_age: CoreDuration::from_millis(2_000),
        timescale: NonZeroU64::new(90_000).unwrap(),
    };
    for kind in drivers() {
        within(30, move || {
            let handle = server::start(config(2, kind), RelayHandler::factory(2).unwrap())
                .expect("start relay");
            let url = format!("tcp://{}/", handle.local_addr());
            let got = driver::block_on(kind, move |_| async move {
                let ctx = Rc::new(ClientCtx::new(16 << 20));
                // The publisher's track, with its own TRACK_INFO values.
                let info = track::Info::from_wire("video", expected).unwrap();
                let t: &'static track::State<'static, GROUPS> =
                    Box::leak(Box::new(track::State::new(ctx.pool(), info)));
                let b: &'static broadcast::State<'static, 'static, TRACKS> = Box::leak(Box::new(
                    broadcast::State::new(Path::new("cam").unwrap()).unwrap(),
                ));
                let o: &'static origin::State<'static, 'static, 4, 16> =
                    Box::leak(Box::new(origin::State::new()));
                let bp = b.producer().unwrap();
                bp.add(t.handle()).unwrap();
                std::mem::forget(bp);
                o.handle().announce(b.handle()).unwrap();
                let producer = t.handle().producer().unwrap();
                let mut g = producer.create_group(0).unwrap();
                g.write_frame(0, b"frame").unwrap();
                g.finish().unwrap();
                {
                    let (ctx, url, origin) = (ctx.clone(), url.clone(), o.handle());
                    monoio::spawn(async move {
                        let _keep = producer;
                        let mut app = Publisher::default();
                        let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
                    });
                }
                // Four subscribers: with two workers, some come through the link.
                let infos: Vec<_> = (0..4).map(|_| Rc::new(RefCell::new(None))).collect();
                for info in &infos {
                    let sub_ctx = Rc::new(ctx.sibling());
                    let mut app = InfoSub {
                        local: sub_ctx.track("video"),
                        asked: false,
                        announced: false,
                        subscribed: false,
                        info: info.clone(),
                    };
                    let url = url.clone();
                    monoio::spawn(async move {
                        let _ = client::run(&url, None, &mut app, &sub_ctx).await;
                    });
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while infos.iter().any(|i| i.borrow().is_none()) && Instant::now() < deadline {
                    monoio::time::sleep(Duration::from_millis(10)).await;
                }
                ctx.close_all();
                infos.iter().map(|i| *i.borrow()).collect::<Vec<_>>()
            })
            .expect("client runtime");
            for (i, info) in got.iter().enumerate() {
                assert_eq!(*info, Some(expected), "{kind:?}: subscriber {i}");
            }
            handle.shutdown().expect("relay stops");
        });
    }
}

//! The relay acknowledges at once (TCP_QUICKACK) a read that drained the
//! socket of a peer that may publish, so a publisher without TCP_NODELAY is
//! not held back by the relay's delayed ACK, and leaves a peer whose SETUP
//! says it only subscribes to the kernel's delayed ACKs (its requests and
//! credit are small, nothing waits on their ACK). Counted by the relay's
//! `short_reads` and `prompt_acks` counters.

mod common;

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use skiff_monoio::driver;
use skiff_relay::metrics::{Metrics, Snapshot};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, Publisher, Subscriber};

/// Subscriber-only viewers that join while the publisher is silent.
const VIEWERS: u64 = 8;

/// Reads of a viewer that may be acknowledged at once: those before the
/// relay has seen its SETUP (its QMux parameters and SETUP).
const BEFORE_SETUP: u64 = 2;
/// Reads of the publisher's answer and group meanwhile, which the relay
/// asks for at the first viewer's subscription.
const PUBLISHER_ANSWERS: u64 = 4;

/// Connects a publisher with a group ready, then lets subscriber-only
/// viewers join: the counters at the start, once the publisher is
/// connected and announced, and after the viewers subscribed.
async fn load(url: String, metrics: Arc<Metrics>) -> (Snapshot, Snapshot, Snapshot) {
    let ctx = Rc::new(ClientCtx::new(64 << 20));
    let notify = ctx.notify().clone();
    let (origin, producer) = ctx.publication("cam", "video");
    let start = metrics.total();
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let settle = || monoio::time::sleep(Duration::from_millis(300));
    settle().await;
    let frame = vec![7u8; 4096];
    let mut g = producer.create_group(0).unwrap();
    for i in 0..30 {
        g.write_frame(i, &frame).unwrap();
        notify.bump();
        monoio::time::sleep(Duration::from_millis(2)).await;
    }
    g.finish().unwrap();
    notify.bump();
    settle().await;
    let published = metrics.total();

    let mut states = Vec::new();
    let mut viewers = Vec::new();
    for _ in 0..VIEWERS {
        let vctx = Rc::new(ctx.sibling());
        let app = Subscriber::new("cam", vctx.track("video"));
        states.push(app.state.clone());
        let (c, url) = (vctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = app;
            let _ = client::run(&url, None, &mut app, &c).await;
        });
        viewers.push(vctx);
    }
    for _ in 0..100 {
        if states.iter().all(|s| s.subscribed.get()) {
            break;
        }
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
    settle().await;
    let viewed = metrics.total();
    for v in &viewers {
        v.close_all();
    }
    ctx.close_all();
    settle().await;
    (start, published, viewed)
}

#[test]
fn prompt_acks_go_to_peers_that_may_publish_only() {
    for kind in drivers() {
        within(60, move || {
            let handle = server::start(config(1, kind), RelayHandler::factory(1).unwrap()).unwrap();
            let url = format!("tcp://{}/", handle.local_addr());
            let metrics = handle.metrics().clone();
            let (start, published, viewed) =
                driver::block_on(kind, move |_| load(url, metrics)).unwrap();
            let publisher = (
                published.short_reads - start.short_reads,
                published.prompt_acks - start.prompt_acks,
            );
            let viewers = (
                viewed.short_reads - published.short_reads,
                viewed.prompt_acks - published.prompt_acks,
            );
            eprintln!(
                "{kind:?}: publisher {} short reads, {} acknowledged at once; \
                 {VIEWERS} viewers {} short reads, {} acknowledged at once",
                publisher.0, publisher.1, viewers.0, viewers.1
            );
            // Every read that drained the publisher's socket was acknowledged.
            assert!(publisher.1 > 0, "{kind:?}: no prompt ACK for the publisher");
            assert_eq!(
                publisher.0, publisher.1,
                "{kind:?}: a publisher read left to the kernel"
            );
            // The viewers' reads past their SETUP were left to the kernel:
            // each sent at least its SUBSCRIBE after the relay's SETUP.
            assert!(
                viewers.1 <= VIEWERS * BEFORE_SETUP + PUBLISHER_ANSWERS,
                "{kind:?}: {} prompt ACKs for {VIEWERS} subscriber-only viewers",
                viewers.1
            );
            assert!(
                viewers.0 - viewers.1 >= VIEWERS,
                "{kind:?}: only {} viewer reads left to the kernel",
                viewers.0 - viewers.1
            );
            handle.shutdown().unwrap();
        });
    }
}

//! skiff's client SDK over `ws://` against moq-dev's own WebSocket server
//! (qmux 0.5.3 `ws::Server`, moq-net 0.3.18 publishing the docs/protocol.md
//! §6 clock fixture): the upgrade, the masking of every client frame, the
//! subprotocol `qmux-01.moq-lite-05` and no SETUP Path (docs/protocol.md §9).

use std::time::Duration;

use skiff_interop::reference::{self, End, Options, Publication};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::{End as WindowEnd, Request, Start};

#[test]
fn skiff_sdk_subscribes_to_moq_net_over_websocket() {
    let publication = Publication::clock();
    let server = reference::serve_publisher(
        Options::server()
            .with_websocket()
            .with_timeout(Duration::from_secs(20)),
        publication.clone(),
    )
    .expect("start the moq-net server");
    let addr = server.local_addr().expect("server address");
    let url = format!("ws://{addr}/room");
    let got = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (client, runner) =
            skiff_monoio::connect(&url, skiff_monoio::Config::default()).expect("connect");
        monoio::spawn(runner.run());
        let request = Request {
            start: Start::Group(5),
            end: WindowEnd::Open,
            ordered: true,
            priority: 3,
            max_latency: skiff_core::time::Duration::from_secs(10),
        };
        let mut track = client
            .subscribe("clock", "seconds", request)
            .await
            .expect("subscribe");
        let mut got = Vec::new();
        while let Ok(Some(mut group)) = track.next_group().await {
            while let Ok(Some(frame)) = group.read_frame().await {
                got.push((group.sequence(), frame.timestamp, frame.payload.to_vec()));
            }
            if got.len() == 4 {
                break;
            }
        }
        client.close().await;
        got
    })
    .expect("runtime");
    let report = server.join().expect("server run");
    let want: Vec<(u64, u64, Vec<u8>)> = publication
        .groups
        .iter()
        .flat_map(|g| {
            g.frames
                .iter()
                .map(move |f| (g.sequence, f.timestamp, f.payload.clone()))
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(report.protocol.as_deref(), Some("moq-lite-05"));
    // The path travelled in the request URI only.
    assert!(
        report
            .peer_path
            .as_deref()
            .is_none_or(|p| p.is_empty() || p == "/"),
        "SETUP carried a path: {:?}",
        report.peer_path
    );
    assert!(matches!(report.end, End::PeerClosed(_)), "{:?}", report.end);
}

//! End to end in moq-dev's media format: skiff's camera node publishes H.264
//! as a hang broadcast through skiff-relay, and the reference moq-net client
//! subscribes to its video track. Every frame must decode with hang's legacy
//! container (its prefix time equal to the FRAME timestamp), every group must
//! open with a keyframe, the TRACK_INFO must be hang's, and openh264 must turn
//! every access unit into a picture whose stamp reads back in order.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hang::container::Frame;
use openh264::formats::YUVSource;
use skiff_interop::ALPN_LITE_05;
use skiff_interop::reference::{self, End, Options, SubscribeRequest};
use skiff_media::h264::Decoder;
use skiff_media::node::{self, NodeOptions};
use skiff_media::pattern;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

/// Complete groups the reference subscriber must receive.
const GROUPS: usize = 3;

#[test]
fn moq_net_reads_the_hang_camera_through_skiff_relay() {
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let addr = relay.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let camera = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let opts = NodeOptions {
                width: 160,
                height: 120,
                fps: 60.0,
                gop: 12,
                bitrate: 300_000,
                frames: Some(6_000),
                ..NodeOptions::pattern(format!("tcp://{addr}/anon"), "cam.hang")
            };
            driver::block_on(DriverKind::Legacy, move |_| node::run(opts, stop, |_| {}))
                .expect("camera runtime")
                .expect("camera runs")
        })
    };
    let request = SubscribeRequest {
        broadcast: "cam.hang".into(),
        track: "video".into(),
        priority: 3,
        max_age_ms: 10_000,
        start: None,
        end: None,
        stop_after: Some(GROUPS),
    };
    let opts = Options::client()
        .with_path(Some("/anon"))
        .with_timeout(Duration::from_secs(30));
    let received = reference::dial_subscriber(addr, opts, request)
        .expect("start subscriber")
        .join()
        .expect("subscriber run");
    stop.store(true, Ordering::Relaxed);
    let progress = camera.join().expect("camera thread");
    relay.shutdown().expect("relay stops");
    eprintln!("camera: {progress}");

    assert_eq!(received.protocol.as_deref(), Some(ALPN_LITE_05));
    assert_eq!(received.end, End::GroupCount, "subscriber end");
    let info = received.info.expect("TRACK_INFO");
    let theirs = hang::container::track_info(hang::catalog::PRIORITY.video);
    assert_eq!(info.priority, theirs.priority);
    assert_eq!(info.timescale, theirs.timescale.as_u64());
    assert_eq!(u128::from(info.max_age_ms), theirs.max_age.as_millis());

    let mut decoder = Decoder::new().unwrap();
    let mut last_stamp = None;
    let mut last_pts = None;
    let mut frames = 0;
    assert!(received.groups.len() >= GROUPS);
    for group in &received.groups {
        assert!(!group.frames.is_empty());
        for (i, f) in group.frames.iter().enumerate() {
            let hf = Frame::decode(bytes::Bytes::from(f.payload.clone()))
                .expect("hang decodes the frame");
            let pts = hf.timestamp.as_micros() as u64;
            assert_eq!(pts, f.timestamp, "prefix and FRAME timestamp agree");
            assert!(last_pts.is_none_or(|l| pts > l), "times rise");
            last_pts = Some(pts);
            let key = skiff_core::hang::avc::LengthPrefixed::new(&hf.payload)
                .map(|n| n.expect("length-prefixed NAL units"))
                .any(|n| skiff_core::hang::avc::nal_type(n[0]) == skiff_core::hang::avc::NAL_IDR);
            assert_eq!(
                key,
                i == 0,
                "group {} frame {i}: keyframe only first",
                group.sequence
            );
            let yuv = decoder
                .decode(&hf.payload)
                .expect("openh264 decodes")
                .expect("a picture");
            assert_eq!(yuv.dimensions(), (160, 120));
            let stamp = pattern::read_stamp(yuv.y(), yuv.strides().0, 160, 120)
                .expect("the stamp reads back");
            assert!(last_stamp.is_none_or(|l| stamp.frame > l));
            last_stamp = Some(stamp.frame);
            frames += 1;
        }
    }
    assert!(frames >= GROUPS * 6, "{frames} frames");
}

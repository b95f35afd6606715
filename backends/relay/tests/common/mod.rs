//! Helpers shared by the integration tests: driver lists, configs, bounded
//! blocking clients.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::num::NonZeroUsize;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use skiff_core::model::track;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_testkit::client::{self, ClientCtx, Frame, FrameReader, ReadState, SubState, Subscriber};

/// Socket timeout for every blocking client operation in tests.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The drivers to test on: legacy always, io_uring where the kernel has it.
pub fn drivers() -> Vec<DriverKind> {
    let mut v = vec![DriverKind::Legacy];
    if driver::io_uring_available() {
        v.push(DriverKind::IoUring);
    } else {
        eprintln!("io_uring unavailable here: testing the legacy driver only");
    }
    v
}

/// A loopback config on a free port.
pub fn config(threads: usize, driver: DriverKind) -> RelayConfig {
    RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(threads).unwrap(),
        driver,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    }
}

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => {
            let _ = t.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match t.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("sender dropped without a panic"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test did not finish within {secs} s"),
    }
}

/// Waits until `cond` holds (server counters are updated just after the
/// I/O a client observes), failing the test after [`IO_TIMEOUT`].
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A blocking client with timeouts.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Sends `msg` and asserts the same bytes come back.
pub fn echo_once(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).expect("write");
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).expect("read echo");
    assert_eq!(back, msg);
}

/// Whether the server closed `s` (EOF or reset) within the read timeout.
pub fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
        ),
    }
}

/// GETs `path` from an HTTP server with a raw TCP client; returns (status line, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = connect(addr);
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read response");
    let (head, body) = resp.split_once("\r\n\r\n").expect("response has a head");
    let status = head.lines().next().unwrap_or("").to_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length")
        .parse()
        .unwrap();
    assert_eq!(body.len(), len, "body length matches Content-Length");
    (status, body.to_owned())
}

/// The value of an unlabelled or labelled sample line in Prometheus text.
pub fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

/// Checks frame `f` against what an in-order subscriber expects next (group
/// and index `next`, then `payload`, then `timestamp` if given), records any
/// mismatch in `errors`, and moves `next` on (`frames_per_group` per group).
pub fn check_in_order(
    next: &mut (u64, u64),
    errors: &mut Vec<String>,
    f: &skiff_testkit::client::Frame<'_>,
    frames_per_group: u64,
    payload: &[u8],
    timestamp: Option<u64>,
) {
    if (f.group, f.index) != *next {
        errors.push(format!(
            "got frame {}/{}, wanted {}/{}",
            f.group, f.index, next.0, next.1
        ));
    } else if f.payload != payload {
        errors.push(format!(
            "frame {}/{}: payload differs ({} bytes)",
            f.group,
            f.index,
            f.payload.len()
        ));
    } else if let Some(ts) = timestamp.filter(|&ts| ts != f.timestamp) {
        errors.push(format!(
            "frame {}/{}: timestamp {}, wanted {ts}",
            f.group, f.index, f.timestamp
        ));
    }
    *next = if f.index + 1 == frames_per_group {
        (f.group + 1, 0)
    } else {
        (f.group, f.index + 1)
    };
}

/// Starts a subscriber of `broadcast` into `local` over a session to `url`,
/// and a reader that hands every frame to `on_frame` and then how the track
/// ended to `on_end`; returns the subscription's state.
pub fn spawn_subscriber(
    ctx: &Rc<ClientCtx>,
    url: &str,
    broadcast: &str,
    local: track::Ref<'static, 'static>,
    mut on_frame: impl FnMut(Frame<'_>) + 'static,
    on_end: impl FnOnce(ReadState) + 'static,
) -> Rc<SubState> {
    let mut app = Subscriber::new(broadcast, local);
    let state = app.state.clone();
    let (session_ctx, url) = (ctx.clone(), url.to_owned());
    monoio::spawn(async move {
        let _ = client::run(&url, None, &mut app, &session_ctx).await;
    });
    let notify = ctx.notify().clone();
    monoio::spawn(async move {
        let mut reader = FrameReader::sequential(local, 0);
        on_end(reader.read_to_end(&notify, &mut on_frame).await);
    });
    state
}

/// Waits for a subscriber of `track`, then writes group 0 of `frames`
/// frames of `bytes` bytes, frame `i` all `i as u8` at timestamp `i`, and
/// finishes it.
pub async fn write_numbered_group(
    track: &mut skiff_monoio::sdk::TrackProducer,
    frames: u64,
    bytes: usize,
) {
    while track.subscribers() == 0 {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut group = track.create_group(0).unwrap();
    for i in 0..frames {
        group.write_frame(i, &vec![i as u8; bytes]).await.unwrap();
    }
    group.finish().unwrap();
}

/// Reads the next group of `sub` to its end, each frame `bytes` long and
/// all `i as u8` for frame `i` ([`write_numbered_group`]), pausing `pause`
/// after each; returns the frames read.
///
/// # Panics
/// On a missing group, a failed read, or a frame of other bytes.
pub async fn read_numbered_group(
    sub: &mut skiff_monoio::sdk::TrackConsumer,
    bytes: usize,
    pause: Duration,
) -> u64 {
    let mut g = sub.next_group().await.unwrap().expect("a group");
    let mut read = 0u64;
    while let Some(frame) = g.read_frame().await.expect("the whole group") {
        assert_eq!(frame.payload.len(), bytes, "frame {read}");
        assert!(
            frame.payload.chunks().flatten().all(|&b| b == read as u8),
            "frame {read} corrupted"
        );
        read += 1;
        if !pause.is_zero() {
            monoio::time::sleep(pause).await;
        }
    }
    read
}

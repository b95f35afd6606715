//! Test network: two embassy-net stacks joined by an in-memory IP link, and a
//! gateway on the far stack that bridges accepted TCP connections to Linux sockets.
//!
//! ```text
//!  publisher stack 10.42.0.2 ── channel link (medium IP) ── gateway stack 10.42.0.1
//!                                                               │ accept :4443
//!                                                               └─ tokio TcpStream → 127.0.0.1:<reference>
//! ```
//!
//! Everything runs in one future on a current-thread tokio runtime (the channel
//! driver and the stacks are `!Sync`); embassy-time's std driver with its generic
//! queue wakes timers from its own thread.
#![allow(dead_code)]

use core::future::Future;
use std::net::SocketAddr;

use embassy_net::tcp::TcpSocket;
use embassy_net::{Ipv4Address, Ipv4Cidr, Stack, StackResources, StaticConfigV4};
use embassy_net_driver_channel as ch;
use embassy_time::{Duration, with_timeout};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Link MTU (IP packets).
pub const MTU: usize = 1500;
/// Channel state of one side of the link: 8 packets each way.
pub type LinkState = ch::State<MTU, 8, 8>;
/// The publisher's address on the link.
pub const DEVICE_ADDR: Ipv4Address = Ipv4Address::new(10, 42, 0, 2);
/// The gateway's address on the link.
pub const GATEWAY_ADDR: Ipv4Address = Ipv4Address::new(10, 42, 0, 1);
/// The port the gateway accepts on.
pub const GATEWAY_PORT: u16 = 4443;

/// A null defmt logger, so the tests link when the `defmt` feature is on.
#[cfg(feature = "defmt")]
mod null_logger {
    #[defmt::global_logger]
    struct Null;

    // SAFETY: the logger does nothing and holds no state, so every call order is sound.
    unsafe impl defmt::Logger for Null {
        fn acquire() {}
        unsafe fn flush() {}
        unsafe fn release() {}
        unsafe fn write(_bytes: &[u8]) {}
    }

    defmt::timestamp!("{=u64}", 0);

    #[defmt::panic_handler]
    fn panic() -> ! {
        panic!("defmt panic")
    }
}

/// Runs `fut` to completion on a current-thread tokio runtime (with tokio's net and time).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(fut)
}

/// One embassy-net stack with a static IPv4 address on a /24.
pub fn stack<'d>(
    device: ch::Device<'d, MTU>,
    addr: Ipv4Address,
    resources: &'d mut StackResources<4>,
    seed: u64,
) -> (Stack<'d>, embassy_net::Runner<'d, ch::Device<'d, MTU>>) {
    let config = embassy_net::Config::ipv4_static(StaticConfigV4 {
        address: Ipv4Cidr::new(addr, 24),
        gateway: None,
        dns_servers: Default::default(),
    });
    embassy_net::new(device, config, resources, seed)
}

/// Moves packets between the two ends of the link, both ways, forever.
pub async fn wire(a: ch::Runner<'_, MTU>, b: ch::Runner<'_, MTU>) {
    let (a_state, mut a_rx, mut a_tx) = a.split();
    let (b_state, mut b_rx, mut b_tx) = b.split();
    a_state.set_link_state(ch::driver::LinkState::Up);
    b_state.set_link_state(ch::driver::LinkState::Up);
    tokio::join!(forward(&mut a_tx, &mut b_rx), forward(&mut b_tx, &mut a_rx));
}

async fn forward(from: &mut ch::TxRunner<'_, MTU>, to: &mut ch::RxRunner<'_, MTU>) {
    loop {
        let packet = from.tx_buf().await;
        let buf = to.rx_buf().await;
        let n = packet.len().min(buf.len());
        buf[..n].copy_from_slice(&packet[..n]);
        to.rx_done(n);
        from.tx_done();
    }
}

/// What the gateway does with its `n`-th accepted connection.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// Bridge it to this Linux TCP address until either side closes.
    Forward(SocketAddr),
    /// Bridge it to this address, then reset both sides once `after` bytes went from
    /// the publisher to the server (a relay dropping the connection mid-session).
    ForwardThenDrop(SocketAddr, usize),
}

/// Accepts connections on [`GATEWAY_PORT`] one after the other and handles each as
/// `route(n)` says; a `None` route ends the gateway.
pub async fn gateway(stack: Stack<'_>, mut route: impl FnMut(usize) -> Option<Route>) {
    let mut rx = vec![0u8; 16 * 1024];
    let mut tx = vec![0u8; 16 * 1024];
    for n in 0.. {
        let Some(plan) = route(n) else { return };
        let mut socket = TcpSocket::new(stack, &mut rx, &mut tx);
        if socket.accept(GATEWAY_PORT).await.is_err() {
            continue;
        }
        let (addr, limit) = match plan {
            Route::Forward(addr) => (addr, usize::MAX),
            Route::ForwardThenDrop(addr, after) => (addr, after),
        };
        let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
            socket.abort();
            let _ = with_timeout(Duration::from_secs(1), socket.flush()).await;
            continue;
        };
        let dropped = bridge(&mut socket, stream, limit).await;
        if dropped {
            socket.abort();
        } else {
            socket.close();
        }
        let _ = with_timeout(Duration::from_secs(1), socket.flush()).await;
    }
}

/// Copies both ways until either side ends; true if it stopped at `limit` bytes
/// (publisher to server).
async fn bridge(socket: &mut TcpSocket<'_>, stream: tokio::net::TcpStream, limit: usize) -> bool {
    let (mut er, mut ew) = socket.split();
    let (mut tr, mut tw) = stream.into_split();
    let up = async {
        let mut buf = vec![0u8; 4096];
        let mut total = 0usize;
        loop {
            let room = buf.len().min(limit - total);
            if room == 0 {
                return true;
            }
            match er.read(&mut buf[..room]).await {
                Ok(0) | Err(_) => {
                    let _ = tw.shutdown().await;
                    return false;
                }
                Ok(n) => {
                    total += n;
                    if tw.write_all(&buf[..n]).await.is_err() {
                        return false;
                    }
                }
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 4096];
        loop {
            match tr.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    let mut pos = 0;
                    while pos < n {
                        match ew.write(&buf[pos..n]).await {
                            Ok(k) => pos += k,
                            Err(_) => return false,
                        }
                    }
                }
            }
        }
    };
    tokio::select! {
        dropped = up => dropped,
        _ = down => false,
    }
}

/// Prints `log` records to stderr (with `--features log`; `SKIFF_LOG=trace` for more).
#[cfg(feature = "log")]
pub fn init_log() {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            eprintln!(
                "{:>10?} {:<5} {}: {}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() % 100_000)
                    .unwrap_or(0),
                record.level(),
                record.target(),
                record.args()
            );
        }
        fn flush(&self) {}
    }
    static LOGGER: Stderr = Stderr;
    let level = match std::env::var("SKIFF_LOG").as_deref() {
        Ok("trace") => log::LevelFilter::Trace,
        Ok("info") => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

/// Logging is off without the `log` feature.
#[cfg(not(feature = "log"))]
pub fn init_log() {}

/// A boxed task of [`run_tasks`].
pub type Task<'a> = core::pin::Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Runs `background` tasks beside `main` in the calling task and returns `main`'s
/// output; each future is polled only after its own waker fired, as if it were a
/// task of its own.
///
/// Joining them with `tokio::join!` instead would poll every future at every wake:
/// an embassy-net socket poll wakes its stack, whose poll wakes the shared task
/// again, and the test would spin (firmware runs them as separate tasks).
pub async fn run_tasks<T>(
    mut main: core::pin::Pin<Box<dyn Future<Output = T> + '_>>,
    mut background: Vec<Task<'_>>,
) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Wake, Waker};

    struct Flag {
        woken: AtomicBool,
        parent: Mutex<Option<Waker>>,
    }
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.woken.store(true, Ordering::SeqCst);
            if let Some(w) = self.parent.lock().expect("waker lock").as_ref() {
                w.wake_by_ref();
            }
        }
    }
    let flags: Vec<Arc<Flag>> = (0..=background.len())
        .map(|_| {
            Arc::new(Flag {
                woken: AtomicBool::new(true),
                parent: Mutex::new(None),
            })
        })
        .collect();
    let wakers: Vec<Waker> = flags.iter().map(|f| Waker::from(f.clone())).collect();
    let mut done = vec![false; background.len()];
    core::future::poll_fn(|cx| {
        for flag in &flags {
            let mut parent = flag.parent.lock().expect("waker lock");
            if !parent.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *parent = Some(cx.waker().clone());
            }
        }
        if flags[0].woken.swap(false, Ordering::SeqCst)
            && let Poll::Ready(out) = main.as_mut().poll(&mut Context::from_waker(&wakers[0]))
        {
            return Poll::Ready(out);
        }
        for (i, task) in background.iter_mut().enumerate() {
            if !done[i] && flags[i + 1].woken.swap(false, Ordering::SeqCst) {
                done[i] = task
                    .as_mut()
                    .poll(&mut Context::from_waker(&wakers[i + 1]))
                    .is_ready();
            }
        }
        Poll::Pending
    })
    .await
}

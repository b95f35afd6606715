//! After warm-up, echoing through a connection (read, write, drain-aware
//! read with its canceller) allocates nothing on the worker thread, on
//! either driver: buffers go to the kernel and come back.

mod common;
mod counting;

use skiff_relay::conn::Connection;
use std::rc::Rc;
use std::sync::mpsc;

use common::*;
use counting::*;
use skiff_relay::handler::ConnectionHandler;
use skiff_relay::server;

#[global_allocator]
static A: Counting = Counting;

const WARM_UP: u32 = 20;
const MEASURED: u32 = 200;

/// Echoes like `EchoHandler`, and reports the worker thread's allocations
/// during the measured round trips.
struct Measuring(mpsc::Sender<u64>);

impl ConnectionHandler for Measuring {
    type Error = std::io::Error;

    #[allow(clippy::manual_async_fn)]
    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = std::io::Result<()>> + 'static {
        async move {
            let (mut r, mut w) = conn.into_split();
            let mut trips = 0u32;
            let mut start = 0;
            loop {
                if trips == WARM_UP {
                    start = allocs();
                }
                if trips == WARM_UP + MEASURED {
                    let _ = self.0.send(allocs() - start);
                }
                match r.read_or_drain().await? {
                    None | Some([]) => break,
                    Some(data) => w.write_all(data).await?,
                }
                trips += 1;
            }
            w.close().await
        }
    }
}

#[test]
fn steady_state_echo_allocates_nothing() {
    for kind in drivers() {
        within(60, move || {
            let (tx, rx) = mpsc::channel();
            let handle = server::start(config(1, kind), move |_| Measuring(tx.clone())).unwrap();
            let mut c = connect(handle.local_addr());
            // One message per read: the client waits for each echo.
            for i in 0..WARM_UP + MEASURED + 1 {
                echo_once(&mut c, format!("{i:08}").as_bytes());
            }
            let n = rx.recv_timeout(IO_TIMEOUT).expect("measurement");
            assert_eq!(n, 0, "{kind:?}: {n} allocations in {MEASURED} round trips");
            drop(c);
            handle.shutdown().unwrap();
        });
    }
}

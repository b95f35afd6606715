//! SIGINT/SIGTERM: the first one stops the server (stop accepting, drain),
//! a second one exits at once.
//!
//! The handlers are installed with `signal-hook`, whose handler only writes to
//! a pipe; a plain OS thread reads that pipe. Worker threads therefore never
//! run signal code: at most their `io_uring_enter`/`epoll_wait` returns EINTR,
//! which monoio retries.

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use skiff_monoio::shutdown::StopTrigger;

/// Exit status used when a second signal cuts the drain short.
pub const FORCED_EXIT_CODE: i32 = 130;

/// Installed SIGINT/SIGTERM handlers, not yet connected to a server.
#[derive(Debug)]
pub struct SignalWatcher {
    signals: Signals,
}

/// The thread that turns signals into a stop; closed when dropped.
#[derive(Debug)]
pub struct SignalThread {
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

impl SignalWatcher {
    /// Installs the handlers now, so a signal that arrives before the server
    /// is up is kept and acted on later rather than killing the process.
    ///
    /// # Errors
    /// The handlers or their pipe cannot be set up.
    pub fn install() -> io::Result<Self> {
        Ok(SignalWatcher {
            signals: Signals::new([SIGINT, SIGTERM])?,
        })
    }

    /// Starts the thread: the first signal calls `trigger.stop()`, a second
    /// exits the process with [`FORCED_EXIT_CODE`].
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn stop_on_signal(self, trigger: Arc<StopTrigger>) -> io::Result<SignalThread> {
        self.on_signal(move || trigger.stop())
    }

    /// Starts the thread: the first signal calls `on_first`, a second exits
    /// the process with [`FORCED_EXIT_CODE`].
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn on_signal(self, on_first: impl FnOnce() + Send + 'static) -> io::Result<SignalThread> {
        let mut signals = self.signals;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("skiff-signals".into())
            .spawn(move || {
                let mut on_first = Some(on_first);
                for sig in signals.forever() {
                    let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                    if let Some(f) = on_first.take() {
                        tracing::info!(
                            "{name} received: no longer accepting, draining connections"
                        );
                        f();
                    } else {
                        tracing::warn!(
                            "second signal ({name}): exiting without finishing the drain"
                        );
                        std::process::exit(FORCED_EXIT_CODE);
                    }
                }
            })?;
        Ok(SignalThread {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for SignalThread {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! SIGINT/SIGTERM: the first one stops the server (stop accepting, drain),
//! a second one exits at once. SIGHUP calls the reload hook (the TLS
//! certificate, [`crate::tls::TlsServer::reload`]) and never stops the relay.
//!
//! The handlers are installed with `signal-hook`, whose handler only writes to
//! a pipe; a plain OS thread reads that pipe. Worker threads therefore never
//! run signal code: at most their `io_uring_enter`/`epoll_wait` returns EINTR,
//! which monoio retries.

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use skiff_monoio::shutdown::StopTrigger;

/// Exit status used when a second signal cuts the drain short.
pub const FORCED_EXIT_CODE: i32 = 130;

/// What SIGHUP runs (on the signal thread).
type ReloadHook = Box<dyn Fn() + Send + 'static>;

/// Installed SIGINT/SIGTERM/SIGHUP handlers, not yet connected to a server.
pub struct SignalWatcher {
    signals: Signals,
    reload: Option<ReloadHook>,
}

impl std::fmt::Debug for SignalWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalWatcher")
            .field("reload", &self.reload.is_some())
            .finish_non_exhaustive()
    }
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
            signals: Signals::new([SIGINT, SIGTERM, SIGHUP])?,
            reload: None,
        })
    }

    /// Runs `reload` at every SIGHUP (without it, SIGHUP is logged and ignored).
    #[must_use]
    pub fn on_reload(mut self, reload: impl Fn() + Send + 'static) -> Self {
        self.reload = Some(Box::new(reload));
        self
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
        let reload = self.reload;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("skiff-signals".into())
            .spawn(move || {
                let mut on_first = Some(on_first);
                for sig in signals.forever() {
                    if sig == SIGHUP {
                        match &reload {
                            Some(reload) => {
                                tracing::info!("SIGHUP received: reloading");
                                reload();
                            }
                            None => tracing::info!("SIGHUP received: nothing to reload"),
                        }
                        continue;
                    }
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

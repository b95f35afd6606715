//! Errors that stop the relay process (as opposed to one connection).

use std::io;
use std::net::SocketAddr;

use crate::config::ConfigError;

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The flags or configuration file are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listening socket could not be created, bound or put into listen state.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        source: io::Error,
    },
    /// The metrics endpoint could not be started.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        source: io::Error,
    },
    /// A worker's runtime could not be built or its listener registered
    /// (e.g. `--driver io-uring` on a kernel without io_uring).
    #[error("worker {worker} failed to start: {source}")]
    Worker {
        /// Index of the worker.
        worker: usize,
        /// The underlying failure.
        source: io::Error,
    },
    /// A worker thread panicked (a bug; the other workers were stopped).
    #[error("worker {worker} panicked")]
    WorkerPanicked {
        /// Index of the worker.
        worker: usize,
    },
    /// SIGINT/SIGTERM handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    /// An OS thread or the stop pipes could not be created.
    #[error("cannot start a thread: {0}")]
    Spawn(io::Error),
    /// Some `demo` viewers failed (an I/O error, or a frame missing or
    /// different from what was published).
    #[error("{failed} of {viewers} demo viewers failed")]
    DemoFailed {
        /// Viewers that failed.
        failed: usize,
        /// Viewers that ran.
        viewers: usize,
    },
    /// `export` found nothing to write, or could not read or write a file.
    #[error("export: {0}")]
    Export(crate::record::export::ExportError),
}

impl RelayError {
    /// The process exit status for this error: 2 for bad configuration
    /// (like a usage error), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            RelayError::Config(_) => 2,
            _ => 1,
        }
    }
}

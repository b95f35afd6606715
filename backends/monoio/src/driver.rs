//! Choosing and building the per-thread monoio runtime: io_uring when the
//! kernel allows it, the epoll ("legacy") driver otherwise.

use std::fmt;
use std::future::Future;
use std::io;
use std::str::FromStr;

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

/// Submission-queue entries of each io_uring runtime.
pub(crate) const URING_ENTRIES: u32 = 1024;

/// Which I/O driver a worker should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DriverKind {
    /// io_uring if the kernel supports it, else legacy.
    #[default]
    Auto,
    /// io_uring only; fail if unavailable.
    IoUring,
    /// epoll through mio, even where io_uring works.
    Legacy,
}

/// A driver name [`DriverKind`] does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDriver(pub String);

impl fmt::Display for UnknownDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown driver `{}` (use auto, io-uring or legacy)",
            self.0
        )
    }
}

impl std::error::Error for UnknownDriver {}

impl FromStr for DriverKind {
    type Err = UnknownDriver;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DriverKind::Auto),
            "io-uring" | "io_uring" | "iouring" | "uring" => Ok(DriverKind::IoUring),
            "legacy" | "epoll" => Ok(DriverKind::Legacy),
            _ => Err(UnknownDriver(s.to_owned())),
        }
    }
}

/// The driver a runtime actually runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveDriver {
    /// Linux io_uring: completion-based, buffers owned by the kernel while in flight.
    IoUring,
    /// epoll readiness through mio.
    Legacy,
}

impl ActiveDriver {
    /// A short lowercase name for logs and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            ActiveDriver::IoUring => "io_uring",
            ActiveDriver::Legacy => "legacy",
        }
    }
}

impl fmt::Display for ActiveDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this kernel (and sandbox) lets us create an io_uring.
pub fn io_uring_available() -> bool {
    monoio::utils::detect_uring()
}

/// Runs the future made by `make` to completion on a new runtime of the
/// requested driver kind, on the calling thread, with timers enabled.
///
/// `Auto` tries io_uring first and falls back to legacy if io_uring is
/// unsupported or its ring cannot be created. `make` learns which driver
/// runs it.
///
/// # Errors
/// The runtime could not be built: io_uring asked for explicitly but not
/// available, or the kernel refused the ring / epoll instance.
pub fn block_on<F, M>(kind: DriverKind, make: M) -> io::Result<F::Output>
where
    F: Future,
    M: FnOnce(ActiveDriver) -> F,
{
    let uring = match kind {
        DriverKind::Legacy => None,
        DriverKind::IoUring if !io_uring_available() => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring is not available on this kernel (try --driver legacy or auto)",
            ));
        }
        DriverKind::IoUring => Some(
            RuntimeBuilder::<IoUringDriver>::new()
                .with_entries(URING_ENTRIES)
                .enable_timer()
                .build()?,
        ),
        DriverKind::Auto if !io_uring_available() => None,
        DriverKind::Auto => match RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(URING_ENTRIES)
            .enable_timer()
            .build()
        {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring ring could not be created; falling back to the legacy driver");
                None
            }
        },
    };
    match uring {
        Some(mut rt) => Ok(rt.block_on(make(ActiveDriver::IoUring))),
        None => {
            let mut rt = RuntimeBuilder::<LegacyDriver>::new()
                .enable_timer()
                .build()?;
            Ok(rt.block_on(make(ActiveDriver::Legacy)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_driver_names() {
        assert_eq!("auto".parse::<DriverKind>(), Ok(DriverKind::Auto));
        assert_eq!("io-uring".parse::<DriverKind>(), Ok(DriverKind::IoUring));
        assert_eq!("IO_URING".parse::<DriverKind>(), Ok(DriverKind::IoUring));
        assert_eq!("epoll".parse::<DriverKind>(), Ok(DriverKind::Legacy));
        assert!("kqueue".parse::<DriverKind>().is_err());
    }

    #[test]
    fn legacy_runtime_reports_itself() {
        let got = block_on(DriverKind::Legacy, |d| async move {
            (d, monoio::utils::is_legacy())
        })
        .unwrap();
        assert_eq!(got, (ActiveDriver::Legacy, true));
    }

    #[test]
    fn auto_picks_io_uring_when_available() {
        let got = block_on(DriverKind::Auto, |d| async move { d }).unwrap();
        let want = if io_uring_available() {
            ActiveDriver::IoUring
        } else {
            ActiveDriver::Legacy
        };
        assert_eq!(got, want);
    }
}

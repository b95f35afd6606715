//! A library for `LD_PRELOAD` that logs every socket read and write of the
//! process it is loaded into: the call's monotonic time, descriptor,
//! direction and byte count, one [`Event`] of 24 bytes each, into
//! `$SKIFF_TIMELINE_DIR/ev.<pid>` (a file mapped shared, so the log
//! survives a process that is killed). `timeline-split` reads the files of
//! a load run and splits a frame's latency into its hops.
//!
//! Only calls that moved bytes are logged, and only through the C library's
//! functions: io_uring submissions are not seen, so a relay is measured on
//! its epoll driver. Without `SKIFF_TIMELINE_DIR` nothing is logged.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use libc::{iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

/// One logged call, as stored in the file (little-endian on the hosts this
/// runs on).
#[repr(C)]
struct Event {
    /// `CLOCK_MONOTONIC`, nanoseconds.
    ns: u64,
    /// Unused (0): a thread id would cost a system call per logged call.
    tid: i32,
    /// The descriptor.
    fd: i32,
    /// 1: a read, 2: a write.
    op: i32,
    /// Bytes moved.
    bytes: i32,
}

/// Events one process may log; later calls are not logged.
const CAPACITY: usize = 1 << 22;

static RING: AtomicPtr<Event> = AtomicPtr::new(core::ptr::null_mut());
static NEXT: AtomicUsize = AtomicUsize::new(0);

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// Maps the log file when the library is loaded.
extern "C" fn init() {
    // SAFETY: getenv's result is read before any other call could change the
    // environment; open, ftruncate and mmap take values this function owns
    // (the path is NUL-terminated: `path` is zeroed past `total`). A failure
    // leaves RING null and nothing is logged.
    unsafe {
        let dir = libc::getenv(c"SKIFF_TIMELINE_DIR".as_ptr());
        if dir.is_null() {
            return;
        }
        let dir = core::ffi::CStr::from_ptr(dir).to_bytes();
        let mut path = [0u8; 512];
        let name = format_pid(libc::getpid());
        let total = dir.len() + 4 + name.1;
        if total >= path.len() {
            return;
        }
        path[..dir.len()].copy_from_slice(dir);
        path[dir.len()..dir.len() + 4].copy_from_slice(b"/ev.");
        path[dir.len() + 4..total].copy_from_slice(&name.0[..name.1]);
        let fd = libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            return;
        }
        let len = CAPACITY * core::mem::size_of::<Event>();
        if libc::ftruncate(fd, len as libc::off_t) != 0 {
            libc::close(fd);
            return;
        }
        let map = libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        if map != libc::MAP_FAILED {
            RING.store(map.cast(), Ordering::Release);
        }
    }
}

/// The decimal digits of `pid` and their count.
fn format_pid(pid: i32) -> ([u8; 12], usize) {
    let mut digits = [0u8; 12];
    let mut n = pid.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 || len == digits.len() {
            break;
        }
    }
    digits[..len].reverse();
    (digits, len)
}

/// Logs a call that moved `moved` bytes.
fn log(fd: c_int, op: i32, moved: ssize_t) {
    let ring = RING.load(Ordering::Acquire);
    if ring.is_null() || moved <= 0 {
        return;
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= CAPACITY {
        return;
    }
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a live timespec; `ring` maps CAPACITY events and `i`
    // is below it, and no other call writes slot `i` (fetch_add).
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
        ring.add(i).write(Event {
            ns: t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64,
            tid: 0,
            fd,
            op,
            bytes: i32::try_from(moved).unwrap_or(i32::MAX),
        });
    }
}

/// Defines a logged wrapper of the C library's `$name`, found once with
/// `dlsym(RTLD_NEXT)`.
macro_rules! logged {
    ($name:ident, $op:expr, ($($arg:ident: $ty:ty),*)) => {
        #[doc = concat!("`", stringify!($name), "`, logged.")]
        ///
        /// # Safety
        /// As the C library's function of that name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, $($arg: $ty),*) -> ssize_t {
            static REAL: AtomicUsize = AtomicUsize::new(0);
            let mut f = REAL.load(Ordering::Relaxed);
            if f == 0 {
                // SAFETY: a NUL-terminated symbol name; RTLD_NEXT finds the
                // C library's definition after this one.
                f = unsafe {
                    libc::dlsym(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_ptr().cast())
                } as usize;
                REAL.store(f, Ordering::Relaxed);
            }
            if f == 0 {
                return -1;
            }
            let real: unsafe extern "C" fn(c_int, $($ty),*) -> ssize_t =
                // SAFETY: `f` is the C library's function of this signature.
                unsafe { core::mem::transmute(f) };
            // SAFETY: the caller's arguments, passed on unchanged.
            let moved = unsafe { real(fd, $($arg),*) };
            log(fd, $op, moved);
            moved
        }
    };
}

logged!(read, 1, (buf: *mut c_void, n: size_t));
logged!(recv, 1, (buf: *mut c_void, n: size_t, flags: c_int));
logged!(recvfrom, 1, (buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t));
logged!(readv, 1, (iov: *const iovec, count: c_int));
logged!(recvmsg, 1, (msg: *mut msghdr, flags: c_int));
logged!(write, 2, (buf: *const c_void, n: size_t));
logged!(send, 2, (buf: *const c_void, n: size_t, flags: c_int));
logged!(sendto, 2, (buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t));
logged!(writev, 2, (iov: *const iovec, count: c_int));
logged!(sendmsg, 2, (msg: *const msghdr, flags: c_int));

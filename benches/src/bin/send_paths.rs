//! `send_paths`: what a sender's CPU pays to fan one frame out to many loopback
//! TCP sockets, by two kernel paths.
//!
//! Each frame is 64 KiB of payload in four QMux-sized records (an 8-byte
//! header and 16,352 bytes each), sent to every viewer socket:
//! - `writev`: one gathered write per viewer, the kernel copying the payload
//!   into each socket (the relay's path);
//! - `tee+splice`: the payload written once into a pipe, `tee`d into a pipe
//!   per viewer, then per record a `send` of the header and a `splice` of the
//!   chunk, so the kernel shares the pipe's pages among the sockets instead of
//!   copying them per viewer;
//! - `tee+splice/1`: the same with the whole frame in one `splice` and no
//!   headers, the least that sharing the pages can cost (not a valid stream);
//! - `pipe-framed`: each record's chunk in a pipe of its own, written once;
//!   per viewer, each header written into the viewer's pipe and the chunk
//!   `tee`d after it, then the whole framed stream in one `splice` to the
//!   socket: valid records, one socket operation per viewer.
//!
//! One thread per viewer drains its socket. The figure is the sending thread's
//! own CPU time (`CLOCK_THREAD_CPUTIME_ID`) per delivered GB; the two paths
//! alternate within each round, so they share the host's state.

use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::LazyLock;
use std::time::Instant;

use clap::Parser;
use skiff_core::wire::qmux::{
    DEFAULT_MAX_RECORD_SIZE, StreamId, encode_stream_record_header, max_stream_payload,
};

/// The stream the records are framed for: a group stream.
const STREAM: StreamId = StreamId(3);
/// The offset the records are framed at: past the group's first record,
/// where the relay's record headers are 8 bytes.
const OFFSET: u64 = 16_352;

/// Payload bytes of one record: the most one STREAM frame carries in a record
/// of QMux's default size limit (16,352).
static CHUNK: LazyLock<usize> =
    LazyLock::new(|| max_stream_payload(DEFAULT_MAX_RECORD_SIZE, STREAM, OFFSET));
/// Records per frame.
const RECORDS: usize = 4;
/// A record header as the relay writes it ahead of a gathered chunk (record
/// size, STREAM type, stream id, offset, length), by the core's encoder.
static HEADER: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut buf = [0u8; 32];
    let n = encode_stream_record_header(STREAM, OFFSET, *CHUNK, false, &mut buf)
        .expect("a STREAM record header fits 32 bytes");
    buf[..n].to_vec()
});
/// Pipe capacity asked for, above one frame.
const PIPE_BYTES: libc::c_int = 256 * 1024;

#[derive(Debug, Parser)]
#[command(about = "Sender CPU per GB: writev per viewer against tee+splice from one pipe")]
struct Args {
    /// Viewer sockets.
    #[arg(long, default_value_t = 100)]
    viewers: usize,
    /// Frames per path per round.
    #[arg(long, default_value_t = 300)]
    frames: usize,
    /// Rounds, each running both paths in turn.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// The calling thread's CPU time, seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Turns a libc return value into an `io::Result` of the byte count.
fn check(ret: isize) -> io::Result<usize> {
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}

/// Writes all of `buf` to `fd` in one call (a pipe with room for it), or fails
/// saying `what` came up short.
fn write_whole(fd: RawFd, buf: &[u8], what: &str) -> io::Result<()> {
    // SAFETY: `buf` is a live, readable slice for the call's duration.
    let n = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
    if check(n)? != buf.len() {
        return Err(io::Error::other(format!("short write: {what}")));
    }
    Ok(())
}

/// A pipe (read end, write end) with room for a frame.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe(2) succeeded, so both descriptors are open and ours alone.
    let ends = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETPIPE_SZ takes an int argument on an open pipe descriptor.
    if unsafe { libc::fcntl(ends.1.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ends)
}

/// Writes the whole of `iov` to `fd`, again after a short write.
fn writev_all(fd: RawFd, parts: &[&[u8]]) -> io::Result<()> {
    let mut skip = 0usize;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    while skip < total {
        let mut left = skip;
        let iov: Vec<libc::iovec> = parts
            .iter()
            .filter_map(|p| {
                if left >= p.len() {
                    left -= p.len();
                    return None;
                }
                let rest = &p[left..];
                left = 0;
                Some(libc::iovec {
                    iov_base: rest.as_ptr() as *mut libc::c_void,
                    iov_len: rest.len(),
                })
            })
            .collect();
        // SAFETY: each iovec points into a live slice of `parts`, read-only.
        let n = unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as libc::c_int) };
        skip += check(n)?;
    }
    Ok(())
}

/// Moves `len` bytes from pipe `from` to `to` (a socket or /dev/null).
fn splice_all(from: RawFd, to: RawFd, mut len: usize, flags: libc::c_uint) -> io::Result<()> {
    while len > 0 {
        // SAFETY: both descriptors are open; null offsets mean "current position".
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                flags,
            )
        };
        match check(n)? {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "splice moved nothing",
                ));
            }
            k => len -= k,
        }
    }
    Ok(())
}

/// One frame to every viewer by a gathered write each.
fn send_writev(viewers: &[TcpStream], frame: &[u8]) -> io::Result<()> {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * RECORDS);
    for chunk in frame.chunks(*CHUNK) {
        parts.push(&HEADER[..]);
        parts.push(chunk);
    }
    for v in viewers {
        writev_all(v.as_raw_fd(), &parts)?;
    }
    Ok(())
}

/// The pipes of the spliced paths.
struct Pipes {
    source: (OwnedFd, OwnedFd),
    /// One per record, for `pipe-framed`.
    chunks: Vec<(OwnedFd, OwnedFd)>,
    per_viewer: Vec<(OwnedFd, OwnedFd)>,
    sink: std::fs::File,
}

/// One frame into the source pipe once, then shared into every viewer socket,
/// record by record with headers, or (`whole`) in one splice without them.
fn send_spliced(viewers: &[TcpStream], frame: &[u8], pipes: &Pipes, whole: bool) -> io::Result<()> {
    let source_out = pipes.source.0.as_raw_fd();
    write_whole(pipes.source.1.as_raw_fd(), frame, "the source pipe")?;
    for (v, (out, inp)) in viewers.iter().zip(&pipes.per_viewer) {
        // SAFETY: both are open pipe descriptors; tee copies page references only.
        let t = unsafe { libc::tee(source_out, inp.as_raw_fd(), frame.len(), 0) };
        if check(t)? != frame.len() {
            return Err(io::Error::other("short tee"));
        }
        if whole {
            splice_all(out.as_raw_fd(), v.as_raw_fd(), frame.len(), 0)?;
            continue;
        }
        for _ in 0..RECORDS {
            // SAFETY: HEADER is a live buffer of the length passed; the socket is open.
            let h = unsafe {
                libc::send(
                    v.as_raw_fd(),
                    HEADER.as_ptr() as *const libc::c_void,
                    HEADER.len(),
                    libc::MSG_MORE,
                )
            };
            if check(h)? != HEADER.len() {
                return Err(io::Error::other("short header send"));
            }
            splice_all(out.as_raw_fd(), v.as_raw_fd(), *CHUNK, libc::SPLICE_F_MORE)?;
        }
    }
    // The source pipe's copy has been shared; empty it for the next frame.
    splice_all(source_out, pipes.sink.as_raw_fd(), frame.len(), 0)
}

/// One frame's chunks into their pipes once; per viewer the records are framed
/// in the viewer's pipe (header written, chunk tee'd) and spliced out at once.
fn send_pipe_framed(viewers: &[TcpStream], frame: &[u8], pipes: &Pipes) -> io::Result<()> {
    for (chunk, (_, inp)) in frame.chunks(*CHUNK).zip(&pipes.chunks) {
        write_whole(inp.as_raw_fd(), chunk, "a chunk pipe")?;
    }
    let framed = RECORDS * (HEADER.len() + *CHUNK);
    for (v, (out, inp)) in viewers.iter().zip(&pipes.per_viewer) {
        for (chunk_out, _) in &pipes.chunks {
            write_whole(inp.as_raw_fd(), &HEADER[..], "a header")?;
            // SAFETY: both are open pipe descriptors; tee copies page references only.
            let t = unsafe { libc::tee(chunk_out.as_raw_fd(), inp.as_raw_fd(), *CHUNK, 0) };
            if check(t)? != *CHUNK {
                return Err(io::Error::other("short tee"));
            }
        }
        splice_all(out.as_raw_fd(), v.as_raw_fd(), framed, 0)?;
    }
    for (chunk_out, _) in &pipes.chunks {
        splice_all(chunk_out.as_raw_fd(), pipes.sink.as_raw_fd(), *CHUNK, 0)?;
    }
    Ok(())
}

fn main() -> io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut viewers = Vec::with_capacity(args.viewers);
    for _ in 0..args.viewers {
        let mut reader = TcpStream::connect(addr)?;
        let (sender, _) = listener.accept()?;
        sender.set_nodelay(true)?;
        viewers.push(sender);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
        });
    }
    let frame: Vec<u8> = (0..RECORDS * *CHUNK).map(|i| (i % 251) as u8).collect();
    let pipes = Pipes {
        source: pipe()?,
        chunks: (0..RECORDS).map(|_| pipe()).collect::<io::Result<_>>()?,
        per_viewer: (0..args.viewers)
            .map(|_| pipe())
            .collect::<io::Result<_>>()?,
        sink: std::fs::OpenOptions::new().write(true).open("/dev/null")?,
    };
    let bytes = (args.frames * args.viewers * RECORDS * (HEADER.len() + *CHUNK)) as f64;
    println!(
        "send_paths: {} viewers, {} frames of {} B per path per round, loopback TCP",
        args.viewers,
        args.frames,
        frame.len()
    );
    println!("round  path          sender_CPU-s/GB  wall_MB/s");
    for round in 1..=args.rounds {
        for path in ["writev", "tee+splice", "tee+splice/1", "pipe-framed"] {
            let cpu = thread_cpu();
            let wall = Instant::now();
            for _ in 0..args.frames {
                match path {
                    "writev" => send_writev(&viewers, &frame)?,
                    "pipe-framed" => send_pipe_framed(&viewers, &frame, &pipes)?,
                    spliced => send_spliced(&viewers, &frame, &pipes, spliced == "tee+splice/1")?,
                }
            }
            let cpu = thread_cpu() - cpu;
            // The headerless path delivers the payload alone.
            let sent = match path {
                "tee+splice/1" => (args.frames * args.viewers * frame.len()) as f64,
                _ => bytes,
            };
            println!(
                "{round:>5}  {path:<12}  {:>15.3}  {:>9.0}",
                cpu / (sent / 1e9),
                sent / 1e6 / wall.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

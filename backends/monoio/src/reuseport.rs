//! A worker group's UDP sockets on one port, and the kernel filter that
//! steers each datagram to the worker owning its connection
//! (docs/protocol.md §11.8).
//!
//! Linux numbers the sockets of a SO_REUSEPORT group in the order they were
//! bound, and a classic BPF program attached to the group
//! (SO_ATTACH_REUSEPORT_CBPF) returns, for each datagram, the number of the
//! socket that gets it. [`bind_group`] binds the sockets one after the
//! other, so socket `i` is worker `i`'s; [`steer_by_connection_id`] attaches
//! a program that returns the first byte of the datagram's destination
//! connection ID modulo the group's size, the worker that issued the ID
//! (`skiff_quic::steer`). Without the program (or when it names a socket
//! the group no longer has) the kernel picks by a hash of the addresses.

use std::io;
use std::net::{SocketAddr, UdpSocket};

/// Instructions in [`steering_program`].
pub const PROGRAM_LEN: usize = 7;

/// Binds `n` UDP sockets with SO_REUSEPORT on `addr`, in index order: the
/// first on `addr` (port 0 picks a free port), the others on the address
/// the first got. Socket `i` is number `i` in the kernel's group.
///
/// # Errors
/// A socket could not be made or bound (the port is taken by a socket of
/// another user or without SO_REUSEPORT).
pub fn bind_group(addr: SocketAddr, n: usize) -> io::Result<Vec<UdpSocket>> {
    let mut sockets = Vec::with_capacity(n);
    let first = crate::quic::bind(addr, true)?;
    let addr = first.local_addr()?;
    sockets.push(first);
    for _ in 1..n {
        sockets.push(crate::quic::bind(addr, true)?);
    }
    Ok(sockets)
}

/// One classic BPF instruction.
fn op(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: u16::try_from(code).unwrap_or(u16::MAX),
        jt,
        jf,
        k,
    }
}

/// The program that steers a group of `workers` sockets: the first byte of
/// the UDP payload tells the header form (0x80 set: long); the DCID's first
/// byte is payload byte 6 in a long header and byte 1 in a short one; the
/// socket is that byte modulo `workers`. A datagram too short for the byte
/// it reads ends the program with 0, socket 0.
pub fn steering_program(workers: u32) -> [libc::sock_filter; PROGRAM_LEN] {
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_JA, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_MOD, BPF_RET,
    };
    let long = skiff_quic::steer::LONG_HEADER_DCID as u32;
    let short = skiff_quic::steer::SHORT_HEADER_DCID as u32;
    [
        // A = payload[0]
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
        // long header? next; short: skip two
        op(BPF_JMP | BPF_JSET | BPF_K, 0, 2, 0x80),
        // A = payload[6], then past the short header's load
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, long),
        op(BPF_JMP | BPF_JA, 0, 0, 1),
        // A = payload[1]
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, short),
        // A %= workers
        op(BPF_ALU | BPF_MOD | BPF_K, 0, 0, workers.max(1)),
        op(BPF_RET | BPF_A, 0, 0, 0),
    ]
}

/// Attaches [`steering_program`] for `workers` sockets to the group
/// `socket` belongs to (any member will do; the group keeps it for all).
///
/// # Errors
/// `InvalidInput` for 0 workers or more than a byte can name; or the
/// kernel refused the program (too old a kernel, or a sandbox forbidding
/// socket filters).
pub fn steer_by_connection_id(socket: &UdpSocket, workers: usize) -> io::Result<()> {
    if workers == 0 || workers > skiff_quic::steer::MAX_WORKERS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a steering byte names 1 to 256 workers",
        ));
    }
    let mut program = steering_program(u32::try_from(workers).unwrap_or(1));
    let fprog = libc::sock_fprog {
        len: PROGRAM_LEN as u16,
        filter: program.as_mut_ptr(),
    };
    // `fprog` points at `program`, PROGRAM_LEN instructions alive for the
    // call; the kernel copies them.
    crate::quic::set_opt(
        socket,
        libc::SOL_SOCKET,
        libc::SO_ATTACH_REUSEPORT_CBPF,
        &fprog,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const WORKERS: usize = 4;

    /// A short-header datagram whose DCID starts with `byte`.
    fn short(byte: u8, tag: u8) -> Vec<u8> {
        let mut d = vec![0x40, byte, 1, 2, 3, 4, 5, 6, 7];
        d.extend_from_slice(&[tag; 24]);
        d
    }

    /// A long-header datagram (an Initial's first bytes) whose DCID starts
    /// with `byte`.
    fn long(byte: u8, tag: u8) -> Vec<u8> {
        let mut d = vec![0xc0, 0, 0, 0, 1, 8, byte, 1, 2, 3, 4, 5, 6, 7, 8];
        d.extend_from_slice(&[tag; 24]);
        d
    }

    /// Which socket of `group` got each datagram, by the tag it carries
    /// last; every socket is read until it has nothing.
    fn receivers(group: &[UdpSocket], count: usize) -> Vec<Option<usize>> {
        let mut got = vec![None; count];
        let mut buf = [0u8; 256];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut seen = 0;
        while seen < count && std::time::Instant::now() < deadline {
            for (i, s) in group.iter().enumerate() {
                while let Ok(n) = s.recv(&mut buf) {
                    let tag = usize::from(buf[n - 1]);
                    assert!(got[tag].is_none(), "datagram {tag} twice");
                    got[tag] = Some(i);
                    seen += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }

    /// Datagrams with chosen first DCID bytes, sent from one address and
    /// from many, reach the socket the byte names, whatever the header
    /// form; bytes that name a socket twice over (k·N + i) too.
    #[test]
    fn the_program_steers_by_the_first_dcid_byte() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), WORKERS).unwrap();
        let port = group[0].local_addr().unwrap();
        for s in &group {
            assert_eq!(s.local_addr().unwrap(), port);
        }
        steer_by_connection_id(&group[1], WORKERS).expect("the kernel takes the program");
        let mut expected = Vec::new();
        let senders: Vec<UdpSocket> = (0..8)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let mut tag = 0u8;
        for byte in [0u8, 1, 2, 3, 4, 5, 6, 7, 0x41, 0x82, 0xc3, 0xfd, 0xfe, 0xff] {
            for (k, sender) in senders.iter().enumerate() {
                let d = if k % 2 == 0 {
                    short(byte, tag)
                } else {
                    long(byte, tag)
                };
                sender.send_to(&d, port).unwrap();
                expected.push(Some(usize::from(byte) % WORKERS));
                tag += 1;
            }
        }
        // A long-header datagram too short to reach its DCID: socket 0.
        senders[0].send_to(&[0xc0, tag], port).unwrap();
        expected.push(Some(0));
        assert_eq!(receivers(&group, expected.len()), expected);
    }

    /// Without the program the kernel picks by the addresses: one DCID
    /// sent from many source ports reaches more than one socket, as a
    /// client's datagrams would after a NAT gave it a new port.
    #[test]
    fn without_the_program_a_new_source_port_may_reach_another_socket() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), WORKERS).unwrap();
        let port = group[0].local_addr().unwrap();
        let count = 64;
        for tag in 0..count {
            let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
            sender.send_to(&short(0x02, tag), port).unwrap();
        }
        let got = receivers(&group, usize::from(count));
        let mut sockets: Vec<usize> = got.iter().map(|g| g.expect("received")).collect();
        sockets.sort_unstable();
        sockets.dedup();
        // 64 addresses on one socket of four by chance: 4^-63.
        assert!(sockets.len() > 1, "every datagram on socket {sockets:?}");
    }

    #[test]
    fn a_group_too_large_for_a_byte_is_refused() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = steer_by_connection_id(&s, 257).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

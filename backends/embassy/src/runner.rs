//! The task that moves bytes and time for the session: [`Runner`].
//!
//! One connection is: TCP connect, [`Session::new`] (client), then a loop that
//!
//! 1. runs due timers ([`Session::run_timers`]),
//! 2. hands the session every received byte it has not consumed yet through an
//!    [`Inbox`] over the input buffer (the rest waits there for the next call),
//! 3. hands the session's events to its handler ([`Session::deliver`]),
//! 4. fills the output buffer with one [`Session::transmit_to`] call once the
//!    previous records went into the socket,
//! 5. publishes the subscriber count and a pacing turn to the [`Publisher`]s,
//! 6. waits for the first of: the socket readable (if the input buffer has room),
//!    the socket writable (if records wait), the session's next timeout, a change of
//!    the local media (the origin or any of its tracks), or a new pacing registration.
//!
//! When the session or the socket ends, the runner logs why, waits out its backoff
//! and dials again ([`Runner::run`]).
//!
//! [`Publisher`]: crate::Publisher

use core::future::{Future, poll_fn};
use core::pin::pin;
use core::task::{Context, Poll};

use embassy_net::Stack;
use embassy_net::tcp::{self, TcpSocket};
use embassy_time::{Duration, Timer, with_timeout};
use skiff_core::model::origin;
use skiff_core::session::{Event, Handler, Inbox, Once, Session};
use skiff_core::wire::lite::SessionCode;

use crate::clock;
use crate::config::{Config, next_backoff};
use crate::error::Error;
use crate::publisher::{Shared, State};
use crate::resources::MakeSession;

/// Drives one publisher's connection to the relay; never spawned for you (the
/// application owns every task it runs): run [`Runner::run`] in a task of the
/// executor that runs the application (their shared state is `!Sync`).
///
/// `'d` is the network stack's lifetime, `'r` the resources', `'a` the local media's
/// (origin, broadcasts, tracks, and the configuration's path), `'p` the block pool's;
/// `N` is the session's stream table (`STREAMS` of the resources).
pub struct Runner<'d, 'r, 'a, 'p, const N: usize> {
    pub(crate) stack: Stack<'d>,
    pub(crate) config: Config<'a>,
    pub(crate) origin: origin::Ref<'a, 'p>,
    pub(crate) shared: &'r Shared<'a, 'p>,
    pub(crate) storage: &'r mut dyn MakeSession<'a, 'p, N>,
    pub(crate) rx: &'r mut [u8],
    pub(crate) tx: &'r mut [u8],
    pub(crate) socket_rx: &'r mut [u8],
    pub(crate) socket_tx: &'r mut [u8],
    /// The wait before the next attempt after a failure.
    pub(crate) backoff: Duration,
}

/// What woke the connection loop.
enum Wake {
    Read(Result<usize, tcp::Error>),
    Wrote(Result<usize, tcp::Error>),
    Timer,
    Changed,
}

/// How a connection loop ended, before the socket is shut down.
enum End {
    /// The session is closed; the close (if ours) is in the output to flush.
    Session(Result<(), Error>),
    /// The socket failed or the relay shut TCP down first.
    Socket,
}

impl<'d, 'r, 'a, 'p, const N: usize> Runner<'d, 'r, 'a, 'p, N> {
    /// Connects, publishes and reconnects forever: after each connection it waits
    /// [`Config::backoff_min`] if the session reached the relay's SETUP, else the
    /// current backoff, which doubles per failure up to [`Config::backoff_max`].
    pub async fn run(&mut self) -> ! {
        loop {
            let before = self.shared_sessions();
            let result = self.run_once().await;
            let reached_setup = self.shared_sessions() != before;
            let wait = match result {
                Ok(()) => {
                    info!("publisher: session ended cleanly");
                    self.backoff = self.config.backoff_min;
                    self.config.backoff_min
                }
                Err(e) => {
                    warn!("publisher: connection ended: {}", e);
                    if matches!(e, Error::Config(_)) {
                        self.config.backoff_max
                    } else if reached_setup {
                        self.backoff = self.config.backoff_min;
                        self.config.backoff_min
                    } else {
                        let wait = self.backoff;
                        self.backoff =
                            next_backoff(wait, self.config.backoff_min, self.config.backoff_max);
                        wait
                    }
                }
            };
            debug!("publisher: reconnecting in {} ms", wait.as_millis());
            Timer::after(wait).await;
        }
    }

    /// The wait [`Runner::run`] takes after the next failed attempt.
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    fn shared_sessions(&self) -> u32 {
        crate::Publisher {
            shared: self.shared,
        }
        .sessions()
    }

    /// One connection: dial the relay, run a session until it ends, shut the socket
    /// down. `Ok(())` if the relay closed the session with NO_ERROR.
    ///
    /// # Errors
    /// Why the connection ended otherwise (also kept for
    /// [`Publisher::last_error`](crate::Publisher::last_error)).
    pub async fn run_once(&mut self) -> Result<(), Error> {
        let result = self.connect_and_serve().await;
        self.shared.set_in_session(false);
        self.shared.set_error(result.err());
        self.shared.set_state(State::Backoff);
        result
    }

    async fn connect_and_serve(&mut self) -> Result<(), Error> {
        self.shared.set_state(State::Connecting);
        self.stack.wait_config_up().await;
        let mut socket = TcpSocket::new(self.stack, &mut *self.socket_rx, &mut *self.socket_tx);
        // Records are sent whole as soon as they are written: no Nagle delay on media.
        socket.set_nagle_enabled(false);
        self.shared.count_attempt();
        debug!("publisher: dialing the relay");
        match with_timeout(
            self.config.connect_timeout,
            socket.connect(self.config.relay),
        )
        .await
        {
            Err(_) => {
                socket.abort();
                return Err(Error::ConnectTimeout);
            }
            Ok(Err(e)) => return Err(Error::Connect(e)),
            Ok(Ok(())) => {}
        }
        info!("publisher: connected to the relay");
        self.shared.set_state(State::Handshake);
        let mut session = self
            .storage
            .make(self.config.session, clock::now(), self.origin)?;
        self.shared.set_in_session(true);
        let mut conn = Connection {
            socket: &mut socket,
            rx: Inbox::new(&mut *self.rx),
            tx: &mut *self.tx,
            tx_pos: 0,
            tx_len: 0,
            shared: self.shared,
            origin: self.origin,
        };
        let end = conn.serve(&mut session).await;
        let tx_left = (conn.tx_pos, conn.tx_len);
        match end {
            End::Session(result) => {
                // Send what is left (our close) and a FIN, within the close timeout.
                let close = Self::flush_close(&mut socket, &mut session, &mut *self.tx, tx_left);
                if with_timeout(self.config.close_timeout, close)
                    .await
                    .is_err()
                {
                    socket.abort();
                }
                drop(session);
                result
            }
            End::Socket => {
                drop(session);
                socket.abort();
                let _ = with_timeout(self.config.close_timeout, socket.flush()).await;
                Err(Error::ConnectionLost)
            }
        }
    }

    /// Writes the pending output and whatever the closed session still writes (its
    /// close), then shuts the socket's send side and waits for the FIN to be acked.
    async fn flush_close<const M: usize>(
        socket: &mut TcpSocket<'_>,
        session: &mut Session<'_, '_, '_, M>,
        tx: &mut [u8],
        (mut pos, mut len): (usize, usize),
    ) {
        loop {
            while pos < len {
                match socket.write(tx.get(pos..len).unwrap_or(&[])).await {
                    Ok(n) if n > 0 => pos += n,
                    _ => return,
                }
            }
            pos = 0;
            len = session.poll_transmit(clock::now(), tx);
            if len == 0 {
                break;
            }
        }
        socket.close();
        let _ = socket.flush().await;
    }
}

/// The runner's handler of the session's events: logs them, keeps the
/// shared status, and notes how the session ended or whether the relay sent
/// GOAWAY.
struct Events<'h, 'a, 'p> {
    shared: &'h Shared<'a, 'p>,
    ended: Option<Result<(), Error>>,
    goaway: bool,
}

impl<'s, 'x, 'y, const N: usize> Handler<'s, 'x, 'y, N, skiff_core::conn::Connection<N>>
    for Events<'_, '_, '_>
{
    fn on_event(&mut self, _now: skiff_core::time::Instant, event: &Event<'_>) {
        match *event {
            Event::Connected { protocol } => {
                debug!("publisher: qmux established, protocol {}", protocol);
            }
            Event::Setup { hop, .. } => {
                info!("publisher: relay SETUP, hop {}", hop);
                self.shared.set_ready();
            }
            Event::Goaway { uri } => {
                info!("publisher: relay GOAWAY, uri '{}'", uri);
                self.goaway = true;
            }
            Event::Closed {
                code,
                reason,
                application,
                local,
            } => {
                info!(
                    "publisher: session closed, code {}, local {}, reason '{}'",
                    code, local, reason
                );
                self.ended = Some(if code == 0 && !local {
                    Ok(())
                } else {
                    Err(Error::Closed {
                        code,
                        application,
                        local,
                    })
                });
            }
            _ => trace!("publisher: session event"),
        }
    }
}

/// The state of one live connection.
struct Connection<'s, 'b, 'r, 'a, 'p> {
    socket: &'s mut TcpSocket<'b>,
    /// Received bytes not consumed by the session yet.
    rx: Inbox<&'s mut [u8]>,
    tx: &'s mut [u8],
    /// Records in `tx[tx_pos..tx_len]` wait for the socket.
    tx_pos: usize,
    tx_len: usize,
    shared: &'r Shared<'a, 'p>,
    origin: origin::Ref<'a, 'p>,
}

impl<'a, 'p> Connection<'_, '_, '_, 'a, 'p> {
    async fn serve<const N: usize>(&mut self, session: &mut Session<'_, 'a, 'p, N>) -> End {
        loop {
            let now = clock::now();
            session.run_timers(now);
            let mut ended = self.process_input(session, now);
            ended = ended.or(self.drain_events(session, now));
            if self.tx_pos == self.tx_len {
                self.tx_pos = 0;
                let mut out = Once::new(self.tx);
                session.transmit_to(now, &mut out);
                self.tx_len = out.written;
                ended = ended.or(self.drain_events(session, now));
            }
            self.publish_status(session);
            if let Some(result) = ended {
                return End::Session(result);
            }
            if session.is_closed() {
                return End::Session(Ok(()));
            }
            if self.rx.is_full() && !session.is_stalled() {
                // A record longer than the whole buffer: it can never be taken.
                error!(
                    "publisher: record over {} bytes from the relay",
                    self.rx.capacity()
                );
                session.close(SessionCode::Internal, "record too large");
                return End::Session(Err(Error::RecordTooLarge));
            }
            match self.wait(session).await {
                Wake::Read(Ok(0)) | Wake::Read(Err(_)) | Wake::Wrote(Err(_)) => {
                    debug!("publisher: tcp connection closed or reset");
                    return End::Socket;
                }
                Wake::Read(Ok(n)) => self.rx.commit(n),
                Wake::Wrote(Ok(n)) => self.tx_pos += n,
                Wake::Timer | Wake::Changed => {}
            }
        }
    }

    /// Feeds the buffered input to the session until it takes no more; `Some` if
    /// the session ended.
    fn process_input<const N: usize>(
        &mut self,
        session: &mut Session<'_, 'a, 'p, N>,
        now: skiff_core::time::Instant,
    ) -> Option<Result<(), Error>> {
        let mut ended = None;
        while let Ok(fed) = self.rx.feed(session, now) {
            // Events (and held control messages) must be polled for input to go on.
            ended = ended.or(self.drain_events(session, now));
            if !fed.progress() {
                break;
            }
        }
        ended
    }

    /// Logs the session's events and keeps the shared status; `Some` once it ended.
    fn drain_events<const N: usize>(
        &mut self,
        session: &mut Session<'_, 'a, 'p, N>,
        now: skiff_core::time::Instant,
    ) -> Option<Result<(), Error>> {
        let mut events = Events {
            shared: self.shared,
            ended: None,
            goaway: false,
        };
        session.deliver(now, &mut events);
        let mut ended = events.ended;
        if events.goaway && ended.is_none() {
            // docs/protocol.md §3.12: make no new requests; a publisher simply redials.
            session.close(SessionCode::NoError, "goaway");
            ended = Some(Err(Error::GoingAway));
        }
        ended
    }

    /// Publishes the subscriber count and ends the wait of every newly registered
    /// paced group (the session reports its window in the group itself).
    fn publish_status<const N: usize>(&self, session: &Session<'_, 'a, 'p, N>) {
        self.shared.set_subscribers(session.served_count());
        for slot in &self.shared.pace {
            if slot.track.get().is_some() && !slot.fresh.replace(true) {
                slot.wakers.wake();
            }
        }
    }

    /// Waits for socket readiness, the session's timer, a media change or a pacing
    /// registration.
    async fn wait<const N: usize>(&mut self, session: &Session<'_, 'a, 'p, N>) -> Wake {
        let deadline = session.poll_timeout();
        let origin = self.origin;
        let shared = self.shared;
        let seen = media_version(origin);
        let (mut reader, mut writer) = self.socket.split();
        let room = Some(self.rx.spare_mut()).filter(|r| !r.is_empty());
        let pending = self
            .tx
            .get(self.tx_pos..self.tx_len)
            .filter(|t| !t.is_empty());
        let mut read = pin!(room.map(|buf| reader.read(buf)));
        let mut write = pin!(pending.map(|buf| writer.write(buf)));
        let mut timer = pin!(deadline.map(|t| Timer::at(clock::to_embassy(t))));
        poll_fn(|cx| {
            if let Some(f) = read.as_mut().as_pin_mut()
                && let Poll::Ready(r) = f.poll(cx)
            {
                return Poll::Ready(Wake::Read(r));
            }
            if let Some(f) = write.as_mut().as_pin_mut()
                && let Poll::Ready(r) = f.poll(cx)
            {
                return Poll::Ready(Wake::Wrote(r));
            }
            if let Some(f) = timer.as_mut().as_pin_mut()
                && f.poll(cx).is_ready()
            {
                return Poll::Ready(Wake::Timer);
            }
            if poll_media(cx, origin, seen) {
                return Poll::Ready(Wake::Changed);
            }
            shared.runner_wakers.register(cx.waker());
            Poll::Pending
        })
        .await
    }
}

/// A digest of the versions of the origin, its broadcasts and their tracks: it
/// changes when anything the session serves changed (a wake hint, not an identity).
fn media_version(origin: origin::Ref<'_, '_>) -> u64 {
    let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(5);
    let mut h = mix(0xcbf2_9ce4_8422_2325, origin.version());
    for b in origin.iter() {
        h = mix(h, b.version());
        for t in b.tracks() {
            h = mix(h, t.version());
        }
    }
    h
}

/// True if the media changed since `seen`; otherwise registers the task with the
/// origin and every track it serves.
fn poll_media(cx: &mut Context<'_>, origin: origin::Ref<'_, '_>, seen: u64) -> bool {
    if media_version(origin) != seen {
        return true;
    }
    let _ = origin.poll_changed(cx, origin.version());
    for b in origin.iter() {
        for t in b.tracks() {
            let _ = t.poll_changed(cx, t.version());
        }
    }
    false
}

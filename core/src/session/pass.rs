//! One pass of a driver over a session: the part every driver repeats.
//!
//! A driver feeds the session what its transport received, then runs a
//! pass: the timers that are due ([`Session::run_timers`]), the events
//! drained into a [`Handler`] ([`Session::deliver`]), the handler's turn to
//! make requests ([`Handler::act`]); [`Session::pass`] does those three in
//! that order. It then writes what the session has to send into an [`Out`]
//! ([`Session::transmit_to`]) until the session writes nothing more or the
//! `Out` must be sent first, and forwards the changes the pass made
//! ([`Session::poll_changed`]) to whoever waits on them. A driver whose
//! order differs (the input fed between the timers and the events) calls
//! the pieces itself.
//!
//! Everything here is generic over the handler and the buffer: no
//! allocation, and no dynamic call besides the gather the session already
//! takes as `dyn`.

use super::{Event, Gather, Session};
use crate::time::Instant;
use crate::transport::Transport;

/// What a driver does with what a session brings up during a pass.
pub trait Handler<'s, 'a, 'p, const N: usize, T: Transport> {
    /// One event of the session (its text is borrowed for this call only).
    fn on_event(&mut self, now: Instant, event: &Event<'_>);

    /// Called after each event, before the next one is polled, with the
    /// session: what must change the session before it reads on (tables the
    /// peer's SETUP calls for). The default does nothing.
    fn after_event(&mut self, session: &mut Session<'s, 'a, 'p, N, T>) {
        let _ = session;
    }

    /// The handler's turn after the events: requests on the session. The
    /// default does nothing.
    fn act(&mut self, now: Instant, session: &mut Session<'s, 'a, 'p, N, T>) {
        let _ = (now, session);
    }
}

/// What [`Session::pass`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Passed {
    /// Due timers ran.
    pub timed_out: bool,
    /// Events handed to the handler.
    pub events: usize,
}

/// Where [`Session::transmit_to`] writes: a buffer of the driver's, with or
/// without payload ranges gathered beside it.
pub trait Out<'p> {
    /// Whether what was written must be sent before the session writes more
    /// (the room left is too small for another call); asked before each call.
    fn must_flush(&self) -> bool;

    /// Calls `write` once with the room the next call writes into and,
    /// for a buffer that gathers, where its payload ranges go (`None`: the
    /// payload is copied into the room); returns the room's length and what
    /// `write` returned (the bytes it wrote).
    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'p>>) -> usize;

    /// The call wrote `n` bytes (at least one) of the `room` it was offered;
    /// a call that wrote nothing is not committed. Returns whether
    /// another call may write more: a call that stopped with room to spare
    /// (and, gathering, with room for more ranges) had nothing more to send,
    /// and another would only walk the session's tables again.
    fn commit(&mut self, room: usize, n: usize) -> bool;
}

/// An [`Out`] of one call into a caller's buffer, payload copied: for a
/// driver that sends each call's bytes before it makes the next.
#[derive(Debug)]
pub struct Once<'o> {
    buf: &'o mut [u8],
    /// Bytes the call wrote at the front of the buffer.
    pub written: usize,
}

impl<'o> Once<'o> {
    /// One call's room: all of `buf`.
    pub fn new(buf: &'o mut [u8]) -> Self {
        Once { buf, written: 0 }
    }
}

impl<'p> Out<'p> for Once<'_> {
    fn must_flush(&self) -> bool {
        false
    }

    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'p>>) -> usize,
    {
        (self.buf.len(), write(&mut *self.buf, None))
    }

    fn commit(&mut self, _room: usize, n: usize) -> bool {
        self.written = n;
        false
    }
}

/// What [`Session::transmit_to`] came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transmitted {
    /// The session wrote something.
    pub wrote: bool,
    /// The `Out` must be sent before the session writes more
    /// ([`Out::must_flush`]): send it and call again.
    pub flush: bool,
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Runs the timers if [`poll_timeout`](Self::poll_timeout) is due at
    /// `now`; true if it was.
    pub fn run_timers(&mut self, now: Instant) -> bool {
        if self.poll_timeout().is_some_and(|t| t <= now) {
            self.handle_timeout(now);
            true
        } else {
            false
        }
    }

    /// Hands every pending event to `handler` ([`Handler::on_event`], then
    /// [`Handler::after_event`] before the next) and returns how many.
    pub fn deliver<H: Handler<'s, 'a, 'p, N, T>>(
        &mut self,
        now: Instant,
        handler: &mut H,
    ) -> usize {
        let mut n = 0;
        while let Some(event) = self.poll_event() {
            handler.on_event(now, &event);
            n += 1;
            handler.after_event(self);
        }
        n
    }

    /// One pass after the input: the due timers, the events to `handler`,
    /// then its [`act`](Handler::act).
    pub fn pass<H: Handler<'s, 'a, 'p, N, T>>(&mut self, now: Instant, handler: &mut H) -> Passed {
        let timed_out = self.run_timers(now);
        let events = self.deliver(now, handler);
        handler.act(now, self);
        Passed { timed_out, events }
    }

    /// Writes what the session has to send into `out`, call after call,
    /// until a call writes nothing or says there is nothing more
    /// ([`Out::commit`]), or `out` must be sent first ([`Out::must_flush`],
    /// reported as [`Transmitted::flush`]).
    pub fn transmit_to<O: Out<'p>>(&mut self, now: Instant, out: &mut O) -> Transmitted {
        let mut wrote = false;
        loop {
            if out.must_flush() {
                return Transmitted { wrote, flush: true };
            }
            let (len, n) = out.write(|room, gather| match gather {
                Some(gather) => self.poll_transmit_gather(now, room, gather),
                None => self.poll_transmit(now, room),
            });
            if n == 0 {
                return Transmitted {
                    wrote,
                    flush: false,
                };
            }
            wrote = true;
            if !out.commit(len, n) {
                return Transmitted {
                    wrote,
                    flush: false,
                };
            }
        }
    }
}

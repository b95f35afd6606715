//! The QMux connection as the session's [`Transport`]: every call goes to the
//! connection's method of the same name.

use super::{Closed, Connection, Event, OpenError, StreamError, WriteError, Written};
use crate::time::Instant;
use crate::transport::Transport;
use crate::wire::qmux::{Dir, StreamId};

impl<const N: usize> Transport for Connection<N> {
    const GATHER: bool = true;

    #[inline]
    fn is_established(&self) -> bool {
        Connection::is_established(self)
    }

    #[inline]
    fn is_closed(&self) -> bool {
        Connection::is_closed(self)
    }

    #[inline]
    fn is_drained(&self) -> bool {
        Connection::is_drained(self)
    }

    #[inline]
    fn open_stream(&mut self, dir: Dir) -> Result<StreamId, OpenError> {
        Connection::open_stream(self, dir)
    }

    #[inline]
    fn write_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
        out: &mut [u8],
    ) -> Result<Written, WriteError> {
        Connection::write_stream(self, now, id, data, fin, out)
    }

    #[inline]
    fn write_stream_header(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        out: &mut [u8],
    ) -> Result<Written, WriteError> {
        Connection::write_stream_header(self, now, id, len, fin, out)
    }

    #[inline]
    fn lends(&self) -> bool {
        cfg!(feature = "stream-refs") && self.config.stream_refs
    }

    #[inline]
    fn write_stream_ref<F: FnOnce(usize) -> Option<u64>>(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        out: &mut [u8],
        lend: F,
    ) -> Result<Option<Written>, WriteError> {
        Connection::write_stream_ref(self, now, id, len, fin, out, lend)
    }

    #[inline]
    fn send_credit(&self, id: StreamId) -> u64 {
        Connection::send_credit(self, id)
    }

    #[inline]
    fn recv_credit(&self, id: StreamId) -> u64 {
        Connection::recv_credit(self, id)
    }

    #[inline]
    fn release(&mut self, id: StreamId, n: u64) {
        Connection::release(self, id, n);
    }

    #[inline]
    fn reset_stream(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        Connection::reset_stream(self, id, code)
    }

    #[inline]
    fn stop_sending(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        Connection::stop_sending(self, id, code)
    }

    #[inline]
    fn close(&mut self, code: u64, reason: &str) {
        Connection::close(self, code, reason);
    }

    #[inline]
    fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        Connection::poll_transmit(self, now, out)
    }

    #[inline]
    fn whole_write_room(&self) -> usize {
        self.whole_record_room()
    }

    #[inline]
    fn poll_timeout(&self) -> Option<Instant> {
        Connection::poll_timeout(self)
    }

    #[inline]
    fn handle_timeout(&mut self, now: Instant) -> Option<Closed<'static>> {
        match Connection::handle_timeout(self, now) {
            Some(Event::Closed(c)) => Some(c),
            _ => None,
        }
    }
}

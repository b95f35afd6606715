//! Links between the workers of one relay: the socket pairs made before they
//! start ([`Mesh`]) and the session each pair runs.

use super::*;

impl RelayHandler {
    /// Runs the link session to worker `peer` over `end` (client side on the
    /// lower-numbered worker). The link lends and borrows blocks
    /// ([`crate::lend`]).
    pub(super) fn spawn_link(&self, info: &WorkerInfo, peer: usize, end: LinkEnd) {
        let name = ConnName::link(info.index, peer);
        let LinkEnd {
            socket,
            lends,
            borrows,
        } = end;
        let stream = match socket
            .set_nonblocking(true)
            .and_then(|()| monoio::net::UnixStream::from_std(socket))
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(conn = ?name, error = %e, "cannot open worker link");
                return;
            }
        };
        let side = if info.index < peer {
            Side::Client
        } else {
            Side::Server
        };
        let ctx = self.drive_ctx(info);
        let relay = self.relay.clone();
        // All links together lend at most half the pool (see `crate::lend`).
        let limit = lend_limit(self.relay.pool.capacity(), info.config.threads.get());
        let lender = Rc::new(Lender::new(lends, limit));
        relay.add_link(peer, lender.clone(), borrows.clone());
        let borrower = Borrower::new(borrows, relay.pool, peer);
        monoio::spawn(async move {
            let (reader, writer) = split_halves(stream, 64 * 1024);
            let mut storage = Box::new(TrunkStorage::new());
            let (config, origin) = relay.session_setup(Remote::Link);
            let session: Result<Box<TrunkSession<'_>>, _> =
                Session::new(side, config, ctx.clock.now(), &mut storage, Some(origin)).map(
                    |mut s| {
                        s.set_foreign(Some(&borrower));
                        Box::new(s)
                    },
                );
            let res = run_session::<_, _, TRUNK_STREAMS, TRUNK_UPSTREAM>(
                relay,
                session,
                None,
                reader,
                writer,
                side,
                &name,
                Remote::Link,
                Some(lender),
                None,
                None,
                &ctx,
            );
            match res.await {
                Ok(ended) => tracing::debug!(conn = ?name, ?ended, "worker link ended"),
                Err(e) => tracing::warn!(conn = ?name, error = %e, "worker link failed"),
            }
        });
    }
}

// ---------------------------------------------------------------------------
// Worker links
// ---------------------------------------------------------------------------

/// The socket pairs linking every two workers (made before they start).
///
/// Cross-thread routing: worker *i* and worker *j* run one moq-lite session
/// over a Unix socket pair, worker *min(i, j)* as the client. Each side asks
/// the other for its announcements; a worker offers on its links only the
/// broadcasts of its own clients (its local origin), so a broadcast is one
/// link away from every worker and nothing loops. A subscriber's request for
/// a broadcast learned over a link creates a relay track on its worker and
/// one subscription over the link, which the publisher's worker serves from
/// its own relay track. Payload crosses by reference ([`crate::lend`]): the
/// link carries small STREAM_REF records naming blocks of the publisher's
/// worker, which the subscriber's worker links into its groups without a
/// copy; its subscribers are served from the publisher worker's blocks.
#[derive(Debug)]
pub struct Mesh {
    ends: Mutex<HashMap<(usize, usize), LinkEnd>>,
}

/// One worker's end of the link to another: the socket, and the shares of
/// blocks lent each way ([`crate::lend`]).
#[derive(Debug)]
pub struct LinkEnd {
    /// The socket to the other worker.
    pub socket: StdUnixStream,
    /// What this worker lends to the other.
    pub lends: Arc<LinkShare>,
    /// What the other worker lends to this one.
    pub borrows: Arc<LinkShare>,
}

impl Mesh {
    /// Socket pairs for every two of `threads` workers.
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn new(threads: usize) -> io::Result<Self> {
        let mut ends = HashMap::new();
        for i in 0..threads {
            for j in i + 1..threads {
                let (a, b) = StdUnixStream::pair()?;
                let (i_to_j, j_to_i) = (LinkShare::new(), LinkShare::new());
                ends.insert(
                    (i, j),
                    LinkEnd {
                        socket: a,
                        lends: i_to_j.clone(),
                        borrows: j_to_i.clone(),
                    },
                );
                ends.insert(
                    (j, i),
                    LinkEnd {
                        socket: b,
                        lends: j_to_i,
                        borrows: i_to_j,
                    },
                );
            }
        }
        Ok(Mesh {
            ends: Mutex::new(ends),
        })
    }

    /// Worker `index`'s ends, with the peer each leads to.
    pub fn take(&self, index: usize) -> Vec<(usize, LinkEnd)> {
        let mut ends = match self.ends.lock() {
            Ok(e) => e,
            Err(p) => p.into_inner(),
        };
        let keys: Vec<_> = ends.keys().filter(|(i, _)| *i == index).copied().collect();
        keys.into_iter()
            .filter_map(|k| ends.remove(&k).map(|s| (k.1, s)))
            .collect()
    }
}

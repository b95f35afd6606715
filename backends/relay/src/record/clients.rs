//! The SDK clients the relay dials its own listen port with (the recorder's
//! subscribers, the replay publisher): a pool that shares each client among
//! up to a fixed number of users and dials another when all are full.

use std::cell::Cell;
use std::rc::Rc;

use skiff_monoio::{Client, Config};

/// Clients of the relay's own port, each shared by up to `per_client` users.
pub struct Clients {
    /// Whom the clients are for, in log lines ("recorder", "replay").
    what: &'static str,
    /// The relay's own URL, its query holding the relay's token.
    url: String,
    config: Config,
    per_client: usize,
    /// Each client with the number of users it has.
    list: Vec<(Client, Rc<Cell<usize>>)>,
}

/// One user's share of a client, given back when dropped.
pub struct Lease(Rc<Cell<usize>>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl Clients {
    /// An empty pool dialing `url` with `config`, `per_client` users per client.
    pub fn new(what: &'static str, url: String, config: Config, per_client: usize) -> Self {
        Clients {
            what,
            url,
            config,
            per_client: per_client.max(1),
            list: Vec::new(),
        }
    }

    /// A client with room for one more user, dialing a new one if every
    /// client is full; `None` (logged) if none can be made.
    pub fn lease(&mut self) -> Option<(Client, Lease)> {
        let slot = match self.list.iter().find(|(_, n)| n.get() < self.per_client) {
            Some((client, n)) => (client.clone(), n.clone()),
            None => match skiff_monoio::connect(&self.url, self.config.clone()) {
                Ok((client, runner)) => {
                    monoio::spawn(runner.run());
                    let n = Rc::new(Cell::new(0));
                    self.list.push((client.clone(), n.clone()));
                    (client, n)
                }
                Err(e) => {
                    // The URL's query holds the relay's own token: never logged.
                    let url = self.url.split('?').next().unwrap_or_default();
                    tracing::error!(url, error = %e, "{}: cannot make a client", self.what);
                    return None;
                }
            },
        };
        slot.1.set(slot.1.get() + 1);
        Some((slot.0, Lease(slot.1)))
    }
    /// Closes every client.
    pub async fn close(&self) {
        for (client, _) in &self.list {
            client.close().await;
        }
    }
}

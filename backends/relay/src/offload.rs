//! Blocking work (file reads) run on a thread of its own while the worker
//! that asked serves its other connections.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the waiting worker task looks whether the thread is done.
const POLL: Duration = Duration::from_millis(1);

/// Runs `work` on a new thread named `name` and waits for its result
/// without blocking the worker; `None` if the thread cannot start.
pub async fn on_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let done: Arc<Mutex<Option<T>>> = Arc::default();
    let out = done.clone();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let result = work();
            if let Ok(mut slot) = out.lock() {
                *slot = Some(result);
            }
        })
        .ok()?;
    loop {
        if let Some(result) = done.lock().ok().and_then(|mut d| d.take()) {
            return Some(result);
        }
        monoio::time::sleep(POLL).await;
    }
}

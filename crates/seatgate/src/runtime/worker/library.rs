//! Whether the function library the worker calls is its own: someone with
//! `FUNCTION LOAD REPLACE` could put other code under this build's library
//! name, and every FCALL would run it. The worker checks the code Redis
//! holds against its own at start and every [`EVERY`]; while it differs the
//! worker reads no request (they wait, pending or unread, and are served
//! once the library is this build's again), is not ready, logs it and sets
//! `seatgate_library_foreign`. A missing library is loaded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::runtime::metrics;
use seatgate_core::db::Db;
use seatgate_core::scripts::{LibraryState, Scripts};

/// How often the library is checked while the worker runs.
pub(super) const EVERY: Duration = Duration::from_secs(10);

/// The verdict of the last check, shared by the read loops.
#[derive(Debug, Default)]
pub(super) struct LibraryWatch {
    /// The library under this build's name holds other code.
    foreign: AtomicBool,
}

impl LibraryWatch {
    /// Whether the last check found another library's code.
    pub(super) fn is_foreign(&self) -> bool {
        self.foreign.load(Ordering::Relaxed)
    }

    /// Checks the library once: loads it when missing, and records (logging
    /// a change) whether it is foreign. A failed check changes nothing: Redis
    /// failing is the read loops' to report.
    pub(super) async fn check(&self, con: &mut Db) {
        let scripts = Scripts::get();
        let state = match scripts.library_state(con).await {
            Ok(LibraryState::Missing) => match scripts.load_all(con).await {
                Ok(()) => LibraryState::Ours,
                Err(e) => {
                    warn!(error = %e, "cannot load the function library");
                    return;
                }
            },
            Ok(state) => state,
            Err(e) => {
                tracing::debug!(error = %e, "cannot check the function library");
                return;
            }
        };
        let foreign = state == LibraryState::Foreign;
        let was = self.foreign.swap(foreign, Ordering::Relaxed);
        metrics::library_foreign(foreign);
        match (was, foreign) {
            (false, true) => error!(
                library = scripts.library_name(),
                "the function library on Redis under this build's name holds other code (FUNCTION LOAD REPLACE by someone): serving nothing until it is this build's again; remove it (FUNCTION DELETE) and a worker loads its own"
            ),
            (true, false) => info!(library = scripts.library_name(), "the function library is this build's again; serving"),
            _ => {}
        }
    }

    /// Checks every [`EVERY`] until `shutdown`.
    pub(super) async fn watch(&self, mut con: Db, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            self.check(&mut con).await;
        }
    }
}

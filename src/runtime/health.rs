//! Readiness: whether this process can serve requests now. The worker sets
//! it (Redis reachable and accepting writes); `/ready` reports it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Shared readiness flag: the worker sets it while it can read its stream.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

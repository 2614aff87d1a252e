//! seatgate-history, the history checker: a seeded run of real processes — a
//! redis-server with an fsynced AOF (or a Redis Cluster of 3 masters with a
//! replica each, [`Options::cluster`]), several `seatgate run` workers and
//! concurrent wire-level clients — under a seeded fault schedule, every
//! request, reply, event and sample recorded, then checked against a model
//! of the seat rules. Jepsen's way: a test of one feature at a time cannot
//! see a break between two.
//!
//! - `run`: starts the processes, the clients, the admin, the sampler and
//!   the faults; quiesces; collects the events and the final state
//! - `faults`: the processes, the seeded fault schedule, how each fault is
//!   injected and healed
//! - `record`: what a run records (the history), nothing else
//! - `check`: the model's checks over a history, each anomaly with evidence
//!
//! `seatgate`'s binary is a parameter ([`Options::binary`]): the test suite
//! passes `CARGO_BIN_EXE_seatgate`, `ops/history.sh` and `ops/mutate.sh` a
//! built one.

mod check;
mod error;
mod faults;
mod record;
mod run;

pub use check::{check, totals, Anomaly, Checked, Totals};
pub use error::Error;
pub use faults::FaultKind;
pub use record::History;
pub use run::run;

use std::path::PathBuf;
use std::time::Duration;

/// What a run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// Everything random (ops, faults, timings) follows from it.
    pub seed: u64,
    /// How long clients send requests (then the run quiesces and is checked).
    pub duration: Duration,
    /// `seatgate run` processes.
    pub workers: usize,
    /// Concurrent clients, each one session at a time.
    pub clients: usize,
    /// Inject faults (off: a baseline run of the same ops).
    pub faults: bool,
    /// Run on a Redis Cluster of 3 masters with a replica each (sharded
    /// streams, the events relayed), its Redis faults a master failover
    /// among them, rather than on one redis-server.
    pub cluster: bool,
    /// On a cluster, kill -9 masters too (`cluster_master_kill9`): an
    /// unplanned failover, which can lose writes the master acknowledged
    /// last (Redis Cluster replicates asynchronously). Off by default: such
    /// a loss is Redis's documented one, and the summary then prints the
    /// anomalies apart, as possibly that (docs/testing.md).
    pub master_kill9: bool,
    /// The `seatgate` binary the workers and the admin run.
    pub binary: PathBuf,
}

impl Options {
    /// A short run for the test suite: `seed`, `secs` of ops, 3 workers, 8 clients.
    pub fn short(binary: impl Into<PathBuf>, seed: u64, secs: u64) -> Options {
        Options {
            seed,
            duration: Duration::from_secs(secs),
            workers: 3,
            clients: 8,
            faults: true,
            cluster: false,
            master_kill9: false,
            binary: binary.into(),
        }
    }
}

/// SplitMix64: small, seedable, good enough to pick ops and fault times.
/// (No `rand` dependency for a test tool.)
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo)
        }
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// One of `items` (which must not be empty).
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64) as usize]
    }

    /// A lease: 32 hex digits.
    pub(crate) fn lease(&mut self) -> String {
        format!("{:016x}{:016x}", self.next(), self.next())
    }

    /// A child generator for stream `i` (a client, the admin, the faults).
    pub(crate) fn fork(&self, i: u64) -> Rng {
        let mut r = Rng::new(self.0 ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next();
        r
    }
}

//! The relay: on a Redis Cluster, moves each license's events from its own
//! log to its events shard, exactly once.
//!
//! A seat script records its events in the same atomic step as the change
//! (lua/includes/events.lua). On one node it appends them to the shard
//! itself; on a cluster the shard lies in another slot than the license, so
//! the script appends to the license's own log (`<prefix>:{L}:events`) and
//! this relay moves them on: it reads the log, has lua/relay.lua append on
//! the shard's slot the entries whose `seq` lies above the shard's cursor
//! for the license (so an entry relayed twice, by a relay that died before
//! deleting it or by two relays at once, is appended once), and deletes
//! from the log what the cursor now covers.
//!
//! Who relays: the worker, the licenses of its batch before it writes the
//! replies (so a request's event is on the shard no later than its reply;
//! a redelivered request relays what a worker that died left); the reaper,
//! each license it reaps and deletes; and the reaper's sweep files a
//! license whose log holds entries in the due index (runtime::due), so what
//! nobody relayed is relayed within a pass or two of being found.

use redis::Value;
use tracing::warn;

use crate::error::Error;
use crate::runtime::metrics;
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;
use seatgate_core::scripts::Scripts;

/// Log entries read and relayed per script call.
const PAGE: usize = 100;

/// Moves licenses' events from their logs to their shards.
#[derive(Debug, Clone)]
pub struct Relay {
    /// Key names, with where each license's events go.
    keys: Keys,
}

impl Relay {
    /// The relay of a deployment whose scripts record into the licenses' own
    /// logs (a cluster); `None` where they append to the shards themselves.
    pub fn new(keys: &Keys) -> Option<Relay> {
        keys.events_relayed().then(|| Relay { keys: keys.clone() })
    }

    /// Relays every entry of `license`'s log. Returns how many it moved.
    pub async fn license(&self, con: &mut Db, license: &str) -> Result<usize, Error> {
        let events = self.keys.event_keys(license);
        let keep_ms = self.keys.events_keep_ms();
        let mut moved = 0;
        loop {
            let page: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                .arg(&events.log)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(con)
                .await?;
            if page.is_empty() {
                return Ok(moved);
            }
            let entries: Vec<(i64, &[Vec<u8>])> = page
                .iter()
                .map(|(_, fields)| (seq_of(fields), fields.as_slice()))
                .collect();
            let cursor = Scripts::get().relay(con, &events, keep_ms, &entries).await?;
            // On the shard now (or not an event: no seq); out of the log.
            let done: Vec<&str> = page
                .iter()
                .zip(&entries)
                .filter(|(_, (seq, _))| *seq <= cursor)
                .map(|((id, _), _)| id.as_str())
                .collect();
            if done.is_empty() {
                return Ok(moved);
            }
            let _: Value = redis::cmd("XDEL")
                .arg(&events.log)
                .arg(&done)
                .query_async(con)
                .await?;
            moved += done.len();
            if page.len() < PAGE || done.len() < page.len() {
                return Ok(moved);
            }
        }
    }

    /// Relays the logs of `licenses`, concurrently. A license whose relay
    /// failed is counted (`seatgate_event_errors_total`), logged, and
    /// returned: its entries stay in its log for the next relay.
    pub async fn licenses<'l>(&self, con: &Db, licenses: impl IntoIterator<Item = &'l str>) -> Vec<&'l str> {
        let runs = licenses.into_iter().map(|license| {
            let mut con = con.clone();
            async move { (license, self.license(&mut con, license).await) }
        });
        let mut failed = Vec::new();
        for (license, result) in futures_util::future::join_all(runs).await {
            if let Err(e) = result {
                metrics::event_error();
                warn!(%license, error = %e, "cannot relay a license's events to its shard; the reaper relays them");
                failed.push(license);
            }
        }
        failed
    }
}

/// The `seq` of a log entry's fields (field, value, field, value, ...); 0
/// for an entry without one (not an event: dropped from the log).
fn seq_of(fields: &[Vec<u8>]) -> i64 {
    fields
        .chunks(2)
        .find(|pair| pair[0] == b"seq")
        .and_then(|pair| pair.get(1))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_known_by_its_seq() {
        let fields = |pairs: &[&str]| pairs.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(seq_of(&fields(&["type", "acquired", "seq", "42"])), 42);
        assert_eq!(seq_of(&fields(&["type", "acquired"])), 0);
        assert_eq!(seq_of(&fields(&["seq", "x"])), 0);
        assert_eq!(seq_of(&fields(&["seq"])), 0);
    }
}

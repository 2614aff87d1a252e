//! Changing a license record as `seatgate license put` is told: the
//! record read, merged and checked by engine::license's rules
//! ([`LicenseChange::apply`]), then written by lua/put_license.lua only if
//! nobody changed it in between. Its own module because it needs both the
//! record's rules and the script registry, which itself decodes the
//! record's refusals (engine::license).

use std::collections::HashMap;

use redis::aio::ConnectionLike;

use crate::engine::keys::Keys;
use crate::engine::license::{check_id, Changed, Field, LicenseChange};
use crate::engine::scripts::Scripts;
use crate::error::Error;

/// Changes `license`'s record as `change` says, atomically with its
/// validation: the record is read, merged and checked here (the rules'
/// one Rust home), then written by lua/put_license.lua only if nobody
/// changed it since it was read; otherwise read again and decided anew.
/// Refuses a change whose result breaks the rules (a field, or the policies'
/// fit), writing nothing. Indexes the license.
pub async fn change<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    change: &LicenseChange,
) -> Result<Changed, Error> {
    check_id(license)?;
    let k = keys.license(license);
    // Each retry means another writer got in between: a handful settles
    // any real contention, and the error says what happened otherwise.
    const ATTEMPTS: usize = 20;
    for _ in 0..ATTEMPTS {
        let before: HashMap<String, String> = redis::cmd("HGETALL").arg(&k.license).query_async(con).await?;
        let after = change.apply(license, &before)?;
        let mut set: Vec<(&String, &String)> =
            after.iter().filter(|(f, v)| before.get(*f) != Some(*v)).collect();
        set.sort();
        let mut remove: Vec<&String> = before.keys().filter(|f| !after.contains_key(*f)).collect();
        remove.sort();
        let existed = before.contains_key(Field::SeatsTotal.as_str());
        if !set.is_empty() || !remove.is_empty() {
            let read: Vec<(&String, &String)> = before.iter().collect();
            let wrote = Scripts::get()
                .put_license(con, &k.license, &read, &set, &remove)
                .await?;
            if !wrote {
                continue;
            }
        }
        // The index lives in its own slot: a separate command (a cluster
        // refuses a script across slots).
        let _: i64 = redis::cmd("SADD")
            .arg(keys.license_index())
            .arg(license)
            .query_async(con)
            .await?;
        return Ok(Changed {
            existed,
            record: after,
        });
    }
    Err(Error::InvalidLicense(format!(
        "license {license}: the record kept changing under {ATTEMPTS} attempts to write it; try again"
    )))
}

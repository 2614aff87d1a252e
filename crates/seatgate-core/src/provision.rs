//! Changing a license record as `seatgate license put` is told: the
//! record read, merged and checked by engine::license's rules
//! ([`LicenseChange::apply`]), then written by lua/put_license.lua only if
//! nobody changed it in between. Its own module because it needs both the
//! record's rules and the script registry, which itself decodes the
//! record's refusals (engine::license).

use std::collections::{BTreeMap, HashMap};

use redis::aio::ConnectionLike;

use crate::error::Error;
use crate::keys::Keys;
use crate::license::{check_id, Changed, Field, LicenseChange};
use crate::scripts::Scripts;

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

/// `license`'s group map, user -> group (`seat:{L}:groups`, docs/protocol.md
/// "Policies"): while it exists, acquire takes a request's group from its
/// user there and refuses a claim that disagrees (lua/acquire.lua).
pub async fn groups<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
) -> Result<BTreeMap<String, String>, Error> {
    check_id(license)?;
    Ok(redis::cmd("HGETALL")
        .arg(&keys.license(license).groups)
        .query_async(con)
        .await?)
}

/// Puts `user` in `group` in `license`'s group map (creating the map: from
/// then on, users not in it get no group). Both must be ids like a
/// session's, an application's named `<app>/<id>`; the license itself
/// need not exist yet.
pub async fn set_group<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    user: &str,
    group: &str,
) -> Result<(), Error> {
    check_id(license)?;
    // An application's user or group as the scripts key it: `<app>/<id>`
    // (crate::tenancy).
    for (what, id) in [("user", user), ("group", group)] {
        if !crate::tenancy::valid_stored_id(id) {
            return Err(Error::InvalidId {
                what,
                value: id.to_owned(),
            });
        }
    }
    let () = redis::cmd("HSET")
        .arg(&keys.license(license).groups)
        .arg(user)
        .arg(group)
        .query_async(con)
        .await?;
    Ok(())
}

/// Takes `user` out of `license`'s group map; whether it was there. The
/// last user out removes the map, and with it the map's rule.
pub async fn unset_group<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    user: &str,
) -> Result<bool, Error> {
    check_id(license)?;
    let removed: i64 = redis::cmd("HDEL")
        .arg(&keys.license(license).groups)
        .arg(user)
        .query_async(con)
        .await?;
    Ok(removed > 0)
}

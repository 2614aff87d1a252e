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
use crate::scripts::{PutLicense, Scripts};

/// Changes `license`'s record as `change` says, atomically with its
/// validation: the record is read, merged and checked here (the rules'
/// one Rust home), then written by lua/put_license.lua only if nobody
/// changed it since it was read; otherwise read again and decided anew.
/// Refuses a change whose result breaks the rules (a field, or the policies'
/// fit), writing nothing. A change is written with its `license_put` event
/// by `actor` (the fields changed, before and after: the admin trail), in
/// the same script; a change that changes nothing writes no event. Indexes
/// the license.
pub async fn change<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    change: &LicenseChange,
    actor: &str,
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
            let (was, now) = before_after(&before, &after);
            let put = PutLicense {
                actor,
                before: was,
                after: now,
                read: &read,
                set: &set,
                remove: &remove,
            };
            let wrote = Scripts::get().put_license(con, &k, &put).await?;
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

/// The `before` and `after` of a change of record `before` into `after`:
/// the fields it changed (set, changed or removed), as they were and as they
/// are, each a JSON object of strings (a field absent on one side was not
/// there).
fn before_after(before: &HashMap<String, String>, after: &HashMap<String, String>) -> (String, String) {
    let mut was = BTreeMap::new();
    let mut now = BTreeMap::new();
    for (field, value) in after {
        if before.get(field) != Some(value) {
            now.insert(field, value);
            if let Some(old) = before.get(field) {
                was.insert(field, old);
            }
        }
    }
    for (field, value) in before {
        if !after.contains_key(field) {
            was.insert(field, value);
        }
    }
    let json = |m: &BTreeMap<&String, &String>| serde_json::to_string(m).unwrap_or_else(|_| "{}".to_owned());
    (json(&was), json(&now))
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
/// need not exist yet. Written with its `groups_changed` event by `actor`
/// (lua/group_map.lua) when it changes the map. Returns the user's group before.
pub async fn set_group<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    user: &str,
    group: &str,
    actor: &str,
) -> Result<Option<String>, Error> {
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
    Ok(Scripts::get()
        .group_map(con, &keys.license(license), actor, user, Some(group))
        .await?)
}

/// Takes `user` out of `license`'s group map; whether it was there. The
/// last user out removes the map, and with it the map's rule. Written with
/// its `groups_changed` event by `actor` when the user was there.
pub async fn unset_group<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    user: &str,
    actor: &str,
) -> Result<bool, Error> {
    check_id(license)?;
    let was = Scripts::get()
        .group_map(con, &keys.license(license), actor, user, None)
        .await?;
    Ok(was.is_some())
}

//! License records, the provisioning contract: HASH `seat:{<license>}:license`
//! with `seats_total`, `expires_at_ms` (0 = never), `active` (1/0) and optional
//! `heartbeat_timeout_ms`, and the policy fields (engine::policy), plus the
//! license index SET. Billing systems may write the same hash directly; this
//! module is what `seatgate license` does.

use redis::aio::ConnectionLike;
use serde::Serialize;

use crate::engine::keys::Keys;
use crate::engine::policy::LicensePolicy;
use crate::engine::protocol::valid_id;
use crate::error::Error;

/// A license's settings, as provisioned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LicenseSpec {
    /// Seats that may be held at once.
    pub seats_total: u64,
    /// Unix ms after which acquires are refused; 0 = never.
    pub expires_at_ms: u64,
    /// Whether acquires are allowed at all.
    pub active: bool,
    /// Per-license heartbeat timeout, ms; `None` = the configured default.
    pub heartbeat_timeout_ms: Option<u64>,
}

/// A license and its current use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LicenseInfo {
    /// License id.
    pub license: String,
    /// Provisioned settings.
    #[serde(flatten)]
    pub spec: LicenseSpec,
    /// Seats held now.
    pub seats_used: u64,
    /// Its policies, as the scripts apply them (none while the record's
    /// `policy` flag is off).
    pub policy: LicensePolicy,
    /// The record has policy fields, but its `policy` flag is off: the
    /// scripts ignore them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub policy_ignored: bool,
}

fn check_id(license: &str) -> Result<(), Error> {
    if valid_id(license) {
        Ok(())
    } else {
        Err(Error::InvalidId {
            what: "license",
            value: license.to_owned(),
        })
    }
}

/// Creates or replaces a license record and indexes it.
pub async fn put<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    spec: &LicenseSpec,
) -> Result<(), Error> {
    check_id(license)?;
    let k = keys.license(license);
    let mut pipe = redis::pipe();
    pipe.cmd("HSET")
        .arg(&k.license)
        .arg("seats_total")
        .arg(spec.seats_total)
        .arg("expires_at_ms")
        .arg(spec.expires_at_ms)
        .arg("active")
        .arg(if spec.active { 1 } else { 0 })
        .ignore();
    match spec.heartbeat_timeout_ms {
        Some(ms) => pipe
            .cmd("HSET")
            .arg(&k.license)
            .arg("heartbeat_timeout_ms")
            .arg(ms)
            .ignore(),
        None => pipe
            .cmd("HDEL")
            .arg(&k.license)
            .arg("heartbeat_timeout_ms")
            .ignore(),
    };
    pipe.query_async::<()>(con).await?;
    // The index lives in its own slot: a separate command (a cluster refuses
    // a pipeline across slots), never inside a script.
    let _: i64 = redis::cmd("SADD")
        .arg(keys.license_index())
        .arg(license)
        .query_async(con)
        .await?;
    Ok(())
}

/// Provisions `license`'s policies: writes the fields of `policy` with the
/// `policy` flag and removes every policy field it does not set, in one
/// transaction (an empty policy removes them all, the flag too). Refuses a
/// policy that does not fit the record's `seats_total`
/// ([`LicensePolicy::validate`]).
pub async fn put_policy<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    policy: &LicensePolicy,
) -> Result<(), Error> {
    check_id(license)?;
    let k = keys.license(license);
    let record: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(&k.license).query_async(con).await?;
    let seats_total = record
        .get("seats_total")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    policy
        .validate(seats_total)
        .map_err(|e| Error::Usage(format!("license {license} policy: {e}")))?;
    let fields = policy.fields();
    let stale: Vec<&String> = record
        .keys()
        .filter(|f| LicensePolicy::is_policy_field(f) && !fields.iter().any(|(name, _)| name == *f))
        .collect();
    let mut pipe = redis::pipe();
    pipe.atomic();
    if !stale.is_empty() {
        pipe.cmd("HDEL").arg(&k.license).arg(stale).ignore();
    }
    if !fields.is_empty() {
        pipe.cmd("HSET").arg(&k.license).arg(fields).ignore();
    }
    pipe.query_async::<()>(con).await?;
    Ok(())
}

/// Reads one license; `None` when it does not exist.
pub async fn show<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
) -> Result<Option<LicenseInfo>, Error> {
    check_id(license)?;
    let k = keys.license(license);
    type Read = (Vec<Option<String>>, u64, std::collections::HashMap<String, String>);
    let (fields, used, record): Read = redis::pipe()
        .cmd("HMGET")
        .arg(&k.license)
        .arg(&["seats_total", "expires_at_ms", "active", "heartbeat_timeout_ms"])
        .cmd("ZCARD")
        .arg(&k.holders)
        .cmd("HGETALL")
        .arg(&k.license)
        .query_async(con)
        .await?;
    let (policy, policy_ignored) = LicensePolicy::from_record(&record);
    let num = |i: usize| {
        fields
            .get(i)
            .cloned()
            .flatten()
            .and_then(|s| s.parse::<u64>().ok())
    };
    let Some(seats_total) = num(0) else {
        return Ok(None);
    };
    Ok(Some(LicenseInfo {
        license: license.to_owned(),
        spec: LicenseSpec {
            seats_total,
            expires_at_ms: num(1).unwrap_or(0),
            active: fields.get(2).cloned().flatten().as_deref() != Some("0"),
            heartbeat_timeout_ms: num(3),
        },
        seats_used: used,
        policy,
        policy_ignored,
    }))
}

/// Every indexed license, sorted by id.
pub async fn list<C: ConnectionLike>(con: &mut C, keys: &Keys) -> Result<Vec<LicenseInfo>, Error> {
    let mut ids: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys.license_index())
        .query_async(con)
        .await?;
    ids.sort();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids.iter().filter(|id| valid_id(id)) {
        if let Some(info) = show(con, keys, id).await? {
            out.push(info);
        }
    }
    Ok(out)
}

/// Deletes a license with its holders and sessions. Returns whether it existed.
pub async fn delete<C: ConnectionLike>(con: &mut C, keys: &Keys, license: &str) -> Result<bool, Error> {
    check_id(license)?;
    let k = keys.license(license);
    // One DEL: every key of the license shares its hash tag, so this is one slot.
    let deleted: i64 = redis::cmd("DEL").arg(&k.all()[..]).query_async(con).await?;
    let _: i64 = redis::cmd("SREM")
        .arg(keys.license_index())
        .arg(license)
        .query_async(con)
        .await?;
    Ok(deleted > 0)
}

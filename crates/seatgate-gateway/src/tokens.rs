//! Gateway tokens: bearer credentials an administrator issues
//! (`seatgate token issue --app cad --user ada`), each naming the
//! application, user and group its caller is. A token is printed once and
//! never stored: Redis keeps its SHA-256 with what it names, so reading Redis
//! gives nobody a usable token.
//!
//! Keys, all in one hash slot (`{tokens}`) so that an issue or a revoke is
//! one transaction on a cluster too:
//!
//! - `<prefix>:{tokens}:<sha256 hex>` HASH: `id`, `app`, `user`, `group`,
//!   `expires_at_ms` (0 = never; the key also expires then), `issued_by`,
//!   `issued_at_ms`, `note`;
//! - `<prefix>:{tokens}:index` HASH: token id -> its SHA-256 hex, for
//!   `token list` and `token revoke <id>`;
//! - `<prefix>:{tokens}:trail` STREAM: the tokens' admin trail, an entry
//!   per issue and revoke, written in the same transaction as the change
//!   (so none lands without it; in the tokens' slot, as a cluster needs):
//!   `type` (`token_issued`, `token_revoked`), `token` (its id), `actor`,
//!   `at_ms`, and `before` and `after`, JSON objects of what the token
//!   names (`{}` on the side where there was no token). A token belongs to
//!   no license, so its events are not on a license's events shard.
//!
//! A token's id is the first 16 hex digits of its SHA-256: safe to print and
//! log, useless to authenticate with.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use redis::aio::ConnectionLike;
use ring::rand::{SecureRandom, SystemRandom};
use seatgate_core::protocol::valid_id;

use crate::error::GatewayError;

/// What every token starts with, so that a leaked one is recognisable (secret scanners).
pub const TOKEN_PREFIX: &str = "sgt_";

/// Most tokens one gateway remembers between lookups.
const CACHE_MAX: usize = 100_000;

/// What a token says of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// The token's id (not secret).
    pub id: String,
    /// The application its caller belongs to.
    pub app: String,
    /// The user; `None`: the caller names no user (a service, say).
    pub user: Option<String>,
    /// The group; `None`: none (the license's group map may still give one).
    pub group: Option<String>,
    /// When it stops working, Unix ms; 0 = never.
    pub expires_at_ms: u64,
    /// Who issued it.
    pub issued_by: String,
    /// When, Unix ms.
    pub issued_at_ms: u64,
    /// The administrator's note.
    pub note: String,
}

/// What `token issue` is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    /// The application (one of `stream.applications` when that is set).
    pub app: String,
    /// The user, if the token names one.
    pub user: Option<String>,
    /// The group, if the token names one.
    pub group: Option<String>,
    /// How long it works; `None` = until revoked.
    pub expires_in: Option<Duration>,
    /// Who issues it (the OS user of `seatgate token issue`, or `--actor`).
    pub issued_by: String,
    /// A note for `token list`.
    pub note: String,
}

/// The tokens of one deployment (its key prefix).
#[derive(Debug, Clone)]
pub struct TokenStore {
    prefix: String,
}

/// Unix ms now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The SHA-256 of `token`, in hex.
pub fn token_hash(token: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` random bytes from the system's generator.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], GatewayError> {
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| GatewayError::Internal("the system's random number generator failed".into()))?;
    Ok(bytes)
}

impl TokenStore {
    /// The tokens under key prefix `prefix` (`keys.prefix`, `seat`).
    pub fn new(prefix: &str) -> TokenStore {
        TokenStore {
            prefix: prefix.to_owned(),
        }
    }

    fn key(&self, hash: &str) -> String {
        format!("{}:{{tokens}}:{hash}", self.prefix)
    }

    fn index(&self) -> String {
        format!("{}:{{tokens}}:index", self.prefix)
    }

    /// STREAM: the tokens' admin trail (module docs).
    pub fn trail_key(&self) -> String {
        format!("{}:{{tokens}}:trail", self.prefix)
    }

    /// The trail's entry for a change of token `id` by `actor`, into `pipe`
    /// (the change's transaction).
    fn record_trail(
        &self,
        pipe: &mut redis::Pipeline,
        kind: &str,
        id: &str,
        actor: &str,
        before: &str,
        after: &str,
    ) {
        pipe.cmd("XADD")
            .arg(self.trail_key())
            .arg("*")
            .arg("type")
            .arg(kind)
            .arg("token")
            .arg(id)
            .arg("actor")
            .arg(actor)
            .arg("at_ms")
            .arg(now_ms())
            .arg("before")
            .arg(before)
            .arg("after")
            .arg(after)
            .ignore();
    }

    /// The tokens' admin trail, oldest first: each entry's fields.
    pub async fn trail<C: ConnectionLike>(
        &self,
        con: &mut C,
    ) -> Result<Vec<HashMap<String, String>>, GatewayError> {
        let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(self.trail_key())
            .arg("-")
            .arg("+")
            .query_async(con)
            .await?;
        Ok(entries.into_iter().map(|(_, fields)| fields).collect())
    }

    /// Issues a token: stores its hash with `new`, and returns the token
    /// (shown once) with its record.
    pub async fn issue<C: ConnectionLike>(
        &self,
        con: &mut C,
        new: &NewToken,
    ) -> Result<(String, TokenRecord), GatewayError> {
        for (what, value) in [
            ("--app", Some(&new.app)),
            ("--user", new.user.as_ref()),
            ("--group", new.group.as_ref()),
        ] {
            if let Some(v) = value {
                if !valid_id(v) {
                    return Err(GatewayError::Usage(format!(
                        "{what} {v:?} must be 1 to 128 characters of A-Z a-z 0-9 . _ - : @"
                    )));
                }
            }
        }
        let secret = random_bytes::<32>()?;
        let token = format!(
            "{TOKEN_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        );
        let hash = token_hash(&token);
        let now = now_ms();
        let expires_at_ms = new
            .expires_in
            .map(|d| now.saturating_add(d.as_millis() as u64))
            .unwrap_or(0);
        let record = TokenRecord {
            id: hash[..16].to_owned(),
            app: new.app.clone(),
            user: new.user.clone(),
            group: new.group.clone(),
            expires_at_ms,
            issued_by: new.issued_by.clone(),
            issued_at_ms: now,
            note: new.note.clone(),
        };
        let key = self.key(&hash);
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        for (field, value) in [
            ("id", record.id.clone()),
            ("app", record.app.clone()),
            ("user", record.user.clone().unwrap_or_default()),
            ("group", record.group.clone().unwrap_or_default()),
            ("expires_at_ms", expires_at_ms.to_string()),
            ("issued_by", record.issued_by.clone()),
            ("issued_at_ms", now.to_string()),
            ("note", record.note.clone()),
        ] {
            hset.arg(field).arg(value);
        }
        let mut pipe = redis::pipe();
        pipe.atomic()
            .add_command(hset)
            .ignore()
            .hset(self.index(), &record.id, &hash)
            .ignore();
        if expires_at_ms > 0 {
            pipe.cmd("PEXPIREAT").arg(&key).arg(expires_at_ms).ignore();
        }
        self.record_trail(
            &mut pipe,
            "token_issued",
            &record.id,
            &record.issued_by,
            "{}",
            &names(&record),
        );
        pipe.query_async::<()>(con).await?;
        Ok((token, record))
    }

    /// The record of the token whose SHA-256 is `hash`, if it is issued
    /// (expired or not: [`TokenRecord::expired`] tells).
    pub async fn lookup<C: ConnectionLike>(
        &self,
        con: &mut C,
        hash: &str,
    ) -> Result<Option<TokenRecord>, GatewayError> {
        let map: HashMap<String, String> = redis::cmd("HGETALL").arg(self.key(hash)).query_async(con).await?;
        Ok(record_of(&map))
    }

    /// Every issued token, by id (expired ones included until their key expires).
    pub async fn list<C: ConnectionLike>(&self, con: &mut C) -> Result<Vec<TokenRecord>, GatewayError> {
        let index: HashMap<String, String> = redis::cmd("HGETALL").arg(self.index()).query_async(con).await?;
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (id, hash) in index {
            match self.lookup(con, &hash).await? {
                Some(record) => out.push(record),
                None => gone.push(id),
            }
        }
        if !gone.is_empty() {
            // Expired keys: their index entries go too.
            redis::cmd("HDEL")
                .arg(self.index())
                .arg(&gone)
                .query_async::<()>(con)
                .await?;
        }
        out.sort_by(|a, b| (a.issued_at_ms, &a.id).cmp(&(b.issued_at_ms, &b.id)));
        Ok(out)
    }

    /// Revokes the token with id `id`, by `actor` (its `token_revoked`
    /// entry on the trail, in the same transaction); whether there was one.
    pub async fn revoke<C: ConnectionLike>(
        &self,
        con: &mut C,
        id: &str,
        actor: &str,
    ) -> Result<bool, GatewayError> {
        let hash: Option<String> = redis::cmd("HGET")
            .arg(self.index())
            .arg(id)
            .query_async(con)
            .await?;
        let Some(hash) = hash else {
            return Ok(false);
        };
        // A token's record never changes once issued, only goes (revoked,
        // expired): what is read here is what the transaction deletes, or
        // the transaction deletes nothing and says so.
        let Some(record) = self.lookup(con, &hash).await? else {
            redis::cmd("HDEL")
                .arg(self.index())
                .arg(id)
                .query_async::<()>(con)
                .await?;
            return Ok(false);
        };
        let mut pipe = redis::pipe();
        pipe.atomic().del(self.key(&hash)).hdel(self.index(), id).ignore();
        self.record_trail(&mut pipe, "token_revoked", id, actor, &names(&record), "{}");
        let (deleted,): (u64,) = pipe.query_async(con).await?;
        Ok(deleted > 0)
    }
}

impl TokenRecord {
    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms > 0 && now_ms >= self.expires_at_ms
    }
}

/// What a token names, for the trail's `before` / `after`: a JSON object
/// of strings (never the token, nor its hash).
fn names(r: &TokenRecord) -> String {
    serde_json::json!({
        "app": r.app,
        "user": r.user.clone().unwrap_or_default(),
        "group": r.group.clone().unwrap_or_default(),
        "expires_at_ms": r.expires_at_ms.to_string(),
        "issued_by": r.issued_by,
        "note": r.note,
    })
    .to_string()
}

fn record_of(map: &HashMap<String, String>) -> Option<TokenRecord> {
    let get = |k: &str| map.get(k).cloned().unwrap_or_default();
    let opt = |k: &str| map.get(k).filter(|v| !v.is_empty()).cloned();
    let app = opt("app")?;
    Some(TokenRecord {
        id: get("id"),
        app,
        user: opt("user"),
        group: opt("group"),
        expires_at_ms: get("expires_at_ms").parse().unwrap_or(0),
        issued_by: get("issued_by"),
        issued_at_ms: get("issued_at_ms").parse().unwrap_or(0),
        note: get("note"),
    })
}

/// What a gateway read of tokens lately, for at most `ttl`, so that a
/// revocation is seen within it and a busy caller costs no lookup per request.
pub(crate) struct TokenCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Instant, Option<TokenRecord>)>>,
}

impl TokenCache {
    pub(crate) fn new(ttl: Duration) -> TokenCache {
        TokenCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// What was read of `hash` within the ttl: `Some(None)` = no such token.
    pub(crate) fn get(&self, hash: &str) -> Option<Option<TokenRecord>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(hash)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, r)| r.clone())
    }

    pub(crate) fn put(&self, hash: &str, record: Option<TokenRecord>) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CACHE_MAX {
            let ttl = self.ttl;
            entries.retain(|_, (at, _)| at.elapsed() < ttl);
            if entries.len() >= CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(hash.to_owned(), (Instant::now(), record));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_needs_its_application_and_reads_empty_fields_as_none() {
        let mut map: HashMap<String, String> = [
            ("id", "0123456789abcdef"),
            ("app", "cad"),
            ("user", "ada"),
            ("group", ""),
            ("expires_at_ms", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let r = record_of(&map).expect("a record");
        assert_eq!(
            (r.app.as_str(), r.user.as_deref(), r.group.as_deref()),
            ("cad", Some("ada"), None)
        );
        assert!(!r.expired(u64::MAX));
        map.remove("app");
        assert_eq!(record_of(&map), None);
    }

    #[test]
    fn the_cache_forgets_after_its_ttl() {
        let cache = TokenCache::new(Duration::from_millis(50));
        cache.put("h", None);
        assert_eq!(cache.get("h"), Some(None));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get("h"), None);
    }

    #[test]
    fn hashes_are_sha256_hex() {
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

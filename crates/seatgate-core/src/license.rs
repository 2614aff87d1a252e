//! License records, the provisioning contract: HASH `seat:{<license>}:license`
//! with `seats_total`, `expires_at_ms` (0 = never), `active` (1/0) and optional
//! `heartbeat_timeout_ms` and `queue_max`, the policy fields
//! (engine::policy; enforced whenever present) and the legacy `policy` flag,
//! plus the license index SET. Billing systems may
//! write the same hash directly; this module is what `seatgate license`
//! does, and the one Rust home of the record's rules
//! ([`StoredRecord::validate`]), which lua/includes/license.lua applies in
//! the scripts: tests/it/lease.rs runs both on the same values.

use std::fmt;

use redis::aio::ConnectionLike;
use serde::ser::SerializeStruct;
use serde::Serialize;
use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::error::Error;
use crate::keys::Keys;
use crate::policy::{LicensePolicy, FLAG_FIELD, MAX_BORROW_MS};
use crate::protocol::valid_id;

/// Most seats one license may have.
pub const MAX_SEATS: u64 = 1_000_000;
/// Largest millisecond value or count in the other fields: 15 digits, below
/// 2^53, so a Lua number holds every allowed value exactly.
pub const MAX_NUMBER: u64 = 999_999_999_999_999;
/// The earliest expiry other than 0 (never): 2001-01-01T00:00:00Z in unix ms.
/// Anything below is an expiry written in seconds (1.7 billion is 1970 in
/// ms) or a typo, never a license that ran out in the 1970s.
pub const MIN_EXPIRES_AT_MS: u64 = 978_307_200_000;

/// A field of the license record.
///
/// The wire name is the variant's name in snake_case; the declaration order
/// is the order the rules are checked in, here and in lua/includes/license.lua
/// (the policy fields in lua/includes/policy.lua), so both report the same
/// field of a record that breaks several rules. The policy fields, from
/// `max_per_user` on, are read and checked whenever the record holds them,
/// whatever `policy` says; the group fields are named `group_max:<group>`
/// and `group_reserve:<group>` in the record and are checked last, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Field {
    /// Seats that may be held at once: digits, 0 to [`MAX_SEATS`]. Required.
    SeatsTotal,
    /// Unix ms from which acquires are refused, 0 = never: digits, 0 to [`MAX_NUMBER`].
    ExpiresAtMs,
    /// `1` (acquires allowed) or `0`.
    Active,
    /// Per-license heartbeat timeout, ms: digits, 1 to [`MAX_NUMBER`].
    HeartbeatTimeoutMs,
    /// Most sessions waiting in the queue: digits, 1 to [`MAX_NUMBER`].
    QueueMax,
    /// `0` or `1`, and nothing more: kept for compatibility. The policy
    /// fields apply whenever present; `license put` still writes `1` beside
    /// them, so a worker from before they did enforces them during an upgrade.
    Policy,
    /// Seats one user holds at most: digits, 0 to [`MAX_NUMBER`].
    MaxPerUser,
    /// The highest queue priority an acquire gets: digits, 0 to 9.
    MaxPriority,
    /// How long a released seat lingers, ms: digits, 0 to [`MAX_NUMBER`].
    LingerMs,
    /// The longest borrow allowed, ms: digits, 0 to [`MAX_BORROW_MS`].
    MaxBorrowMs,
    /// `1`: an acquire without a user is refused (LIMIT_REACHED
    /// `require_user`), so that omitting `user` escapes no limit; or `0`.
    RequireUser,
    /// Sessions one user has waiting in the queue at most: digits, 0 to
    /// [`MAX_NUMBER`]; an acquire that would queue one more is refused
    /// NO_SEATS_AVAILABLE (`queue_user_full`).
    QueueMaxPerUser,
    /// Sessions one group has waiting in the queue at most: digits, 0 to
    /// [`MAX_NUMBER`]; an acquire that would queue one more is refused
    /// NO_SEATS_AVAILABLE (`queue_group_full`).
    QueueMaxPerGroup,
    /// `group_max:<group>`: seats the group holds at most: digits, 0 to [`MAX_SEATS`].
    GroupMax,
    /// `group_reserve:<group>`: seats kept for the group: digits, 0 to [`MAX_SEATS`].
    GroupReserve,
    /// `application:<app>`: `1`, the application may use the license, or
    /// `0`. A record holding any such field is used by the applications
    /// set to 1 alone (LIMIT_REACHED `application` for the others, and for
    /// requests of the shared stream, which are no application's).
    Application,
}

impl Field {
    /// Every field, in the order the rules are checked.
    pub const ALL: &'static [Field] = <Field as VariantArray>::VARIANTS;

    /// The field's name in the record (for a group field, the part before `:<group>`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether it is a policy field: one the scripts read (with the whole
    /// record) only when the record holds more than the other fields.
    pub fn is_policy(self) -> bool {
        matches!(
            self,
            Field::MaxPerUser
                | Field::MaxPriority
                | Field::LingerMs
                | Field::MaxBorrowMs
                | Field::RequireUser
                | Field::QueueMaxPerUser
                | Field::QueueMaxPerGroup
                | Field::GroupMax
                | Field::GroupReserve
                | Field::Application
        )
    }

    /// Whether the field is keyed by a name after its own
    /// (`group_max:<group>`, `group_reserve:<group>`, `application:<app>`).
    pub fn is_keyed(self) -> bool {
        matches!(self, Field::GroupMax | Field::GroupReserve | Field::Application)
    }

    /// The field a record field name stands for, with its group for
    /// `group_max:<group>` and `group_reserve:<group>`; `None` for a name
    /// that is none of them.
    pub fn parse_name(name: &str) -> Option<(Field, Option<String>)> {
        for (field, prefix) in [
            (Field::GroupMax, "group_max:"),
            (Field::GroupReserve, "group_reserve:"),
            (Field::Application, "application:"),
        ] {
            if let Some(group) = name.strip_prefix(prefix) {
                return Some((field, Some(group.to_owned())));
            }
        }
        let field: Field = name.parse().ok()?;
        (!field.is_keyed()).then_some((field, None))
    }

    /// The rule a value breaks, as the error message ends.
    pub fn rule(self) -> &'static str {
        match self {
            Field::SeatsTotal => "is not a whole number from 0 to 1000000",
            Field::ExpiresAtMs => {
                "is not 0 (never) or a whole number of unix ms from 978307200000 (2001-01-01) to 999999999999999 (a time in seconds is too small)"
            }
            Field::Active => "is not 0 or 1",
            Field::HeartbeatTimeoutMs => "is not a whole number of ms from 1 to 999999999999999",
            Field::QueueMax => "is not a whole number from 1 to 999999999999999",
            Field::Policy => "is not 0 or 1",
            Field::MaxPerUser => "is not a whole number from 0 to 999999999999999",
            Field::MaxPriority => "is not a whole number from 0 to 9",
            Field::LingerMs => "is not a whole number of ms from 0 to 999999999999999",
            Field::MaxBorrowMs => "is not a whole number of ms from 0 to 31536000000",
            Field::RequireUser => "is not 0 or 1",
            Field::QueueMaxPerUser | Field::QueueMaxPerGroup => "is not a whole number from 0 to 999999999999999",
            Field::GroupMax | Field::GroupReserve => {
                "is not a whole number from 0 to 1000000 for a group of 1 to 128 characters of A-Z a-z 0-9 . _ - : @"
            }
            Field::Application => "is not 0 or 1 for an application of 1 to 64 characters of A-Z a-z 0-9 . _ -",
        }
    }

    /// The value `raw` stands for when it keeps the field's rule (`active`:
    /// 1 or 0). Digits only, as the Lua side checks with `^%d+$`: Lua's
    /// `tonumber` would take "0x10", " 5", "1e3", "inf" and "nan".
    pub fn check(self, raw: &str) -> Result<u64, InvalidField> {
        let (min, max, digits) = match self {
            Field::SeatsTotal => (0, MAX_SEATS, 7),
            Field::ExpiresAtMs => (0, MAX_NUMBER, 15),
            Field::Active | Field::Policy | Field::RequireUser | Field::Application => (0, 1, 1),
            Field::HeartbeatTimeoutMs | Field::QueueMax => (1, MAX_NUMBER, 15),
            Field::MaxPerUser | Field::LingerMs | Field::QueueMaxPerUser | Field::QueueMaxPerGroup => {
                (0, MAX_NUMBER, 15)
            }
            Field::MaxPriority => (0, 9, 1),
            Field::MaxBorrowMs => (0, MAX_BORROW_MS, 11),
            Field::GroupMax | Field::GroupReserve => (0, MAX_SEATS, 7),
        };
        let number = Some(raw)
            .filter(|r| !r.is_empty() && r.len() <= digits && r.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|r| r.parse::<u64>().ok())
            .filter(|n| (min..=max).contains(n))
            .filter(|&n| self != Field::ExpiresAtMs || n == 0 || n >= MIN_EXPIRES_AT_MS);
        number.ok_or_else(|| InvalidField {
            field: self,
            group: None,
            value: raw.to_owned(),
        })
    }

    /// [`Field::check`] of group field `<self>:<group>`: the group must be an
    /// id like a session's too.
    pub fn check_group(self, group: &str, raw: &str) -> Result<u64, InvalidField> {
        let refused = || InvalidField {
            field: self,
            group: Some(group.to_owned()),
            value: raw.to_owned(),
        };
        let named = match self {
            Field::Application => crate::tenancy::valid_application(group),
            _ => crate::tenancy::valid_stored_id(group),
        };
        if !named {
            return Err(refused());
        }
        self.check(raw).map_err(|_| refused())
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A license record field that breaks its rule: acquires on such a record
/// get LICENSE_INVALID, and `license put` refuses to write one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidField {
    /// Which field.
    pub field: Field,
    /// The group of a `group_max:<group>` or `group_reserve:<group>` field.
    pub group: Option<String>,
    /// Its value as stored (as the script reported it: at most 64 bytes).
    pub value: String,
}

impl InvalidField {
    /// The field's name in the record: `group_max:cad` for a group field.
    pub fn name(&self) -> String {
        match &self.group {
            Some(group) => format!("{}:{group}", self.field),
            None => self.field.to_string(),
        }
    }

    /// The value for a message: at most 32 characters, control characters
    /// escaped, so the message stays one short line whatever was stored.
    pub fn shown_value(&self) -> String {
        let mut out: String = self
            .value
            .chars()
            .take(32)
            .flat_map(char::escape_default)
            .collect();
        if self.value.chars().nth(32).is_some() {
            out.push('…');
        }
        out
    }
}

impl fmt::Display for InvalidField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "license field {} = \"{}\" {}",
            self.name(),
            self.shown_value(),
            self.field.rule()
        )
    }
}

/// `{"field": "seats_total", "value": "5.5", "error": "license field …"}`:
/// the value exactly, and the message for people.
impl Serialize for InvalidField {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("InvalidField", 3)?;
        s.serialize_field("field", &self.name())?;
        s.serialize_field("value", &self.value)?;
        s.serialize_field("error", &self.to_string())?;
        s.end()
    }
}

/// The license record as Redis holds it: each field's text, `None` when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredRecord {
    /// The values, in [`Field::ALL`] order (the group fields' are `None`).
    values: Vec<Option<String>>,
    /// The group fields, `(GroupMax or GroupReserve, group, value)`, sorted
    /// by record field name: read only from a whole record.
    groups: Vec<(Field, String, String)>,
}

impl StoredRecord {
    /// A record from the values of [`Field::ALL`], in that order (an HMGET
    /// of them); it has no group fields.
    pub fn from_values(values: Vec<Option<String>>) -> StoredRecord {
        StoredRecord {
            values,
            groups: Vec::new(),
        }
    }

    /// A record read whole (HGETALL), group fields included.
    pub fn from_map(record: &std::collections::HashMap<String, String>) -> StoredRecord {
        let values = Field::ALL
            .iter()
            .map(|f| match f {
                f if f.is_keyed() => None,
                f => record.get(f.as_str()).cloned(),
            })
            .collect();
        let mut groups: Vec<(String, Field, String, String)> = record
            .iter()
            .filter_map(|(name, value)| match Field::parse_name(name)? {
                (field, Some(group)) => Some((name.clone(), field, group, value.clone())),
                _ => None,
            })
            .collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        StoredRecord {
            values,
            groups: groups.into_iter().map(|(_, f, g, v)| (f, g, v)).collect(),
        }
    }

    /// The record `license put` writes for `spec` (it leaves `queue_max`
    /// alone; the policy fields are [`put_policy`]'s).
    pub fn of_spec(spec: &LicenseSpec) -> StoredRecord {
        let mut values = vec![None; Field::ALL.len()];
        values[0] = Some(spec.seats_total.to_string());
        values[1] = Some(spec.expires_at_ms.to_string());
        values[2] = Some(if spec.active { "1" } else { "0" }.to_owned());
        values[3] = spec.heartbeat_timeout_ms.map(|ms| ms.to_string());
        StoredRecord::from_values(values)
    }

    /// A field's stored text.
    pub fn get(&self, field: Field) -> Option<&str> {
        let i = Field::ALL.iter().position(|f| *f == field)?;
        self.values.get(i)?.as_deref()
    }

    /// Whether the license exists: the contract says a record without
    /// `seats_total` is none (LICENSE_NOT_FOUND).
    pub fn exists(&self) -> bool {
        self.get(Field::SeatsTotal).is_some()
    }

    /// The provisioning rules, the one Rust home of them: `seats_total` 0 to
    /// 1000000, `expires_at_ms` 0 or more, `active` 0 or 1, and, when present,
    /// `heartbeat_timeout_ms` and `queue_max` 1 or more, every number in
    /// plain digits. Absent optional fields are fine (`active` absent =
    /// active). The first field that breaks its rule, in [`Field::ALL`]
    /// order: the policy fields too, whatever `policy` says, then the group
    /// fields by record field name.
    pub fn validate(&self) -> Result<(), InvalidField> {
        for &field in Field::ALL {
            if field.is_keyed() {
                continue;
            }
            if let Some(raw) = self.get(field) {
                field.check(raw)?;
            }
        }
        for (field, group, raw) in &self.groups {
            field.check_group(group, raw)?;
        }
        Ok(())
    }

    /// A field's value when present and valid.
    fn number(&self, field: Field) -> Option<u64> {
        self.get(field).and_then(|raw| field.check(raw).ok())
    }

    /// What the record provisions, field by field: a field that breaks its
    /// rule reads as if absent (seats 0, never expires, active, the default
    /// timeout), for display beside [`StoredRecord::validate`]'s complaint.
    pub fn spec(&self) -> LicenseSpec {
        LicenseSpec {
            seats_total: self.number(Field::SeatsTotal).unwrap_or(0),
            expires_at_ms: self.number(Field::ExpiresAtMs).unwrap_or(0),
            active: self.number(Field::Active) != Some(0),
            heartbeat_timeout_ms: self.number(Field::HeartbeatTimeoutMs),
        }
    }
}

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

impl LicenseSpec {
    /// Checks the spec against the record's rules before it is written.
    pub fn validate(&self) -> Result<(), InvalidField> {
        StoredRecord::of_spec(self).validate()
    }
}

/// A license and its current use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LicenseInfo {
    /// License id.
    pub license: String,
    /// Provisioned settings (a field that breaks its rule reads as absent).
    #[serde(flatten)]
    pub spec: LicenseSpec,
    /// Seats held now.
    pub seats_used: u64,
    /// Its policies, as the scripts apply them (whatever the record's
    /// `policy` flag says).
    pub policy: LicensePolicy,
    /// The field that breaks the record's rules, if one does: acquires get
    /// LICENSE_INVALID until it is fixed. Absent from JSON when the record is valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<InvalidField>,
}

/// Refuses `license` unless it is a valid license id.
pub fn check_id(license: &str) -> Result<(), Error> {
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
    spec.validate()
        .map_err(|e| Error::InvalidLicense(e.to_string()))?;
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

/// A change to a license record, as `seatgate license put` is told it: the
/// fields given are written, the fields named in `unset` removed, and every
/// other field is kept, unless `replace` asks for the record exactly as
/// given (the fields not given removed, `queue_max` and the policies too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LicenseChange {
    /// Write the whole record as given: `seats_total` is required,
    /// `expires_at_ms` defaults to 0 (never) and `active` to 1.
    pub replace: bool,
    /// `seats_total`; required when the license does not exist yet.
    pub seats_total: Option<u64>,
    /// `expires_at_ms` (0 = never).
    pub expires_at_ms: Option<u64>,
    /// `active`.
    pub active: Option<bool>,
    /// `heartbeat_timeout_ms`.
    pub heartbeat_timeout_ms: Option<u64>,
    /// The policy fields to write (one group's field leaves the other groups' alone).
    pub policy: LicensePolicy,
    /// Record fields to remove, by name (`linger_ms`, `group_max:cad`, …):
    /// any field of [`Field`] but `seats_total`.
    pub unset: Vec<String>,
}

/// What a license change did (`provision::change` returns it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// Whether the license existed before.
    pub existed: bool,
    /// The record as written (or as it was, when the change changed nothing).
    pub record: std::collections::HashMap<String, String>,
}

impl LicenseChange {
    /// The record this change makes of `before`, refused when the result
    /// breaks the record's rules or the policies do not fit it.
    pub fn apply(
        &self,
        license: &str,
        before: &std::collections::HashMap<String, String>,
    ) -> Result<std::collections::HashMap<String, String>, Error> {
        let usage = |m: String| Error::Usage(format!("license {license}: {m}"));
        for name in &self.unset {
            match Field::parse_name(name) {
                None => {
                    let known: Vec<&str> = Field::ALL
                        .iter()
                        .map(|f| match f {
                            Field::GroupMax => "group_max:<group>",
                            Field::GroupReserve => "group_reserve:<group>",
                            Field::Application => "application:<app>",
                            f => f.as_str(),
                        })
                        .collect();
                    return Err(usage(format!(
                        "cannot unset {name:?}: not a license field ({})",
                        known.join(", ")
                    )));
                }
                Some((Field::SeatsTotal, _)) => {
                    return Err(usage(
                        "cannot unset seats_total: a record without it is no license (use `license delete`)"
                            .into(),
                    ))
                }
                Some(_) => {}
            }
        }
        let creating = !before.contains_key(Field::SeatsTotal.as_str());
        let mut after = if self.replace {
            std::collections::HashMap::new()
        } else {
            before.clone()
        };
        if (self.replace || creating) && self.seats_total.is_none() {
            return Err(usage(if self.replace {
                "--replace needs --seats".into()
            } else {
                "does not exist yet: give --seats to create it".into()
            }));
        }
        let mut set = |field: Field, value: Option<String>| {
            if let Some(v) = value {
                after.insert(field.as_str().to_owned(), v);
            }
        };
        set(Field::SeatsTotal, self.seats_total.map(|n| n.to_string()));
        // A new record (or a replaced one) always holds these two, as
        // `license put` has always written them.
        let fresh = self.replace || creating;
        set(
            Field::ExpiresAtMs,
            self.expires_at_ms.or(fresh.then_some(0)).map(|n| n.to_string()),
        );
        set(
            Field::Active,
            self.active
                .or(fresh.then_some(true))
                .map(|a| if a { "1" } else { "0" }.to_owned()),
        );
        set(
            Field::HeartbeatTimeoutMs,
            self.heartbeat_timeout_ms.map(|n| n.to_string()),
        );
        for (name, value) in self.policy.fields() {
            if name != FLAG_FIELD {
                after.insert(name, value);
            }
        }
        for name in &self.unset {
            if self.sets(name) {
                return Err(usage(format!("{name} is both given and unset")));
            }
            after.remove(name);
        }
        // The flag follows the policy fields: 1 while the record holds one
        // (a worker from before they applied whatever the flag says, during
        // an upgrade, enforces them too), gone with the last.
        if after
            .keys()
            .any(|f| f != FLAG_FIELD && LicensePolicy::is_policy_field(f))
        {
            after.insert(FLAG_FIELD.to_owned(), "1".to_owned());
        } else if self.replace || !self.policy.is_empty() || !self.unset.is_empty() {
            after.remove(FLAG_FIELD);
        }
        let record = StoredRecord::from_map(&after);
        record
            .validate()
            .map_err(|e| Error::InvalidLicense(format!("license {license}: {e}")))?;
        LicensePolicy::from_record(&after)
            .validate(record.spec().seats_total)
            .map_err(|e| Error::InvalidLicense(format!("license {license} policy: {e}")))?;
        Ok(after)
    }

    /// Whether the change writes record field `name`.
    fn sets(&self, name: &str) -> bool {
        let given = |field: Field, v: bool| v && name == field.as_str();
        given(Field::SeatsTotal, self.seats_total.is_some())
            || given(Field::ExpiresAtMs, self.expires_at_ms.is_some())
            || given(Field::Active, self.active.is_some())
            || given(Field::HeartbeatTimeoutMs, self.heartbeat_timeout_ms.is_some())
            || self
                .policy
                .fields()
                .iter()
                .any(|(f, _)| f == name && f != FLAG_FIELD)
    }
}

/// Provisions `license`'s policies: writes the fields of `policy` with the
/// `policy` flag and removes every policy field it does not set, in one
/// transaction (an empty policy removes them all, the flag too). Refuses a
/// policy that does not fit the record's `seats_total`
/// ([`LicensePolicy::validate`]) or breaks a field's rule.
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
        .and_then(|s| Field::SeatsTotal.check(s).ok())
        .unwrap_or(0);
    policy
        .validate(seats_total)
        .map_err(|e| Error::InvalidLicense(format!("license {license} policy: {e}")))?;
    let fields = policy.fields();
    for (name, value) in &fields {
        let checked = match Field::parse_name(name) {
            Some((field, Some(group))) => field.check_group(&group, value),
            Some((field, None)) => field.check(value),
            None => Ok(0),
        };
        checked.map_err(|e| Error::InvalidLicense(e.to_string()))?;
    }
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
    let (fields, used): (std::collections::HashMap<String, String>, u64) = redis::pipe()
        .cmd("HGETALL")
        .arg(&k.license)
        .cmd("ZCARD")
        .arg(&k.holders)
        .query_async(con)
        .await?;
    let record = StoredRecord::from_map(&fields);
    if !record.exists() {
        return Ok(None);
    }
    Ok(Some(LicenseInfo {
        license: license.to_owned(),
        spec: record.spec(),
        seats_used: used,
        policy: LicensePolicy::from_record(&fields),
        invalid: record.validate().err(),
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

/// Drops a license's keys, holders and waiters with them, and ends nothing:
/// no event ends a hold, no waiter hears. For tools that clean up licenses
/// of their own; `seatgate license delete` ends every seat and wait first
/// (`runtime::reaper::Reaper::delete_license`). Returns whether it existed.
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

/// Values each field's rule refuses: the kinds Lua's `tonumber` would take,
/// and those out of range. One table for both homes of the rules: the unit
/// tests below check [`StoredRecord::validate`] with it,
/// tests/it/lease.rs runs every value through lua/includes/license.lua
/// (and policy.lua) and expects the same [`InvalidField`].
#[doc(hidden)]
pub const REFUSED_VALUES: &[(Field, &str)] = &[
    (Field::SeatsTotal, "5.5"),
    (Field::SeatsTotal, "inf"),
    (Field::SeatsTotal, "-inf"),
    (Field::SeatsTotal, "nan"),
    (Field::SeatsTotal, "0x10"),
    (Field::SeatsTotal, " 5"),
    (Field::SeatsTotal, "5 "),
    (Field::SeatsTotal, "5\n"),
    (Field::SeatsTotal, "1e3"),
    (Field::SeatsTotal, "-1"),
    (Field::SeatsTotal, "+5"),
    (Field::SeatsTotal, ""),
    (Field::SeatsTotal, "1000001"),
    (Field::SeatsTotal, "99999999999999999999"),
    (Field::ExpiresAtMs, "soon"),
    (Field::ExpiresAtMs, "1.7e12"),
    (Field::ExpiresAtMs, "-5"),
    (Field::ExpiresAtMs, "0x1"),
    (Field::ExpiresAtMs, "1000000000000000"),
    (Field::ExpiresAtMs, "1796011191"),
    (Field::ExpiresAtMs, "978307199999"),
    (Field::ExpiresAtMs, "1"),
    (Field::Active, "false"),
    (Field::Active, "true"),
    (Field::Active, "2"),
    (Field::Active, "00"),
    (Field::Active, "yes"),
    (Field::Active, ""),
    (Field::HeartbeatTimeoutMs, "0"),
    (Field::HeartbeatTimeoutMs, "90s"),
    (Field::HeartbeatTimeoutMs, "9e9"),
    (Field::QueueMax, "0"),
    (Field::QueueMax, "ten"),
    (Field::QueueMax, "1.5"),
    (Field::Policy, "2"),
    (Field::Policy, "on"),
    (Field::MaxPerUser, "-1"),
    (Field::MaxPerUser, "2.5"),
    (Field::MaxPriority, "10"),
    (Field::LingerMs, "30s"),
    (Field::MaxBorrowMs, "31536000001"),
    (Field::RequireUser, "2"),
    (Field::RequireUser, "yes"),
    (Field::QueueMaxPerUser, "-1"),
    (Field::QueueMaxPerUser, "5x"),
    (Field::QueueMaxPerGroup, "-1"),
    (Field::QueueMaxPerGroup, "2.0"),
];

/// Values each field's rule takes, with what they stand for; used as
/// [`REFUSED_VALUES`] is.
#[doc(hidden)]
pub const TAKEN_VALUES: &[(Field, &str, u64)] = &[
    (Field::SeatsTotal, "0", 0),
    (Field::SeatsTotal, "5", 5),
    (Field::SeatsTotal, "007", 7),
    (Field::SeatsTotal, "1000000", MAX_SEATS),
    (Field::ExpiresAtMs, "0", 0),
    (Field::ExpiresAtMs, "978307200000", MIN_EXPIRES_AT_MS),
    (Field::ExpiresAtMs, "1796011191648", 1_796_011_191_648),
    (Field::ExpiresAtMs, "999999999999999", MAX_NUMBER),
    (Field::Active, "0", 0),
    (Field::Active, "1", 1),
    (Field::HeartbeatTimeoutMs, "1", 1),
    (Field::HeartbeatTimeoutMs, "90000", 90_000),
    (Field::QueueMax, "1", 1),
    (Field::QueueMax, "999999999999999", MAX_NUMBER),
    (Field::Policy, "0", 0),
    (Field::Policy, "1", 1),
    (Field::MaxPerUser, "0", 0),
    (Field::MaxPriority, "9", 9),
    (Field::LingerMs, "600000", 600_000),
    (Field::MaxBorrowMs, "31536000000", MAX_BORROW_MS),
    (Field::RequireUser, "0", 0),
    (Field::RequireUser, "1", 1),
    (Field::QueueMaxPerUser, "0", 0),
    (Field::QueueMaxPerUser, "5", 5),
    (Field::QueueMaxPerGroup, "0", 0),
    (Field::QueueMaxPerGroup, "12", 12),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn record(field: Field, value: &str) -> StoredRecord {
        let mut values = vec![None; Field::ALL.len()];
        values[0] = Some("5".to_owned());
        if field.is_policy() {
            values[5] = Some("1".to_owned());
        }
        let i = Field::ALL.iter().position(|f| *f == field).unwrap();
        values[i] = Some(value.to_owned());
        StoredRecord::from_values(values)
    }

    #[test]
    fn each_field_refuses_what_breaks_its_rule_and_names_field_and_value() {
        for &(field, value) in REFUSED_VALUES {
            let err = record(field, value).validate().expect_err(value);
            assert_eq!((err.field, err.value.as_str()), (field, value));
            let message = err.to_string();
            assert!(
                message.starts_with(&format!("license field {field} = \"")),
                "{message}"
            );
            assert!(message.ends_with(field.rule()), "{message}");
        }
        let err = record(Field::SeatsTotal, "5.5").validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"license field seats_total = "5.5" is not a whole number from 0 to 1000000"#
        );
    }

    #[test]
    fn each_field_takes_plain_digits_in_range() {
        for &(field, value, number) in TAKEN_VALUES {
            assert_eq!(field.check(value), Ok(number), "{field} = {value:?}");
            assert_eq!(record(field, value).validate(), Ok(()), "{field} = {value:?}");
        }
    }

    #[test]
    fn the_first_bad_field_in_rule_order_is_reported_and_absent_ones_are_fine() {
        let r = StoredRecord::from_values(vec![
            Some("5".into()),
            Some("x".into()),
            Some("maybe".into()),
            None,
            None,
        ]);
        assert_eq!(r.validate().unwrap_err().field, Field::ExpiresAtMs);
        let minimal = StoredRecord::from_values(vec![Some("5".into()), None, None, None, None]);
        assert_eq!(minimal.validate(), Ok(()));
        assert!(minimal.spec().active);
        assert!(!StoredRecord::from_values(vec![None, Some("0".into())]).exists());
    }

    #[test]
    fn policy_fields_are_checked_whatever_the_flag_and_groups_by_name() {
        let map = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let off = map(&[
            ("seats_total", "5"),
            ("max_per_user", "x"),
            ("group_max:cad", "y"),
        ]);
        assert_eq!(
            StoredRecord::from_map(&off).validate().unwrap_err().field,
            Field::MaxPerUser,
            "checked without the flag"
        );
        let mut zero = off.clone();
        zero.insert("policy".into(), "0".into());
        zero.insert("max_per_user".into(), "2".into());
        assert_eq!(
            StoredRecord::from_map(&zero).validate().unwrap_err().name(),
            "group_max:cad",
            "checked with the flag at 0"
        );
        let on = map(&[
            ("seats_total", "5"),
            ("policy", "1"),
            ("group_reserve:eng", "1"),
            ("group_max:zed", "x"),
            ("group_max:cad", "3"),
            ("group_reserve:{bad}", "1"),
        ]);
        let err = StoredRecord::from_map(&on).validate().unwrap_err();
        assert_eq!(
            (err.name(), err.value.as_str()),
            ("group_max:zed".to_owned(), "x")
        );
        assert!(
            err.to_string().starts_with("license field group_max:zed = \"x\""),
            "{err}"
        );
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(json["field"], "group_max:zed");
        let fixed = map(&[
            ("seats_total", "5"),
            ("policy", "1"),
            ("group_reserve:{bad}", "1"),
        ]);
        let err = StoredRecord::from_map(&fixed).validate().unwrap_err();
        assert_eq!(err.name(), "group_reserve:{bad}", "the group must be an id");
        let scalar_first = map(&[
            ("seats_total", "5"),
            ("policy", "1"),
            ("group_max:a", "x"),
            ("linger_ms", "y"),
        ]);
        assert_eq!(
            StoredRecord::from_map(&scalar_first)
                .validate()
                .unwrap_err()
                .field,
            Field::LingerMs
        );
        assert_eq!(
            Field::parse_name("group_reserve:cad"),
            Some((Field::GroupReserve, Some("cad".into())))
        );
        assert_eq!(Field::parse_name("group_max"), None);
        assert_eq!(Field::parse_name("linger_ms"), Some((Field::LingerMs, None)));
    }

    #[test]
    fn invalid_values_are_shown_short_and_on_one_line() {
        let err = record(Field::Active, &format!("\n{}", "x".repeat(40)))
            .validate()
            .unwrap_err();
        let message = err.to_string();
        assert!(
            !message.contains('\n') && message.contains(r"\n") && message.contains('…'),
            "{message}"
        );
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(json["field"], "active");
        assert_eq!(
            json["value"].as_str().map(str::len),
            Some(41),
            "JSON keeps the value exactly"
        );
    }

    #[test]
    fn a_change_keeps_what_it_is_not_told_and_replace_keeps_nothing() {
        let map = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let before = map(&[
            ("seats_total", "2"),
            ("expires_at_ms", "4070908800000"),
            ("active", "1"),
            ("heartbeat_timeout_ms", "45000"),
            ("queue_max", "7"),
            ("policy", "1"),
            ("max_per_user", "1"),
            ("group_reserve:sim", "1"),
        ]);
        let seats = |n| LicenseChange {
            seats_total: Some(n),
            ..LicenseChange::default()
        };
        let after = seats(4).apply("l", &before).unwrap();
        let mut expected = before.clone();
        expected.insert("seats_total".into(), "4".into());
        assert_eq!(after, expected);
        // Replace: the record as given, the defaults of a new one.
        let replaced = LicenseChange {
            replace: true,
            ..seats(3)
        }
        .apply("l", &before)
        .unwrap();
        assert_eq!(
            replaced,
            map(&[("seats_total", "3"), ("expires_at_ms", "0"), ("active", "1")])
        );
        // Unset: one field; the flag goes with the last policy field.
        let unset = |names: &[&str]| LicenseChange {
            unset: names.iter().map(|n| n.to_string()).collect(),
            ..LicenseChange::default()
        };
        let after = unset(&["max_per_user"]).apply("l", &before).unwrap();
        assert!(!after.contains_key("max_per_user"));
        assert_eq!(after.get("policy").map(String::as_str), Some("1"));
        let after = unset(&["max_per_user", "group_reserve:sim", "heartbeat_timeout_ms"])
            .apply("l", &before)
            .unwrap();
        assert_eq!(
            after,
            map(&[
                ("seats_total", "2"),
                ("expires_at_ms", "4070908800000"),
                ("active", "1"),
                ("queue_max", "7")
            ])
        );
        // Refused: seats_total, unknown names, set and unset at once, a new
        // license without seats, a result breaking a rule or the policies' fit.
        for refused in [
            unset(&["seats_total"]),
            unset(&["colour"]),
            unset(&["group_max"]),
            LicenseChange {
                unset: vec!["seats_total".into()],
                ..seats(1)
            },
            LicenseChange {
                unset: vec!["heartbeat_timeout_ms".into()],
                heartbeat_timeout_ms: Some(1),
                ..LicenseChange::default()
            },
            seats(0),
            LicenseChange {
                replace: true,
                ..LicenseChange::default()
            },
        ] {
            assert!(refused.apply("l", &before).is_err(), "{refused:?}");
        }
        assert!(seats(1).apply("l", &Default::default()).is_ok());
        assert!(unset(&["queue_max"]).apply("l", &Default::default()).is_err());
        let mut broken = before.clone();
        broken.insert("linger_ms".into(), "10m".into());
        assert!(
            seats(4).apply("l", &broken).is_err(),
            "a broken field stays broken"
        );
        assert!(LicenseChange {
            unset: vec!["linger_ms".into()],
            ..seats(4)
        }
        .apply("l", &broken)
        .is_ok());
    }

    #[test]
    fn put_refuses_a_spec_the_rules_refuse() {
        let spec = |seats_total, heartbeat_timeout_ms| LicenseSpec {
            seats_total,
            expires_at_ms: 0,
            active: true,
            heartbeat_timeout_ms,
        };
        assert_eq!(spec(MAX_SEATS, Some(1)).validate(), Ok(()));
        assert_eq!(
            spec(MAX_SEATS + 1, None).validate().unwrap_err().field,
            Field::SeatsTotal
        );
        assert_eq!(
            spec(1, Some(0)).validate().unwrap_err().field,
            Field::HeartbeatTimeoutMs
        );
        let far = LicenseSpec {
            expires_at_ms: MAX_NUMBER + 1,
            ..spec(1, None)
        };
        assert_eq!(far.validate().unwrap_err().field, Field::ExpiresAtMs);
    }
}

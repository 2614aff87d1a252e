//! License records, the provisioning contract: HASH `seat:{<license>}:license`
//! with `seats_total`, `expires_at_ms` (0 = never), `active` (1/0) and optional
//! `heartbeat_timeout_ms` and `queue_max`, plus the license index SET. Billing
//! systems may write the same hash directly; this module is what `seatgate
//! license` does, and the one Rust home of the record's rules
//! ([`StoredRecord::validate`]), which lua/includes/license.lua applies in
//! the scripts: tests/it/lease.rs runs both on the same values.

use std::fmt;

use redis::aio::ConnectionLike;
use serde::ser::SerializeStruct;
use serde::Serialize;
use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::engine::keys::Keys;
use crate::engine::protocol::valid_id;
use crate::error::Error;

/// Most seats one license may have.
pub const MAX_SEATS: u64 = 1_000_000;
/// Largest millisecond value or count in the other fields: 15 digits, below
/// 2^53, so a Lua number holds every allowed value exactly.
pub const MAX_NUMBER: u64 = 999_999_999_999_999;

/// A field of the license record.
///
/// The wire name is the variant's name in snake_case; the declaration order
/// is the order the rules are checked in, here and in lua/includes/license.lua,
/// so both report the same field of a record that breaks several rules.
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
}

impl Field {
    /// Every field, in the order the rules are checked.
    pub const ALL: &'static [Field] = <Field as VariantArray>::VARIANTS;

    /// The field's name in the record.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The rule a value breaks, as the error message ends.
    pub fn rule(self) -> &'static str {
        match self {
            Field::SeatsTotal => "is not a whole number from 0 to 1000000",
            Field::ExpiresAtMs => "is not a whole number of unix ms from 0 (never) to 999999999999999",
            Field::Active => "is not 0 or 1",
            Field::HeartbeatTimeoutMs => "is not a whole number of ms from 1 to 999999999999999",
            Field::QueueMax => "is not a whole number from 1 to 999999999999999",
        }
    }

    /// The value `raw` stands for when it keeps the field's rule (`active`:
    /// 1 or 0). Digits only, as the Lua side checks with `^%d+$`: Lua's
    /// `tonumber` would take "0x10", " 5", "1e3", "inf" and "nan".
    pub fn check(self, raw: &str) -> Result<u64, InvalidField> {
        let (min, max, digits) = match self {
            Field::SeatsTotal => (0, MAX_SEATS, 7),
            Field::ExpiresAtMs => (0, MAX_NUMBER, 15),
            Field::Active => (0, 1, 1),
            Field::HeartbeatTimeoutMs | Field::QueueMax => (1, MAX_NUMBER, 15),
        };
        let number = Some(raw)
            .filter(|r| !r.is_empty() && r.len() <= digits && r.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|r| r.parse::<u64>().ok())
            .filter(|n| (min..=max).contains(n));
        number.ok_or_else(|| InvalidField {
            field: self,
            value: raw.to_owned(),
        })
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
    /// Its value as stored (as the script reported it: at most 64 bytes).
    pub value: String,
}

impl InvalidField {
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
            self.field,
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
        s.serialize_field("field", self.field.as_str())?;
        s.serialize_field("value", &self.value)?;
        s.serialize_field("error", &self.to_string())?;
        s.end()
    }
}

/// The license record as Redis holds it: each field's text, `None` when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredRecord {
    /// The values, in [`Field::ALL`] order.
    values: Vec<Option<String>>,
}

impl StoredRecord {
    /// A record from the values of [`Field::ALL`], in that order (an HMGET of them).
    pub fn from_values(values: Vec<Option<String>>) -> StoredRecord {
        StoredRecord { values }
    }

    /// The record `license put` writes for `spec` (it leaves `queue_max` alone).
    pub fn of_spec(spec: &LicenseSpec) -> StoredRecord {
        StoredRecord::from_values(vec![
            Some(spec.seats_total.to_string()),
            Some(spec.expires_at_ms.to_string()),
            Some(if spec.active { "1" } else { "0" }.to_owned()),
            spec.heartbeat_timeout_ms.map(|ms| ms.to_string()),
            None,
        ])
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
    /// active). The first field that breaks its rule, in [`Field::ALL`] order.
    pub fn validate(&self) -> Result<(), InvalidField> {
        for &field in Field::ALL {
            if let Some(raw) = self.get(field) {
                field.check(raw)?;
            }
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
    /// The field that breaks the record's rules, if one does: acquires get
    /// LICENSE_INVALID until it is fixed. Absent from JSON when the record is valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<InvalidField>,
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

/// Reads one license; `None` when it does not exist.
pub async fn show<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
) -> Result<Option<LicenseInfo>, Error> {
    check_id(license)?;
    let k = keys.license(license);
    let fields: Vec<&str> = Field::ALL.iter().map(|f| f.as_str()).collect();
    let (values, used): (Vec<Option<String>>, u64) = redis::pipe()
        .cmd("HMGET")
        .arg(&k.license)
        .arg(&fields)
        .cmd("ZCARD")
        .arg(&k.holders)
        .query_async(con)
        .await?;
    let record = StoredRecord::from_values(values);
    if !record.exists() {
        return Ok(None);
    }
    Ok(Some(LicenseInfo {
        license: license.to_owned(),
        spec: record.spec(),
        seats_used: used,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Values each field refuses. tests/it/lease.rs runs the same kinds of
    /// values through lua/includes/license.lua.
    const REFUSED: &[(Field, &str)] = &[
        (Field::SeatsTotal, "5.5"),
        (Field::SeatsTotal, "inf"),
        (Field::SeatsTotal, "nan"),
        (Field::SeatsTotal, "0x10"),
        (Field::SeatsTotal, " 5"),
        (Field::SeatsTotal, "5 "),
        (Field::SeatsTotal, "1e3"),
        (Field::SeatsTotal, "-1"),
        (Field::SeatsTotal, "+5"),
        (Field::SeatsTotal, ""),
        (Field::SeatsTotal, "1000001"),
        (Field::SeatsTotal, "99999999999999999999"),
        (Field::ExpiresAtMs, "soon"),
        (Field::ExpiresAtMs, "1.7e12"),
        (Field::ExpiresAtMs, "-5"),
        (Field::ExpiresAtMs, "1000000000000000"),
        (Field::Active, "false"),
        (Field::Active, "true"),
        (Field::Active, "2"),
        (Field::Active, "yes"),
        (Field::Active, ""),
        (Field::HeartbeatTimeoutMs, "0"),
        (Field::HeartbeatTimeoutMs, "90s"),
        (Field::HeartbeatTimeoutMs, "9e9"),
        (Field::QueueMax, "0"),
        (Field::QueueMax, "ten"),
    ];

    /// Values each field takes, with what they stand for.
    const TAKEN: &[(Field, &str, u64)] = &[
        (Field::SeatsTotal, "0", 0),
        (Field::SeatsTotal, "5", 5),
        (Field::SeatsTotal, "007", 7),
        (Field::SeatsTotal, "1000000", 1_000_000),
        (Field::ExpiresAtMs, "0", 0),
        (Field::ExpiresAtMs, "1796011191648", 1_796_011_191_648),
        (Field::ExpiresAtMs, "999999999999999", MAX_NUMBER),
        (Field::Active, "0", 0),
        (Field::Active, "1", 1),
        (Field::HeartbeatTimeoutMs, "1", 1),
        (Field::HeartbeatTimeoutMs, "90000", 90_000),
        (Field::QueueMax, "1", 1),
    ];

    fn record(field: Field, value: &str) -> StoredRecord {
        let mut values = vec![Some("5".to_owned()), None, None, None, None];
        let i = Field::ALL.iter().position(|f| *f == field).unwrap();
        values[i] = Some(value.to_owned());
        StoredRecord::from_values(values)
    }

    #[test]
    fn each_field_refuses_what_breaks_its_rule_and_names_field_and_value() {
        for &(field, value) in REFUSED {
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
        for &(field, value, number) in TAKEN {
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

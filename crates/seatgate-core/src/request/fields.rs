//! Reading one request entry's fields: sizes, the addressing fields every
//! request has (`reply_to`, `id`, `license`, `session`) and the typed readers
//! each op's parser (acquire.rs, release.rs, …) builds on. A step that finds
//! a problem returns a [`Refusal`] naming the field; the first one found is
//! the one reported (docs/protocol.md, "Invalid requests").

use std::collections::HashMap;
use std::str::Utf8Error;

use crate::policy::{RequestPolicy, MAX_BORROW_MS, MAX_PRIORITY};
use crate::protocol::{
    valid_id, valid_lease, Echo, Invalid, Lease, RequestField, Rules, MAX_FIELDS, MAX_FIELD_LEN,
    MAX_FIELD_NAME_LEN, MAX_ID_LEN, MAX_LEASE_LEN, MAX_META_LEN, MAX_REPLY_TO_LEN, MAX_REQUEST_ID_LEN,
    MAX_TTL_MS, MAX_WAIT_MS, MIN_LEASE_LEN, OVERSIZE_FIELD,
};

/// Longest unknown op echoed back as sent; a longer one is answered with an empty `op`.
pub(crate) const MAX_ECHOED_OP_LEN: usize = 32;

/// The fields and bytes of an entry read as lua/read.lua's stub: its first
/// field is [`OVERSIZE_FIELD`], valued `<fields> <bytes>`.
fn stored_size(pairs: &[(String, Vec<u8>)]) -> Option<(usize, usize)> {
    let (name, value) = pairs.first()?;
    if name != OVERSIZE_FIELD {
        return None;
    }
    let (fields, bytes) = std::str::from_utf8(value).ok()?.split_once(' ')?;
    Some((fields.parse().ok()?, bytes.parse().ok()?))
}

/// The entry limits, on lengths alone: the number of fields, the whole
/// entry's bytes, then each field name's length, `meta`'s size (whatever the
/// op) and every other value's.
///
/// An entry the worker read as lua/read.lua's stub ([`OVERSIZE_FIELD`])
/// is judged by the size it has in the stream.
pub(super) fn check_sizes(pairs: &[(String, Vec<u8>)], max_entry_bytes: usize) -> Result<(), Refusal> {
    let (count, total) = stored_size(pairs).unwrap_or_else(|| {
        let total = pairs.iter().fold(0usize, |sum, (name, value)| {
            sum.saturating_add(name.len()).saturating_add(value.len())
        });
        (pairs.len(), total)
    });
    if count > MAX_FIELDS {
        return Err(Refusal::new(
            RequestField::Fields,
            format!("request has {count} fields; at most {MAX_FIELDS} are allowed"),
        ));
    }
    if total > max_entry_bytes {
        return Err(Refusal::new(
            RequestField::Fields,
            format!("request entry is {total} bytes; at most {max_entry_bytes} are allowed (limits.max_entry_bytes)"),
        ));
    }
    for (name, value) in pairs {
        if name.len() > MAX_FIELD_NAME_LEN {
            return Err(Refusal::new(
                RequestField::Fields,
                format!(
                    "a field name is {} bytes; at most {MAX_FIELD_NAME_LEN} are allowed",
                    name.len()
                ),
            ));
        }
        if name == "meta" {
            if value.len() > MAX_META_LEN {
                return Err(Refusal::new(
                    RequestField::Meta,
                    format!(
                        "field `meta` is {} bytes; at most {MAX_META_LEN} are allowed",
                        value.len()
                    ),
                ));
            }
        } else if value.len() > MAX_FIELD_LEN {
            return Err(Refusal::new(
                RequestField::Fields,
                format!("field `{}` is longer than {MAX_FIELD_LEN} bytes", truncate(name)),
            ));
        }
    }
    Ok(())
}

/// The fields a refusal is addressed and labelled with.
const ECHOED: [RequestField; 5] = [
    RequestField::ReplyTo,
    RequestField::Id,
    RequestField::Op,
    RequestField::License,
    RequestField::Session,
];

/// What an entry refused for its size can still be answered with: its
/// `reply_to`, `id`, `op`, `license` and `session`, each read only when
/// short (at most [`MAX_REPLY_TO_LEN`] bytes), so that the cost stays
/// independent of the entry's size. A `reply_to` that is unusable leaves the
/// refusal unanswered (logged, counted and acknowledged, never copied to the
/// dead-letter stream).
pub(super) fn salvage_echo(pairs: &[(String, Vec<u8>)], reply_prefix: &str, echo: &mut Echo) {
    let mut small = Fields {
        values: HashMap::with_capacity(ECHOED.len()),
        duplicate: None,
    };
    for (name, value) in pairs {
        if value.len() <= MAX_REPLY_TO_LEN && ECHOED.iter().any(|f| f.as_str() == name) {
            small.values.insert(name, value);
        }
    }
    echo.reply_to = parse_reply_to(&small, reply_prefix).ok().flatten();
    if let Ok(Some(id)) = parse_request_id(&small) {
        echo.id = id.to_owned();
    }
    echo_valid_parts(&small, echo);
}

/// The fields of one entry by name.
pub(super) struct Fields<'a> {
    /// Each field's value; a repeated name keeps its last value, so a refusal
    /// of the repeat is sent to the last `reply_to`.
    values: HashMap<&'a str, &'a [u8]>,
    /// The first name seen more than once: refused only after `reply_to` and
    /// `id` are read, so that the refusal can be answered.
    duplicate: Option<&'a str>,
}

impl<'a> Fields<'a> {
    pub(super) fn collect(pairs: &'a [(String, Vec<u8>)]) -> Fields<'a> {
        let mut fields = Fields {
            values: HashMap::with_capacity(pairs.len()),
            duplicate: None,
        };
        for (name, value) in pairs {
            if fields.values.insert(name, value).is_some() {
                fields.duplicate.get_or_insert(name);
            }
        }
        fields
    }

    /// The field as text: `None` when it is absent, an error when it is not UTF-8.
    pub(super) fn text(&self, name: RequestField) -> Option<Result<&'a str, Utf8Error>> {
        self.values.get(name.as_str()).map(|raw| std::str::from_utf8(raw))
    }
}

/// What one step found wrong; [`Refusal::answer`] adds what is known of the caller.
pub(super) struct Refusal {
    /// The offending field ([`Invalid::field`] is its label).
    field: RequestField,
    /// The one-line message ([`Invalid::reason`]).
    reason: String,
}

impl Refusal {
    pub(super) fn new(field: RequestField, reason: impl Into<String>) -> Refusal {
        Refusal {
            field,
            reason: reason.into(),
        }
    }

    pub(super) fn answer(self, echo: Echo) -> Invalid {
        Invalid {
            reason: self.reason,
            field: self.field.as_str(),
            echo: Box::new(echo),
        }
    }
}

/// Checks the `reply_to` field: 1 to [`MAX_REPLY_TO_LEN`] bytes of printable
/// ASCII that start with `reply_prefix` (`replies.prefix`) and name a stream
/// after it. A refusal has field `reply_to` and no address: the request cannot
/// be answered, so the worker dead-letters it instead of deciding it, and a
/// key outside the reply namespace (another application's stream, a seat
/// record) is never touched.
pub(super) fn parse_reply_to(fields: &Fields, reply_prefix: &str) -> Result<Option<String>, Refusal> {
    let Some(value) = fields.text(RequestField::ReplyTo) else {
        return Ok(None);
    };
    let Ok(r) = value else {
        return Err(Refusal::new(
            RequestField::ReplyTo,
            "field `reply_to` is not UTF-8",
        ));
    };
    if r.is_empty() || r.len() > MAX_REPLY_TO_LEN || !r.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal::new(
            RequestField::ReplyTo,
            format!(
                "field `reply_to` must be 1 to {MAX_REPLY_TO_LEN} bytes of printable ASCII without spaces"
            ),
        ));
    }
    if r.len() > reply_prefix.len() && r.starts_with(reply_prefix) {
        return Ok(Some(r.to_owned()));
    }
    Err(Refusal::new(
        RequestField::ReplyTo,
        format!(
            "field `reply_to` \"{}\" lies outside the reply namespace: it must start with {reply_prefix:?} (replies.prefix) and name a stream after it",
            truncate(r)
        ),
    ))
}

/// The caller's request id, when it sent one.
pub(super) fn parse_request_id<'a>(fields: &Fields<'a>) -> Result<Option<&'a str>, Refusal> {
    match fields.text(RequestField::Id) {
        None => Ok(None),
        Some(Ok(id))
            if !id.is_empty() && id.len() <= MAX_REQUEST_ID_LEN && !id.contains(char::is_control) =>
        {
            Ok(Some(id))
        }
        Some(_) => Err(Refusal::new(
            RequestField::Id,
            format!(
                "field `id` must be 1 to {MAX_REQUEST_ID_LEN} bytes of UTF-8 text without control characters"
            ),
        )),
    }
}

/// Each field at most once.
pub(super) fn check_unique(fields: &Fields) -> Result<(), Refusal> {
    match fields.duplicate {
        Some(name) => Err(Refusal::new(
            RequestField::Fields,
            format!("field `{}` appears more than once", truncate(name)),
        )),
        None => Ok(()),
    }
}

/// Copies into `echo` the license, session and op that look valid before
/// each is checked, so that the caller can match a refusal of the op (or of
/// the session) to its request. An unknown op is echoed when it is short and
/// made of id characters; a known one always is.
pub(super) fn echo_valid_parts(fields: &Fields, echo: &mut Echo) {
    let valid = |name| fields.text(name).and_then(Result::ok).filter(|s| valid_id(s));
    if let Some(license) = valid(RequestField::License) {
        echo.license = license.to_owned();
    }
    if let Some(session) = valid(RequestField::Session) {
        echo.session = session.to_owned();
    }
    if let Some(op) = valid(RequestField::Op).filter(|op| op.len() <= MAX_ECHOED_OP_LEN) {
        echo.op = op.to_owned();
    }
}

/// A license or session id; `name` is also the field's label.
pub(super) fn parse_id(fields: &Fields, name: RequestField) -> Result<String, Refusal> {
    match fields.text(name) {
        Some(Ok(s)) if valid_id(s) => Ok(s.to_owned()),
        None => Err(Refusal::new(name, format!("missing field `{name}`"))),
        Some(_) => Err(Refusal::new(
            name,
            format!("field `{name}` must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ - : @"),
        )),
    }
}

/// A session as an administrator names it: a plain id, or an
/// application's (`billing/ws-7`, [`crate::tenancy::valid_stored_id`]).
pub(super) fn parse_stored_id(fields: &Fields, name: RequestField) -> Result<String, Refusal> {
    match fields.text(name) {
        Some(Ok(s)) if crate::tenancy::valid_stored_id(s) => Ok(s.to_owned()),
        None => Err(Refusal::new(name, format!("missing field `{name}`"))),
        Some(_) => Err(Refusal::new(
            name,
            format!("field `{name}` must be {}", crate::tenancy::STORED_ID_RULE),
        )),
    }
}

/// The `user` or `group` of an acquire: an id like a session's, when present.
/// Checked for every op, like `wait_ms`; only acquire uses them.
pub(super) fn parse_owner_id(fields: &Fields, name: RequestField) -> Result<Option<String>, Refusal> {
    match fields.text(name) {
        None => Ok(None),
        Some(Ok(s)) if valid_id(s) => Ok(Some(s.to_owned())),
        Some(_) => Err(Refusal::new(
            name,
            format!("field `{name}` must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ - : @"),
        )),
    }
}

/// A free-text field (`reason`, `actor`), when present: 1 to `max` bytes of
/// UTF-8 without control characters, so it stays one line in replies,
/// events and logs.
pub(super) fn parse_text<'a>(
    fields: &Fields<'a>,
    name: RequestField,
    max: usize,
) -> Result<Option<&'a str>, Refusal> {
    match fields.text(name) {
        None => Ok(None),
        Some(Ok(s)) if !s.is_empty() && s.len() <= max && !s.contains(char::is_control) => Ok(Some(s)),
        Some(_) => Err(Refusal::new(
            name,
            format!("field `{name}` must be 1 to {max} bytes of UTF-8 text without control characters"),
        )),
    }
}

/// The request's lease: required when `required` (`sessions.require_lease`),
/// checked for every op. The messages never repeat the value: a lease is a
/// secret, and a refusal is logged.
pub(super) fn parse_lease(fields: &Fields, required: bool) -> Result<Option<Lease>, Refusal> {
    match fields.text(RequestField::Lease) {
        None if required => Err(Refusal::new(
            RequestField::Lease,
            "missing field `lease`: this service requires one on every acquire, heartbeat and release (sessions.require_lease)",
        )),
        None => Ok(None),
        Some(Ok(s)) if valid_lease(s) => Ok(Lease::parse(s)),
        Some(_) => Err(Refusal::new(
            RequestField::Lease,
            format!("field `lease` must be {MIN_LEASE_LEN} to {MAX_LEASE_LEN} characters of A-Z a-z 0-9 _ -"),
        )),
    }
}

/// A whole number field from 0 to `max`, when present (`priority`, `borrow_ms`).
pub(super) fn parse_number(
    fields: &Fields,
    name: RequestField,
    max: u64,
    what: &str,
) -> Result<Option<u64>, Refusal> {
    match fields.text(name) {
        None => Ok(None),
        Some(Ok(s)) => match s.parse::<u64>() {
            Ok(n) if n <= max && s.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
            _ => Err(Refusal::new(
                name,
                format!("field `{name}` must be {what} from 0 to {max}"),
            )),
        },
        Some(Err(_)) => Err(Refusal::new(name, format!("field `{name}` is not UTF-8"))),
    }
}

/// How long an acquire may wait; checked for every op although only acquire uses it.
pub(super) fn parse_wait_ms(fields: &Fields) -> Result<u64, Refusal> {
    match fields.text(RequestField::WaitMs) {
        None => Ok(0),
        Some(Ok(s)) => match s.parse::<u64>() {
            Ok(ms) if ms <= MAX_WAIT_MS => Ok(ms),
            _ => Err(Refusal::new(
                RequestField::WaitMs,
                format!("field `wait_ms` must be a whole number of milliseconds from 0 to {MAX_WAIT_MS}"),
            )),
        },
        Some(Err(_)) => Err(Refusal::new(RequestField::WaitMs, "field `wait_ms` is not UTF-8")),
    }
}

/// How long after its entry was added the request may still be decided, ms
/// (0 = no limit), every op: its `ttl_ms`, 1 to [`MAX_TTL_MS`], counting for
/// at most `requests.max_ttl_ms` (a client cannot know the service's cap, so
/// a longer one is not refused), or `requests.default_ttl_ms` without one.
pub(super) fn parse_ttl_ms(fields: &Fields, rules: &Rules<'_>) -> Result<u64, Refusal> {
    let refuse = || {
        Refusal::new(
            RequestField::TtlMs,
            format!("field `ttl_ms` must be a whole number of milliseconds from 1 to {MAX_TTL_MS}"),
        )
    };
    match fields.text(RequestField::TtlMs) {
        None => Ok(rules.default_ttl_ms.min(rules.max_ttl_ms)),
        Some(Ok(s)) => match s.parse::<u64>() {
            Ok(ms) if (1..=MAX_TTL_MS).contains(&ms) && s.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(ms.min(rules.max_ttl_ms))
            }
            _ => Err(refuse()),
        },
        Some(Err(_)) => Err(Refusal::new(RequestField::TtlMs, "field `ttl_ms` is not UTF-8")),
    }
}

/// At most 32 characters of untrusted text for an error message, with
/// control characters escaped so the message stays one line.
pub(super) fn truncate(s: &str) -> String {
    let mut out: String = s.chars().take(32).flat_map(char::escape_default).collect();
    if s.chars().nth(32).is_some() {
        out.push('…');
    }
    out
}

/// Who asks (`user`, `group`, `priority`, `borrow_ms`): kept by an acquire,
/// checked and dropped by the other ops, like `wait_ms`.
pub(super) fn parse_policy(fields: &Fields) -> Result<RequestPolicy, Refusal> {
    Ok(RequestPolicy {
        user: parse_owner_id(fields, RequestField::User)?,
        group: parse_owner_id(fields, RequestField::Group)?,
        priority: parse_number(
            fields,
            RequestField::Priority,
            u64::from(MAX_PRIORITY),
            "a whole number",
        )?
        .map_or(0, |p| p as u8),
        borrow_ms: parse_number(
            fields,
            RequestField::BorrowMs,
            MAX_BORROW_MS,
            "a whole number of milliseconds",
        )?
        .unwrap_or(0),
    })
}

/// What a release or heartbeat reads: its `lease`, between the fields only
/// an acquire uses, which it checks and drops in the documented order
/// (`wait_ms` before the lease, who asks after it).
pub(super) fn parse_ignored_acquire_fields(
    fields: &Fields,
    rules: &Rules<'_>,
) -> Result<Option<Lease>, Refusal> {
    parse_wait_ms(fields)?;
    let lease = parse_lease(fields, rules.require_lease)?;
    parse_policy(fields)?;
    Ok(lease)
}

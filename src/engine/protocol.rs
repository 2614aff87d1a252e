//! The wire contract: parsing request entries and formatting replies.
//!
//! A request is one entry of the requests stream (or of the admin stream, for
//! an administrator's `revoke`), a flat map of fields. This module turns it
//! into a [`Request`] or an [`Invalid`] that says which field is wrong and
//! whether the caller can be answered. Nothing here talks to Redis;
//! docs/protocol.md is the prose form of this file.

use std::collections::HashMap;
use std::fmt;
use std::str::Utf8Error;

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::engine::policy::{RequestPolicy, MAX_BORROW_MS, MAX_PRIORITY};
use crate::engine::status::Status;

/// Longest license or session id, in bytes.
pub const MAX_ID_LEN: usize = 128;
/// Longest caller request id (`id`), in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Longest reply stream key (`reply_to`), in bytes.
pub const MAX_REPLY_TO_LEN: usize = 256;
/// Largest `meta` JSON document, in bytes.
pub const MAX_META_LEN: usize = 4096;
/// Deepest nesting of objects and arrays inside `meta`.
pub const MAX_META_DEPTH: usize = 8;
/// Longest time an acquire may wait in the queue (`wait_ms`): one day.
pub const MAX_WAIT_MS: u64 = 86_400_000;
/// Longest `reason` of a revoke, in bytes.
pub const MAX_REASON_LEN: usize = 512;
/// Longest `actor` of a revoke, in bytes.
pub const MAX_ACTOR_LEN: usize = 128;
/// Longest `cooldown_ms` of a revoke: seven days.
pub const MAX_COOLDOWN_MS: u64 = 7 * 86_400_000;
/// The `actor` of a revoke sent without one: the audit trail still names
/// the gap rather than an empty string.
pub const UNKNOWN_ACTOR: &str = "unknown";
/// Most fields one request entry may have.
pub const MAX_FIELDS: usize = 32;
/// Largest value of any field we do not otherwise limit, in bytes.
pub const MAX_FIELD_LEN: usize = 8192;
/// Longest field name, in bytes.
pub const MAX_FIELD_NAME_LEN: usize = 64;
/// The default of `limits.max_entry_bytes`: the most bytes of field names
/// and values one request entry may hold.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 16 * 1024;
/// Shortest `lease`, in characters.
pub const MIN_LEASE_LEN: usize = 16;
/// Longest `lease`, in characters.
pub const MAX_LEASE_LEN: usize = 128;

/// What the service's settings tell the parser: handed to it, so that the
/// engine reads no settings itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules<'a> {
    /// The namespace every `reply_to` must lie in (`replies.prefix`).
    pub reply_prefix: &'a str,
    /// Every acquire, heartbeat and release must carry a `lease`
    /// (`sessions.require_lease`).
    pub require_lease: bool,
    /// The most bytes of field names and values one entry may hold
    /// (`limits.max_entry_bytes`).
    pub max_entry_bytes: usize,
}

impl<'a> Rules<'a> {
    /// The default rules under reply namespace `reply_prefix`: leases
    /// optional, entries up to [`DEFAULT_MAX_ENTRY_BYTES`].
    pub fn new(reply_prefix: &'a str) -> Rules<'a> {
        Rules {
            reply_prefix,
            require_lease: false,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
        }
    }
}

/// A lease: the caller's secret that a seat (or place in the queue) is bound
/// to, 16 to 128 characters of `[A-Za-z0-9_-]`. Its `Debug` form hides it, so
/// that no log line, panic message or `{:?}` of a request shows it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Lease(String);

impl Lease {
    /// `s` as a lease, when it is one.
    pub fn parse(s: &str) -> Option<Lease> {
        valid_lease(s).then(|| Lease(s.to_owned()))
    }

    /// The lease itself, to send or to hand to a script.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lease(<redacted>)")
    }
}

/// Checks that `s` is 16 to 128 characters of `[A-Za-z0-9_-]`: URL- and
/// shell-safe, and long enough for a random lease to be unguessable.
pub fn valid_lease(s: &str) -> bool {
    (MIN_LEASE_LEN..=MAX_LEASE_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// What a request asks for.
///
/// The wire form, which is also the script's name, is the variant's name in
/// snake_case, derived; `FromStr` accepts exactly those strings. Adding an op
/// means adding its variant, its [`Lane`], its script and its branch in the
/// worker: the list of ops, the metric label and the parser's messages follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Op {
    /// Take a seat (idempotent per session).
    Acquire,
    /// Give the session's seat back.
    Release,
    /// Keep the session's seat alive.
    Heartbeat,
    /// Take a session's seat (or place in the queue) away: an
    /// administrator's op, accepted on the admin stream only.
    Revoke,
}

impl Op {
    /// Every op, in declaration order, for metric labels, messages and tests.
    /// Derived: a new variant is in it without anyone remembering to add it.
    pub const ALL: &'static [Op] = <Op as VariantArray>::VARIANTS;

    /// The op as written on the wire (and used as the script name).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The stream an op is accepted on.
    pub fn lane(self) -> Lane {
        match self {
            Op::Acquire | Op::Release | Op::Heartbeat => Lane::Requests,
            Op::Revoke => Lane::Admin,
        }
    }
}

/// Which stream an entry was read from: each takes its own ops, so that the
/// ACL that lets a service XADD requests does not let it revoke others' seats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The requests stream (`stream.requests`, or its shards): acquire,
    /// release, heartbeat.
    Requests,
    /// The admin stream (`stream.admin_requests`): revoke.
    Admin,
}

impl Lane {
    /// How messages name the stream.
    fn describe(self) -> &'static str {
        match self {
            Lane::Requests => "the requests stream (stream.requests)",
            Lane::Admin => "the admin stream (stream.admin_requests)",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A well-formed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The caller's request id, echoed in the reply; the stream entry id when
    /// the caller sent none.
    pub id: String,
    /// What to do.
    pub op: Op,
    /// The license id (safe charset, no braces: it becomes a hash tag).
    pub license: String,
    /// The session id (safe charset).
    pub session: String,
    /// Stream key to XADD the reply to; `None` for fire-and-forget requests.
    pub reply_to: Option<String>,
    /// Session metadata, a compact JSON object (acquire only; `{}` otherwise).
    pub meta: String,
    /// How long an acquire may wait for a seat, in ms (0 = do not wait).
    pub wait_ms: u64,
    /// Who asks (acquire only): user and group for the license's per-user
    /// and per-group policies, queue priority, borrow.
    pub policy: RequestPolicy,
    /// The lease the request carries: an acquire binds the seat (or place in
    /// the queue) to it, a heartbeat or release must carry the one bound.
    pub lease: Option<Lease>,
    /// Who revokes, why, and for how long (revoke only; `None` otherwise).
    pub revoke: Option<RevokeFields>,
}

/// The audit fields of a revoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeFields {
    /// Why: told to the revoked session and published in the `revoked` event.
    pub reason: String,
    /// Who revokes ([`UNKNOWN_ACTOR`] when the entry named nobody).
    pub actor: String,
    /// How long the session's acquires are refused afterwards, ms (0 = not at all).
    pub cooldown_ms: u64,
}

/// Why a request was refused, and what is known of the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// One line naming the field and the problem; sent back in `error`.
    pub reason: String,
    /// A short, bounded label for metrics (the offending field).
    pub field: &'static str,
    /// Whatever could be salvaged to address the reply (boxed: refusals are rare).
    pub echo: Box<Echo>,
}

/// Fields echoed in a reply, kept when they were themselves valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Echo {
    /// The request id (or the entry id).
    pub id: String,
    /// The op, as sent, when it was valid UTF-8 and short.
    pub op: String,
    /// The license, when valid.
    pub license: String,
    /// The session, when valid.
    pub session: String,
    /// The reply stream, when valid.
    pub reply_to: Option<String>,
}

/// Checks that an id (license or session) is 1..=128 bytes of `[A-Za-z0-9._:@-]`.
/// Braces are excluded on purpose: a license id becomes a Redis Cluster hash tag.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'@'))
}

/// Longest unknown op echoed back as sent; a longer one is answered with an empty `op`.
const MAX_ECHOED_OP_LEN: usize = 32;

/// Parses one entry of the requests stream: [`parse_entry`] on [`Lane::Requests`].
pub fn parse_request(
    entry_id: &str,
    pairs: &[(String, Vec<u8>)],
    rules: &Rules<'_>,
) -> Result<Request, Invalid> {
    parse_entry(Lane::Requests, entry_id, pairs, rules)
}

/// Parses one stream entry read from `lane`. `entry_id` is the stream entry
/// id, used as the request id when the caller sent none. `rules` are the
/// settings the parser obeys (reply namespace, required lease, entry size).
pub fn parse_entry(
    lane: Lane,
    entry_id: &str,
    pairs: &[(String, Vec<u8>)],
    rules: &Rules<'_>,
) -> Result<Request, Invalid> {
    let mut echo = Echo {
        id: entry_id.to_owned(),
        ..Echo::default()
    };
    // Sizes first, read off the lengths alone: nothing of an oversized entry
    // is decoded, hashed or parsed, only its small addressing fields.
    if let Err(refusal) = check_sizes(pairs, rules.max_entry_bytes) {
        salvage_echo(pairs, rules.reply_prefix, &mut echo);
        return Err(refusal.answer(echo));
    }
    let fields = Fields::collect(pairs);
    parse_fields(lane, &fields, rules, &mut echo).map_err(|refusal| refusal.answer(echo))
}

/// The checks in their documented order (docs/protocol.md, "Invalid
/// requests"), after the sizes: the first problem found is the one
/// reported, so the order decides what a request with several problems is
/// told. Each step that passes adds to `echo` what a later refusal is
/// answered with.
fn parse_fields(lane: Lane, fields: &Fields, rules: &Rules<'_>, echo: &mut Echo) -> Result<Request, Refusal> {
    // Reply address first, so that every later refusal can be answered.
    let reply_to = parse_reply_to(fields, rules.reply_prefix)?;
    echo.reply_to = reply_to.clone();
    if let Some(id) = parse_request_id(fields)? {
        echo.id = id.to_owned();
    }
    check_unique(fields)?;
    echo_valid_parts(fields, echo);
    let op = parse_op(fields, lane)?;
    let license = parse_id(fields, "license")?;
    let session = parse_id(fields, "session")?;
    let meta = parse_meta(fields, op)?;
    let wait_ms = parse_wait_ms(fields)?;
    // A revoke is the administrator's way around a lease: it carries none,
    // whatever `sessions.require_lease` says.
    let lease = match lane {
        Lane::Requests => parse_lease(fields, rules.require_lease)?,
        Lane::Admin => None,
    };
    let revoke = parse_revoke(fields, op)?;
    let policy = RequestPolicy {
        user: parse_owner_id(fields, "user")?,
        group: parse_owner_id(fields, "group")?,
        priority: parse_number(fields, "priority", u64::from(MAX_PRIORITY), "a whole number")?
            .map_or(0, |p| p as u8),
        borrow_ms: parse_number(
            fields,
            "borrow_ms",
            MAX_BORROW_MS,
            "a whole number of milliseconds",
        )?
        .unwrap_or(0),
    };
    Ok(Request {
        id: echo.id.clone(),
        op,
        license,
        session,
        reply_to,
        meta,
        wait_ms,
        policy,
        lease,
        revoke,
    })
}

/// The entry limits, on lengths alone: the number of fields, the whole
/// entry's bytes, then each field name's length, `meta`'s size (whatever the
/// op) and every other value's.
fn check_sizes(pairs: &[(String, Vec<u8>)], max_entry_bytes: usize) -> Result<(), Refusal> {
    let count = pairs.len();
    if count > MAX_FIELDS {
        return Err(Refusal::new(
            "fields",
            format!("request has {count} fields; at most {MAX_FIELDS} are allowed"),
        ));
    }
    let total = pairs.iter().fold(0usize, |sum, (name, value)| {
        sum.saturating_add(name.len()).saturating_add(value.len())
    });
    if total > max_entry_bytes {
        return Err(Refusal::new(
            "fields",
            format!("request entry is {total} bytes; at most {max_entry_bytes} are allowed (limits.max_entry_bytes)"),
        ));
    }
    for (name, value) in pairs {
        if name.len() > MAX_FIELD_NAME_LEN {
            return Err(Refusal::new(
                "fields",
                format!(
                    "a field name is {} bytes; at most {MAX_FIELD_NAME_LEN} are allowed",
                    name.len()
                ),
            ));
        }
        if name == "meta" {
            if value.len() > MAX_META_LEN {
                return Err(Refusal::new(
                    "meta",
                    format!(
                        "field `meta` is {} bytes; at most {MAX_META_LEN} are allowed",
                        value.len()
                    ),
                ));
            }
        } else if value.len() > MAX_FIELD_LEN {
            return Err(Refusal::new(
                "fields",
                format!("field `{}` is longer than {MAX_FIELD_LEN} bytes", truncate(name)),
            ));
        }
    }
    Ok(())
}

/// The fields a refusal is addressed and labelled with.
const ECHOED: [&str; 5] = ["reply_to", "id", "op", "license", "session"];

/// What an entry refused for its size can still be answered with: its
/// `reply_to`, `id`, `op`, `license` and `session`, each read only when
/// short (at most [`MAX_REPLY_TO_LEN`] bytes), so that the cost stays
/// independent of the entry's size. A `reply_to` that is unusable leaves the
/// refusal unanswered (logged, counted and acknowledged, never copied to the
/// dead-letter stream).
fn salvage_echo(pairs: &[(String, Vec<u8>)], reply_prefix: &str, echo: &mut Echo) {
    let mut small = Fields {
        values: HashMap::with_capacity(ECHOED.len()),
        duplicate: None,
    };
    for (name, value) in pairs {
        if value.len() <= MAX_REPLY_TO_LEN && ECHOED.contains(&name.as_str()) {
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
struct Fields<'a> {
    /// Each field's value; a repeated name keeps its last value, so a refusal
    /// of the repeat is sent to the last `reply_to`.
    values: HashMap<&'a str, &'a [u8]>,
    /// The first name seen more than once: refused only after `reply_to` and
    /// `id` are read, so that the refusal can be answered.
    duplicate: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn collect(pairs: &'a [(String, Vec<u8>)]) -> Fields<'a> {
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
    fn text(&self, name: &str) -> Option<Result<&'a str, Utf8Error>> {
        self.values.get(name).map(|raw| std::str::from_utf8(raw))
    }
}

/// What one step found wrong; [`Refusal::answer`] adds what is known of the caller.
struct Refusal {
    /// The offending field's metric label ([`Invalid::field`]).
    field: &'static str,
    /// The one-line message ([`Invalid::reason`]).
    reason: String,
}

impl Refusal {
    fn new(field: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            field,
            reason: reason.into(),
        }
    }

    fn answer(self, echo: Echo) -> Invalid {
        Invalid {
            reason: self.reason,
            field: self.field,
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
fn parse_reply_to(fields: &Fields, reply_prefix: &str) -> Result<Option<String>, Refusal> {
    let Some(value) = fields.text("reply_to") else {
        return Ok(None);
    };
    let Ok(r) = value else {
        return Err(Refusal::new("reply_to", "field `reply_to` is not UTF-8"));
    };
    if r.is_empty() || r.len() > MAX_REPLY_TO_LEN || !r.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal::new(
            "reply_to",
            format!(
                "field `reply_to` must be 1 to {MAX_REPLY_TO_LEN} bytes of printable ASCII without spaces"
            ),
        ));
    }
    if r.len() > reply_prefix.len() && r.starts_with(reply_prefix) {
        return Ok(Some(r.to_owned()));
    }
    Err(Refusal::new(
        "reply_to",
        format!(
            "field `reply_to` \"{}\" lies outside the reply namespace: it must start with {reply_prefix:?} (replies.prefix) and name a stream after it",
            truncate(r)
        ),
    ))
}

/// The caller's request id, when it sent one.
fn parse_request_id<'a>(fields: &Fields<'a>) -> Result<Option<&'a str>, Refusal> {
    match fields.text("id") {
        None => Ok(None),
        Some(Ok(id))
            if !id.is_empty() && id.len() <= MAX_REQUEST_ID_LEN && !id.contains(char::is_control) =>
        {
            Ok(Some(id))
        }
        Some(_) => Err(Refusal::new(
            "id",
            format!(
                "field `id` must be 1 to {MAX_REQUEST_ID_LEN} bytes of UTF-8 text without control characters"
            ),
        )),
    }
}

/// Each field at most once.
fn check_unique(fields: &Fields) -> Result<(), Refusal> {
    match fields.duplicate {
        Some(name) => Err(Refusal::new(
            "fields",
            format!("field `{}` appears more than once", truncate(name)),
        )),
        None => Ok(()),
    }
}

/// Copies into `echo` the license, session and op that look valid before
/// each is checked, so that the caller can match a refusal of the op (or of
/// the session) to its request. An unknown op is echoed when it is short and
/// made of id characters; a known one always is.
fn echo_valid_parts(fields: &Fields, echo: &mut Echo) {
    let valid = |name| fields.text(name).and_then(Result::ok).filter(|s| valid_id(s));
    if let Some(license) = valid("license") {
        echo.license = license.to_owned();
    }
    if let Some(session) = valid("session") {
        echo.session = session.to_owned();
    }
    if let Some(op) = valid("op").filter(|op| op.len() <= MAX_ECHOED_OP_LEN) {
        echo.op = op.to_owned();
    }
}

/// The op, by its wire form, if `lane` takes it; the messages list the ops
/// [`Op`] knows for that lane.
fn parse_op(fields: &Fields, lane: Lane) -> Result<Op, Refusal> {
    let op: Op = match fields.text("op") {
        None => {
            return Err(Refusal::new(
                "op",
                format!("missing field `op` ({})", op_choices(lane)),
            ))
        }
        Some(Err(_)) => return Err(Refusal::new("op", "field `op` is not UTF-8")),
        Some(Ok(s)) => s.parse().map_err(|_| {
            Refusal::new(
                "op",
                format!("unknown op {:?}; expected {}", truncate(s), op_choices(lane)),
            )
        })?,
    };
    if op.lane() != lane {
        return Err(Refusal::new(
            "op",
            format!(
                "op `{op}` is not accepted on {}, only on {}",
                lane.describe(),
                op.lane().describe()
            ),
        ));
    }
    Ok(op)
}

/// The ops of `lane` as the messages list them: "acquire, release or heartbeat".
fn op_choices(lane: Lane) -> String {
    let ops: Vec<&str> = Op::ALL
        .iter()
        .filter(|op| op.lane() == lane)
        .map(|op| op.as_str())
        .collect();
    match ops.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// A license or session id; `name` is also the field's label.
fn parse_id(fields: &Fields, name: &'static str) -> Result<String, Refusal> {
    match fields.text(name) {
        Some(Ok(s)) if valid_id(s) => Ok(s.to_owned()),
        None => Err(Refusal::new(name, format!("missing field `{name}`"))),
        Some(_) => Err(Refusal::new(
            name,
            format!("field `{name}` must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ - : @"),
        )),
    }
}

/// The session metadata of an acquire, re-serialised compactly so that what
/// is stored is exactly what was validated. The other ops ignore `meta`
/// without validating it (beyond its size, [`check_sizes`]) and store `{}`.
fn parse_meta(fields: &Fields, op: Op) -> Result<String, Refusal> {
    let refuse = |reason: String| Refusal::new("meta", reason);
    let raw = match (op, fields.text("meta")) {
        (Op::Acquire, Some(Ok(raw))) => raw,
        (Op::Acquire, Some(Err(_))) => return Err(refuse("field `meta` is not UTF-8".to_owned())),
        _ => return Ok("{}".to_owned()),
    };
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| refuse(format!("field `meta` is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(refuse("field `meta` must be a JSON object".to_owned()));
    }
    if json_depth(&value) > MAX_META_DEPTH {
        return Err(refuse(format!(
            "field `meta` nests deeper than {MAX_META_DEPTH} levels"
        )));
    }
    Ok(value.to_string())
}

/// Depth of the deepest object/array nesting in a JSON value.
fn json_depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// How long an acquire may wait; checked for every op although only acquire uses it.
fn parse_wait_ms(fields: &Fields) -> Result<u64, Refusal> {
    match fields.text("wait_ms") {
        None => Ok(0),
        Some(Ok(s)) => match s.parse::<u64>() {
            Ok(ms) if ms <= MAX_WAIT_MS => Ok(ms),
            _ => Err(Refusal::new(
                "wait_ms",
                format!("field `wait_ms` must be a whole number of milliseconds from 0 to {MAX_WAIT_MS}"),
            )),
        },
        Some(Err(_)) => Err(Refusal::new("wait_ms", "field `wait_ms` is not UTF-8")),
    }
}

/// The `user` or `group` of an acquire: an id like a session's, when present.
/// Checked for every op, like `wait_ms`; only acquire uses them.
fn parse_owner_id(fields: &Fields, name: &'static str) -> Result<Option<String>, Refusal> {
    match fields.text(name) {
        None => Ok(None),
        Some(Ok(s)) if valid_id(s) => Ok(Some(s.to_owned())),
        Some(_) => Err(Refusal::new(
            name,
            format!("field `{name}` must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ - : @"),
        )),
    }
}

/// The audit fields of a revoke; other ops ignore them without validating them.
fn parse_revoke(fields: &Fields, op: Op) -> Result<Option<RevokeFields>, Refusal> {
    if op != Op::Revoke {
        return Ok(None);
    }
    let reason = parse_text(fields, "reason", MAX_REASON_LEN)?.ok_or_else(|| {
        Refusal::new(
            "reason",
            "missing field `reason`: a revoke must say why (it is told to the session and published)",
        )
    })?;
    let actor = parse_text(fields, "actor", MAX_ACTOR_LEN)?.unwrap_or(UNKNOWN_ACTOR);
    let cooldown_ms = match fields.text("cooldown_ms") {
        None => 0,
        Some(Ok(s)) => s
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms <= MAX_COOLDOWN_MS)
            .ok_or_else(|| {
                Refusal::new(
                    "cooldown_ms",
                    format!("field `cooldown_ms` must be a whole number of milliseconds from 0 to {MAX_COOLDOWN_MS}"),
                )
            })?,
        Some(Err(_)) => return Err(Refusal::new("cooldown_ms", "field `cooldown_ms` is not UTF-8")),
    };
    Ok(Some(RevokeFields {
        reason: reason.to_owned(),
        actor: actor.to_owned(),
        cooldown_ms,
    }))
}

/// A free-text field (`reason`, `actor`), when present: 1 to `max` bytes of
/// UTF-8 without control characters, so it stays one line in replies,
/// events and logs.
fn parse_text<'a>(fields: &Fields<'a>, name: &'static str, max: usize) -> Result<Option<&'a str>, Refusal> {
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
fn parse_lease(fields: &Fields, required: bool) -> Result<Option<Lease>, Refusal> {
    match fields.text("lease") {
        None if required => Err(Refusal::new(
            "lease",
            "missing field `lease`: this service requires one on every acquire, heartbeat and release (sessions.require_lease)",
        )),
        None => Ok(None),
        Some(Ok(s)) if valid_lease(s) => Ok(Some(Lease(s.to_owned()))),
        Some(_) => Err(Refusal::new(
            "lease",
            format!("field `lease` must be {MIN_LEASE_LEN} to {MAX_LEASE_LEN} characters of A-Z a-z 0-9 _ -"),
        )),
    }
}

/// A whole number field from 0 to `max`, when present (`priority`, `borrow_ms`).
fn parse_number(fields: &Fields, name: &'static str, max: u64, what: &str) -> Result<Option<u64>, Refusal> {
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

/// At most 32 characters of untrusted text for an error message, with
/// control characters escaped so the message stays one line.
fn truncate(s: &str) -> String {
    let mut out: String = s.chars().take(32).flat_map(char::escape_default).collect();
    if s.chars().nth(32).is_some() {
        out.push('…');
    }
    out
}

/// One reply, as XADDed to the caller's `reply_to` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The request id being answered.
    pub id: String,
    /// The op being answered (as sent, or empty when it was unusable).
    pub op: String,
    /// The outcome.
    pub status: Status,
    /// The license (empty when the request had no valid one).
    pub license: String,
    /// The session (empty when the request had no valid one).
    pub session: String,
    /// Seats held after the request.
    pub seats_used: i64,
    /// The license's seat count.
    pub seats_total: i64,
    /// Heartbeats the session has sent (heartbeat replies only).
    pub heartbeats: Option<i64>,
    /// 1-based place in the queue (QUEUED only).
    pub position: Option<i64>,
    /// How long the session waited in the queue, ms (GRANTED, QUEUE_TIMEOUT).
    pub waited_ms: Option<i64>,
    /// The license's heartbeat timeout in force, ms (ACQUIRED,
    /// ALREADY_ACTIVE, GRANTED): the holder heartbeats well within it (a
    /// third of it), without having to know the service's settings.
    pub heartbeat_timeout_ms: Option<i64>,
    /// The queue priority the session got (QUEUED with a priority above 0).
    pub priority: Option<i64>,
    /// How long the released seat lingers with the session, ms (RELEASED
    /// under the license's `linger_ms`).
    pub linger_ms: Option<i64>,
    /// When the borrowed seat comes back, unix ms (ACQUIRED with `borrow_ms`).
    pub borrowed_until_ms: Option<i64>,
    /// A human-readable reason, for refusals and errors.
    pub error: Option<String>,
}

impl Reply {
    /// The reply to an invalid request.
    pub fn invalid(bad: &Invalid) -> Reply {
        Reply {
            id: bad.echo.id.clone(),
            op: bad.echo.op.clone(),
            status: Status::InvalidRequest,
            license: bad.echo.license.clone(),
            session: bad.echo.session.clone(),
            seats_used: 0,
            seats_total: 0,
            heartbeats: None,
            position: None,
            waited_ms: None,
            heartbeat_timeout_ms: None,
            priority: None,
            linger_ms: None,
            borrowed_until_ms: None,
            error: Some(bad.reason.clone()),
        }
    }

    /// The field/value pairs of the reply stream entry.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("id", self.id.clone()),
            ("op", self.op.clone()),
            ("status", self.status.as_str().to_owned()),
            ("ok", if self.status.is_ok() { "1" } else { "0" }.to_owned()),
            ("license", self.license.clone()),
            ("session", self.session.clone()),
            ("seats_used", self.seats_used.to_string()),
            ("seats_total", self.seats_total.to_string()),
        ];
        if let Some(n) = self.heartbeats {
            out.push(("heartbeats", n.to_string()));
        }
        if let Some(n) = self.position {
            out.push(("position", n.to_string()));
        }
        if let Some(n) = self.waited_ms {
            out.push(("waited_ms", n.to_string()));
        }
        if let Some(n) = self.heartbeat_timeout_ms {
            out.push(("heartbeat_timeout_ms", n.to_string()));
        }
        let policy = [
            ("priority", self.priority),
            ("linger_ms", self.linger_ms),
            ("borrowed_until_ms", self.borrowed_until_ms),
        ];
        for (field, value) in policy {
            if let Some(n) = value {
                out.push((field, n.to_string()));
            }
        }
        if let Some(e) = &self.error {
            out.push(("error", e.clone()));
        }
        out
    }
}

#[cfg(test)]
mod hostile;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn entry(pairs: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect()
    }

    fn parse(pairs: &[(&str, &[u8])]) -> Result<Request, Invalid> {
        parse_request("1-0", &entry(pairs), &Rules::new("seat:reply:"))
    }

    #[test]
    fn a_full_acquire_parses() {
        let req = parse(&[
            ("op", b"acquire"),
            ("id", b"r1"),
            ("license", b"acme"),
            ("session", b"s-1"),
            ("reply_to", b"seat:reply:c1"),
            ("meta", br#"{ "user_email": "a@b.c" }"#),
            ("wait_ms", b"1500"),
        ])
        .unwrap();
        assert_eq!(req.op, Op::Acquire);
        assert_eq!(req.id, "r1");
        assert_eq!(req.meta, r#"{"user_email":"a@b.c"}"#);
        assert_eq!(req.wait_ms, 1500);
        assert_eq!(req.reply_to.as_deref(), Some("seat:reply:c1"));
    }

    #[test]
    fn an_acquire_carries_who_asks() {
        let req = parse(&[
            ("op", b"acquire"),
            ("license", b"cad"),
            ("session", b"s-1"),
            ("user", b"ada@example.com"),
            ("group", b"eng"),
            ("priority", b"7"),
            ("borrow_ms", b"86400000"),
        ])
        .unwrap();
        assert_eq!(
            req.policy,
            RequestPolicy {
                user: Some("ada@example.com".into()),
                group: Some("eng".into()),
                priority: 7,
                borrow_ms: 86_400_000,
            }
        );
        let plain = parse(&[("op", b"acquire"), ("license", b"cad"), ("session", b"s-1")]).unwrap();
        assert_eq!(plain.policy, RequestPolicy::NONE);
    }

    #[test]
    fn the_entry_id_stands_in_for_a_missing_request_id() {
        let req = parse(&[("op", b"release"), ("license", b"a"), ("session", b"s")]).unwrap();
        assert_eq!(req.id, "1-0");
        assert_eq!(req.reply_to, None);
    }

    #[test]
    fn malformed_requests_name_the_field_and_keep_the_reply_address() {
        let long = vec![b'a'; 200];
        let deep = format!("{}{}", "{\"a\":".repeat(9) + "1", "}".repeat(9));
        let big_meta = format!("{{\"x\":\"{}\"}}", "y".repeat(MAX_META_LEN));
        type Case<'a> = (Vec<(&'a str, &'a [u8])>, &'a str);
        let cases: Vec<Case> = vec![
            (vec![("license", b"a"), ("session", b"s")], "op"),
            (vec![("op", b"steal"), ("license", b"a"), ("session", b"s")], "op"),
            (
                vec![("op", b"\xff\xfe"), ("license", b"a"), ("session", b"s")],
                "op",
            ),
            (vec![("op", b"acquire"), ("session", b"s")], "license"),
            (vec![("op", b"acquire"), ("license", b"a")], "session"),
            (
                vec![("op", b"acquire"), ("license", b"{a}"), ("session", b"s")],
                "license",
            ),
            (
                vec![("op", b"acquire"), ("license", b""), ("session", b"s")],
                "license",
            ),
            (
                vec![("op", b"acquire"), ("license", &long), ("session", b"s")],
                "license",
            ),
            (
                vec![("op", b"acquire"), ("license", b"a"), ("session", b"s p")],
                "session",
            ),
            (
                vec![("op", b"acquire"), ("license", b"a"), ("session", b"\xc3\x28")],
                "session",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("meta", b"{nope"),
                ],
                "meta",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("meta", b"[1,2]"),
                ],
                "meta",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("meta", deep.as_bytes()),
                ],
                "meta",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("meta", big_meta.as_bytes()),
                ],
                "meta",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("wait_ms", b"-1"),
                ],
                "wait_ms",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("wait_ms", b"99999999999"),
                ],
                "wait_ms",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("user", b"a b"),
                ],
                "user",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("group", b"{g}"),
                ],
                "group",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("priority", b"10"),
                ],
                "priority",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("priority", b"+1"),
                ],
                "priority",
            ),
            (
                vec![
                    ("op", b"acquire"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("borrow_ms", b"31536000001"),
                ],
                "borrow_ms",
            ),
        ];
        for (mut pairs, field) in cases {
            pairs.push(("reply_to", b"seat:reply:c1"));
            pairs.push(("id", b"r9"));
            let bad = parse(&pairs).expect_err(field);
            assert_eq!(bad.field, field, "{pairs:?}: {}", bad.reason);
            assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:c1"));
            assert_eq!(bad.echo.id, "r9");
            assert!(!bad.reason.is_empty() && !bad.reason.contains('\n'));
        }
    }

    fn rules(require_lease: bool, max_entry_bytes: usize) -> Rules<'static> {
        Rules {
            reply_prefix: "seat:reply:",
            require_lease,
            max_entry_bytes,
        }
    }

    #[test]
    fn oversized_entries_are_refused_on_their_lengths_and_still_answered() {
        let big = vec![b'x'; 9_000];
        let long_name = "n".repeat(MAX_FIELD_NAME_LEN + 1);
        let meta = format!("{{\"x\":\"{}\"}}", "y".repeat(MAX_META_LEN));
        type Case<'a> = (Vec<(&'a str, &'a [u8])>, usize, &'a str, &'a str);
        let cases: Vec<Case> = vec![
            // The whole entry, even when each value is within its own limit.
            (
                vec![("a", &big[..4000]), ("b", &big[..4000]), ("c", &big[..4000])],
                10_000,
                "fields",
                "request entry is 1205",
            ),
            (
                vec![(long_name.as_str(), b"1")],
                DEFAULT_MAX_ENTRY_BYTES,
                "fields",
                "a field name is 65 bytes; at most 64",
            ),
            (
                vec![("note", &big)],
                DEFAULT_MAX_ENTRY_BYTES,
                "fields",
                "field `note` is longer than 8192 bytes",
            ),
            // `meta` on any op, not only acquire.
            (
                vec![("meta", meta.as_bytes())],
                DEFAULT_MAX_ENTRY_BYTES,
                "meta",
                "field `meta` is 4104 bytes; at most 4096",
            ),
        ];
        for op in [&b"release"[..], b"heartbeat", b"acquire"] {
            for (extra, max, field, reason) in &cases {
                let mut pairs: Vec<(&str, &[u8])> = vec![
                    ("op", op),
                    ("id", b"r9"),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("reply_to", b"seat:reply:c1"),
                ];
                pairs.extend(extra.iter().copied());
                let bad = parse_request("1-0", &entry(&pairs), &rules(false, *max)).unwrap_err();
                assert_eq!(bad.field, *field, "{}", bad.reason);
                assert!(bad.reason.starts_with(reason), "{}", bad.reason);
                assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:c1"));
                assert_eq!((bad.echo.id.as_str(), bad.echo.license.as_str()), ("r9", "a"));
            }
        }
    }

    #[test]
    fn an_oversized_entry_reads_no_long_addressing_field() {
        // A reply_to beyond its own limit is not read at all: unanswered.
        let long_reply = format!("seat:reply:{}", "r".repeat(300));
        let pairs = entry(&[
            ("op", b"release"),
            ("reply_to", long_reply.as_bytes()),
            ("x", &[b'x'; 9_000]),
        ]);
        let bad = parse_request("1-0", &pairs, &Rules::new("seat:reply:")).unwrap_err();
        assert_eq!((bad.field, bad.echo.reply_to), ("fields", None));
        // Far more fields than allowed: refused before any is read.
        let many: Vec<(String, Vec<u8>)> = (0..10_000).map(|i| (format!("f{i}"), vec![0xff])).collect();
        let bad = parse_request("1-0", &many, &Rules::new("seat:reply:")).unwrap_err();
        assert!(
            bad.reason.starts_with("request has 10000 fields"),
            "{}",
            bad.reason
        );
    }

    #[test]
    fn a_lease_is_checked_on_every_op_and_never_repeated() {
        let secret = "Secret_lease-0123456789";
        for op in [&b"acquire"[..], b"heartbeat", b"release"] {
            let ok = parse(&[
                ("op", op),
                ("license", b"a"),
                ("session", b"s"),
                ("lease", secret.as_bytes()),
            ])
            .unwrap();
            assert_eq!(ok.lease.as_ref().map(Lease::as_str), Some(secret));
            assert!(!format!("{ok:?}").contains(secret), "Debug hides the lease");
            for bad in [
                &b"short"[..],
                b"has space in it....",
                b"sixteen+chars!!!!",
                &[b'a'; 129],
                b"\xff\xfe0123456789abcdef",
            ] {
                let refused =
                    parse(&[("op", op), ("license", b"a"), ("session", b"s"), ("lease", bad)]).unwrap_err();
                assert_eq!(refused.field, "lease");
                assert!(
                    !refused
                        .reason
                        .contains(std::str::from_utf8(bad).unwrap_or("\u{fffd}")),
                    "{}",
                    refused.reason
                );
            }
            assert_eq!(
                parse(&[("op", op), ("license", b"a"), ("session", b"s")])
                    .unwrap()
                    .lease,
                None
            );
            let required = parse_request(
                "1-0",
                &entry(&[
                    ("op", op),
                    ("license", b"a"),
                    ("session", b"s"),
                    ("reply_to", b"seat:reply:c"),
                ]),
                &rules(true, DEFAULT_MAX_ENTRY_BYTES),
            )
            .unwrap_err();
            assert_eq!(required.field, "lease");
            assert!(
                required.reason.contains("sessions.require_lease"),
                "{}",
                required.reason
            );
            assert_eq!(required.echo.reply_to.as_deref(), Some("seat:reply:c"));
        }
        assert!(valid_lease(&"a".repeat(MIN_LEASE_LEN)) && valid_lease(&"Z".repeat(MAX_LEASE_LEN)));
        assert!(!valid_lease(&"a".repeat(MIN_LEASE_LEN - 1)));
    }

    #[test]
    fn reply_to_outside_the_reply_namespace_is_refused_without_an_address() {
        let outside: [&[u8]; 7] = [
            b"orders:jobs",
            b"seat:{a}:holders",
            b"seat:requests",
            b"seat:reply:",
            b"seat:replyx:1",
            b"reply:c1",
            b"SEAT:REPLY:c1",
        ];
        for reply_to in outside {
            let bad = parse(&[
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("reply_to", reply_to),
            ])
            .unwrap_err();
            assert_eq!(bad.field, "reply_to");
            assert_eq!(bad.echo.reply_to, None, "no address to answer at");
            assert!(
                bad.reason.contains("`reply_to`") && bad.reason.contains("\"seat:reply:\""),
                "{}",
                bad.reason
            );
        }
        for malformed in [&b"seat:reply:a b"[..], b"seat:reply:\xff", b""] {
            let bad = parse(&[("op", b"release"), ("reply_to", malformed)]).unwrap_err();
            assert_eq!((bad.field, bad.echo.reply_to.as_deref()), ("reply_to", None));
        }
        let ok = parse(&[
            ("op", b"release"),
            ("license", b"a"),
            ("session", b"s"),
            ("reply_to", b"seat:reply:{app}:1"),
        ])
        .unwrap();
        assert_eq!(ok.reply_to.as_deref(), Some("seat:reply:{app}:1"));
    }

    #[test]
    fn an_invalid_id_is_still_answered_under_the_entry_id() {
        let bad = parse(&[("op", b"acquire"), ("id", b""), ("reply_to", b"seat:reply:c1")]).unwrap_err();
        assert_eq!((bad.field, bad.echo.id.as_str()), ("id", "1-0"));
        assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:c1"));
    }

    #[test]
    fn untrusted_text_in_errors_stays_on_one_line() {
        let long = vec![b'z'; MAX_FIELD_LEN + 1];
        let bad = parse(&[("\n", &long)]).unwrap_err();
        assert!(!bad.reason.contains('\n'), "{}", bad.reason);
        assert_eq!(truncate(&"x".repeat(40)), format!("{}…", "x".repeat(32)));
    }

    #[test]
    fn duplicate_fields_are_refused() {
        let bad = parse(&[
            ("op", b"acquire"),
            ("license", b"a"),
            ("session", b"s"),
            ("op", b"release"),
        ])
        .unwrap_err();
        assert_eq!(bad.field, "fields");
        assert!(bad.reason.contains("`op`"), "{}", bad.reason);
    }

    #[test]
    fn a_bad_op_still_echoes_license_and_session() {
        let bad = parse(&[("op", b"steal"), ("license", b"a"), ("session", b"s")]).unwrap_err();
        assert_eq!((bad.echo.license.as_str(), bad.echo.session.as_str()), ("a", "s"));
    }

    #[test]
    fn too_many_fields_are_refused() {
        let names: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
        let mut pairs: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
        pairs.push(("op", b"acquire"));
        assert_eq!(parse(&pairs).unwrap_err().field, "fields");
    }

    #[test]
    fn reply_fields_carry_ok_and_optional_parts() {
        let reply = Reply {
            id: "r1".into(),
            op: "heartbeat".into(),
            status: Status::HeartbeatUpdated,
            license: "a".into(),
            session: "s".into(),
            seats_used: 1,
            seats_total: 5,
            heartbeats: Some(3),
            position: None,
            waited_ms: None,
            heartbeat_timeout_ms: None,
            priority: None,
            linger_ms: None,
            borrowed_until_ms: None,
            error: None,
        };
        let f = reply.fields();
        assert!(f.contains(&("ok", "1".into())));
        assert!(f.contains(&("heartbeats", "3".into())));
        assert!(!f
            .iter()
            .any(|(k, _)| *k == "error" || *k == "heartbeat_timeout_ms"));
        let acquired = Reply {
            status: Status::Acquired,
            heartbeats: None,
            heartbeat_timeout_ms: Some(90_000),
            ..reply
        };
        assert!(acquired
            .fields()
            .contains(&("heartbeat_timeout_ms", "90000".into())));
    }

    /// The documented wire form of every op. A match without a wildcard, so
    /// a new op does not compile until it has its row here.
    fn documented(op: Op) -> &'static str {
        match op {
            Op::Acquire => "acquire",
            Op::Release => "release",
            Op::Heartbeat => "heartbeat",
            Op::Revoke => "revoke",
        }
    }

    #[test]
    fn every_op_round_trips_through_its_wire_form() {
        for &op in Op::ALL {
            assert_eq!(op.as_str(), documented(op));
            assert_eq!(op.to_string(), documented(op));
            assert_eq!(documented(op).parse::<Op>(), Ok(op));
        }
        assert!("Acquire".parse::<Op>().is_err());
    }

    #[test]
    fn messages_and_the_protocol_document_list_every_op() {
        assert_eq!(op_choices(Lane::Requests), "acquire, release or heartbeat");
        assert_eq!(op_choices(Lane::Admin), "revoke");
        let doc = include_str!("../../docs/protocol.md");
        // The requests' field table and the admin stream's each have an `op` row.
        let rows: Vec<&str> = doc.lines().filter(|line| line.starts_with("| `op`")).collect();
        for &op in Op::ALL {
            assert!(op_choices(op.lane()).contains(op.as_str()));
            assert!(
                rows.iter().any(|row| row.contains(&format!("`{op}`"))),
                "docs/protocol.md: {rows:?}"
            );
        }
    }

    fn admin(pairs: &[(&str, &[u8])]) -> Result<Request, Invalid> {
        parse_entry(Lane::Admin, "1-0", &entry(pairs), &Rules::new("seat:reply:"))
    }

    #[test]
    fn a_revoke_parses_on_the_admin_stream_only() {
        let full: Vec<(&str, &[u8])> = vec![
            ("op", b"revoke"),
            ("id", b"r1"),
            ("license", b"cad"),
            ("session", b"alice"),
            (
                "reason",
                "seat shared outside the team — see ticket 42".as_bytes(),
            ),
            ("actor", b"ada"),
            ("cooldown_ms", b"60000"),
            ("reply_to", b"seat:reply:admin:1"),
        ];
        let req = admin(&full).unwrap();
        assert_eq!((req.op, req.session.as_str()), (Op::Revoke, "alice"));
        assert_eq!(
            req.revoke,
            Some(RevokeFields {
                reason: "seat shared outside the team — see ticket 42".into(),
                actor: "ada".into(),
                cooldown_ms: 60_000,
            })
        );
        let bad = parse(&full).unwrap_err();
        assert_eq!((bad.field, bad.echo.op.as_str()), ("op", "revoke"));
        assert_eq!(
            bad.reason,
            "op `revoke` is not accepted on the requests stream (stream.requests), only on the admin stream (stream.admin_requests)"
        );
        assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:admin:1"));

        let bad = admin(&[("op", b"acquire"), ("license", b"cad"), ("session", b"s")]).unwrap_err();
        assert_eq!(bad.field, "op");
        assert!(
            bad.reason.contains("only on the requests stream"),
            "{}",
            bad.reason
        );
        let bad = admin(&[("op", b"steal")]).unwrap_err();
        assert_eq!(bad.reason, r#"unknown op "steal"; expected revoke"#);

        let minimal = admin(&[
            ("op", b"revoke"),
            ("license", b"cad"),
            ("session", b"s"),
            ("reason", b"r"),
        ])
        .unwrap();
        let fields = minimal.revoke.unwrap();
        assert_eq!((fields.actor.as_str(), fields.cooldown_ms), (UNKNOWN_ACTOR, 0));
        assert_eq!(
            parse(&[("op", b"acquire"), ("license", b"a"), ("session", b"s")])
                .unwrap()
                .revoke,
            None
        );
    }

    #[test]
    fn a_revoke_must_say_why_in_one_line_and_bounded() {
        let long_reason = vec![b'r'; MAX_REASON_LEN + 1];
        let long_actor = vec![b'a'; MAX_ACTOR_LEN + 1];
        type Case<'a> = (Vec<(&'a str, &'a [u8])>, &'a str);
        let cases: Vec<Case> = vec![
            (vec![], "reason"),
            (vec![("reason", b"")], "reason"),
            (vec![("reason", &long_reason)], "reason"),
            (vec![("reason", b"two\nlines")], "reason"),
            (vec![("reason", b"\xff")], "reason"),
            (vec![("reason", b"r"), ("actor", b"")], "actor"),
            (vec![("reason", b"r"), ("actor", &long_actor)], "actor"),
            (vec![("reason", b"r"), ("actor", b"a\tb")], "actor"),
            (vec![("reason", b"r"), ("cooldown_ms", b"-1")], "cooldown_ms"),
            (
                vec![("reason", b"r"), ("cooldown_ms", b"604800001")],
                "cooldown_ms",
            ),
        ];
        for (extra, field) in cases {
            let mut pairs: Vec<(&str, &[u8])> =
                vec![("op", b"revoke"), ("license", b"cad"), ("session", b"s")];
            pairs.extend(extra);
            let bad = admin(&pairs).expect_err(field);
            assert_eq!(bad.field, field, "{pairs:?}: {}", bad.reason);
            assert!(!bad.reason.contains('\n'));
        }
        let longest = vec![b'r'; MAX_REASON_LEN];
        let at_the_limits = admin(&[
            ("op", b"revoke"),
            ("license", b"cad"),
            ("session", b"s"),
            ("reason", &longest),
            ("cooldown_ms", b"604800000"),
        ]);
        assert!(at_the_limits.is_ok());
    }

    #[test]
    fn an_unknown_op_is_echoed_only_when_short_and_made_of_id_characters() {
        let bad = parse(&[("op", b"steal"), ("license", b"a"), ("session", b"s")]).unwrap_err();
        assert_eq!(bad.echo.op, "steal");
        assert_eq!(
            bad.reason,
            r#"unknown op "steal"; expected acquire, release or heartbeat"#
        );
        let long = "x".repeat(MAX_ECHOED_OP_LEN + 1);
        let bad = parse(&[("op", long.as_bytes())]).unwrap_err();
        assert_eq!(bad.echo.op, "");
        let bad = parse(&[("op", b"st eal")]).unwrap_err();
        assert_eq!(bad.echo.op, "");
        let bad = parse(&[("license", b"a")]).unwrap_err();
        assert_eq!(bad.reason, "missing field `op` (acquire, release or heartbeat)");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// The parser never panics, and what it accepts is within the documented limits.
        #[test]
        fn the_parser_never_panics_and_accepts_only_valid_requests(fields in hostile::entry()) {
            for lane in [Lane::Requests, Lane::Admin] {
                match parse_entry(lane, "1-0", &fields, &Rules::new("seat:reply:")) {
                    Ok(req) => {
                        prop_assert_eq!(req.op.lane(), lane);
                        prop_assert!(valid_id(&req.license));
                        prop_assert!(valid_id(&req.session));
                        prop_assert!(req.meta.len() <= MAX_META_LEN);
                        prop_assert!(req.wait_ms <= MAX_WAIT_MS);
                        prop_assert!(req.policy.priority <= MAX_PRIORITY);
                        prop_assert!(req.policy.borrow_ms <= MAX_BORROW_MS);
                        prop_assert!(req.lease.as_ref().is_none_or(|l| valid_lease(l.as_str())));
                        prop_assert_eq!(req.revoke.is_some(), req.op == Op::Revoke);
                        if let Some(r) = &req.revoke {
                            prop_assert!(r.reason.len() <= MAX_REASON_LEN && !r.reason.contains('\n'));
                            prop_assert!(r.cooldown_ms <= MAX_COOLDOWN_MS);
                        }
                    }
                    Err(bad) => {
                        prop_assert!(!bad.reason.is_empty());
                        prop_assert!(!bad.reason.contains('\n'));
                    }
                }
            }
        }
    }
}

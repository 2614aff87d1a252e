//! The shared Lua helpers under `lua/includes/` and the `--- @include "name"`
//! lines that pull them into a script, and the function library assembled
//! from every script ([`library`]).
//!
//! A script names the helpers it uses, one line each, and an include may name
//! the helpers it uses in turn. Run on its own ([`resolve`], an EVAL body: a
//! test's script), each is inlined once, where it is first named. In the
//! function library (issue 24) every include appears once, at the library's
//! top level, so its helpers are built once when Redis loads the library, not
//! on every call; each script becomes one registered function whose body is
//! the script's own code.
//!
//! Per-call state: an include whose top-level state depends on the call
//! (keys.lua's `K`, events.lua's `EV`) binds it in a function named on a line
//! `--- @on_call "name"`. Run on its own, that line becomes the call
//! `name()`; in the library, each function's prologue calls it, after
//! binding the library's `KEYS` and `ARGV` (locals: a library may set no
//! global) to the call's, for every include the script uses. Nothing else at
//! an include's top level may call anything: while Redis loads a library
//! only `redis.register_function` and `redis.log` exist (not `redis.call`,
//! `string`, `tonumber`), so `rcall` is bound per call too.
//!
//! A script's own helpers can be built once as well: a script whose text
//! holds a line `--- @per_call` has what comes before it (its header, its
//! includes and helpers that use nothing of the call's but what the
//! includes offer) placed at the library's top level, and only what follows
//! in its function. Its `local rcall = redis.call` line is left out there
//! (the library binds `rcall`). Run on its own, the marker is a comment.
//!
//! The Lua builtins the scripts use ([`BUILTINS`]) are locals of the
//! library, bound by the first call (they do not exist while it loads): a
//! helper then reads an upvalue where it would look up a global, about 3.6
//! thousand instructions less a seat call (docs/performance.md).

/// Every include, by the name scripts use for it.
const INCLUDES: &[(&str, &str)] = &[
    ("keys", include_str!("../../lua/includes/keys.lua")),
    ("clock", include_str!("../../lua/includes/clock.lua")),
    ("encoding", include_str!("../../lua/includes/encoding.lua")),
    ("license", include_str!("../../lua/includes/license.lua")),
    ("outcome", include_str!("../../lua/includes/outcome.lua")),
    (
        "session_record",
        include_str!("../../lua/includes/session_record.lua"),
    ),
    ("outbox", include_str!("../../lua/includes/outbox.lua")),
    ("owners", include_str!("../../lua/includes/owners.lua")),
    ("queue", include_str!("../../lua/includes/queue.lua")),
    (
        "waiter_record",
        include_str!("../../lua/includes/waiter_record.lua"),
    ),
    ("policy", include_str!("../../lua/includes/policy.lua")),
    ("lease", include_str!("../../lua/includes/lease.lua")),
    ("seat_lease", include_str!("../../lua/includes/seat_lease.lua")),
    ("dedupe", include_str!("../../lua/includes/dedupe.lua")),
    ("rate_limit", include_str!("../../lua/includes/rate_limit.lua")),
    ("due", include_str!("../../lua/includes/due.lua")),
    ("request", include_str!("../../lua/includes/request.lua")),
    ("admin", include_str!("../../lua/includes/admin.lua")),
    ("grant", include_str!("../../lua/includes/grant.lua")),
    ("revoked", include_str!("../../lua/includes/revoked.lua")),
    ("deleted", include_str!("../../lua/includes/deleted.lua")),
    (
        "denial_sample",
        include_str!("../../lua/includes/denial_sample.lua"),
    ),
    ("events", include_str!("../../lua/includes/events.lua")),
];

/// The Lua builtins the library binds as its own locals on its first call
/// (module docs).
const BUILTINS: &str =
    "tonumber, tostring, type, ipairs, pairs, next, unpack, setmetatable, pcall, string, math, table, cjson";

/// The directive, at the start of a line.
const DIRECTIVE: &str = "--- @include ";

/// The per-call directive, at the start of a line of an include.
const ON_CALL: &str = "--- @on_call ";

/// The line after which a script's text runs per call (before it: defined
/// once in the library).
const PER_CALL: &str = "--- @per_call";

/// The line that binds `rcall` in a script run on its own.
const RCALL: &str = "local rcall = redis.call";

/// Why a script could not be assembled: a mistake in `lua/`, found by the
/// unit tests (and at the latest when the registry is first used).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IncludeError {
    /// The name is not in the include table.
    #[error("{script}: unknown include {name:?}")]
    Unknown {
        /// The file naming it.
        script: String,
        /// The name.
        name: String,
    },
    /// The line does not read `--- @include "name"`.
    #[error("{script}: malformed include line {line:?}")]
    Malformed {
        /// The file holding it.
        script: String,
        /// The line.
        line: String,
    },
    /// An include names itself, directly or through others.
    #[error("{script}: include cycle through {name:?}")]
    Cycle {
        /// The file naming it.
        script: String,
        /// The include met again.
        name: String,
    },
}

/// `source` (the file `script`) with every include line replaced by that
/// include, resolved the same way, or by nothing when already inlined.
pub fn resolve(script: &str, source: &str) -> Result<String, IncludeError> {
    resolve_in(script, source, INCLUDES)
}

/// [`resolve`] against an include table of the caller's (for tests).
fn resolve_in(script: &str, source: &str, table: &[(&str, &str)]) -> Result<String, IncludeError> {
    let mut out = String::with_capacity(source.len() * 4);
    let mut done = Vec::new();
    inline(script, source, table, &mut Vec::new(), &mut done, &mut out, None)?;
    Ok(out)
}

/// One script of the library: the function's name and the script's file name and text.
pub struct Entry<'a> {
    /// The registered function's name.
    pub function: &'a str,
    /// The file, for errors (`acquire.lua`).
    pub file: &'a str,
    /// The file's text.
    pub text: &'a str,
}

/// The function library named `name` (`#!lua name=<name>`): every include
/// the entries use, once, in an order where each follows those it includes,
/// then one `redis.register_function` per entry.
pub fn library(name: &str, entries: &[Entry<'_>]) -> Result<String, IncludeError> {
    library_in(name, entries, INCLUDES)
}

fn library_in(name: &str, entries: &[Entry<'_>], table: &[(&str, &str)]) -> Result<String, IncludeError> {
    let mut out = format!(
        "#!lua name={name}\n-- seatgate's function library, assembled from lua/ by src/engine/scripts/includes.rs.\n\
         -- Bound at the start of every call (see the functions' prologues).\nlocal rcall, KEYS, ARGV\n\
         -- The builtins, bound by the first call (they do not exist while the library loads).\n\
         local function builtins() return {BUILTINS} end\nlocal {BUILTINS}\n"
    );
    let mut done = Vec::new();
    // Each include's per-call binder, in library order.
    let mut on_call: Vec<(&str, String)> = Vec::new();
    let mut functions = String::new();
    for entry in entries {
        let mut body = String::new();
        // Before the script's `--- @per_call` line, if it has one: what the
        // library defines once.
        let marked = entry.text.lines().any(|l| l.trim_end() == PER_CALL);
        let mut once = marked;
        for line in entry.text.lines() {
            if line.contains("@per_call") {
                if line.trim_end() != PER_CALL || !once {
                    return Err(IncludeError::Malformed {
                        script: entry.file.to_owned(),
                        line: line.to_owned(),
                    });
                }
                once = false;
                continue;
            }
            if !line.contains("@include") {
                if !once {
                    body.push_str(line);
                    body.push('\n');
                } else if line.trim_end() != RCALL {
                    out.push_str(line);
                    out.push('\n');
                }
                continue;
            }
            if marked && !once {
                // An include after the marker would be inlined into the library
                // after helpers that ran before it: keep them all above it.
                return Err(IncludeError::Malformed {
                    script: entry.file.to_owned(),
                    line: line.to_owned(),
                });
            }
            let (inc, inc_body) = directive(entry.file, line, table)?;
            if done.contains(&inc) {
                continue;
            }
            let mut open = vec![inc];
            inline(
                &format!("includes/{inc}.lua"),
                inc_body,
                table,
                &mut open,
                &mut done,
                &mut out,
                Some((inc, &mut on_call)),
            )?;
            done.push(inc);
        }
        let mut used = Vec::new();
        uses(entry.text, table, &mut used);
        functions.push_str(&format!(
            "redis.register_function('{}', function(keys, args)\n  rcall, KEYS, ARGV = redis.call, keys, args\n  \
             if not tonumber then {BUILTINS} = builtins() end\n",
            entry.function
        ));
        for (inc, binder) in &on_call {
            if used.contains(inc) {
                functions.push_str(&format!("  {binder}()\n"));
            }
        }
        functions.push_str(&body);
        functions.push_str("end)\n");
    }
    out.push_str(&functions);
    Ok(out)
}

/// Every include `source` names, directly or through others, into `used`
/// (the text is already known to resolve).
fn uses<'a>(source: &str, table: &[(&'a str, &'a str)], used: &mut Vec<&'a str>) {
    for line in source.lines().filter(|l| l.starts_with(DIRECTIVE)) {
        if let Ok((name, body)) = directive("", line, table) {
            if !used.contains(&name) {
                used.push(name);
                uses(body, table, used);
            }
        }
    }
}

/// The include an `--- @include "name"` line names, and its text.
fn directive<'a>(
    script: &str,
    line: &str,
    table: &[(&'a str, &'a str)],
) -> Result<(&'a str, &'a str), IncludeError> {
    let name = line
        .strip_prefix(DIRECTIVE)
        .and_then(|rest| rest.trim_end().strip_prefix('"'))
        .and_then(|rest| rest.strip_suffix('"'))
        .filter(|name| !name.is_empty() && !name.contains('"'))
        .ok_or_else(|| IncludeError::Malformed {
            script: script.to_owned(),
            line: line.to_owned(),
        })?;
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(n, body)| (n, body))
        .ok_or_else(|| IncludeError::Unknown {
            script: script.to_owned(),
            name: name.to_owned(),
        })
}

/// The binder an `--- @on_call "name"` line names.
fn on_call_name<'l>(script: &str, line: &'l str) -> Result<&'l str, IncludeError> {
    line.strip_prefix(ON_CALL)
        .and_then(|rest| rest.trim_end().strip_prefix('"'))
        .and_then(|rest| rest.strip_suffix('"'))
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .ok_or_else(|| IncludeError::Malformed {
            script: script.to_owned(),
            line: line.to_owned(),
        })
}

/// Inlines `source`'s includes (and `source`) into `out`. `library`: the
/// include being inlined into the function library and where its per-call
/// binders go (None: a script run on its own, where a binder is called in place).
fn inline<'a>(
    script: &str,
    source: &str,
    table: &[(&'a str, &'a str)],
    open: &mut Vec<&'a str>,
    done: &mut Vec<&'a str>,
    out: &mut String,
    mut library: Option<(&'a str, &mut Vec<(&'a str, String)>)>,
) -> Result<(), IncludeError> {
    for line in source.lines() {
        if line.trim_end() == PER_CALL {
            continue;
        }
        if line.contains("@on_call") {
            let binder = on_call_name(script, line)?;
            match library.as_mut() {
                Some((inc, binders)) => binders.push((*inc, binder.to_owned())),
                None => {
                    out.push_str(binder);
                    out.push_str("()\n");
                }
            }
            continue;
        }
        if !line.contains("@include") {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let (name, body) = directive(script, line, table)?;
        if open.contains(&name) {
            return Err(IncludeError::Cycle {
                script: script.to_owned(),
                name: name.to_owned(),
            });
        }
        if done.contains(&name) {
            continue;
        }
        open.push(name);
        let nested = library.as_mut().map(|(_, binders)| (name, &mut **binders));
        inline(
            &format!("includes/{name}.lua"),
            body,
            table,
            open,
            done,
            out,
            nested,
        )?;
        open.pop();
        done.push(name);
    }
    Ok(())
}

/// Whether `text`'s header comment, when it opens with `--[[`, closes on a
/// line of its own: a `]]` inside it (a JSON example, say) would end it early
/// and turn the rest into code.
#[cfg(test)]
pub(super) fn header_is_closed_on_its_own_line(text: &str) -> bool {
    if !text.starts_with("--[[") {
        return true;
    }
    text.lines().find(|l| l.contains("]]")).map(str::trim_end) == Some("]]")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[(&str, &str)] = &[
        ("a", "local function a() end\n"),
        ("b", "--- @include \"a\"\nlocal function b() a() end\n"),
        ("loop", "--- @include \"loop2\"\n"),
        ("loop2", "--- @include \"loop\"\n"),
    ];

    #[test]
    fn inlines_each_include_once_before_its_first_use() {
        let script = "local rcall = redis.call\n--- @include \"b\"\n--- @include \"a\"\nreturn b()\n";
        let got = resolve_in("s", script, TABLE).unwrap();
        assert_eq!(
            got,
            "local rcall = redis.call\nlocal function a() end\nlocal function b() a() end\nreturn b()\n"
        );
    }

    #[test]
    fn refuses_unknown_malformed_and_cyclic_includes() {
        let unknown = resolve_in("s", "--- @include \"nope\"\n", TABLE);
        assert_eq!(
            unknown,
            Err(IncludeError::Unknown {
                script: "s".into(),
                name: "nope".into()
            })
        );
        for line in [
            "--- @include a",
            "-- @include \"a\"",
            "--- @include \"\"",
            "x() --- @include \"a\"",
        ] {
            assert!(
                matches!(resolve_in("s", line, TABLE), Err(IncludeError::Malformed { .. })),
                "{line}"
            );
        }
        assert!(matches!(
            resolve_in("s", "--- @include \"loop\"\n", TABLE),
            Err(IncludeError::Cycle { .. })
        ));
    }

    #[test]
    fn a_library_defines_includes_and_helpers_once_and_runs_the_rest_per_call() {
        let first = "local rcall = redis.call\n--- @include \"b\"\nlocal function own() b() end\n--- @per_call\nlocal x = own()\nreturn x\n";
        let second = "local rcall = redis.call\n--- @include \"a\"\nreturn a()\n";
        let entries = [
            Entry {
                function: "f",
                file: "f.lua",
                text: first,
            },
            Entry {
                function: "g",
                file: "g.lua",
                text: second,
            },
        ];
        let got = library_in("lib", &entries, TABLE).unwrap();
        let expected = "#!lua name=lib\n\
            -- seatgate's function library, assembled from lua/ by src/engine/scripts/includes.rs.\n\
            -- Bound at the start of every call (see the functions' prologues).\n\
            local rcall, KEYS, ARGV\n\
            -- The builtins, bound by the first call (they do not exist while the library loads).\n\
            local function builtins() return BUILTINS end\n\
            local BUILTINS\n\
            local function a() end\n\
            local function b() a() end\n\
            local function own() b() end\n\
            redis.register_function('f', function(keys, args)\n  rcall, KEYS, ARGV = redis.call, keys, args\n\
            \x20 if not tonumber then BUILTINS = builtins() end\n\
            local x = own()\nreturn x\nend)\n\
            redis.register_function('g', function(keys, args)\n  rcall, KEYS, ARGV = redis.call, keys, args\n\
            \x20 if not tonumber then BUILTINS = builtins() end\n\
            local rcall = redis.call\nreturn a()\nend)\n"
            .replace("BUILTINS", BUILTINS);
        assert_eq!(got, expected);
        // Run on its own, the marker is nothing.
        assert_eq!(
            resolve_in("f", first, TABLE).unwrap(),
            "local rcall = redis.call\nlocal function a() end\nlocal function b() a() end\nlocal function own() b() end\nlocal x = own()\nreturn x\n"
        );
        // An include after the marker, or a second marker, is a mistake.
        for text in [
            "--- @per_call\n--- @include \"a\"\n",
            "--- @per_call\n--- @per_call\n",
        ] {
            let entry = Entry {
                function: "h",
                file: "h.lua",
                text,
            };
            assert!(
                matches!(
                    library_in("lib", &[entry], TABLE),
                    Err(IncludeError::Malformed { .. })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn every_include_in_the_table_resolves() {
        for (name, body) in INCLUDES {
            let got = resolve(name, body).unwrap_or_else(|e| panic!("{e}"));
            assert!(!got.contains("@include"), "{name}");
            assert!(
                header_is_closed_on_its_own_line(body),
                "{name}.lua: a ]] inside the header"
            );
        }
        assert!(!header_is_closed_on_its_own_line(
            "--[[\n  e.g. [[1]]\n]]\nreturn 1\n"
        ));
    }
}

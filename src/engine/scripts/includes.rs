//! The shared Lua helpers under `lua/includes/` and the `--- @include "name"`
//! lines that pull them into a script.
//!
//! A script names the helpers it uses, one line each, and an include may name
//! the helpers it uses in turn. Each is inlined once, where it is first named,
//! so every script stays one self-contained EVALSHA body holding only what it
//! uses (reap.lua carries no replay or rate-limit code). Resolution happens
//! once, when the registry is built.

/// Every include, by the name scripts use for it.
const INCLUDES: &[(&str, &str)] = &[
    ("keys", include_str!("../../../lua/includes/keys.lua")),
    ("clock", include_str!("../../../lua/includes/clock.lua")),
    ("license", include_str!("../../../lua/includes/license.lua")),
    ("outcome", include_str!("../../../lua/includes/outcome.lua")),
    (
        "session_record",
        include_str!("../../../lua/includes/session_record.lua"),
    ),
    ("outbox", include_str!("../../../lua/includes/outbox.lua")),
    ("owners", include_str!("../../../lua/includes/owners.lua")),
    ("queue", include_str!("../../../lua/includes/queue.lua")),
    ("policy", include_str!("../../../lua/includes/policy.lua")),
    ("lease", include_str!("../../../lua/includes/lease.lua")),
    ("seat_lease", include_str!("../../../lua/includes/seat_lease.lua")),
    ("dedupe", include_str!("../../../lua/includes/dedupe.lua")),
    ("rate_limit", include_str!("../../../lua/includes/rate_limit.lua")),
    ("due", include_str!("../../../lua/includes/due.lua")),
    ("request", include_str!("../../../lua/includes/request.lua")),
    ("grant", include_str!("../../../lua/includes/grant.lua")),
    ("revoked", include_str!("../../../lua/includes/revoked.lua")),
    ("deleted", include_str!("../../../lua/includes/deleted.lua")),
    (
        "denial_sample",
        include_str!("../../../lua/includes/denial_sample.lua"),
    ),
    ("events", include_str!("../../../lua/includes/events.lua")),
];

/// The directive, at the start of a line.
const DIRECTIVE: &str = "--- @include ";

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
    inline(script, source, table, &mut Vec::new(), &mut done, &mut out)?;
    Ok(out)
}

fn inline<'a>(
    script: &str,
    source: &str,
    table: &[(&'a str, &'a str)],
    open: &mut Vec<&'a str>,
    done: &mut Vec<&'a str>,
    out: &mut String,
) -> Result<(), IncludeError> {
    for line in source.lines() {
        if !line.contains("@include") {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let name = line
            .strip_prefix(DIRECTIVE)
            .and_then(|rest| rest.trim_end().strip_prefix('"'))
            .and_then(|rest| rest.strip_suffix('"'))
            .filter(|name| !name.is_empty() && !name.contains('"'))
            .ok_or_else(|| IncludeError::Malformed {
                script: script.to_owned(),
                line: line.to_owned(),
            })?;
        let Some(&(name, body)) = table.iter().find(|(n, _)| *n == name) else {
            return Err(IncludeError::Unknown {
                script: script.to_owned(),
                name: name.to_owned(),
            });
        };
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
        inline(&format!("includes/{name}.lua"), body, table, open, done, out)?;
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

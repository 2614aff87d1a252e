// seatgate status page: polls status.json (a summary row per license, from a
// snapshot the server reads once per refresh interval for every viewer) and,
// for the license selected (#license=<id>), license.json (its holders and
// waiters, the first few and how many more). Redraws in place, without
// reloading the page.
//
// Every value from Redis (license ids, group names, and with
// http.page_personal on, user, session and hardware ids) reaches the page
// through textContent or createTextNode, never innerHTML: metadata is
// whatever a client sent, and must show as text.
"use strict";

(() => {
  /** A poll that takes longer counts as failed (the server gives up after 15 s). */
  const TIMEOUT_MS = 20000;
  /** Utilisation at or above which the bar turns amber. */
  const WARN_AT = 0.7;
  /** Summary rows drawn at first, and added by "more licenses". */
  const ROWS = 200;
  /** Holders and waiters listed at first, and added by "show more". */
  const PAGE = 10;

  const $ = (id) => document.getElementById(id);
  /** What the page shows and how; the data of the last successful poll. */
  const state = {
    summary: null,
    detail: null,
    /** Why the selected license could not be shown, if it could not. */
    detailError: null,
    sort: "utilisation",
    /** 1 ascending, -1 descending. */
    dir: -1,
    filter: "",
    rows: ROWS,
    selected: null,
    limit: PAGE,
    refreshMs: 2000,
  };
  /** When the last poll succeeded (browser clock), for the header and banner. */
  let lastOk = null;
  /** The pending poll, so that a new selection can poll at once. */
  let timer = null;

  /** Durations the way `seatgate status` prints them: 850ms, 42s, 3m05s, 1h02m. */
  function ago(ms) {
    ms = Math.max(0, ms);
    const s = Math.floor(ms / 1000);
    const two = (n) => String(n).padStart(2, "0");
    if (s === 0) return `${ms}ms`;
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${two(s % 60)}s`;
    return `${Math.floor(s / 3600)}h${two(Math.floor((s % 3600) / 60))}m`;
  }

  /** A moment as `2027-01-31 00:00 UTC`. */
  function utc(ms) {
    return `${new Date(ms).toISOString().slice(0, 16).replace("T", " ")} UTC`;
  }

  const count = (n) => n.toLocaleString("en-US");

  /**
   * `text` with every control character, format character (zero-width
   * spaces and joiners, bidirectional marks and overrides, U+FEFF) and line
   * or paragraph separator shown as `\u{…}`: a value some caller stored must
   * not hide itself or reorder the line it is on. (The terminal's views
   * escape the same: views::printable.)
   */
  const shown = (text) =>
    text.replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu, (c) => `\\u{${c.codePointAt(0).toString(16)}}`);

  /**
   * createElement with a class and children; strings become text nodes,
   * escaped (`shown`). The only way this script makes DOM.
   */
  function el(tag, className, ...children) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(shown(child)) : child);
    }
    return node;
  }

  /** A table with a header row; `cols` are [title, numeric?]. */
  function table(className, cols, rows) {
    const head = el("tr", null, ...cols.map(([title, num]) => el("th", num ? "num" : null, title)));
    const body = el("tbody");
    for (const row of rows) {
      body.append(
        el("tr", null, ...row.map((cell, i) => {
          const missing = cell === null || cell === undefined || cell === "";
          const cls = [cols[i][1] ? "num" : null, missing ? "dim" : null].filter(Boolean).join(" ");
          return el("td", cls || null, missing ? "—" : String(cell));
        })),
      );
    }
    return el("table", className, el("thead", null, head), body);
  }

  function level(row) {
    if (row.state !== "active" || row.seats_total <= 0) return "none";
    if (row.utilisation >= 1) return "full";
    return row.utilisation >= WARN_AT ? "warn" : "ok";
  }

  /** A utilisation bar for `row`. */
  function bar(row) {
    const fill = el("div", `fill ${level(row)}`);
    // A CSSOM property, not a style attribute: allowed by the page's CSP.
    fill.style.width = `${Math.min(100, 100 * row.utilisation)}%`;
    const node = el("div", "bar", fill);
    node.setAttribute("role", "meter");
    node.setAttribute("aria-label", `${row.license} seats in use`);
    node.setAttribute("aria-valuemin", "0");
    node.setAttribute("aria-valuemax", String(Math.max(0, row.seats_total)));
    node.setAttribute("aria-valuenow", String(row.seats_used));
    return node;
  }

  /** The badges of a license: why it hands out no seats, and its policies. */
  function badges(row, now) {
    const out = [];
    const badge = (cls, text) => out.push(el("span", `badge ${cls}`, text));
    if (row.state === "inactive") badge("bad", "INACTIVE");
    if (row.state === "expired") badge("bad", "EXPIRED");
    if (row.state === "invalid") badge("bad", `INVALID ${row.invalid ? row.invalid.field : ""}`.trim());
    if (row.state === "no_record") badge("bad", "NO RECORD");
    if (row.expires_at_ms > now) badge("info", `expires ${utc(row.expires_at_ms)}`);
    const p = row.policy || {};
    for (const [group, n] of Object.entries(p.group_reserve || {})) badge("policy", `reserve ${group} ${n}`);
    if (p.max_per_user != null) badge("policy", `≤${p.max_per_user} per user`);
    for (const [group, n] of Object.entries(p.group_max || {})) badge("policy", `${group} ≤${n}`);
    if (p.max_priority != null) badge("policy", `priority ≤${p.max_priority}`);
    if (p.linger_ms != null) badge("policy", `linger ${ago(p.linger_ms)}`);
    if (p.max_borrow_ms != null) badge("policy", `borrow ≤${ago(p.max_borrow_ms)}`);
    if (p.require_user) badge("policy", "user required");
    if (row.top_priority > 0) badge("info", `waiter priority ${row.top_priority}`);
    if (row.seats_lingering > 0) badge("info", `${row.seats_lingering} lingering`);
    if (row.seats_borrowed > 0) badge("info", `${row.seats_borrowed} borrowed`);
    return out;
  }

  /** The comparators of the sortable columns; ties go busiest first, then by name. */
  const byName = (a, b) => (a.license < b.license ? -1 : a.license > b.license ? 1 : 0);
  const keys = {
    license: (a, b) => byName(a, b),
    used: (a, b) => a.seats_used - b.seats_used || a.seats_total - b.seats_total,
    utilisation: (a, b) => a.utilisation - b.utilisation || a.waiting - b.waiting,
    waiting: (a, b) => a.waiting - b.waiting || a.utilisation - b.utilisation,
  };

  function sorted(rows) {
    const key = keys[state.sort];
    const dir = state.dir;
    return rows.slice().sort((a, b) => dir * key(a, b) || byName(a, b));
  }

  function renderHeader(summary) {
    const t = summary.totals;
    const left = t.licenses - t.active;
    // replaceChildren() would write a null as the text "null": the parts
    // that are not there are left out.
    const parts = [
      el("strong", null, count(t.active)), t.active === 1 ? " active license · " : " active licenses · ",
      el("strong", null, `${count(t.seats_used)} / ${count(t.seats_total)}`), " seats in use · ",
      el("strong", null, count(t.waiting)), " waiting",
      left > 0 ? el("span", "uncounted", ` · ${count(left)} inactive, expired or invalid (not counted)`) : null,
      summary.personal ? null : el("span", "uncounted", " · user, hardware and session ids hidden"),
    ];
    $("summary").replaceChildren(...parts.filter((p) => p !== null));
  }

  function renderSummary() {
    const summary = state.summary;
    if (!summary) return;
    renderHeader(summary);
    for (const th of document.querySelectorAll("#licenses th")) {
      const button = th.querySelector("button");
      const on = button && button.dataset.sort === state.sort;
      th.classList.toggle("sorted", !!on);
      th.classList.toggle("asc", !!on && state.dir > 0);
      if (on) th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
    const now = summary.at_ms;
    const matching = sorted(summary.licenses.filter((r) => r.license.toLowerCase().includes(state.filter)));
    const drawn = matching.slice(0, state.rows);
    $("licenses").tBodies[0].replaceChildren(...drawn.map((row) => {
      const link = el("a", "mono", row.license);
      link.href = `#license=${encodeURIComponent(row.license)}`;
      const tr = el("tr", row.state === "active" ? null : "inactive",
        el("td", "name", link),
        el("td", "num", `${count(row.seats_used)} / ${count(row.seats_total)}`),
        el("td", null, el("div", "util", bar(row), el("span", "pct", `${Math.round(100 * row.utilisation)}%`))),
        el("td", row.waiting > 0 ? "num queued" : "num", count(row.waiting)),
        el("td", null, el("div", "badges", ...badges(row, now))));
      tr.dataset.license = row.license;
      if (row.license === state.selected) tr.classList.add("selected");
      return tr;
    }));
    const total = summary.licenses.length;
    $("shown").textContent = state.filter
      ? `${count(matching.length)} of ${count(total)} licenses match`
      : `${count(total)} licenses`;
    const empty = $("empty");
    empty.hidden = matching.length > 0;
    empty.textContent = total === 0 ? "No licenses provisioned." : "No license matches the filter.";
    const more = $("more");
    const rest = matching.length - drawn.length;
    more.hidden = rest <= 0;
    more.textContent = `${count(rest)} more licenses — show ${count(Math.min(rest, ROWS))} more`;
  }

  /** "M more" under a paged table, with a button asking for more rows. */
  function moreRows(more) {
    if (more <= 0) return null;
    const button = el("button", "more", "Show more");
    button.type = "button";
    button.addEventListener("click", () => {
      state.limit += PAGE * 5;
      pollSoon();
    });
    return el("div", "more-rows", `${count(more)} more `, button);
  }

  function renderDetail() {
    const section = $("detail");
    if (!state.selected) {
      section.hidden = true;
      section.replaceChildren();
      return;
    }
    section.hidden = false;
    const close = el("a", "close", "× close");
    close.href = "#";
    const d = state.detail;
    if (!d || d.license !== state.selected) {
      const why = state.detailError || "Loading…";
      section.replaceChildren(el("div", "license", el("div", "license-head",
        el("h2", "mono", state.selected), close), el("div", "empty", why)));
      return;
    }
    const now = d.at_ms;
    const box = el("div", d.state === "active" ? "license" : "license inactive");
    box.dataset.license = d.license;
    const counts = el("div", "counts",
      el("strong", null, `${count(d.seats_used)} / ${count(d.seats_total)}`), " seats",
      " · ", el("span", d.waiting > 0 ? "queued" : null, `${count(d.waiting)} waiting`));
    box.append(el("div", "license-head", el("h2", "mono", d.license), ...badges(d, now), counts, close));
    box.append(bar(d));

    const held = Object.entries(d.held_by_group).filter(([, n]) => n > 0);
    const users = d.held_by_user
      ? Object.entries(d.held_by_user).filter(([, n]) => n > 0).map(([u, n]) => `${u} ${n}`).join(" · ")
      : null;
    box.append(el("div", "held",
      held.length > 0 ? `Held by group: ${held.map(([g, n]) => `${g} ${n}`).join(" · ")}. ` : null,
      `${count(d.users_holding)} ${d.users_holding === 1 ? "user holds" : "users hold"} seats`,
      users ? `: ${users}.` : "."));

    const holders = el("div", "holders", el("h3", null, `Holders (${count(d.seats_used)})`));
    if (d.holders.length === 0) holders.append(el("div", "empty", "No seat in use."));
    else {
      const cols = d.personal
        ? [["Session"], ["User"], ["Hardware"], ["Group"], ["Held for", true], ["Last heartbeat", true]]
        : [["Group"], ["Held for", true], ["Last heartbeat", true]];
      holders.append(table(d.personal ? "personal" : null, cols, d.holders.map((h) => {
        const timing = [
          ago(now - h.acquired_at_ms),
          // Lingering and borrowed seats need no heartbeats: show when they come back.
          h.lingering_until_ms != null ? `lingers ${ago(h.lingering_until_ms - now)}`
            : h.borrowed_until_ms != null ? `borrowed ${ago(h.borrowed_until_ms - now)}`
            : `${ago(now - h.last_heartbeat_ms)} ago`,
        ];
        return d.personal ? [h.session, h.user, h.hardware_id, h.group, ...timing] : [h.group, ...timing];
      })), moreRows(d.holders_more));
    }
    box.append(holders);

    const queue = el("div", "queue", el("h3", null, `Waiting (${count(d.waiting)})`));
    if (d.queue.length === 0) queue.append(el("div", "empty", "Nobody waiting."));
    else {
      const cols = d.personal
        ? [["#", true], ["Session"], ["User"], ["Group"], ["Priority", true], ["Waiting for", true], ["Gives up in", true]]
        : [["#", true], ["Group"], ["Priority", true], ["Waiting for", true], ["Gives up in", true]];
      queue.append(table(d.personal ? "personal" : null, cols, d.queue.map((w) => {
        const rest = [w.group, w.priority, ago(now - w.queued_at_ms), ago(w.deadline_ms - now)];
        return d.personal ? [w.position, w.session, w.user, ...rest] : [w.position, ...rest];
      })), moreRows(d.queue_more));
    }
    box.append(queue);
    section.replaceChildren(box);
  }

  function clock(date) {
    return date.toLocaleTimeString([], { hour12: false });
  }

  function showOk() {
    lastOk = new Date();
    $("banner").hidden = true;
    document.body.classList.remove("stale");
    const updated = $("updated");
    updated.className = "updated live";
    updated.textContent = `Live · last updated ${clock(lastOk)}`;
  }

  function showError(err) {
    const banner = $("banner");
    const since = lastOk ? ` Showing the data of ${clock(lastOk)}; retrying.` : " Retrying.";
    banner.replaceChildren(
      "Cannot reach seatgate/Redis. ",
      el("span", "detail-text", `${err.message}.${since}`),
    );
    banner.hidden = false;
    document.body.classList.add("stale");
    const updated = $("updated");
    updated.className = "updated down";
    updated.textContent = lastOk ? `Disconnected · last updated ${clock(lastOk)}` : "Disconnected";
  }

  /** GETs `url` as JSON; throws seatgate's one-line error, or the status. */
  async function getJson(url, signal) {
    const res = await fetch(url, { cache: "no-store", signal });
    let body = null;
    try {
      body = await res.json();
    } catch (_) {
      // Not seatgate's JSON (a proxy's page, say): the status code says enough.
    }
    if (!res.ok) {
      const error = new Error(body && typeof body.error === "string" ? body.error : `HTTP ${res.status}`);
      error.status = res.status;
      throw error;
    }
    return body;
  }

  async function poll() {
    timer = null;
    const abort = new AbortController();
    const giveUp = setTimeout(() => abort.abort(), TIMEOUT_MS);
    const selected = state.selected;
    try {
      const summary = getJson("status.json", abort.signal);
      const detail = selected
        ? getJson(`license.json?license=${encodeURIComponent(selected)}&limit=${state.limit}`, abort.signal)
          .then((d) => ({ d }), (e) => {
            if (e.status === 404) return { missing: e.message };
            throw e;
          })
        : Promise.resolve(null);
      const [s, d] = await Promise.all([summary, detail]);
      state.summary = s;
      state.refreshMs = Math.max(250, Number(s.refresh_ms) || 2000);
      if (selected === state.selected) {
        state.detail = d && d.d ? d.d : null;
        state.detailError = d && d.missing ? `${d.missing}.` : null;
      }
      renderSummary();
      renderDetail();
      showOk();
      // When the data was first on screen, for DevTools and the page test.
      if (performance.getEntriesByName("seatgate:first-render").length === 0) {
        performance.mark("seatgate:first-render");
      }
    } catch (err) {
      const message = err.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : err.message;
      showError(new Error(message.replace(/\.$/, "")));
    } finally {
      clearTimeout(giveUp);
      if (timer === null) timer = setTimeout(poll, state.refreshMs);
    }
  }

  /** Polls now rather than at the next interval (a new selection, more rows). */
  function pollSoon() {
    if (timer !== null) clearTimeout(timer);
    timer = setTimeout(poll, 0);
  }

  /** Follows `#license=<id>`; polls at once for a new selection unless told not to. */
  function select(pollNow = true) {
    const m = /^#license=(.+)$/.exec(location.hash);
    let id = null;
    try {
      id = m ? decodeURIComponent(m[1]) : null;
    } catch (_) {
      id = null;
    }
    if (id !== state.selected) {
      state.selected = id;
      state.detail = null;
      state.detailError = null;
      state.limit = PAGE;
    }
    renderSummary();
    renderDetail();
    if (id && pollNow === true) pollSoon();
  }

  $("filter").addEventListener("input", (e) => {
    state.filter = e.target.value.trim().toLowerCase();
    state.rows = ROWS;
    renderSummary();
  });
  $("more").addEventListener("click", () => {
    state.rows += ROWS;
    renderSummary();
  });
  for (const button of document.querySelectorAll("#licenses th button")) {
    button.addEventListener("click", () => {
      const key = button.dataset.sort;
      if (key === state.sort) state.dir = -state.dir;
      else {
        state.sort = key;
        state.dir = key === "license" ? 1 : -1;
      }
      renderSummary();
    });
  }
  $("licenses").tBodies[0].addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-license]");
    if (tr && !e.target.closest("a")) location.hash = `license=${encodeURIComponent(tr.dataset.license)}`;
  });
  window.addEventListener("hashchange", () => select(true));

  select(false);
  poll();
})();

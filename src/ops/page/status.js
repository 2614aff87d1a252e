// seatgate status page: polls status.json (the data of `seatgate status
// --json`) and redraws in place, without reloading the page.
//
// Every value from Redis (license and session ids, user emails, hardware ids)
// reaches the page through textContent or createTextNode, never innerHTML:
// metadata is whatever a client sent, and must show as text.
"use strict";

(() => {
  /** Time between the end of one poll and the start of the next. */
  const POLL_MS = 1000;
  /** A poll that takes longer counts as failed (the server gives up after 2 s). */
  const TIMEOUT_MS = 4000;
  /** Utilisation at or above which the bar turns amber. */
  const WARN_AT = 0.7;

  const $ = (id) => document.getElementById(id);
  /** When the last poll succeeded (browser clock), for the header and banner. */
  let lastOk = null;

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

  /**
   * createElement with a class and children; strings become text nodes.
   * The only way this script makes DOM.
   */
  function el(tag, className, ...children) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  /** A table with a header row; `cols` are [title, numeric?]. */
  function table(cols, rows) {
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
    const widths = el("colgroup", null, ...cols.map((_, i) => el("col", `c${i}`)));
    return el("table", null, widths, el("thead", null, head), body);
  }

  function level(used, total) {
    if (total <= 0) return "none";
    const ratio = used / total;
    if (ratio >= 1) return "full";
    return ratio >= WARN_AT ? "warn" : "ok";
  }

  function license(l, now) {
    const section = el("section", l.active ? "license" : "license inactive");
    section.dataset.license = l.license;

    const badges = [];
    if (!l.active) badges.push(el("span", "badge bad", "INACTIVE"));
    if (l.expires_at_ms > 0 && l.expires_at_ms <= now) badges.push(el("span", "badge bad", "EXPIRED"));
    else if (l.expires_at_ms > 0) badges.push(el("span", "badge info", `expires ${utc(l.expires_at_ms)}`));
    // A record that breaks the provisioning rules hands out no seat (LICENSE_INVALID).
    if (l.invalid) badges.push(el("span", "badge bad", `INVALID ${l.invalid.field}`));
    else if (l.seats_total <= 0) badges.push(el("span", "badge info", "no license record"));

    const counts = el("div", "counts",
      el("strong", null, `${l.seats_used} / ${l.seats_total}`), " seats",
      " · ", el("span", l.queue.length > 0 ? "queued" : null, `${l.queue.length} waiting`));
    section.append(el("div", "license-head", el("h2", "mono", l.license), ...badges, counts));

    const pct = l.seats_total > 0 ? Math.min(100, (100 * l.seats_used) / l.seats_total) : 0;
    const fill = el("div", `fill ${level(l.seats_used, l.seats_total)}`);
    // A CSSOM property, not a style attribute: allowed by the page's CSP.
    fill.style.width = `${pct}%`;
    const bar = el("div", "bar", fill);
    bar.setAttribute("role", "meter");
    bar.setAttribute("aria-label", `${l.license} seats in use`);
    bar.setAttribute("aria-valuemin", "0");
    bar.setAttribute("aria-valuemax", String(Math.max(0, l.seats_total)));
    bar.setAttribute("aria-valuenow", String(l.seats_used));
    section.append(bar);

    const holders = el("div", "holders", el("h3", null, `Holders (${l.holders.length})`));
    if (l.holders.length === 0) holders.append(el("div", "empty", "No seat in use."));
    else {
      holders.append(table(
        [["Session"], ["User"], ["Hardware"], ["Held for", true], ["Last heartbeat", true]],
        l.holders.map((h) => [
          h.session,
          h.user,
          h.hardware_id,
          ago(now - h.acquired_at_ms),
          // Lingering and borrowed seats need no heartbeats: show when they come back.
          h.lingering_until_ms != null ? `lingers ${ago(h.lingering_until_ms - now)}`
            : h.borrowed_until_ms != null ? `borrowed ${ago(h.borrowed_until_ms - now)}`
            : `${ago(now - h.last_heartbeat_ms)} ago`,
        ]),
      ));
    }
    section.append(holders);

    const queue = el("div", "queue", el("h3", null, `Waiting (${l.queue.length})`));
    if (l.queue.length === 0) queue.append(el("div", "empty", "Nobody waiting."));
    else {
      queue.append(table(
        [["#", true], ["Session"], ["User"], ["Waiting for", true], ["Gives up in", true]],
        l.queue.map((w) => [
          w.position,
          w.session,
          w.user,
          ago(now - w.queued_at_ms),
          ago(w.deadline_ms - now),
        ]),
      ));
    }
    section.append(queue);
    return section;
  }

  function render(status) {
    const now = status.at_ms;
    const ls = status.licenses;
    const used = ls.reduce((n, l) => n + l.seats_used, 0);
    const total = ls.reduce((n, l) => n + Math.max(0, l.seats_total), 0);
    const waiting = ls.reduce((n, l) => n + l.queue.length, 0);
    $("summary").replaceChildren(
      el("strong", null, String(ls.length)), ls.length === 1 ? " license · " : " licenses · ",
      el("strong", null, `${used} / ${total}`), " seats in use · ",
      el("strong", null, String(waiting)), " waiting",
    );
    const main = $("licenses");
    if (ls.length === 0) main.replaceChildren(el("div", "empty", "No licenses provisioned."));
    else main.replaceChildren(...ls.map((l) => license(l, now)));
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
    const since = lastOk ? ` Showing the data of ${clock(lastOk)}; retrying every second.` : " Retrying every second.";
    banner.replaceChildren(
      "Cannot reach seatgate/Redis. ",
      el("span", "detail", `${err.message}.${since}`),
    );
    banner.hidden = false;
    document.body.classList.add("stale");
    const updated = $("updated");
    updated.className = "updated down";
    updated.textContent = lastOk ? `Disconnected · last updated ${clock(lastOk)}` : "Disconnected";
  }

  async function poll() {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
    try {
      const res = await fetch("status.json", { cache: "no-store", signal: abort.signal });
      if (!res.ok) {
        let detail = `HTTP ${res.status}`;
        try {
          const body = await res.json();
          if (typeof body.error === "string") detail = body.error;
        } catch (_) {
          // Not seatgate's JSON error (a proxy's page, say): the status code says enough.
        }
        throw new Error(detail);
      }
      render(await res.json());
      showOk();
    } catch (err) {
      const message = err.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : err.message;
      showError(new Error(message.replace(/\.$/, "")));
    } finally {
      clearTimeout(timer);
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();

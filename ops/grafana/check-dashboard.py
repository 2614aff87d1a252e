#!/usr/bin/env python3
"""Fails if a panel of a Grafana dashboard would be empty at a 1 m scrape.

Every range selector of every panel target (`rate(x[$__rate_interval])`,
`increase(x[5m])`, ...) must span at least two samples at the slowest scrape
interval seatgate supports (1 m), however the Prometheus datasource is set
up. Grafana computes, per query:
  $__interval      = max(time range / max data points, min interval), where the
                     min interval is the panel's (or the target's) `interval`,
                     else the datasource's `timeInterval` (15 s when unset);
  $__rate_interval = max($__interval + scrape interval, 4 x scrape interval),
                     the scrape interval being the datasource's `timeInterval`
                     (15 s when unset).
The worst case is a short time range (the first term small) on a datasource
left at its default: $__rate_interval is then max(min interval + 15 s, 60 s),
which at a 1 m scrape often holds one sample, so rate() returns nothing. A
window of W seconds holds at least floor(W / 60) samples at a 1 m scrape:
it needs W >= 120 s. `$__range` is the dashboard's range (hours) and passes.
Usage: check-dashboard.py DASHBOARD.json...   (run by ops/check-prometheus.sh)
"""
import json
import re
import sys

SCRAPE = 60  # seconds: the slowest scrape interval to hold at
DEFAULT_TIME_INTERVAL = 15  # Grafana's assumption when the datasource says nothing
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration):
    """A Prometheus/Grafana duration ("2m", "1h30m", "90s") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration!r}")
    return sum(float(n) * UNITS[u] for n, u in parts)


def min_interval(*intervals):
    """The smallest $__interval: the largest min interval given, else the default."""
    given = [seconds(i.lstrip("><")) for i in intervals if i]
    return max(given) if given else DEFAULT_TIME_INTERVAL


def windows(expr, interval):
    """(selector text, worst-case seconds) of every range selector in expr."""
    out = []
    for m in re.finditer(r"\[([^\]:]+)(?::[^\]]*)?\]", expr):
        rng = m.group(1).strip()
        if rng == "$__rate_interval":
            w = max(interval + DEFAULT_TIME_INTERVAL, 4 * DEFAULT_TIME_INTERVAL)
        elif rng == "$__interval":
            w = interval
        elif rng == "$__range":
            continue
        else:
            w = seconds(rng)
        out.append((m.group(0), w))
    return out


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def check(path):
    with open(path) as f:
        dashboard = json.load(f)
    failures, checked = [], 0
    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            expr = t.get("expr")
            if not expr:
                continue
            interval = min_interval(p.get("interval"), t.get("interval"))
            for selector, w in windows(expr, interval):
                checked += 1
                if w < 2 * SCRAPE:
                    failures.append(
                        f"{path}: panel {p.get('title')!r}: {selector} spans {w:g} s at worst "
                        f"(min interval {interval:g} s): under {2 * SCRAPE} s it can hold one "
                        f"sample at a {SCRAPE} s scrape, and rate() is empty; set the panel's "
                        f"min interval (\"interval\": \"2m\") or a longer window"
                    )
    return failures, checked


def main(paths):
    failures, checked = [], 0
    for path in paths:
        f, n = check(path)
        failures += f
        checked += n
    for line in failures:
        print(line, file=sys.stderr)
    if failures:
        print(f"check-dashboard: {len(failures)} of {checked} range selectors too short for a 1 m scrape", file=sys.stderr)
        return 1
    print(f"check-dashboard: {checked} range selectors, each at least two samples at a 1 m scrape")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["ops/grafana/seatgate.json"]))

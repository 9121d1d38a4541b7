"""A crawl's state as an operator sees it (``crawlctl status``, the
scrape-time gauges of :mod:`crawld.metrics`).

:func:`shard_status` reads one shard atomically (one read-only script,
:meth:`crawld.frontier.Frontier.counts`; the same on Redis Cluster); :func:`crawl_status`
adds the totals; :func:`render` is the table.  All times are seconds.
:func:`render_crawls` is the table of ``crawlctl list`` (every crawl of a
Redis) and :func:`unserved_shards` the check ``crawlctl rebalance`` makes of
the shards no crawld serves.
"""

from __future__ import annotations

import json
from typing import Any

from . import keys
from .frontier import Frontier

#: per-shard fields, in table order: (key, column heading)
COLUMNS = (("queued", "queued"), ("hosts_waiting", "hosts"), ("claimed", "claimed"),
           ("oldest_claim_s", "oldest_claim_s"), ("expired", "expired"), ("skips", "to_record"),
           ("fetched", "fetched"), ("errors", "errors"), ("recorded", "recorded"), ("dead", "dead"),
           ("leaseholder", "leaseholder"))

#: row outcomes counted by the ack script (stats ``rows_<outcome>``)
FETCHED = ("fetched", "redirect")
RECORDED = ("blocked", "skipped")


def shard_status(frontier: Frontier, shard: int) -> dict[str, Any]:
    """One shard: ``queued`` URLs to fetch, ``hosts_waiting`` politeness
    keys on the schedule, ``claimed`` outstanding claims, ``expired`` claims
    past their visibility deadline, ``oldest_claim_s`` age of the oldest
    claim (0 when none), ``skips`` URLs waiting to be recorded, ``dead``
    dead letters, ``leaseholder`` token or None, ``fetched`` / ``errors`` /
    ``recorded`` rows acked by outcome, ``acked``, ``stats`` (every counter).

    Raises ``redis.RedisError``."""
    c = frontier.counts(shard)
    vt_us = frontier.config.visibility_timeout_s * 1e6
    stats = c["stats"]
    oldest = 0.0
    if c["oldest_deadline_us"] is not None:
        oldest = max(0.0, (c["now_us"] - (c["oldest_deadline_us"] - vt_us)) / 1e6)
    return {
        "shard": shard, "queued": c["queued"], "hosts_waiting": c["scheduled"], "claimed": c["claimed"],
        "expired": c["expired"], "oldest_claim_s": round(oldest, 3), "skips": c["skips"], "dead": c["dead"],
        "leaseholder": c["lease"], "acked": stats.get("acked", 0), "retried": stats.get("retried", 0),
        "fetched": sum(stats.get(f"rows_{o}", 0) for o in FETCHED), "errors": stats.get("rows_error", 0),
        "recorded": sum(stats.get(f"rows_{o}", 0) for o in RECORDED) + stats.get("dead", 0),
        "stats": stats,
    }


def slowed_domains(client, shard: int, only: set[str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Registered domains of shard number ``shard`` whose rate is adapted
    down after 429/503 answers (crawld.politeness; the state is the
    fleet's, shared by every crawl): ``[{"domain", "rate_rps",
    "ceiling_rps"}]``, slowest first, at most ``limit``; ``only`` keeps the
    domains of a crawl's scope.  Reads with HSCAN.  Raises ``redis.RedisError``."""
    from . import keys
    from .politeness import Adapt

    out = []
    for field, raw in client.hscan_iter(keys.shared_key(shard, "adapt"), count=1000):
        domain = field.decode("utf-8", "replace") if isinstance(field, bytes) else field
        if only is not None and domain not in only:
            continue
        a = Adapt.decode(raw)
        if a is None or a.interval <= 0:
            continue
        out.append({"domain": domain, "rate_rps": round(1e6 / a.interval, 3),
                    "ceiling_rps": round(1e6 / a.ceiling, 3) if a.ceiling > 0 else None})
    out.sort(key=lambda d: (d["rate_rps"], d["domain"]))
    return out[:limit] if limit is not None else out


def crawl_status(frontier: Frontier) -> dict[str, Any]:
    """Every shard of the crawl plus ``totals`` (sums; the oldest claim is
    the maximum; ``leased`` counts shards with a leaseholder),
    ``finished`` (every shard empty with nothing claimed) and ``state``
    (``active``, ``paused`` or ``cancelled``: :func:`crawld.keys.crawl_state`)."""
    from . import keys

    raw_state = frontier.client.get(keys.crawl_state(frontier.config.crawl_id))
    shards = [shard_status(frontier, s) for s in range(frontier.config.num_shards)]
    totals: dict[str, Any] = {}
    for name, _ in COLUMNS:
        if name == "leaseholder":
            totals["leased"] = sum(1 for s in shards if s["leaseholder"])
        elif name == "oldest_claim_s":
            totals[name] = max((s[name] for s in shards), default=0)
        else:
            totals[name] = sum(s[name] for s in shards)
    finished = all(s["queued"] == 0 and s["claimed"] == 0 and s["skips"] == 0 for s in shards)
    from .crawls import load_scope
    from .scope import scope_keys

    cfg = frontier.config
    scope = load_scope(frontier.client, cfg.crawl_id) | set(scope_keys(cfg))
    slowed = [dict(d, shard=s) for s in range(cfg.num_shards) for d in slowed_domains(frontier.client, s, scope)]
    slowed.sort(key=lambda d: (d["rate_rps"], d["domain"]))
    return {"crawl_id": cfg.crawl_id, "num_shards": cfg.num_shards,
            "shards": [{k: v for k, v in s.items() if k != "stats"} for s in shards],
            "totals": totals, "finished": finished, "state": raw_state.decode() if raw_state else "active",
            "max_rps_per_host": cfg.max_rps_per_host, "slowed": slowed,
            "robots_cut": sum(s["stats"].get("robots_cut", 0) for s in shards),
            "rate_cuts": sum(s["stats"].get("rate_cuts", 0) for s in shards)}


def render(st: dict[str, Any]) -> str:
    """The status as a fixed-width table, a totals line and the state."""
    heads = [h for _, h in COLUMNS]
    rows = [["shard", *heads]]
    for s in st["shards"]:
        rows.append([str(s["shard"]), *(_cell(s[k]) for k, _ in COLUMNS)])
    t = st["totals"]
    rows.append(["total", *(_cell(t[k]) if k != "leaseholder" else f"{t['leased']}/{st['num_shards']} leased"
                            for k, _ in COLUMNS)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i < len(r) - 1 else c for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    state = st.get("state", "active")
    if st["finished"]:
        progress = "finished (every shard empty, nothing claimed)"
    elif state == "paused":
        progress = f"not finished, nothing claimed until 'crawlctl resume --crawl-id {st['crawl_id']}'"
    elif state == "cancelled":
        progress = "not finished, no longer served (the rest stays unfetched)"
    else:
        progress = "running"
    for d in st.get("slowed", [])[:10]:
        lines.append(f"slowed down after 429/503: {d['domain']} (shard {d['shard']}) at {d['rate_rps']:g} req/s "
                     f"(crawl's max_rps_per_host {st['max_rps_per_host']:g}; last asked to slow down at "
                     f"{d['ceiling_rps']:g} req/s)")
    if len(st.get("slowed", [])) > 10:
        lines.append(f"... and {len(st['slowed']) - 10} more registered domain(s) slowed down (--json lists them)")
    if st.get("robots_cut"):
        lines.append(f"robots.txt cut at 500 KiB: {st['robots_cut']} origin(s) (the rules before the cut apply; "
                     "the worker log names them: event robots_txt_cut)")
    return f"crawl {st['crawl_id']}: {state}, {progress}\n" + "\n".join(lines)


#: ``crawlctl list`` columns, in table order: (key, column heading, numeric)
LIST_COLUMNS = (("crawl_id", "crawl_id", False), ("state", "state", False), ("num_shards", "shards", True),
                ("dedup", "dedup", False), ("queued", "queued", True), ("claimed", "claimed", True),
                ("fetched", "fetched", True), ("finished", "finished", False))


def render_crawls(crawls: list[dict[str, Any]]) -> str:
    """The crawls of a Redis as a fixed-width table (``crawlctl list``).

    ``crawls``: one dict per crawl, in the order to print, with the keys of
    :data:`LIST_COLUMNS` (``finished`` a bool) and ``error``: None, or for
    a crawl whose config is missing or invalid (``state`` ``broken``, the
    other values None) the one-line reason, printed under the table.
    Returns ``no crawls in this Redis`` for an empty list.  Pure: no I/O.
    """
    if not crawls:
        return "no crawls in this Redis"
    rows = [[h for _, h, _ in LIST_COLUMNS]]
    for c in crawls:
        rows.append([("yes" if c[k] else "no") if k == "finished" and c[k] is not None else _cell(c[k])
                     for k, _, _ in LIST_COLUMNS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(LIST_COLUMNS))]
    last = len(LIST_COLUMNS) - 1
    lines = ["  ".join(cell if i == last else cell.rjust(w) if LIST_COLUMNS[i][2] else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    for c in crawls:
        if c.get("error"):
            cid = c["crawl_id"]
            fix = (f"'crawlctl purge --crawl-id {cid} --force' deletes what is left of it"
                   if keys.CRAWL_ID_RE.match(cid)
                   else f"redis-cli SREM {keys.CRAWLS} {json.dumps(cid)} unregisters it")
            lines.append(f"crawl {cid} is broken: {c['error']}"
                         + ("" if "crawlctl purge" in c["error"] else f" ({fix})"))
    return "\n".join(lines)


def unserved_shards(specs: list[str], num_shards: int) -> list[int]:
    """Shards below ``num_shards`` that none of ``specs`` serves.

    ``specs``: the shard sets of the running crawld daemons, as they
    publish them (``"0-3"``, ``"0,2,5"``, ``"0-3,8"``: see
    :func:`crawld.daemon.parse_shard_set`); a malformed one serves nothing.
    Returns the unserved shard numbers, sorted (all of ``0..num_shards-1``
    when ``specs`` is empty).  Pure: no I/O, raises nothing.
    """
    from .config import ConfigError
    from .daemon import parse_shard_set

    served: set[int] = set()
    for spec in specs:
        try:
            served.update(parse_shard_set(str(spec)))
        except ConfigError:
            continue
    return [s for s in range(num_shards) if s not in served]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)

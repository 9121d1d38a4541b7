"""A crawl's state as an operator sees it (``crawlctl status``, the
scrape-time gauges of :mod:`crawld.metrics`).

:func:`shard_status` reads one shard atomically (one read-only script,
:meth:`crawld.frontier.Frontier.counts`; the same on Redis Cluster); :func:`crawl_status`
adds the totals; :func:`render` is the table.  All times are seconds.
"""

from __future__ import annotations

from typing import Any

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
        "leaseholder": c["lease"], "acked": stats.get("acked", 0),
        "fetched": sum(stats.get(f"rows_{o}", 0) for o in FETCHED), "errors": stats.get("rows_error", 0),
        "recorded": sum(stats.get(f"rows_{o}", 0) for o in RECORDED) + stats.get("dead", 0),
        "stats": stats,
    }


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
    return {"crawl_id": frontier.config.crawl_id, "num_shards": frontier.config.num_shards,
            "shards": [{k: v for k, v in s.items() if k != "stats"} for s in shards],
            "totals": totals, "finished": finished, "state": raw_state.decode() if raw_state else "active"}


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
    return f"crawl {st['crawl_id']}: {state}, {progress}\n" + "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)

"""Shard balance: how a set of politeness keys and their weights spreads
over a crawl's shards (``crawlctl shard-balance``).

A shard is served by one worker process, so the shard holding the most
URLs sets the crawl's wall time.  The *imbalance ratio* is the heaviest
shard's weight over the mean shard weight: 1.0 is a perfect spread, 2.0
means one worker has twice its fair share.  Known-large registered domains
can be pinned to chosen shards with the crawl setting ``shard_overrides``
(see :func:`crawld.sharding.shard_for`); this module shows the effect
before (``--hosts``) or during (``--crawl-id``) a crawl.

Everything here is pure except :func:`read_crawl_weights`, which reads a
crawl's frontier from Redis with HSCAN/ZSCAN (never KEYS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from . import keys
from .sharding import politeness_key, shard_for
from .urls import BadURL, canonicalize, url_host

#: heaviest politeness keys listed by default.
TOP_KEYS = 5


class HostsError(ValueError):
    """A line of a hosts file that cannot be read; ``str(err)`` is
    ``"<source>:<line>: <what is wrong>"``."""


@dataclass(frozen=True)
class ShardLoad:
    """One shard's share: ``keys`` politeness keys weighing ``weight`` URLs."""

    shard: int
    keys: int
    weight: float


def parse_host_line(line: str) -> tuple[str, float] | None:
    """``(politeness key, weight)`` of one hosts-file line, or None for a
    blank or comment line.

    A line is a host name or an http(s) URL, optionally followed by
    whitespace and a weight (expected URL count, a number >= 0; default 1).
    ``#`` starts a comment when it begins the line or a word.

    Raises:
        ValueError: not a host or URL, a bad weight, or extra words.
    """
    words = line.split()
    for i, w in enumerate(words):
        if w.startswith("#"):
            words = words[:i]
            break
    if not words:
        return None
    if len(words) > 2:
        raise ValueError(f"expected HOST_OR_URL [WEIGHT], got {len(words)} words")
    target = words[0]
    url = target if "://" in target else f"http://{target}/"
    try:
        host = url_host(canonicalize(url))
    except BadURL as exc:
        raise ValueError(f"{target!r} is not a host or http(s) URL ({exc})") from None
    if not host:
        raise ValueError(f"{target!r} has no host")
    weight = 1.0
    if len(words) == 2:
        try:
            weight = float(words[1])
        except ValueError:
            raise ValueError(f"weight {words[1]!r} is not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight {words[1]!r} must be a finite number >= 0")
    return politeness_key(host), weight


def parse_hosts(lines: Iterable[str], source: str = "-") -> dict[str, float]:
    """Weights per politeness key from hosts-file ``lines`` (see
    :func:`parse_host_line`): hosts of one registered domain, and repeated
    lines, add up.

    Raises:
        HostsError: naming ``source`` and the line number.
    """
    weights: dict[str, float] = {}
    for n, line in enumerate(lines, 1):
        try:
            parsed = parse_host_line(line)
        except ValueError as exc:
            raise HostsError(f"{source}:{n}: {exc}") from None
        if parsed is not None:
            pkey, w = parsed
            weights[pkey] = weights.get(pkey, 0.0) + w
    return weights


def shard_loads(weights: Mapping[str, float], num_shards: int,
                overrides: Mapping[str, int] | None = None) -> list[ShardLoad]:
    """Keys and weight of every shard ``0..num_shards-1`` (empty ones too),
    routing each politeness key with :func:`crawld.sharding.shard_for`."""
    counts = [0] * num_shards
    totals = [0.0] * num_shards
    for pkey, w in weights.items():
        s = shard_for(pkey, num_shards, overrides)
        counts[s] += 1
        totals[s] += w
    return [ShardLoad(s, counts[s], totals[s]) for s in range(num_shards)]


def imbalance_ratio(loads: list[ShardLoad]) -> float:
    """Heaviest shard weight / mean shard weight (over all shards, empty
    ones included); 1.0 when nothing weighs anything."""
    total = sum(ld.weight for ld in loads)
    if not loads or total <= 0:
        return 1.0
    return max(ld.weight for ld in loads) / (total / len(loads))


def heaviest(weights: Mapping[str, float], num_shards: int, overrides: Mapping[str, int] | None = None,
             n: int = TOP_KEYS) -> list[dict[str, Any]]:
    """The ``n`` heaviest politeness keys (ties by name), each as
    ``{"key", "weight", "shard", "pinned"}``."""
    top = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    ov = overrides or {}
    return [{"key": k, "weight": w, "shard": shard_for(k, num_shards, ov), "pinned": k in ov} for k, w in top]


def balance_report(weights: Mapping[str, float], num_shards: int, overrides: Mapping[str, int] | None = None,
                   *, top: int = TOP_KEYS, found_in: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The JSON-able report of ``crawlctl shard-balance``.

    ``found_in`` (politeness key -> shard it is stored in now, from a
    running crawl) adds ``moved``: the keys and weight that ``num_shards``
    and ``overrides`` would place on another shard.
    """
    loads = shard_loads(weights, num_shards, overrides)
    total = sum(ld.weight for ld in loads)
    report: dict[str, Any] = {
        "num_shards": num_shards,
        "shard_overrides": dict(sorted((overrides or {}).items())),
        "keys": len(weights),
        "weight": total,
        "mean": total / num_shards,
        "max": max(ld.weight for ld in loads),
        "imbalance": imbalance_ratio(loads),
        "shards": [{"shard": ld.shard, "keys": ld.keys, "weight": ld.weight,
                    "share": (100.0 * ld.weight / total) if total > 0 else 0.0} for ld in loads],
        "top": heaviest(weights, num_shards, overrides, top),
    }
    if found_in is not None:
        moved = [k for k, s in found_in.items() if shard_for(k, num_shards, overrides) != s]
        report["moved"] = {"keys": len(moved), "weight": sum(weights.get(k, 0.0) for k in moved)}
    return report


def _num(v: float) -> str:
    """A weight for people: an integer when it is one, else 2 decimals."""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def format_report(report: Mapping[str, Any]) -> str:
    """``report`` (from :func:`balance_report`) as aligned text."""
    rows = [("shard", "keys", "weight", "share")]
    for s in report["shards"]:
        rows.append((str(s["shard"]), str(s["keys"]), _num(s["weight"]), f"{s['share']:.1f}%"))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(f"{c:>{w[i]}}" for i, c in enumerate(r)) for r in rows]
    lines.append(f"imbalance {report['imbalance']:.2f} (max {_num(report['max'])} / mean {report['mean']:.2f}; "
                 f"{report['num_shards']} shards, {report['keys']} keys, weight {_num(report['weight'])})")
    if report["shard_overrides"]:
        lines.append("overrides " + ", ".join(f"{k}={v}" for k, v in report["shard_overrides"].items()))
    if "moved" in report:
        lines.append(f"moved {report['moved']['keys']} keys (weight {_num(report['moved']['weight'])}) "
                     "would change shard from where the crawl holds them")
    if report["top"]:
        lines.append("heaviest keys:")
        kw = max(len(t["key"]) for t in report["top"])
        ww = max(len(_num(t["weight"])) for t in report["top"])
        for t in report["top"]:
            lines.append(f"  {t['key']:<{kw}}  {_num(t['weight']):>{ww}}  shard {t['shard']}"
                         + ("  (pinned)" if t["pinned"] else ""))
    return "\n".join(lines)


def _text(v: bytes | str) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def read_crawl_weights(client, crawl_id: str, num_shards: int,
                       batch: int = 1000, private: bool = True) -> tuple[dict[str, float], dict[str, int]]:
    """``(weights, found_in)`` of a crawl's politeness keys, from Redis.

    A key's weight is the URLs queued for fetching so far: the larger of its
    hosts' page-budget counters (every URL ever queued; kept when
    ``max_pages_per_host`` > 0) and the URLs queued now plus claimed now.
    ``found_in`` is the shard each key is stored in.  Reads with ZSCAN and
    HSCAN in batches of ``batch``, never KEYS.  ``private`` is the crawl's
    ``psl_private_domains``.
    """
    sep = b"\x1f"
    weights: dict[str, float] = {}
    found_in: dict[str, int] = {}
    for shard in range(num_shards):
        k = keys.shard_keys(crawl_id, shard)
        live: dict[str, int] = {}
        for member, _ in client.zscan_iter(k.queue, count=batch):
            m = member if isinstance(member, bytes) else member.encode("utf-8")
            pkey = _text(m.split(sep, 1)[0])
            live[pkey] = live.get(pkey, 0) + 1
        for _, value in client.hscan_iter(k.claims, count=batch):
            v = value if isinstance(value, bytes) else value.encode("utf-8")
            parts = v[1:].split(sep, 3)  # state, then pkey, attempts, mode, payload
            if len(parts) == 4 and parts[0] and not parts[2]:
                pkey = _text(parts[0])
                live[pkey] = live.get(pkey, 0) + 1
        budget: dict[str, int] = {}
        for host, count in client.hscan_iter(k.budget, count=batch):
            try:
                pkey = politeness_key(_text(host), private)
                budget[pkey] = budget.get(pkey, 0) + int(count)
            except ValueError:
                continue
        for pkey in live.keys() | budget.keys():
            weights[pkey] = weights.get(pkey, 0.0) + float(max(live.get(pkey, 0), budget.get(pkey, 0)))
            found_in[pkey] = shard
    return weights, found_in

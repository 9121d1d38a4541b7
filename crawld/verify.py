"""``crawlctl verify``: the audit checklist of a finished crawl.

Each check is a pure function of data already read (the shards' state in
Redis as :func:`crawld.status.shard_status` returns it, facts read from the
Parquet artifact, the merge records of the crawl's family) returning a
:class:`Check`: its ``name``, whether it passed (``ok``) and ``figures``, one
line saying what was measured.  I/O is at the edges: :func:`read_artifact`,
:func:`record_merge` / :func:`merge_records` and :func:`run_checks`.

The checks, in order:

``shards_drained``
    per shard, no URL queued to fetch (``queue`` zset) and none waiting to
    be recorded without a fetch (``skips`` list).
``claimed_empty``
    no outstanding claim (``claimed`` zset) in any shard.
``visited_vs_rows``
    per shard and in total, the rows the frontier acknowledged — stats
    ``acked`` (every ack is of a claim whose row was made durable first,
    fetched or recorded, see ``crawld/lua/ack.lua``) plus the dead letters
    (the ``dead`` list; :func:`crawld.crawls.export_dead_letters` turns each
    into a ``dead_letter`` row at merge time), less the URLs queued again by
    ``crawlctl retry`` (stats ``retried``: acked again, one row kept) — against the distinct
    ``canonical_url`` rows of that shard (``shard`` column) in the artifact,
    within a relative tolerance (default 2 %).  A shard with acknowledged
    rows and none in the artifact (its parts missing) fails whatever the
    tolerance.
``row_count_vs_previous``
    the artifact's row count against that of the previous crawl of the same
    family (:attr:`crawld.config.CrawlConfig.family_name`), within a
    relative band (default ±25 %).  The previous crawl is the most recent
    other crawl of the family created before this one (ties on
    ``created_at`` broken by merge time), from the merge records that every
    merge writes (:func:`record_merge`, key
    :func:`crawld.keys.family_merges`).
``politeness``
    no registered domain above the crawl's ``max_rps_per_host`` (requests/s)
    judged from the ``fetched_at`` times (request start, UTC ms) of the rows
    that made a request: outcomes ``fetched`` and ``redirect``, and
    ``error`` rows with a status or a response time.  Rows are grouped by
    the politeness key of their ``host`` (:func:`crawld.sharding.politeness_key`).
    Bounds are those of DESIGN.md promise 2 for a rate R and a GCRA bucket
    of at most 2 tokens, as :func:`crawld.ratecheck.rate_violations`
    applies them: no closed 1 s window with more than ceil(R)+1 requests and
    no 10 s window with more than 10R+ceil(R)+1.  robots.txt requests and
    retried attempts leave no row, so this is a lower bound of what the
    server saw; the server-side measurement is in the tests.
``no_duplicates``
    no two artifact rows with the same ``canonical_url``, and no duplicate
    dropped at merge whose kept row came from another shard
    (:attr:`crawld.merge.MergeResult.cross_shard_duplicates`, from the merge
    record).  Duplicates within one shard (a killed worker's row written
    again after reclaim) are expected and dropped by the merge.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from . import keys
from .config import CrawlConfig
from .ratecheck import limits, max_in_window, rate_violations
from .sharding import politeness_key

#: relative tolerance of ``visited_vs_rows`` (fraction; 0.02 = 2 %)
DEFAULT_TOLERANCE = 0.02
#: relative band of ``row_count_vs_previous`` (fraction; 0.25 = ±25 %)
DEFAULT_BAND = 0.25
#: outcomes whose row is a request to the host
REQUEST_OUTCOMES = ("fetched", "redirect")
#: names of the checks, in the order they run and print
CHECK_NAMES = ("shards_drained", "claimed_empty", "visited_vs_rows", "row_count_vs_previous",
               "politeness", "no_duplicates")
#: at most this many shards or domains are named in a line
MAX_NAMED = 8


@dataclass(frozen=True)
class Check:
    """One check's result: ``figures`` says what was measured (one line);
    ``data`` holds the same figures for ``--json``."""

    name: str
    ok: bool
    figures: str
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """``PASS name: figures`` or ``FAIL name: figures``."""
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.figures}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "figures": self.figures, **self.data}


def _pct(x: float) -> str:
    return f"{x * 100:g} %"


def _named(items: list[str], total: int | None = None) -> str:
    shown = items[:MAX_NAMED]
    more = (total if total is not None else len(items)) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


# -- the checks (pure) --------------------------------------------------------

def check_shards_drained(shards: list[dict[str, Any]]) -> Check:
    """Every shard has ``queued`` == 0 (URLs to fetch) and ``skips`` == 0
    (URLs to record).  ``shards``: :func:`crawld.status.shard_status` dicts."""
    queued = sum(s["queued"] for s in shards)
    skips = sum(s["skips"] for s in shards)
    busy = [s for s in shards if s["queued"] or s["skips"]]
    data = {"queued": queued, "to_record": skips,
            "shards": {str(s["shard"]): {"queued": s["queued"], "to_record": s["skips"]} for s in busy}}
    if not busy:
        return Check("shards_drained", True, f"{len(shards)} shard(s): 0 URLs queued to fetch, "
                                             "0 waiting to be recorded", data)
    named = [f"shard {s['shard']} queued={s['queued']} to_record={s['skips']}" for s in busy]
    return Check("shards_drained", False,
                 f"{_named(named)} ({len(busy)} of {len(shards)} shard(s) not drained; "
                 f"queued={queued} to_record={skips} in total)", data)


def check_claimed_empty(shards: list[dict[str, Any]]) -> Check:
    """No shard has an outstanding claim (``claimed``)."""
    claimed = sum(s["claimed"] for s in shards)
    busy = [s for s in shards if s["claimed"]]
    data = {"claimed": claimed, "shards": {str(s["shard"]): s["claimed"] for s in busy}}
    if not busy:
        return Check("claimed_empty", True, f"0 outstanding claims in {len(shards)} shard(s)", data)
    named = [f"shard {s['shard']} claimed={s['claimed']} (expired={s.get('expired', 0)}, "
             f"oldest {s.get('oldest_claim_s', 0):.1f} s)" for s in busy]
    return Check("claimed_empty", False,
                 f"{_named(named)} ({claimed} claim(s) in {len(busy)} of {len(shards)} shard(s))", data)


def check_visited_vs_rows(shards: list[dict[str, Any]], rows_by_shard: dict[int | None, int],
                          tolerance: float = DEFAULT_TOLERANCE, spilled: int = 0,
                          per_shard: bool = True) -> Check:
    """Per shard and in total, rows acknowledged by the frontier
    (``acked`` + ``dead``) against the artifact's distinct rows of that shard
    (``rows_by_shard``: shard -> rows; None for rows without a shard), within
    ``tolerance`` (a fraction of the acknowledged count).  A shard with
    acknowledged rows and none in the artifact is reported as missing.
    ``spilled`` rows (memory back-pressure, not in ``rows_by_shard``) are
    only reported.  With ``per_shard`` false (a rebalanced crawl: rows keep
    the shard that wrote them, while the counters of removed shards went to
    shard 0, and a shard removed then added again starts over) only the
    total is judged; the per-shard figures stay in ``data``."""
    # a URL queued again by 'crawlctl retry' is acked again, while the
    # artifact keeps one row of it (the newest)
    expected = {s["shard"]: s["acked"] + s["dead"] - s.get("retried", 0) for s in shards}
    retried = sum(s.get("retried", 0) for s in shards)
    acked = sum(s["acked"] for s in shards) - retried
    dead = sum(s["dead"] for s in shards)
    bad: list[str] = []
    missing: list[int] = []
    per: dict[str, Any] = {}
    for shard in sorted(set(expected) | set(rows_by_shard), key=lambda x: (x is None, x if x is not None else 0)):
        want, got = expected.get(shard, 0), rows_by_shard.get(shard, 0)
        per[str(shard)] = {"acked_dead": want, "artifact": got}
        if not per_shard:
            continue
        label = "shard ?" if shard is None else f"shard {shard}"
        if want and not got:
            missing.append(shard)
            bad.append(f"{label} missing: {want} acked+dead, 0 rows in artifact")
        elif abs(got - want) > tolerance * want:
            note = "" if shard in expected else " (not a shard of this crawl)"
            bad.append(f"{label}: {want} acked+dead vs {got} rows ({_rel(got, want)}){note}")
    total_want, total_got = acked + dead, sum(rows_by_shard.values())
    total_ok = abs(total_got - total_want) <= tolerance * total_want
    data = {"acked": acked, "dead": dead, "retried": retried, "artifact_rows": total_got, "tolerance": tolerance,
            "missing_shards": missing, "shards": per}
    total = (f"total {total_want} acked+dead ({acked} acked"
             + (f" besides {retried} retried" if retried else "") + f", {dead} dead) vs {total_got} distinct rows "
             f"in artifact ({_rel(total_got, total_want)}, tolerance {_pct(tolerance)})"
             + (f"; {spilled} links recorded under memory back-pressure not counted" if spilled else ""))
    data["spilled"] = spilled
    data["per_shard_judged"] = per_shard
    if not bad and total_ok:
        if not per_shard:
            return Check("visited_vs_rows", True, f"{total}; per-shard counts not compared (the crawl was "
                                                  "rebalanced)", data)
        return Check("visited_vs_rows", True, f"{len(shards)} shard(s) within tolerance; {total}", data)
    return Check("visited_vs_rows", False, (f"{_named(bad)}; " if bad else "") + total, data)


def _rel(got: float, want: float) -> str:
    if want == 0:
        return "+0 %" if got == 0 else "+inf %"
    return f"{(got - want) / want * 100:+.1f} %"


def check_row_count_vs_previous(rows: int, family: str, previous: tuple[str, dict[str, Any]] | None,
                                band: float = DEFAULT_BAND) -> Check:
    """``rows`` (the artifact's) within ``band`` (a fraction) of the rows of
    the previous crawl of ``family``: ``previous`` is ``(crawl_id, merge
    record)`` (see :func:`previous_crawl`) or None (then it passes)."""
    if previous is None:
        return Check("row_count_vs_previous", True,
                     f"no previous crawl of family {family!r} ({rows} rows)",
                     {"rows": rows, "family": family, "previous": None, "band": band})
    prev_id, rec = previous
    prev_rows = int(rec.get("rows") or 0)
    ok = abs(rows - prev_rows) <= band * prev_rows
    data = {"rows": rows, "family": family, "previous": prev_id, "previous_rows": prev_rows, "band": band}
    return Check("row_count_vs_previous", ok,
                 f"{rows} rows vs {prev_rows} of previous crawl {prev_id} of family {family!r} "
                 f"(created {rec.get('created_at', '?')}; {_rel(rows, prev_rows)}, band ±{_pct(band)})", data)


def check_politeness(times_by_key: dict[str, list[float]], rps: float) -> Check:
    """No politeness key above ``rps`` requests/s: ``times_by_key`` maps a
    registered domain to its request start times (s).  Bounds of DESIGN.md
    promise 2 via :func:`crawld.ratecheck.rate_violations`."""
    lim1, lim10 = limits(rps)
    requests = sum(len(t) for t in times_by_key.values())
    bad = rate_violations(times_by_key, rps)
    head = (f"{requests} request(s) to {len(times_by_key)} registered domain(s) at max_rps_per_host={rps:g} "
            f"(limits {lim1} per 1 s window, {lim10:g} per 10 s window)")
    data: dict[str, Any] = {"requests": requests, "domains": len(times_by_key), "max_rps_per_host": rps,
                            "limit_1s": lim1, "limit_10s": lim10}
    if not bad:
        busiest1 = max(((max_in_window(t, 1.0), k) for k, t in times_by_key.items()), default=(0, "-"))
        busiest10 = max(((max_in_window(t, 10.0), k) for k, t in times_by_key.items()), default=(0, "-"))
        data.update(busiest_1s=busiest1[0], busiest_10s=busiest10[0])
        return Check("politeness", True, f"{head}; busiest 1 s window {busiest1[0]} ({busiest1[1]}), "
                                         f"busiest 10 s window {busiest10[0]} ({busiest10[1]})", data)
    worst = sorted(bad.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
    data["violations"] = {k: {"1s": m1, "10s": m10} for k, (m1, m10) in worst}
    named = [f"{k} 1s={m1} 10s={m10}" for k, (m1, m10) in worst]
    return Check("politeness", False, f"{len(bad)} domain(s) above the rate: {_named(named)}; {head}", data)


def check_no_duplicates(rows: int, duplicate_rows: int, duplicate_examples: list[str],
                        merge_record: dict[str, Any] | None) -> Check:
    """Zero rows sharing a ``canonical_url`` in the artifact (``rows`` rows,
    ``duplicate_rows`` beyond the first of each URL) and zero cross-shard
    duplicates dropped at merge (``merge_record['cross_shard_duplicates']``;
    unknown without a record, which does not fail the check)."""
    cross = None if merge_record is None else merge_record.get("cross_shard_duplicates")
    dropped = None if merge_record is None else merge_record.get("duplicates")
    data = {"rows": rows, "duplicate_rows": duplicate_rows, "merge_duplicates_dropped": dropped,
            "cross_shard_duplicates": cross}
    if cross is None:
        merge = "cross-shard duplicates at merge unknown (merge not recorded in Redis)"
    else:
        merge = f"merge dropped {dropped} duplicate(s), {cross} of them cross-shard"
    ok = duplicate_rows == 0 and not cross
    if duplicate_rows:
        ex = ", ".join(duplicate_examples[:3])
        return Check("no_duplicates", False, f"{duplicate_rows} duplicate canonical_url row(s) among {rows} "
                                             f"in the artifact (e.g. {ex}); {merge}", data)
    return Check("no_duplicates", ok, f"0 duplicate canonical_url rows among {rows} in the artifact; {merge}", data)


# -- artifact -----------------------------------------------------------------

@dataclass
class ArtifactFacts:
    """What the checks need from an artifact: ``rows`` in all,
    ``distinct_by_shard`` (first row of each canonical URL, by ``shard``),
    ``duplicate_rows`` (rows beyond the first of a URL) with a few example
    URLs, and ``request_times`` (registered domain -> request start times
    in Unix seconds).  ``spilled`` rows (links recorded instead of queued
    under Redis memory back-pressure) stand for no claim, so they are left
    out of ``distinct_by_shard``."""

    rows: int = 0
    distinct_by_shard: dict[int | None, int] = field(default_factory=dict)
    spilled: int = 0  # rows of links recorded under Redis memory back-pressure (never acked)
    duplicate_rows: int = 0
    duplicate_examples: list[str] = field(default_factory=list)
    request_times: dict[str, list[float]] = field(default_factory=dict)


def made_request(outcome: str | None, status: int | None, response_ms: float | None) -> bool:
    """Whether a row stands for a request sent to its host: outcomes
    ``fetched`` / ``redirect``, or ``error`` with a status or a response
    time."""
    if outcome in REQUEST_OUTCOMES:
        return True
    return outcome == "error" and (status is not None or bool(response_ms))


def artifact_facts(batches: Iterable[dict[str, list[Any]]], private: bool = True) -> ArtifactFacts:
    """Fold column batches (``canonical_url``, ``shard``, ``outcome``,
    ``status``, ``response_ms``, ``host``, ``fetched_at`` as Unix ms) into
    :class:`ArtifactFacts`; ``private`` is the crawl's
    ``psl_private_domains`` (how hosts group into registered domains).
    Memory: one entry per distinct URL plus one float per request."""
    from .urls import fingerprint

    facts = ArtifactFacts()
    seen: set[bytes] = set()
    by_shard: Counter = Counter()
    times: dict[str, list[float]] = {}
    for b in batches:
        errors = b.get("error") or [None] * len(b["canonical_url"])
        for canon, shard, outcome, status, rms, host, at, err in zip(
                b["canonical_url"], b["shard"], b["outcome"], b["status"], b["response_ms"], b["host"],
                b["fetched_at"], errors):
            facts.rows += 1
            if outcome == "skipped" and err == SPILL_REASON:
                facts.spilled += 1
                continue
            fp = fingerprint(canon or "")
            if fp in seen:
                facts.duplicate_rows += 1
                if len(facts.duplicate_examples) < 3:
                    facts.duplicate_examples.append(canon)
            else:
                seen.add(fp)
                by_shard[shard] += 1
            if host and at is not None and made_request(outcome, status, rms):
                try:
                    key = politeness_key(host, private)
                except ValueError:
                    continue
                times.setdefault(key, []).append(at / 1000.0)
    facts.distinct_by_shard = dict(by_shard)
    facts.request_times = times
    return facts


_COLUMNS = ["canonical_url", "shard", "outcome", "status", "response_ms", "host", "fetched_at", "error"]

#: the error of rows recorded under memory back-pressure (crawld.crawlshard)
SPILL_REASON = "memory_backpressure"


def read_artifact(path: str | os.PathLike, private: bool = True) -> ArtifactFacts:
    """Read the columns the checks need, a row group at a time.

    Raises:
        OSError: no such file.
        pyarrow.ArrowException: not a readable Parquet artifact.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)

    def batches():
        for batch in pf.iter_batches(columns=_COLUMNS, batch_size=65536):
            cols = {n: batch.column(n) for n in _COLUMNS}
            cols["fetched_at"] = pc.cast(cols["fetched_at"], pa.int64())
            yield {n: c.to_pylist() for n, c in cols.items()}
    return artifact_facts(batches(), private)


# -- merge records ------------------------------------------------------------

def utc_now() -> str:
    """Now as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (sorts as text)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def merge_record(config: CrawlConfig, result: Any, merged_at: str | None = None) -> dict[str, Any]:
    """The record of one merge (``result``: a :class:`crawld.merge.MergeResult`)."""
    return {"rows": result.rows, "duplicates": result.duplicates,
            "cross_shard_duplicates": getattr(result, "cross_shard_duplicates", 0),
            "torn_lines_skipped": result.bad_lines, "parts": result.parts,
            "created_at": config.created_at, "merged_at": merged_at or utc_now(),
            "artifact": str(result.path)}


def record_merge(client: Any, config: CrawlConfig, result: Any) -> dict[str, Any]:
    """Store the merge of ``config``'s crawl under its family
    (:func:`crawld.keys.family_merges`, field = crawl id); a new merge of the
    same crawl replaces its record.  Raises ``redis.RedisError``."""
    rec = merge_record(config, result)
    client.hset(keys.family_merges(config.family_name), config.crawl_id, json.dumps(rec, sort_keys=True))
    return rec


def merge_records(client: Any, family: str) -> dict[str, dict[str, Any]]:
    """Every merge record of ``family``: crawl id -> record (unreadable
    records are ignored).  Raises ``redis.RedisError``."""
    out = {}
    for cid, raw in client.hgetall(keys.family_merges(family)).items():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out[cid.decode() if isinstance(cid, bytes) else cid] = rec
    return out


def previous_crawl(records: dict[str, dict[str, Any]], crawl_id: str,
                   created_at: str) -> tuple[str, dict[str, Any]] | None:
    """The most recent crawl of ``records`` other than ``crawl_id`` created
    before it (``created_at``, UTC ISO-8601; on equal ``created_at`` the one
    merged earlier counts as before), or None."""
    mine = records.get(crawl_id)
    my_key = (created_at, mine.get("merged_at", "") if mine else "\uffff")
    cands = [((str(r.get("created_at", "")), str(r.get("merged_at", ""))), cid, r)
             for cid, r in records.items() if cid != crawl_id]
    cands = [c for c in cands if c[0] < my_key]
    if not cands:
        return None
    _, cid, rec = max(cands, key=lambda c: (c[0], c[1]))
    return cid, rec


# -- putting it together ------------------------------------------------------

def default_artifact(config: CrawlConfig, record: dict[str, Any] | None) -> Path:
    """Where the crawl's artifact is: its merge record's, else the standard
    path under the crawl's output."""
    from .merge import artifact_path

    if record and record.get("artifact"):
        return Path(record["artifact"])
    return artifact_path(config.output, config.crawl_id, config.created_at)


def evaluate(config: CrawlConfig, shards: list[dict[str, Any]], facts: ArtifactFacts,
             records: dict[str, dict[str, Any]], tolerance: float = DEFAULT_TOLERANCE,
             band: float = DEFAULT_BAND, rebalanced: bool = False) -> list[Check]:
    """Every check, from data already read (pure).  ``rebalanced``: the
    crawl's shard count was changed by ``crawlctl rebalance``; then
    ``visited_vs_rows`` judges the total only (see
    :func:`check_visited_vs_rows`)."""
    return [
        check_shards_drained(shards),
        check_claimed_empty(shards),
        check_visited_vs_rows(shards, facts.distinct_by_shard, tolerance, spilled=facts.spilled,
                              per_shard=not rebalanced),
        check_row_count_vs_previous(facts.rows, config.family_name,
                                    previous_crawl(records, config.crawl_id, config.created_at), band),
        check_politeness(facts.request_times, config.max_rps_per_host),
        check_no_duplicates(facts.rows, facts.duplicate_rows, facts.duplicate_examples,
                            records.get(config.crawl_id)),
    ]


def run_checks(client: Any, config: CrawlConfig, artifact: str | os.PathLike | None = None,
               tolerance: float = DEFAULT_TOLERANCE, band: float = DEFAULT_BAND) -> tuple[Path, list[Check]]:
    """Read the crawl's state and artifact, run every check.

    Raises:
        FileNotFoundError: no artifact at the given or default path.
        redis.RedisError, pyarrow.ArrowException.
    """
    from .frontier import Frontier
    from .status import shard_status

    records = merge_records(client, config.family_name)
    path = Path(artifact) if artifact else default_artifact(config, records.get(config.crawl_id))
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    frontier = Frontier(client, config)
    shards = [shard_status(frontier, s) for s in range(config.num_shards)]
    facts = read_artifact(path, config.psl_private_domains)
    rebalanced = bool(int(client.get(keys.crawl_epoch(config.crawl_id)) or 0))
    return path, evaluate(config, shards, facts, records, tolerance, band, rebalanced)


def summary_line(crawl_id: str, checks: list[Check]) -> str:
    """The final line: every check passed, or which failed."""
    failed = [c.name for c in checks if not c.ok]
    if not failed:
        return f"OK crawl {crawl_id}: all {len(checks)} checks passed"
    return f"FAILED crawl {crawl_id}: {len(failed)} of {len(checks)} checks failed ({', '.join(failed)})"


def report_json(crawl_id: str, path: Path, checks: list[Check]) -> str:
    """The result as one JSON object."""
    return json.dumps({"crawl_id": crawl_id, "artifact": str(path), "ok": all(c.ok for c in checks),
                       "checks": [c.to_dict() for c in checks]}, sort_keys=True)


__all__ = ["Check", "CHECK_NAMES", "DEFAULT_BAND", "DEFAULT_TOLERANCE", "ArtifactFacts", "artifact_facts",
           "check_claimed_empty", "check_no_duplicates", "check_politeness", "check_row_count_vs_previous",
           "check_shards_drained", "check_visited_vs_rows", "evaluate", "made_request", "merge_record",
           "merge_records", "previous_crawl", "read_artifact", "record_merge", "run_checks", "summary_line"]

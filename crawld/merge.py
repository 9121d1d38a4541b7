"""Merge a crawl's NDJSON parts into one Parquet artifact, in bounded memory.

Rows whose ``canonical_url`` was already seen are dropped and counted; the
row kept of each duplicate group is the one of the latest ``retry``
generation (a URL fetched again by ``crawlctl retry``: its older rows are
counted as ``retried``, not as duplicates), and of those the first in *part order*
(:func:`crawld.output.list_parts`: fetch parts, then dead letters, then skip
parts, each group sorted; inside a part, line order).  The artifact is
written with a ``pyarrow.parquet.ParquetWriter`` (snappy) and the explicit
schema of :mod:`crawld.rows`, to a temporary name that is renamed at the
end, so a reader never sees a half-written file.  Torn last lines (a killed
worker's unacked write) and lines that do not parse or lack a required
column are skipped and counted (``bad_lines``).

Algorithm: a two-pass external hash merge.

1. **Partition.**  Every part is read once (one part in memory at a time),
   its rows get their global order ``__ord = part index << 32 | row index``,
   and they are hash-partitioned by ``blake2b(canonical_url)`` into ``P``
   Arrow IPC spill files.  All rows of one ``canonical_url`` land in the
   same partition.
2. **Deduplicate.**  Each partition is read back alone, grouped by
   ``canonical_url``; the row with the smallest ``__ord`` of each group is
   kept (the same row a one-pass keep-first merge keeps), the others are
   counted (and counted as cross-shard when their ``shard`` differs from the
   kept row's), and the kept rows, in ``__ord`` order, are appended to the
   Parquet writer.  A partition's spill file is deleted once read.

``P = ceil(total part bytes / (memory_budget / 4))`` (at most
:data:`MAX_PARTITIONS`): the NDJSON size bounds a partition's Arrow size
(Arrow does not repeat the keys), and deduplicating it takes about three
copies of it at once (the partition, the kept rows, their sorted copy).

**Memory bound.**  Peak memory is about
``max(4 x largest part, memory_budget)`` plus the interpreter and pyarrow
(~100 MB): the largest part read, parsed and partitioned in pass 1, or one
partition and its copies in pass 2.  It does not grow with the number of
rows (parts are rotated at 64 MiB by default).  The default budget is
:data:`DEFAULT_MEMORY_BUDGET` (512 MiB; ``CRAWLD_MERGE_MEMORY_MB`` or the
``memory_budget`` argument change it).  ``bench/merge.py`` measures it:
see ``bench/README.md``.  Only beyond ``MAX_PARTITIONS x budget / 4`` of
parts (~128 GB of NDJSON at the default budget) do partitions outgrow their
share.

**Disk.**  The spill files hold every row once (about the Arrow size of
the parts, less than their NDJSON size), in a private temporary directory
next to the artifact (``spill_dir`` or ``CRAWLD_MERGE_SPILL_DIR`` to put it
elsewhere); it is removed at the end and on any error.

**Row order.**  With one partition (small crawls) the artifact's rows are
in part order, as a one-pass merge writes them; with several, rows are
grouped by partition, in part order inside each.

Artifact path: ``<output>/crawls/YYYY/MM/DD/<crawl_id>.parquet`` (date of
the crawl's ``created_at``, UTC).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .output import list_parts
from .rows import NDJSON_SCHEMA, SCHEMA

#: default memory budget of a merge, in bytes (see the module docstring).
DEFAULT_MEMORY_BUDGET = 512 * 1024 * 1024
#: most spill files open at once (stays under a 1024 open-files limit).
MAX_PARTITIONS = 900

_ORD = "__ord"
#: the spill files' schema: the artifact's columns, then the global order.
_SPILL_SCHEMA = SCHEMA.append(pa.field(_ORD, pa.int64(), nullable=False))


@dataclass
class MergeResult:
    """What a merge did: ``rows`` written, ``duplicates`` dropped,
    ``bad_lines`` skipped (torn last lines of killed workers' parts),
    ``parts`` read, and the artifact ``path``.  ``cross_shard_duplicates``
    counts the dropped duplicates whose kept row came from another shard
    (the ``shard`` column): a URL owned by two shards, which a correct
    frontier never produces.  ``partitions`` is the number of hash
    partitions the rows were spilled to (see the module docstring);
    ``retried`` the rows dropped because a ``crawlctl retry`` fetched their
    URL again (a newer generation's row kept; not counted as duplicates)."""

    path: Path
    rows: int
    duplicates: int
    bad_lines: int
    parts: int
    cross_shard_duplicates: int = 0
    partitions: int = 1
    retried: int = 0


def artifact_path(output: str | os.PathLike, crawl_id: str, created_at: str) -> Path:
    """``<output>/crawls/YYYY/MM/DD/<crawl_id>.parquet`` for an ISO date."""
    y, m, d = created_at[:4], created_at[5:7], created_at[8:10]
    return Path(output) / "crawls" / y / m / d / f"{crawl_id}.parquet"


def _read_part(path: Path) -> tuple[pa.Table, int]:
    data = path.read_bytes()
    bad = 0
    end = data.rfind(b"\n")
    if end != len(data) - 1:
        # a torn last line: the worker died mid-write, before its ack
        bad += 1 if data[end + 1:].strip() else 0
        data = data[: end + 1]
    if not data:
        return NDJSON_SCHEMA.empty_table(), bad
    opts = pajson.ParseOptions(explicit_schema=NDJSON_SCHEMA, unexpected_field_behavior="ignore")
    try:
        return _drop_incomplete(pajson.read_json(io.BytesIO(data), parse_options=opts), bad)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    # slow path: keep every line that parses, count the others
    rows = []
    for line in data.splitlines():
        try:
            obj = json.loads(line)
            if isinstance(obj, dict):
                rows.append(obj)
                continue
        except ValueError:
            pass
        bad += 1
    try:
        return _drop_incomplete(pa.Table.from_pylist(rows, schema=NDJSON_SCHEMA), bad)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        good = []
        for r in rows:
            try:
                pa.Table.from_pylist([r], schema=NDJSON_SCHEMA)
                good.append(r)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                bad += 1
        return _drop_incomplete(pa.Table.from_pylist(good, schema=NDJSON_SCHEMA), bad)


#: columns a row cannot do without (non-nullable in the artifact schema).
_REQUIRED = [f.name for f in SCHEMA if not f.nullable]


def _drop_incomplete(table: pa.Table, bad: int) -> tuple[pa.Table, int]:
    """Drop (and count) rows missing a required column."""
    mask = None
    for name in _REQUIRED:
        valid = pc.is_valid(table.column(name))
        mask = valid if mask is None else pc.and_(mask, valid)
    if mask is None or pc.all(mask).as_py():
        return table, bad
    kept = table.filter(mask)
    return kept, bad + table.num_rows - kept.num_rows


def _to_artifact_types(table: pa.Table) -> pa.Table:
    """NDJSON columns (``fetched_at`` as int ms) to the artifact's schema."""
    ts = pc.cast(table.column("fetched_at"), pa.timestamp("ms", tz="UTC"))
    table = table.set_column(table.schema.get_field_index("fetched_at"), SCHEMA.field("fetched_at"), ts)
    return table.cast(SCHEMA)


def memory_budget_default() -> int:
    """:data:`DEFAULT_MEMORY_BUDGET`, or ``CRAWLD_MERGE_MEMORY_MB`` MiB."""
    env = os.environ.get("CRAWLD_MERGE_MEMORY_MB", "").strip()
    if env:
        try:
            return max(1, int(env)) * 1024 * 1024
        except ValueError:
            pass
    return DEFAULT_MEMORY_BUDGET


def partitions_for(total_bytes: int, memory_budget: int) -> int:
    """How many hash partitions ``total_bytes`` of parts are spilled to."""
    target = max(1, memory_budget // 4)
    return max(1, min(MAX_PARTITIONS, -(-total_bytes // target)))


def _partition_of(canonical_url: str, n: int) -> int:
    digest = hashlib.blake2b(canonical_url.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n


class _Spill:
    """``n`` Arrow IPC stream files under ``root``, opened on first write."""

    def __init__(self, root: Path, n: int):
        self.root, self.n = root, n
        self._writers: dict[int, tuple[ipc.RecordBatchStreamWriter, pa.NativeFile]] = {}

    def path(self, p: int) -> Path:
        return self.root / f"partition-{p:04d}.arrow"

    def write(self, p: int, table: pa.Table) -> None:
        w = self._writers.get(p)
        if w is None:
            sink = pa.OSFile(str(self.path(p)), "wb")
            w = self._writers[p] = (ipc.new_stream(sink, _SPILL_SCHEMA), sink)
        w[0].write_table(table)

    def close(self) -> None:
        writers, self._writers = self._writers, {}
        for w, sink in writers.values():
            try:
                w.close()
            finally:
                sink.close()

    def read(self, p: int) -> pa.Table | None:
        """The rows of partition ``p`` (None if it got none); the file is
        deleted once read."""
        path = self.path(p)
        if not path.exists():
            return None
        with pa.OSFile(str(path), "rb") as f:
            table = ipc.open_stream(f).read_all()
        path.unlink()
        return table


def _partition_pass(parts: list[Path], spill: _Spill) -> int:
    """Pass 1: every part's rows (artifact types plus ``__ord``) to their
    partition's spill file.  Returns the bad lines skipped."""
    bad = 0
    for index, part in enumerate(parts):
        table, b = _read_part(part)
        bad += b
        n = table.num_rows
        if n == 0:
            continue
        base = index << 32
        table = _to_artifact_types(table).append_column(
            _SPILL_SCHEMA.field(_ORD), pa.array(range(base, base + n), pa.int64()))
        if spill.n == 1:
            spill.write(0, table)
            continue
        pids = [_partition_of(c, spill.n) for c in table.column("canonical_url").to_pylist()]
        order = sorted(range(n), key=pids.__getitem__)  # stable: part order inside a partition
        table = table.take(pa.array(order, pa.int64()))
        start = 0
        while start < n:
            p = pids[order[start]]
            end = start
            while end < n and pids[order[end]] == p:
                end += 1
            spill.write(p, table.slice(start, end - start))
            start = end
        del table
    return bad


def _dedup(table: pa.Table) -> tuple[pa.Table, int, int, int]:
    """Pass 2 on one partition: of each ``canonical_url``, keep the row of
    the latest ``retry`` generation, and of those the first (smallest
    ``__ord``).  Returns (kept rows in ``__ord`` order, without ``__ord``;
    duplicates; cross-shard duplicates; rows superseded by a retry)."""
    retry = pc.fill_null(table.column("retry"), 0)
    keys_ = pa.table({"canonical_url": table.column("canonical_url"), "r": retry, _ORD: table.column(_ORD)})
    latest = keys_.group_by("canonical_url", use_threads=False).aggregate([("r", "max")])
    ranked = keys_.join(latest, "canonical_url", use_threads=False)
    current = ranked.filter(pc.equal(ranked.column("r"), ranked.column("r_max")))
    superseded = ranked.num_rows - current.num_rows
    firsts = current.group_by("canonical_url", use_threads=False).aggregate([(_ORD, "min")]).column(f"{_ORD}_min")
    del keys_, latest, ranked, current
    keep = pc.is_in(table.column(_ORD), value_set=firsts)
    del firsts
    kept = table.filter(keep)
    dups = table.num_rows - kept.num_rows - superseded
    cross = 0
    if dups:
        dropped = table.filter(pc.invert(keep))
        a = pa.table({"canonical_url": dropped.column("canonical_url"),
                      "s": pc.fill_null(dropped.column("shard"), -1), "r": pc.fill_null(dropped.column("retry"), 0)})
        k = pa.table({"canonical_url": kept.column("canonical_url"), "k": pc.fill_null(kept.column("shard"), -1),
                      "kr": pc.fill_null(kept.column("retry"), 0)})
        joined = a.join(k, "canonical_url", join_type="inner", use_threads=False)
        # duplicates only: a row superseded by a retry is not one
        other = pc.and_(pc.not_equal(joined.column("s"), joined.column("k")),
                        pc.equal(joined.column("r"), joined.column("kr")))
        cross = pc.sum(pc.cast(other, pa.int64())).as_py() or 0
    del table, keep
    kept = kept.sort_by(_ORD)
    return kept.select(SCHEMA.names), dups, cross, superseded


def merge_parts(parts: list[Path], dest: Path, *, memory_budget: int | None = None,
                spill_dir: str | os.PathLike | None = None) -> MergeResult:
    """Merge ``parts`` (in :func:`crawld.output.list_parts` order) into the
    Parquet file ``dest`` in about ``memory_budget`` bytes (default
    :func:`memory_budget_default`), spilling to a temporary directory under
    ``spill_dir`` (default ``CRAWLD_MERGE_SPILL_DIR``, else ``dest``'s
    directory).

    Raises:
        OSError: a part cannot be read, or ``dest`` or the spill files
            cannot be written.  No spill file and no temporary artifact is
            left behind.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    budget = memory_budget or memory_budget_default()
    total = sum(p.stat().st_size for p in parts)
    n = partitions_for(total, budget)
    spill_root = Path(spill_dir or os.environ.get("CRAWLD_MERGE_SPILL_DIR") or dest.parent)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    rows = dups = cross = retried = 0
    pool = pa.default_memory_pool()
    workdir = Path(tempfile.mkdtemp(prefix=f".{dest.stem}.merge-", dir=spill_root))
    spill = _Spill(workdir, n)
    writer = None
    try:
        try:
            bad = _partition_pass(parts, spill)
        finally:
            spill.close()
        pool.release_unused()
        writer = pq.ParquetWriter(tmp, SCHEMA, compression="snappy")
        for p in range(n):
            table = spill.read(p)
            if table is None:
                continue
            kept, d, c, r = _dedup(table)
            del table
            dups += d
            cross += c
            retried += r
            if kept.num_rows:
                writer.write_table(kept)
                rows += kept.num_rows
            del kept
            pool.release_unused()
        writer.close()
        writer = None
        os.replace(tmp, dest)
    except BaseException:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return MergeResult(dest, rows, dups, bad, len(parts), cross, n, retried)


def merge_crawl(output: str | os.PathLike, crawl_id: str, created_at: str, *,
                memory_budget: int | None = None) -> MergeResult:
    """Merge every part of ``crawl_id`` under ``output`` to its artifact path."""
    return merge_parts(list_parts(output, crawl_id), artifact_path(output, crawl_id, created_at),
                       memory_budget=memory_budget)

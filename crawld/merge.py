"""Merge a crawl's NDJSON parts into one Parquet artifact.

Parts are read one at a time (memory bounded by the largest part plus the
set of fingerprints already written), rows whose ``canonical_url`` was
already written are dropped and counted, and the rest is streamed into a
``pyarrow.parquet.ParquetWriter`` (snappy) with the explicit schema of
:mod:`crawld.rows`.  The artifact is written to a temporary name and
renamed, so a reader never sees a half-written file.

Artifact path: ``<output>/crawls/YYYY/MM/DD/<crawl_id>.parquet`` (date of
the crawl's ``created_at``, UTC).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .output import list_parts
from .rows import NDJSON_SCHEMA, SCHEMA
from .urls import fingerprint


@dataclass
class MergeResult:
    """What a merge did: ``rows`` written, ``duplicates`` dropped,
    ``bad_lines`` skipped (torn last lines of killed workers' parts),
    ``parts`` read, and the artifact ``path``.  ``cross_shard_duplicates``
    counts the dropped duplicates whose kept row came from another shard
    (the ``shard`` column): a URL owned by two shards, which a correct
    frontier never produces."""

    path: Path
    rows: int
    duplicates: int
    bad_lines: int
    parts: int
    cross_shard_duplicates: int = 0


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


def merge_parts(parts: list[Path], dest: Path) -> MergeResult:
    """Merge ``parts`` into the Parquet file ``dest``.

    Raises:
        OSError: a part cannot be read or ``dest`` cannot be written.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    seen: dict[bytes, int] = {}  # fingerprint -> shard of the kept row
    rows = dups = cross = bad = 0
    writer = pq.ParquetWriter(tmp, SCHEMA, compression="snappy")
    try:
        for part in parts:
            table, b = _read_part(part)
            bad += b
            if table.num_rows == 0:
                continue
            keep = []
            shards = table.column("shard").to_pylist()
            for i, canon in enumerate(table.column("canonical_url").to_pylist()):
                fp = fingerprint(canon or "")
                kept = seen.get(fp)
                if kept is not None:
                    dups += 1
                    if kept != (-1 if shards[i] is None else shards[i]):
                        cross += 1
                else:
                    seen[fp] = -1 if shards[i] is None else shards[i]
                    keep.append(i)
            if len(keep) != table.num_rows:
                table = table.take(pa.array(keep, pa.int64()))
            if table.num_rows == 0:
                continue
            ts = pc.cast(table.column("fetched_at"), pa.timestamp("ms", tz="UTC"))
            table = table.set_column(table.schema.get_field_index("fetched_at"), SCHEMA.field("fetched_at"), ts)
            writer.write_table(table.cast(SCHEMA))
            rows += table.num_rows
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(tmp, dest)
    return MergeResult(dest, rows, dups, bad, len(parts), cross)


def merge_crawl(output: str | os.PathLike, crawl_id: str, created_at: str) -> MergeResult:
    """Merge every part of ``crawl_id`` under ``output`` to its artifact path."""
    return merge_parts(list_parts(output, crawl_id), artifact_path(output, crawl_id, created_at))

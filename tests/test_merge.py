"""crawld.output + crawld.merge: NDJSON parts to one Parquet artifact.

Parts are written with the real PartWriter (real files, real fdatasync) from
rows built by crawld.rows.make_row, as the workers do.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawld import merge
from crawld.merge import artifact_path, merge_crawl, merge_parts
from crawld.output import CLOSED_SUFFIX, OPEN_SUFFIX, PartWriter, list_parts, shard_dir, write_dead_letter_part
from crawld.rows import SCHEMA, make_row

CRAWL = "c1"
T0 = datetime(2024, 3, 5, 10, 0, 0, 123000, tzinfo=timezone.utc)


def row(i: int, canon: str | None = None, at: datetime = T0, **kw) -> dict:
    fields = dict(
        crawl_id=CRAWL, url=f"http://example.com/{i}?utm_source=x",
        canonical_url=canon or f"http://example.com/{i}", outcome="fetched", shard=i % 4, attempt=1,
        depth=i % 5, referrer=None if i == 0 else "http://example.com/", host="example.com",
        fetched_at=at.timestamp(), response_ms=12.3456 + i, status=200, content_type="text/html",
        content_length=1000 + i, title=f"Page {i} \u2014 caf\u00e9", outlinks=[f"http://example.com/{i + 1}"],
    )
    fields.update(kw)
    return make_row(**fields)


def write_part(out: Path, shard: int, rows: list[dict], close: bool = True) -> Path:
    w = PartWriter(out, CRAWL, shard)
    w.write(rows)
    if close:
        return w.close()
    path = w._path  # the open part, as a killed worker leaves it
    w._file.close()
    return path


def read_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def naive_merge(parts: list[Path]) -> tuple[list[dict], int, int]:
    """Keep-first dedup on canonical_url, in memory, with json."""
    seen, out, dups, bad = set(), [], 0, 0
    for p in parts:
        for line in p.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if r["canonical_url"] in seen:
                dups += 1
                continue
            seen.add(r["canonical_url"])
            r["fetched_at"] = datetime.fromtimestamp(r["fetched_at"] / 1000, timezone.utc)
            out.append(r)
    return out, dups, bad


# artifact path --------------------------------------------------------------

@pytest.mark.parametrize("created, rel", [
    ("2024-03-05T10:00:00Z", "crawls/2024/03/05/c1.parquet"),
    ("1999-12-31T23:59:59Z", "crawls/1999/12/31/c1.parquet"),
    ("2024-11-09", "crawls/2024/11/09/c1.parquet"),
])
def test_artifact_path(tmp_path, created, rel):
    assert artifact_path(tmp_path, CRAWL, created) == tmp_path / rel


# merge ----------------------------------------------------------------------

@pytest.fixture
def crawl_out(tmp_path) -> Path:
    """Three shards: duplicates within and across parts, one torn open part."""
    write_part(tmp_path, 0, [row(0), row(1), row(1, title="second copy")])
    write_part(tmp_path, 1, [row(2), row(3), row(0, title="dup of 0 from shard 1")])
    open_part = write_part(tmp_path, 2, [row(4), row(5)], close=False)
    with open(open_part, "ab") as f:  # a killed worker's torn last line: no newline
        f.write(json.dumps(row(6))[:57].encode())
    return tmp_path


def test_parts_listed_including_open(crawl_out):
    parts = list_parts(crawl_out, CRAWL)
    assert len(parts) == 3
    assert sum(p.name.endswith(OPEN_SUFFIX) for p in parts) == 1
    assert [p.parent.name for p in parts] == ["shard-0000", "shard-0001", "shard-0002"]


def test_merge_counts(crawl_out):
    res = merge_crawl(crawl_out, CRAWL, "2024-03-05T10:00:00Z")
    assert res.path == crawl_out / "crawls" / "2024" / "03" / "05" / "c1.parquet"
    assert res.path.exists()
    assert (res.rows, res.duplicates, res.bad_lines, res.parts) == (6, 2, 1, 3)
    rows = read_rows(res.path)
    assert [r["canonical_url"] for r in rows] == [f"http://example.com/{i}" for i in range(6)]
    # keep-first
    assert rows[1]["title"] == "Page 1 \u2014 caf\u00e9"
    assert rows[0]["title"] == "Page 0 \u2014 caf\u00e9"
    # rows of the .ndjson.open part are included, the torn line is not
    assert {"http://example.com/4", "http://example.com/5"} <= {r["canonical_url"] for r in rows}
    assert "http://example.com/6" not in {r["canonical_url"] for r in rows}
    # no temporary file left next to the artifact
    assert [p.name for p in res.path.parent.iterdir()] == ["c1.parquet"]


def test_artifact_schema_is_exactly_rows_schema(crawl_out):
    res = merge_crawl(crawl_out, CRAWL, "2024-03-05T10:00:00Z")
    schema = pq.read_schema(res.path)
    assert schema.equals(SCHEMA)
    assert schema.names == SCHEMA.names
    for got, want in zip(schema, SCHEMA):
        assert (got.name, got.type, got.nullable) == (want.name, want.type, want.nullable)
    assert schema.metadata[b"crawld.schema_version"] == b"2"
    assert pq.read_table(res.path).schema.equals(SCHEMA)


def test_fetched_at_is_utc_timestamp_equal_to_input(tmp_path):
    times = [T0, T0 + timedelta(milliseconds=1), datetime(2001, 1, 1, tzinfo=timezone.utc),
             datetime(2038, 1, 19, 3, 14, 8, 999000, tzinfo=timezone.utc)]
    write_part(tmp_path, 0, [row(i, at=t) for i, t in enumerate(times)])
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    table = pq.read_table(res.path)
    assert table.schema.field("fetched_at").type == pa.timestamp("ms", tz="UTC")
    got = table.column("fetched_at").to_pylist()
    assert got == times
    assert all(g.utcoffset() == timedelta(0) for g in got)


def test_snappy_compression(crawl_out):
    res = merge_crawl(crawl_out, CRAWL, "2024-03-05T10:00:00Z")
    md = pq.ParquetFile(res.path).metadata
    assert md.num_rows == 6
    for rg in range(md.num_row_groups):
        for c in range(md.num_columns):
            assert md.row_group(rg).column(c).compression == "SNAPPY"


def test_values_survive(tmp_path):
    r = row(7, status=301, outcome="redirect", final_url="http://example.com/8",
            redirect_chain=["http://example.com/7", "http://example.com/8"], truncated=True,
            meta_robots="noindex,nofollow", canonical_link="http://example.com/seven", error=None,
            outlinks=[])
    e = row(9, status=None, outcome="error", error="connect: refused", content_type=None,
            content_length=None, title=None)
    write_part(tmp_path, 3, [r, e])
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    got = read_rows(res.path)
    assert got[0]["status"] == 301 and got[0]["outcome"] == "redirect"
    assert got[0]["redirect_chain"] == ["http://example.com/7", "http://example.com/8"]
    assert got[0]["truncated"] is True and got[0]["outlinks"] == []
    assert got[0]["response_ms"] == 19.346 and got[0]["shard"] == 3
    assert got[1]["status"] is None and got[1]["final_url"] is None
    assert got[1]["error"] == "connect: refused" and got[1]["title"] is None


def test_redirect_kind_and_refresh_delay_survive(tmp_path):
    meta = row(1, outcome="redirect", final_url="http://example.com/2", redirect_kind="meta_refresh",
               refresh_delay_s=5)
    http = row(2, status=301, outcome="redirect", final_url="http://example.com/3", redirect_kind="http",
               title=None, outlinks=[])
    write_part(tmp_path, 0, [meta, http, row(3)])
    got = {r["canonical_url"]: r for r in read_rows(merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z").path)}
    assert (got["http://example.com/1"]["redirect_kind"], got["http://example.com/1"]["refresh_delay_s"]) == \
        ("meta_refresh", 5)
    assert got["http://example.com/1"]["status"] == 200 and got["http://example.com/1"]["outlinks"]
    assert (got["http://example.com/2"]["redirect_kind"], got["http://example.com/2"]["refresh_delay_s"]) == ("http", None)
    assert (got["http://example.com/3"]["redirect_kind"], got["http://example.com/3"]["refresh_delay_s"]) == (None, None)


def test_part_written_without_the_redirect_kind_columns_merges(tmp_path):
    # a part written by a worker whose rows lack redirect_kind and
    # refresh_delay_s: both read as null
    old = {k: v for k, v in row(4).items() if k not in ("redirect_kind", "refresh_delay_s")}
    write_part(tmp_path, 0, [old, row(5, redirect_kind="http", outcome="redirect")])
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    got = {r["canonical_url"]: r for r in read_rows(res.path)}
    assert (res.rows, res.bad_lines) == (2, 0)
    assert got["http://example.com/4"]["redirect_kind"] is None and got["http://example.com/4"]["title"]
    assert got["http://example.com/5"]["redirect_kind"] == "http"


def test_merge_equals_naive_merge(tmp_path):
    a = [row(i, canon=f"http://example.com/{i % 7}", at=T0 + timedelta(seconds=i)) for i in range(20)]
    b = [row(i, canon=f"http://example.com/{i % 11}", title=f"b{i}") for i in range(20, 35)]
    write_part(tmp_path, 0, a)
    write_part(tmp_path, 1, b)
    p = write_part(tmp_path, 2, [row(50), row(3, title="late dup")], close=False)
    with open(p, "ab") as f:
        f.write(b'{"crawl_id":"c1","url":"http://exa')
    parts = list_parts(tmp_path, CRAWL)
    expected, dups, bad = naive_merge(parts)
    res = merge_parts(parts, tmp_path / "out.parquet")
    assert read_rows(res.path) == expected
    assert (res.rows, res.duplicates, res.bad_lines) == (len(expected), dups, bad)
    assert res.rows == 12 and res.duplicates == 25 and res.bad_lines == 1


def test_large_row_over_a_megabyte(tmp_path):
    # a link-heavy page (the Python docs' genindex-all has ~14k links)
    big = row(1, outlinks=[f"http://example.com/page/{k:07d}" for k in range(60_000)])
    assert len(json.dumps(big)) > 1 << 20
    write_part(tmp_path, 0, [row(0), big, row(2)])
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    assert (res.rows, res.bad_lines) == (3, 0)
    assert len(read_rows(res.path)[1]["outlinks"]) == 60_000


def test_corrupt_middle_line_is_skipped_and_counted(tmp_path):
    p = write_part(tmp_path, 0, [row(0)])
    with open(p, "ab") as f:
        f.write(b'{"crawl_id": "c1", "url": \n')
        f.write(b"[1, 2]\n")
        f.write((json.dumps(row(1)) + "\n").encode())
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    assert (res.rows, res.bad_lines) == (2, 2)


def test_line_missing_required_column_is_counted_not_fatal(tmp_path):
    # valid JSON, wrong shape (e.g. a part from another version): merge
    # documents only OSError, and skips lines it cannot use
    p = write_part(tmp_path, 0, [row(0)])
    with open(p, "ab") as f:
        f.write(b'{"crawl_id": "c1", "url": "http://example.com/x"}\n')
        f.write((json.dumps(row(1)) + "\n").encode())
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    assert (res.rows, res.bad_lines) == (2, 1)


def test_part_with_only_a_torn_line(tmp_path):
    d = shard_dir(tmp_path, CRAWL, 0)
    d.mkdir(parents=True)
    (d / f"part-20240305T100000-h-1-00001{OPEN_SUFFIX}").write_bytes(b'{"crawl_id":"c1","ur')
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    assert (res.rows, res.duplicates, res.bad_lines, res.parts) == (0, 0, 1, 1)
    assert pq.read_schema(res.path).equals(SCHEMA)


def test_no_parts_gives_empty_artifact(tmp_path):
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    assert (res.rows, res.parts) == (0, 0)
    assert pq.read_table(res.path).num_rows == 0
    assert pq.read_schema(res.path).equals(SCHEMA)


def test_merge_replaces_existing_artifact(crawl_out):
    first = merge_crawl(crawl_out, CRAWL, "2024-03-05T10:00:00Z")
    write_part(crawl_out, 3, [row(100)])
    second = merge_crawl(crawl_out, CRAWL, "2024-03-05T10:00:00Z")
    assert first.path == second.path and second.rows == 7
    assert len(read_rows(second.path)) == 7


# PartWriter -----------------------------------------------------------------

def test_partwriter_rotation_by_max_bytes(tmp_path):
    rows = [row(i) for i in range(30)]
    line = len(json.dumps(rows[0], separators=(",", ":"), ensure_ascii=False).encode()) + 1
    synced: list[int] = []
    w = PartWriter(tmp_path, CRAWL, 5, max_bytes=3 * line, sync=synced.append)
    for i in range(0, 30, 2):  # 15 batches of 2 rows; a part closes once >= 3 lines
        w.write(rows[i:i + 2])
    assert len(synced) == 15
    assert w.rows_written == 30
    d = shard_dir(tmp_path, CRAWL, 5)
    closed = sorted(p for p in d.iterdir() if p.name.endswith(CLOSED_SUFFIX))
    still_open = [p for p in d.iterdir() if p.name.endswith(OPEN_SUFFIX)]
    # every part holds 2 batches (4 rows) -> closed; the 15th batch is open
    assert len(closed) == 7 and len(still_open) == 1
    assert all(len(p.read_bytes().splitlines()) == 4 for p in closed)
    last = w.close()
    assert last is not None and last.name.endswith(CLOSED_SUFFIX) and not last.name.endswith(OPEN_SUFFIX)
    assert w.close() is None
    assert not any(p.name.endswith(OPEN_SUFFIX) for p in d.iterdir())
    names = [p.name for p in list_parts(tmp_path, CRAWL)]
    assert len(names) == 8 and len(set(names)) == 8
    lines = [json.loads(ln) for p in list_parts(tmp_path, CRAWL) for ln in p.read_bytes().splitlines()]
    assert lines == rows


def test_partwriter_single_write_over_limit_closes_part(tmp_path):
    w = PartWriter(tmp_path, CRAWL, 0, max_bytes=1)
    w.write([row(0)])
    w.write([row(1)])
    parts = list_parts(tmp_path, CRAWL)
    assert len(parts) == 2 and all(p.name.endswith(CLOSED_SUFFIX) for p in parts)
    assert w.close() is None


def test_partwriter_rotation_by_age(tmp_path):
    w = PartWriter(tmp_path, CRAWL, 0, max_age_s=0)
    w.write([row(0)])
    assert [p.name.endswith(CLOSED_SUFFIX) for p in list_parts(tmp_path, CRAWL)] == [True]


def test_partwriter_empty_write_opens_nothing(tmp_path):
    w = PartWriter(tmp_path, CRAWL, 0)
    assert w.write([]) == 0
    assert list_parts(tmp_path, CRAWL) == [] and w.close() is None


def test_partwriter_lines_are_utf8_json(tmp_path):
    w = PartWriter(tmp_path, CRAWL, 0)
    n = w.write([row(0, title="na\u00efve \u65e5\u672c \u2028 line\nbreak")])
    p = w.close()
    data = p.read_bytes()
    assert n == len(data) and data.endswith(b"\n") and data.count(b"\n") == 1
    assert "\u65e5\u672c".encode() in data
    assert json.loads(data)["title"] == "na\u00efve \u65e5\u672c \u2028 line\nbreak"
    res = merge_crawl(tmp_path, CRAWL, "2024-03-05T10:00:00Z")
    assert read_rows(res.path)[0]["title"] == "na\u00efve \u65e5\u672c \u2028 line\nbreak"


# bounded (external, partitioned) merge ---------------------------------------

def reference_merge(parts: list[Path]) -> tuple[pa.Table, int, int, int]:
    """The naive in-memory merge: read every part, keep the first row per
    canonical_url in part order; (table, duplicates, cross-shard, bad)."""
    kept: dict[str, dict] = {}
    dups = cross = bad = 0
    for p in parts:
        for line in p.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                bad += 1
                continue
            first = kept.get(r["canonical_url"])
            if first is not None:
                dups += 1
                cross += first["shard"] != r["shard"]
                continue
            r["fetched_at"] = datetime.fromtimestamp(r["fetched_at"] / 1000, timezone.utc)
            kept[r["canonical_url"]] = r
    return pa.Table.from_pylist(list(kept.values()), schema=SCHEMA), dups, cross, bad


def by_canonical(table: pa.Table) -> list[dict]:
    return table.sort_by("canonical_url").to_pylist()


@pytest.fixture
def dup_crawl(tmp_path) -> Path:
    """~200 rows over 4 shards and all three part kinds: duplicates within a
    part, across parts of one shard, across shards and across kinds; torn
    last lines; a corrupt middle line."""
    out = tmp_path / "out"
    for shard in range(4):
        for k in range(2):
            rows = [row(i, canon=f"http://example.com/{(i * 7 + shard) % 90}", shard=shard,
                        title=f"s{shard} p{k} r{i}", at=T0 + timedelta(seconds=i))
                    for i in range(k * 20, k * 20 + 20)]
            own = row(900 + shard, canon=f"http://example.com/own/{shard}/{k}", shard=shard, title="own")
            rows[5:5] = [own, dict(own, title="copy within the part")]
            if k == 1:
                rows.append(dict(own, canonical_url=f"http://example.com/own/{shard}/0", title="copy, same shard"))
            p = write_part(out, shard, rows, close=(shard != 2 or k == 0))
            if shard == 1 and k == 1:
                with open(p, "ab") as f:
                    f.write(b"{not json\n" + (json.dumps(row(500, shard=1)) + "\n").encode())
            if shard == 2 and k == 1:
                with open(p, "ab") as f:  # the open part of a killed worker
                    f.write(json.dumps(row(501))[:40].encode())
    write_dead_letter_part(out, CRAWL, 3, [row(600, outcome="dead_letter", shard=3, error="gave up"),
                                           row(5, outcome="dead_letter", shard=3, error="dup of a fetched")])
    w = PartWriter(out, CRAWL, 0, kind="skip")
    w.write([row(700, outcome="skipped", status=None, error="out_of_scope"),
             row(8, outcome="skipped", status=None, error="over_depth")])
    w.close()
    return out


def spill_dirs(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".merge-" in p.name or p.name.endswith(".arrow")]


def test_bounded_merge_equals_naive_merge_over_partitions(dup_crawl, monkeypatch):
    parts = list_parts(dup_crawl, CRAWL)
    assert {p.name.split("-", 1)[0] for p in parts} == {"part", "dead", "skip"}
    want, dups, cross, bad = reference_merge(parts)
    assert dups > 40 and 10 < cross <= dups - 6 and bad == 2  # same-shard duplicates too
    spilled: list[str] = []
    real_write = merge._Spill.write
    monkeypatch.setattr(merge._Spill, "write",
                        lambda self, p, t: (spilled.append(self.path(p).name), real_write(self, p, t))[1])
    # a tiny budget forces many partitions
    res = merge_parts(parts, dup_crawl / "small.parquet", memory_budget=8 * 1024)
    assert res.partitions > 4 and len(set(spilled)) > 4
    got = pq.read_table(res.path)
    assert got.schema.equals(SCHEMA)
    assert by_canonical(got) == by_canonical(want)
    assert (res.rows, res.duplicates, res.cross_shard_duplicates, res.bad_lines, res.parts) == \
        (want.num_rows, dups, cross, bad, len(parts))
    # one partition (the default budget): the same rows, in part order
    one = merge_parts(parts, dup_crawl / "one.parquet")
    assert one.partitions == 1
    assert pq.read_table(one.path).to_pylist() == want.to_pylist()
    assert (one.rows, one.duplicates, one.cross_shard_duplicates, one.bad_lines) == \
        (res.rows, res.duplicates, res.cross_shard_duplicates, res.bad_lines)
    for md in (pq.ParquetFile(res.path).metadata, pq.ParquetFile(one.path).metadata):
        assert all(md.row_group(g).column(c).compression == "SNAPPY"
                   for g in range(md.num_row_groups) for c in range(md.num_columns))
    assert spill_dirs(dup_crawl) == []
    assert sorted(p.name for p in dup_crawl.iterdir()) == ["one.parquet", "parts", "small.parquet"]


def test_partitions_follow_the_budget():
    assert merge.partitions_for(0, 512 << 20) == 1
    assert merge.partitions_for(128 << 20, 512 << 20) == 1
    assert merge.partitions_for((128 << 20) + 1, 512 << 20) == 2
    assert merge.partitions_for(10 << 30, 512 << 20) == 80
    assert merge.partitions_for(1 << 50, 512 << 20) == merge.MAX_PARTITIONS


def test_spill_dir_option_and_env(dup_crawl, tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    seen: list[Path] = []
    real_read = merge._Spill.read
    monkeypatch.setattr(merge._Spill, "read", lambda self, p: (seen.append(self.root), real_read(self, p))[1])
    merge_parts(list_parts(dup_crawl, CRAWL), dup_crawl / "a.parquet", memory_budget=8 * 1024, spill_dir=spill)
    assert seen and all(r.parent == spill for r in seen)
    monkeypatch.setenv("CRAWLD_MERGE_SPILL_DIR", str(spill))
    seen.clear()
    merge_parts(list_parts(dup_crawl, CRAWL), dup_crawl / "b.parquet", memory_budget=8 * 1024)
    assert seen and all(r.parent == spill for r in seen)
    assert list(spill.iterdir()) == []


def test_unreadable_part_midway_leaves_no_spill_files(dup_crawl):
    # a part that cannot be read (a directory where a file should be),
    # listed after parts already spilled
    bad = shard_dir(dup_crawl, CRAWL, 3) / f"part-99999999T000000-h-1-00001{CLOSED_SUFFIX}"
    bad.mkdir()
    parts = list_parts(dup_crawl, CRAWL)
    assert parts.index(bad) > 2
    dest = dup_crawl / "crawls" / "c1.parquet"
    with pytest.raises(OSError):
        merge_parts(parts, dest, memory_budget=8 * 1024)
    assert spill_dirs(dup_crawl) == []
    assert list(dest.parent.iterdir()) == []


def test_failure_in_second_pass_leaves_nothing(dup_crawl, monkeypatch):
    calls = []
    real = merge._dedup

    def failing(table):
        calls.append(table.num_rows)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(table)
    monkeypatch.setattr(merge, "_dedup", failing)
    dest = dup_crawl / "crawls" / "c1.parquet"
    with pytest.raises(OSError, match="No space"):
        merge_parts(list_parts(dup_crawl, CRAWL), dest, memory_budget=8 * 1024)
    assert len(calls) == 3
    assert spill_dirs(dup_crawl) == []
    assert list(dest.parent.iterdir()) == []

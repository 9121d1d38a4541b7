"""Benchmark of ``crawlctl merge``: peak RSS, wall time and rows/s.

Generates ``--rows`` realistic rows (:func:`crawld.rows.make_row`, written
by the real :class:`crawld.output.PartWriter`, 64 MiB parts) over
``--shards`` shards, ``--dup-share`` of them duplicates of an earlier
canonical URL (``--cross-share`` of those from another shard, the rest a
re-fetch in the same shard), ~5 % in skip parts and a dead-letter part per
shard, and a torn last line in one part.  Then, each in its own child
process (peak RSS from ``os.wait4``'s rusage, wall time around it):

* ``floor``: import crawld.merge and read + parse the largest part only
  (what any merge that reads a part at a time needs);
* ``naive``: the one-pass in-memory merge (a dict of every fingerprint
  written, the merge before the bounded one) on ``--baseline-rows``;
* ``bounded``: :func:`crawld.merge.merge_parts` on ``--baseline-rows``
  and on ``--rows`` (and ``naive`` on ``--rows`` too with ``--naive-full``).

Usage: ``.venv/bin/python bench/merge.py [--rows 10000000]
[--baseline-rows 1000000] [--dup-share 0.1] [--dir /var/tmp]``.
Needs about 1.8 kB of disk per row (parts, spill files, artifact).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CRAWL = "bench"
T0 = 1_717_200_000.0
SECTIONS = ("docs", "library", "reference", "howto", "tutorial", "blog", "news", "api", "guide", "faq")


def canon(shard: int, j: int) -> str:
    """The j-th unique canonical URL of a shard (deterministic)."""
    site = (j * 31 + shard) % 997
    return (f"https://www.site{shard:02d}-{site:03d}.example.com/{SECTIONS[j % 10]}/"
            f"section-{j // 1000 % 100}/page-{j:08d}.html")


from crawld.rows import make_row  # noqa: E402


def make(shard: int, j: int, rng: random.Random, *, canonical: str | None = None, attempt: int = 1,
         outcome: str = "fetched") -> dict:
    c = canonical or canon(shard, j)
    host = c.split("/")[2]
    base = c.rsplit("/", 1)[0]
    n_links = rng.choice((0, 2, 5, 8, 12, 20, 40))
    r0 = rng.getrandbits(26)
    links = [f"{base}/page-{(r0 + k * 7919) % 100_000_000:08d}.html" for k in range(n_links)]
    status = rng.choices((200, 301, 404, 500), (90, 5, 4, 1))[0]
    kw: dict = {}
    if outcome == "skipped":
        kw = dict(status=None, error=rng.choice(("out_of_scope", "over_depth", "nofollow")))
    elif status == 301:
        kw = dict(status=301, final_url=c + "/", redirect_chain=[c, c + "/"])
        outcome = "redirect"
    else:
        kw = dict(status=status, content_type="text/html; charset=utf-8",
                  content_length=2_000 + rng.getrandbits(17), outlinks=links,
                  title=f"{SECTIONS[j % 10].title()} \u2014 page {j} | Site {shard}",
                  meta_robots=rng.choice((None, None, None, "noindex,follow")),
                  canonical_link=c if rng.random() < 0.5 else None)
    return make_row(crawl_id=CRAWL, url=c + ("?utm_source=feed" if j % 7 == 0 else ""), canonical_url=c,
                    outcome=outcome, shard=shard, attempt=attempt, depth=j % 7,
                    referrer=f"{base}/index.html", host=host, fetched_at=T0 + j * 0.01,
                    response_ms=rng.uniform(5, 900), **kw)


def gen_shard(job: tuple) -> int:
    """Write one shard's parts; returns the rows written."""
    from crawld.output import PartWriter, write_dead_letter_part

    out, shard, shards, n, dup_share, cross_share, seed = job
    rng = random.Random(seed * 1000 + shard)
    parts = PartWriter(out, CRAWL, shard, sync=lambda fd: None)
    skips = PartWriter(out, CRAWL, shard, sync=lambda fd: None, kind="skip")
    batch, skip_batch, uniq, written = [], [], 0, 0
    for _ in range(n):
        r = rng.random()
        if r < dup_share and uniq > 0:
            if rng.random() < cross_share:  # a URL of another shard: cross-shard duplicate
                other = (shard + 1 + rng.randrange(shards - 1)) % shards if shards > 1 else shard
                row = make(shard, uniq, rng, canonical=canon(other, rng.randrange(max(1, uniq))))
            else:  # re-fetched after a reclaim: same shard, a later part
                row = make(shard, rng.randrange(uniq), rng, attempt=2)
        else:
            skip = r > 0.95
            row = make(shard, uniq, rng, outcome="skipped" if skip else "fetched")
            uniq += 1
            if skip:
                skip_batch.append(row)
                continue
        batch.append(row)
        if len(batch) >= 2000:
            parts.write(batch)
            batch = []
    parts.write(batch)
    skips.write(skip_batch)
    parts.close()
    skips.close()
    written = n
    dead = [make(shard, uniq + k, rng, outcome="dead_letter") for k in range(20)]
    for d in dead:
        d.update(outcome="dead_letter", error="max_attempts: timeout", status=None)
    write_dead_letter_part(out, CRAWL, shard, dead)
    return written + len(dead)


def generate(out: Path, rows: int, shards: int, dup_share: float, cross_share: float, seed: int) -> dict:
    t = time.monotonic()
    per = [rows // shards + (1 if s < rows % shards else 0) for s in range(shards)]
    with Pool(min(shards, os.cpu_count() or 1)) as pool:
        total = sum(pool.map(gen_shard, [(str(out), s, shards, per[s], dup_share, cross_share, seed)
                                         for s in range(shards)]))
    from crawld.output import list_parts

    parts = list_parts(out, CRAWL)
    with open(parts[len(parts) // 2], "ab") as f:  # a killed worker's torn last line
        f.write(b'{"crawl_id":"bench","url":"https://www.torn')
    size = sum(p.stat().st_size for p in parts)
    return {"rows": total, "parts": len(parts), "bytes": size, "gen_s": time.monotonic() - t,
            "largest_part": max(p.stat().st_size for p in parts)}


# -- what runs in the child ----------------------------------------------------

def child(mode: str, src: str, dest: str) -> dict:
    from crawld import merge
    from crawld.output import list_parts

    parts = list_parts(src, CRAWL)
    if mode == "floor":
        largest = max(parts, key=lambda p: p.stat().st_size)
        table, _ = merge._read_part(largest)
        return {"rows": table.num_rows, "arrow_bytes": table.nbytes, "ndjson_bytes": largest.stat().st_size}
    if mode == "bounded":
        r = merge.merge_parts(parts, Path(dest))
        return {"rows": r.rows, "duplicates": r.duplicates, "cross": r.cross_shard_duplicates,
                "bad": r.bad_lines, "partitions": r.partitions}
    if mode == "naive":
        import pyarrow as pa
        import pyarrow.parquet as pq
        from crawld.rows import SCHEMA
        from crawld.urls import fingerprint

        seen: dict[bytes, int] = {}
        rows = dups = cross = bad = 0
        with pq.ParquetWriter(dest, SCHEMA, compression="snappy") as w:
            for part in parts:
                table, b = merge._read_part(part)
                bad += b
                keep = []
                shards = table.column("shard").to_pylist()
                for i, c in enumerate(table.column("canonical_url").to_pylist()):
                    fp = fingerprint(c)
                    s = -1 if shards[i] is None else shards[i]
                    k = seen.get(fp)
                    if k is None:
                        seen[fp] = s
                        keep.append(i)
                    else:
                        dups += 1
                        cross += k != s
                table = merge._to_artifact_types(table.take(pa.array(keep, pa.int64())))
                w.write_table(table)
                rows += table.num_rows
        return {"rows": rows, "duplicates": dups, "cross": cross, "bad": bad, "partitions": 0}
    raise SystemExit(f"unknown mode {mode}")


def run_child(mode: str, src: Path, dest: Path) -> dict:
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, str(src), str(dest)],
                            stdout=subprocess.PIPE, cwd=str(ROOT))
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} on {src} failed ({proc.returncode})")
    res = json.loads(out)
    res.update(mode=mode, wall_s=wall, peak_rss_mib=ru.ru_maxrss / 1024, cpu_s=ru.ru_utime + ru.ru_stime)
    return res


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], sys.argv[4])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--baseline-rows", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--dup-share", type=float, default=0.10)
    ap.add_argument("--cross-share", type=float, default=0.5, help="share of the duplicates from another shard")
    ap.add_argument("--naive-full", action="store_true", help="also run the in-memory merge on --rows")
    ap.add_argument("--dir", default=None, help="where to generate (default $TMPDIR)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the generated parts")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="crawld-bench-merge-", dir=args.dir))
    print(f"work dir {work}; free: {shutil.disk_usage(work).free / 2**30:.1f} GiB; "
          f"need ~{args.rows * 1.8e3 / 2**30:.1f} GiB", flush=True)
    results = []
    try:
        sets = {}
        for name, n in (("small", args.baseline_rows), ("full", args.rows)):
            if name == "full" and n == args.baseline_rows:
                sets["full"] = sets["small"]
                continue
            src = work / name
            g = generate(src, n, args.shards, args.dup_share, args.cross_share, args.seed)
            print(f"generated {name}: {g['rows']:,} rows in {g['parts']} parts, "
                  f"{g['bytes'] / 2**30:.2f} GiB NDJSON, {g['gen_s']:.0f} s", flush=True)
            sets[name] = (src, g)
        plan = [("floor", "full"), ("naive", "small"), ("bounded", "small"), ("bounded", "full")]
        if args.naive_full:
            plan.append(("naive", "full"))
        for mode, name in plan:
            src, g = sets[name]
            dest = work / f"{mode}-{name}.parquet"
            r = run_child(mode, src, dest)
            r.update(set=name, input_rows=g["rows"], input_bytes=g["bytes"], parts=g["parts"])
            if dest.exists():
                r["artifact_bytes"] = dest.stat().st_size
                dest.unlink()
            results.append(r)
            rate = r["input_rows"] / r["wall_s"] if mode != "floor" else float("nan")
            print(f"{mode:8s} {name:5s} rows_in={r['input_rows']:>11,} wall={r['wall_s']:7.1f}s "
                  f"rows/s={rate:>9,.0f} peak_rss={r['peak_rss_mib']:7.0f} MiB cpu={r['cpu_s']:.0f}s "
                  + " ".join(f"{k}={r[k]}" for k in ("rows", "duplicates", "cross", "bad", "partitions",
                                                      "arrow_bytes", "ndjson_bytes") if k in r), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    by = {(r["mode"], r["set"]): r for r in results}
    floor = by[("floor", "full")]["peak_rss_mib"]
    full = by[("bounded", "full")]
    print(json.dumps({"results": results}, indent=1))
    print(f"\nbounded merge of {full['input_rows']:,} rows: peak RSS {full['peak_rss_mib']:.0f} MiB "
          f"({full['peak_rss_mib'] / floor:.2f}x reading the largest part alone, {floor:.0f} MiB), "
          f"{full['wall_s']:.0f} s, {full['input_rows'] / full['wall_s']:,.0f} rows/s; "
          f"target < 1024 MiB: {'met' if full['peak_rss_mib'] < 1024 else 'MISSED'}")
    nv, bs = by[("naive", "small")], by[("bounded", "small")]
    print(f"at {nv['input_rows']:,} rows: naive {nv['peak_rss_mib']:.0f} MiB / {nv['wall_s']:.0f} s, "
          f"bounded {bs['peak_rss_mib']:.0f} MiB / {bs['wall_s']:.0f} s "
          f"(time ratio bounded/naive {bs['wall_s'] / nv['wall_s']:.2f})")
    if nv["rows"] != bs["rows"] or nv["duplicates"] != bs["duplicates"] or nv["cross"] != bs["cross"]:
        print("MISMATCH between naive and bounded counts", file=sys.stderr)
        return 1
    return 0 if full["peak_rss_mib"] < 1024 else 1


if __name__ == "__main__":
    sys.exit(main())

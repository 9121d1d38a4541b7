#!/usr/bin/env python3
"""Benchmark: pages/s and CPU seconds per 1,000 pages on the demo sites.

Serves the four documentation sites of ``make demo`` from a site server in
its own process, then, in the same run:

1. the lean baseline (bench/leanloop.py: one process, no Redis, no output);
2. ``crawlctl run`` over the same seeds with no effective rate limit, one
   worker per shard, against a redis-server started here (so its CPU is
   measured apart from the crawler's).

Crawler CPU is user+sys of every crawler process (crawlctl, its workers and
reclaimer: RUSAGE_CHILDREN); Redis CPU comes from INFO cpu.  Prints a table
and the ratio crawld / baseline, which is what to compare across machines.

    make bench            # or: .venv/bin/python bench/cpu_per_page.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from docsites import missing_packages, seeds, site_dirs  # noqa: E402

from crawld.localredis import RedisServer  # noqa: E402

PY = sys.executable


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port_file = tmp / "port"
    args = [PY, "-m", "crawld.sitesrv", "--port-file", str(port_file)]
    for host, d in site_dirs().items():
        args += ["--site", f"{host}={d}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}"
        time.sleep(0.05)
    raise SystemExit("site server did not start")


def run_lean(proxy: str, concurrency: int) -> dict:
    out = subprocess.run([PY, str(ROOT / "bench" / "leanloop.py"), "--proxy", proxy,
                          "--concurrency", str(concurrency), *seeds()],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_crawld(proxy: str, shards: int, concurrency: int, tmp: Path, rnd: int) -> dict:
    with RedisServer() as rs:
        client = redis.Redis.from_url(rs.url)
        redis_cpu0 = client.info("cpu")
        cpu0 = children_cpu()
        t0 = time.monotonic()
        out = subprocess.run(
            [str(Path(PY).with_name("crawlctl")), "run", *seeds(), "--crawl-id", f"bench-{rnd}",
             "--shards", str(shards), "--workers", str(concurrency), "--max-rps-per-host", "10000",
             "--max-inflight-per-host", str(concurrency), "--proxy", proxy, "--redis-url", rs.url,
             "--out", str(tmp / f"out-{rnd}"), "--json", "--quiet"],
            capture_output=True, text=True, env={**os.environ, "CRAWLD_LOG_LEVEL": "warning"})
        wall = time.monotonic() - t0
        cpu = children_cpu() - cpu0
        redis_cpu1 = client.info("cpu")
    if out.returncode != 0:
        raise SystemExit(f"crawlctl run failed:\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    rcpu = sum(redis_cpu1[k] - redis_cpu0[k] for k in ("used_cpu_user", "used_cpu_sys"))
    return {"pages": summary["pages"], "cpu_s": cpu, "wall_s": wall, "redis_cpu_s": rcpu}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds of baseline and crawld")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()
    if missing_packages():
        raise SystemExit(f"missing Debian packages: {' '.join(missing_packages())} (make bench installs them)")
    tmp = Path(tempfile.mkdtemp(prefix="crawld-bench-"))
    srv, proxy = start_server(tmp)
    results = {"lean": [], "crawld": []}
    try:
        for rnd in range(args.rounds):
            results["lean"].append(run_lean(proxy, args.concurrency))
            results["crawld"].append(run_crawld(proxy, args.shards, args.concurrency, tmp, rnd))
    finally:
        srv.terminate()
        srv.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    def per_k(rs: list[dict], key: str = "cpu_s") -> float:
        return 1000 * sum(r[key] for r in rs) / sum(r["pages"] for r in rs)

    lean, crawld = results["lean"], results["crawld"]
    print(f"{'':24}{'pages':>8}{'wall s':>9}{'pages/s':>9}{'CPU s/1k pages':>16}")
    for name, rs in (("lean loop (baseline)", lean), ("crawld", crawld)):
        pages = sum(r["pages"] for r in rs) / len(rs)
        wall = sum(r["wall_s"] for r in rs) / len(rs)
        print(f"{name:24}{pages:>8.0f}{wall:>9.1f}{pages / wall:>9.1f}{per_k(rs):>16.2f}")
    print(f"{'crawld redis-server':24}{'':>26}{per_k(crawld, 'redis_cpu_s'):>16.2f}")
    ratio = per_k(crawld) / per_k(lean)
    print(f"crawld CPU per page / baseline CPU per page = {ratio:.2f}"
          f" (with redis-server: {(per_k(crawld) + per_k(crawld, 'redis_cpu_s')) / per_k(lean):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

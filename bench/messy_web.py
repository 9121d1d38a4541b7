#!/usr/bin/env python3
"""Benchmark: crawld on a messy many-site web, with no extra flags.

Part 1, the web of ``tests/messyweb.py`` at scale (default 100 sites of 40
pages; at 2 r/s each, 300 sites need more requests per second than 2 cores
serve, crawler and site server together: the CPU line says so): bare domains redirect every path to ``www.`` (robots.txt too), every
fifth site answers robots.txt through five redirects, every seventh has
none, ``/private/`` is disallowed, one more site answers 429 above 1
request/s (nginx ``limit_req``).  ``crawlctl run`` at ``--rps`` per
registered domain (default 2) through the site server as proxy.  From the
server's own log (NDJSON, the server in its own process):

* violations   registered domains with more than ceil(R)+1 requests in a
               1 s window or 10R+ceil(R)+1 in a 10 s window (crawld.ratecheck);
* efficiency   lower bound (max over domains of the requests it needs / its
               rate: no polite crawler is done sooner) / the server-side span;
* completeness every page a correct crawler fetches got one 200, nothing
               disallowed was requested, robots.txt once per host.

Part 2 (``--throttle-pages N``, default 1000; 0 to skip): one host that
answers 429 above 2 requests/s, crawled at ``--max-rps-per-host 1000``: the
share of 429 answers, every page fetched, time against N / 2 s.

Exits 1 when a promise broke (a violation, a page missing or fetched twice,
a disallowed page requested), 2 when a crawl failed.

    .venv/bin/python bench/messy_web.py [--sites 100] [--pages 40] [--rps 2] [--shards 4] [--workers 64]
                                         [--throttle-pages 1000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import messyweb  # noqa: E402  (tests/messyweb.py: the web both the test and this bench crawl)

import redis  # noqa: E402

from crawld.localredis import RedisServer  # noqa: E402
from crawld.ratecheck import limits, max_in_window, rate_violations  # noqa: E402
from crawld.sharding import politeness_key  # noqa: E402
from crawld.sitesrv import SiteServer, SyntheticSite  # noqa: E402

CRAWLCTL = str(Path(sys.executable).with_name("crawlctl"))


def _serve(kwargs: dict, log: str, port_file: str) -> None:
    srv = SiteServer(("127.0.0.1", 0), log_path=log, **kwargs)
    Path(port_file).write_text(str(srv.server_address[1]))
    srv.serve_forever()


def start_server(tmp: Path, kwargs: dict, name: str) -> tuple[multiprocessing.Process, str, Path]:
    """The site server in its own process (fork), logging every request."""
    log, port_file = tmp / f"{name}.ndjson", tmp / f"{name}.port"
    proc = multiprocessing.get_context("fork").Process(target=_serve, args=(kwargs, str(log), str(port_file)),
                                                       daemon=True)
    proc.start()
    for _ in range(400):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}", log
        time.sleep(0.05)
    raise SystemExit("bench: site server did not start")


def _cpu(pid: int | None = None) -> float:
    """CPU seconds (user+sys) of process ``pid`` (psutil), or of this
    process's reaped children (``crawlctl run`` and its workers)."""
    if pid is None:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime
    try:
        import psutil  # a test dependency (requirements-dev.txt)
        ct = psutil.Process(pid).cpu_times()
        return ct.user + ct.system
    except Exception:  # noqa: BLE001 - a diagnosis only
        return float("nan")


def crawl(tmp: Path, name: str, seeds: list[str], proxy: str, redis_url: str, args, extra=()) -> tuple[dict, float]:
    seeds_file = tmp / f"{name}.seeds"
    seeds_file.write_text("\n".join(seeds) + "\n")
    cmd = [CRAWLCTL, "run", "--seeds-file", str(seeds_file), "--crawl-id", name, "--shards", str(args.shards),
           "--workers", str(args.workers), "--proxy", proxy, "--redis-url", redis_url,
           "--out", str(tmp / "out"), "--json", "--quiet", *extra]
    env = {**os.environ, "CRAWLD_LOG_LEVEL": "warning"}
    env.pop("REDIS_URL", None)
    t0, cpu0 = time.time(), _cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    wall = time.time() - t0
    crawl.cpu = _cpu() - cpu0
    if proc.returncode != 0:
        print(f"bench: crawlctl run failed ({proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(2)
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def _redis_cpu(rds) -> float:
    info = rds.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def hits_of(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def table(rows: list[tuple[str, str]]) -> None:
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")


def part1(args, tmp: Path, redis_url: str) -> bool:
    web = messyweb.build(args.sites, args.pages)
    srv, proxy, log = start_server(tmp, web.server_kwargs(), "messy")
    rds = redis.Redis.from_url(redis_url)
    redis_cpu0 = _redis_cpu(rds)
    try:
        summary, wall = crawl(tmp, "messy", web.seeds, proxy, redis_url, args,
                              ["--max-rps-per-host", f"{args.rps:g}"])
        srv_cpu = _cpu(srv.pid)
        redis_cpu = _redis_cpu(rds) - redis_cpu0
    finally:
        srv.terminate()
        srv.join()
    hits = hits_of(log)
    by_domain: dict[str, list[float]] = defaultdict(list)
    for h in hits:
        by_domain[politeness_key(h["host"])].append(h["t"])
    bad = rate_violations(by_domain, args.rps)
    lim1, lim10 = limits(args.rps)
    worst1 = max(max_in_window(ts, 1.0) for ts in by_domain.values())
    worst10 = max(max_in_window(ts, 10.0) for ts in by_domain.values())
    robots = Counter(h["host"] for h in hits if h["path"] == "/robots.txt")
    pages = Counter((h["host"], h["path"]) for h in hits if h["status"] == 200 and not h["path"].startswith("/robots"))
    expected = web.expected_pages()
    missing = expected - set(pages)
    twice = [k for k, n in pages.items() if n > 1]
    forbidden = [h for h in hits if h["path"].startswith("/private/") and web.has_robots(politeness_key(h["host"]))]
    limited = [h for h in hits if politeness_key(h["host"]) == web.limited]
    n429 = sum(1 for h in limited if h["status"] == 429)
    times = sorted(h["t"] for h in hits)
    span = times[-1] - times[0]
    lower = web.lower_bound(args.rps)
    print(f"part 1: {len(web.domains)} sites ({args.sites} of {args.pages} pages + the 429 site), "
          f"{args.rps:g} r/s per registered domain, {args.shards} shards, {args.workers} fetches per worker")
    table([
        ("requests seen by the server", f"{len(hits)} ({sum(robots.values())} robots.txt, "
                                        + " ".join(f"{k}={v}" for k, v in sorted(Counter(
                                            f"{h['status'] // 100}xx" for h in hits).items())) + ")"),
        ("rate violations", f"{len(bad)} of {len(by_domain)} domains (limits {lim1}/1 s, {lim10:g}/10 s; worst "
                            f"seen {worst1}/1 s, {worst10}/10 s)"),
        ("robots.txt per host", f"at most {max(robots.values())} ({len(robots)} hosts)"),
        ("pages with 200", f"{len(set(pages) & expected)} of {len(expected)} expected; {len(missing)} missing, "
                           f"{len(twice)} fetched twice"),
        ("disallowed pages requested", f"{len(forbidden)}"),
        ("429 site", f"{len(limited)} requests, {n429} answered 429 ({100 * n429 / max(len(limited), 1):.1f} %)"),
        ("lower bound", f"{lower:.1f} s"),
        ("server-side span", f"{span:.1f} s (crawlctl wall {wall:.1f} s: start-up, end detection, merge)"),
        ("efficiency", f"{lower / span:.3f} of the lower bound (vs crawlctl wall {lower / wall:.3f})"),
        ("CPU", f"crawler {crawl.cpu:.1f} s, site server {srv_cpu:.1f} s, redis-server {redis_cpu:.1f} s: "
                f"{(crawl.cpu + srv_cpu + redis_cpu) / wall:.2f} of {os.cpu_count()} cores busy on average; "
                f"{len(hits) / lower:.0f} requests/s needed to meet the lower bound"),
        ("artifact rows", f"{summary['rows']} (" + " ".join(f"{k}={v}" for k, v in summary["outcomes"].items()) + ")"),
    ])
    return not bad and not missing and not twice and not forbidden


def part2(args, tmp: Path, redis_url: str) -> bool:
    n = args.throttle_pages
    host = "www.throttled-site.com"
    kwargs = dict(synthetic={host: SyntheticSite(n, extra_links=2)}, limits={host: 2.0})
    srv, proxy, log = start_server(tmp, kwargs, "throttle")
    try:
        summary, wall = crawl(tmp, "throttle", [f"http://{host}/"], proxy, redis_url, args,
                              ["--max-rps-per-host", "1000"])
    finally:
        srv.terminate()
        srv.join()
    hits = hits_of(log)
    n429 = sum(1 for h in hits if h["status"] == 429)
    ok = {(h["path"]) for h in hits if h["status"] == 200 and h["path"] != "/robots.txt"}
    times = sorted(h["t"] for h in hits)
    span = times[-1] - times[0]
    accepted = len(hits) - n429
    print(f"part 2: one site of {n + 1} pages answering 429 above 2 r/s (limit_req), crawled at "
          "--max-rps-per-host 1000")
    table([
        ("requests", f"{len(hits)}: {accepted} accepted, {n429} answered 429 = {100 * n429 / len(hits):.2f} %"),
        ("pages with 200", f"{len(ok)} of {n + 1}"),
        ("artifact", f"{summary['rows']} rows, statuses " + " ".join(f"{k}={v}" for k, v in summary["statuses"].items())),
        ("time", f"{span:.1f} s server-side; the host's own limit allows {accepted / 2.0:.1f} s at best "
                 f"(efficiency {accepted / 2.0 / span:.3f})"),
    ])
    return len(ok) == n + 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=100)
    p.add_argument("--pages", type=int, default=40)
    p.add_argument("--rps", type=float, default=2.0)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--throttle-pages", type=int, default=1000)
    p.add_argument("--keep", metavar="DIR", help="keep the server logs and the artifacts in DIR")
    args = p.parse_args()
    good = True
    with tempfile.TemporaryDirectory(prefix="crawld-messy-") as tmp, RedisServer() as rs:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.sites:
            good &= part1(args, work, rs.url)
        if args.throttle_pages:
            good &= part2(args, work, rs.url)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())

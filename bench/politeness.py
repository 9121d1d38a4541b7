#!/usr/bin/env python3
"""Benchmark: how close crawld gets to the politeness limit on a web of many hosts.

A synthetic web of ``--hosts`` host names (``--pages-per-host`` pages each,
plus the home page) spread over registered domains with real public
suffixes: most domains hold one host, some two or three (``www.``,
``blog.``, ``shop.``), so the per-registered-domain rate is what limits
them.  The site server (``python -m crawld.sitesrv``) runs in its own
process and logs every request; a private redis-server is started here;
``crawlctl run`` crawls every host's home page at ``--rps`` requests/s per
registered domain.

From the server's own request log:

* lower bound   max over registered domains of requests / R: no polite
                crawler can finish sooner;
* efficiency    lower bound / measured time, (a) against the server-side
                span (first to last request of the whole crawl) and (b)
                against crawlctl's wall time (start-up, termination
                detection and merge included);
* violations    registered domains breaking crawld.ratecheck's bounds
                (1 s window > ceil(R)+1, or 10 s window > 10R+ceil(R)+1).

Crawler CPU is RUSAGE_CHILDREN around ``crawlctl run`` (crawlctl, its shard
workers and the reclaimer): the site server and redis-server are children of
this process too, but they are started before the baseline and reaped only
after the measurement, so the kernel has not added their CPU to
RUSAGE_CHILDREN when it is read.  Their CPU is read apart (psutil for the
site server, INFO cpu for Redis).  While the crawl runs a sampler thread
records, every 0.25 s, CPU per process (psutil) and, per registered domain,
the entries queued in the frontier (ZLEXCOUNT on its shard's queue, read
only), for the diagnosis printed after the table.

Exits 1 when a domain broke the rate bounds, 2 when the crawl failed.

    .venv/bin/python bench/politeness.py [--hosts 200] [--pages-per-host 80] [--rps 2] [--shards 4] [--workers 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import redis

import crawld
from crawld import keys
from crawld.localredis import RedisServer
from crawld.ratecheck import limits, max_in_window, rate_violations
from crawld.sharding import politeness_key, shard_of

try:  # a test dependency (requirements-dev.txt); only the diagnosis needs it
    import psutil
except ImportError:  # pragma: no cover
    psutil = None

PY = sys.executable

#: real public suffixes (ICANN section of the PSL), one- and two-label
SUFFIXES = ("com", "org", "net", "co.uk", "de", "com.au", "io", "fr", "co.jp", "nl", "org.uk", "com.br")
#: sub-domains of the domains that hold several hosts
SUBS = ("www", "blog", "shop")


# -- the synthetic web ------------------------------------------------------------

def build_web(n_hosts: int) -> dict[str, list[str]]:
    """Registered domain -> its host names, ``n_hosts`` hosts in all.

    Of every 9 domains, 7 hold one host (alternately ``www.D`` and ``D``),
    one holds two (www., blog.) and one three (www., blog., shop.); so about
    a quarter of the hosts share their registered domain with another.
    """
    web: dict[str, list[str]] = {}
    i = 0
    left = n_hosts
    while left > 0:
        size = 3 if i % 9 == 4 else 2 if i % 9 == 7 else 1
        size = min(size, left)
        domain = f"site{i:03d}-bench.{SUFFIXES[i % len(SUFFIXES)]}"
        hosts = list(SUBS[:size]) if size > 1 else (["www"] if i % 2 == 0 else [""])
        web[domain] = [f"{s}.{domain}" if s else domain for s in hosts]
        left -= size
        i += 1
    for domain, hosts in web.items():  # the politeness key must be the domain we meant
        for h in hosts:
            if politeness_key(h) != domain:
                raise SystemExit(f"bench: politeness_key({h!r}) = {politeness_key(h)!r}, expected {domain!r}")
    return web


def start_server(tmp: Path, hosts: list[str], pages: int) -> tuple[subprocess.Popen, str, Path]:
    """``python -m crawld.sitesrv`` in its own process, logging every request."""
    port_file, log = tmp / "port", tmp / "requests.ndjson"
    args = [PY, "-m", "crawld.sitesrv", "--port-file", str(port_file), "--log", str(log)]
    for h in hosts:
        args += ["--synthetic", f"{h}={pages}"]
    # cwd: not the repository, so that 'python -m' imports the same crawld as
    # this process (the venv's, or $PYTHONPATH's), not ./crawld
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, cwd=tmp)
    for _ in range(400):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}", log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit("bench: site server did not start")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# -- sampling while the crawl runs ---------------------------------------------

@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)  # label -> cumulative CPU s
    machine_busy: list[float] = field(default_factory=list)    # cumulative busy CPU s, all cores
    machine_steal: list[float] = field(default_factory=list)   # cumulative steal (VM host took the core)
    queued: list[list[int]] = field(default_factory=list)      # per domain (web order)
    inflight: list[list[int]] = field(default_factory=list)


class Sampler(threading.Thread):
    """Every ``interval`` s: CPU per process and the frontier per domain."""

    def __init__(self, interval: float, server_pid: int, redis_pid: int, rds: redis.Redis,
                 crawl_id: str, shards: int, domains: list[str]):
        super().__init__(daemon=True, name="sampler")
        self.interval = interval
        self.stop = threading.Event()
        self.samples = Samples()
        self.rds = rds
        self.domains = domains
        self.qkeys = [keys.shard_keys(crawl_id, shard_of(d, shards)) for d in domains]
        self.crawl_pid: int | None = None
        self._procs: dict[int, tuple[str, object]] = {}
        self._last: dict[int, float] = {}
        self._labels: dict[int, str] = {}
        if psutil:
            for pid, label in ((server_pid, "site server"), (redis_pid, "redis-server"),
                               (os.getpid(), "bench (sampler)")):
                self._procs[pid] = (label, psutil.Process(pid))
        self._next_scan = 0.0
        self.error: str | None = None

    def _label(self, p) -> str:
        try:
            cmd = p.cmdline()
        except Exception:  # noqa: BLE001
            return "crawler: ?"
        if "crawld.worker" in cmd and "--shard" in cmd:
            return f"crawler: worker-{cmd[cmd.index('--shard') + 1]}"
        if "crawld.reclaim" in cmd:
            return "crawler: reclaim"
        return "crawler: crawlctl" if p.pid == self.crawl_pid else f"crawler: {p.name()}"

    def _cpu(self) -> dict[str, float]:
        if not psutil:
            return {}
        now = time.monotonic()
        if self.crawl_pid and now >= self._next_scan:
            self._next_scan = now + 1.0
            try:
                root = psutil.Process(self.crawl_pid)
                for p in [root, *root.children(recursive=True)]:
                    if p.pid not in self._procs:
                        self._procs[p.pid] = (self._label(p), p)
            except psutil.Error:
                pass
        for pid, (label, p) in list(self._procs.items()):
            try:
                ct = p.cpu_times()
                self._last[pid] = ct.user + ct.system
                self._labels[pid] = label
            except psutil.Error:
                pass  # exited: keep its last reading
        out: dict[str, float] = defaultdict(float)
        for pid, v in self._last.items():
            out[self._labels[pid]] += v
        return dict(out)

    def _frontier(self) -> tuple[list[int], list[int]]:
        pipe = self.rds.pipeline(transaction=False)
        for d, k in zip(self.domains, self.qkeys):
            pipe.zlexcount(k.queue, b"[" + d.encode() + b"\x1f", b"(" + d.encode() + b"\x20")
            pipe.hget(k.inflight, d)
        r = pipe.execute()
        return [int(x) for x in r[0::2]], [int(x or 0) for x in r[1::2]]

    def sample(self) -> None:
        s = self.samples
        try:
            q, inf = self._frontier()
        except redis.RedisError as exc:  # the key schema may change under us: diagnosis only
            self.error = f"frontier sampling failed: {exc}"
            q = inf = [-1] * len(self.domains)
        s.t.append(time.time())
        s.cpu.append(self._cpu())
        if psutil:
            ct = psutil.cpu_times()
            steal = getattr(ct, "steal", 0.0)
            s.machine_busy.append(sum(ct) - ct.idle - getattr(ct, "iowait", 0.0) - steal
                                  - getattr(ct, "guest", 0.0) - getattr(ct, "guest_nice", 0.0))
            s.machine_steal.append(steal)
        s.queued.append(q)
        s.inflight.append(inf)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)
        self.sample()


# -- the run ---------------------------------------------------------------------

def run(args, tmp: Path, web: dict[str, list[str]]) -> dict:
    hosts = [h for hs in web.values() for h in hs]
    crawl_id = f"bench-polite-{os.getpid()}"
    srv, proxy, log = start_server(tmp, hosts, args.pages_per_host)
    try:
        with RedisServer() as rs:
            rds = redis.Redis.from_url(rs.url)
            sampler = Sampler(0.25, srv.pid, rs.proc.pid, rds, crawl_id, args.shards, list(web))
            cmd = [str(Path(PY).with_name("crawlctl")), "run", *(f"http://{h}/" for h in hosts),
                   "--crawl-id", crawl_id, "--shards", str(args.shards), "--workers", str(args.workers),
                   "--max-rps-per-host", f"{args.rps:g}", "--max-inflight-per-host", "2",
                   "--proxy", proxy, "--redis-url", rs.url, "--out", str(tmp / "out"), "--json", "--quiet"]
            env = {**os.environ, "CRAWLD_LOG_LEVEL": "warning"}
            env.pop("REDIS_URL", None)
            redis_cpu0 = rds.info("cpu")
            srv_cpu0 = _proc_cpu(srv.pid)
            cpu0 = children_cpu()
            t0 = time.time()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=tmp)
            sampler.crawl_pid = proc.pid
            sampler.start()
            stdout, stderr = proc.communicate()
            t1 = time.time()
            cpu = children_cpu() - cpu0
            sampler.stop.set()
            sampler.join()
            srv_cpu = _proc_cpu(srv.pid) - srv_cpu0
            redis_cpu1 = rds.info("cpu")
    finally:
        srv.terminate()
        srv.wait()
    if proc.returncode != 0:
        print(f"bench: crawlctl run failed ({proc.returncode}):\n{stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(2)
    if stderr.strip():
        print(f"bench: crawlctl stderr (last lines):\n{stderr.strip()[-1500:]}", file=sys.stderr)
    summary = json.loads(stdout.strip().splitlines()[-1])
    hits = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {"summary": summary, "hits": hits, "t0": t0, "t1": t1, "cpu": cpu, "srv_cpu": srv_cpu,
            "redis_cpu": sum(redis_cpu1[k] - redis_cpu0[k] for k in ("used_cpu_user", "used_cpu_sys")),
            "samples": sampler.samples, "sampler_error": sampler.error, "cmd": cmd}


def _proc_cpu(pid: int) -> float:
    if not psutil:
        return float("nan")
    ct = psutil.Process(pid).cpu_times()
    return ct.user + ct.system


# -- analysis ---------------------------------------------------------------------

def analyse(args, web: dict[str, list[str]], r: dict) -> tuple[list[tuple[str, str]], dict]:
    R = args.rps
    T = 1.0 / R
    hits, t0, t1 = r["hits"], r["t0"], r["t1"]
    by_domain: dict[str, list[float]] = defaultdict(list)
    for h in hits:
        by_domain[politeness_key(h["host"])].append(h["t"])
    for ts in by_domain.values():
        ts.sort()
    times = sorted(h["t"] for h in hits)
    first, last = times[0], times[-1]
    span = last - first
    wall = t1 - t0
    counts = {d: len(ts) for d, ts in by_domain.items()}
    busiest = max(counts, key=counts.get)
    lower = counts[busiest] / R
    robots = sum(1 for h in hits if h["path"] == "/robots.txt")
    urls = Counter((h["host"], h["path"]) for h in hits)
    twice = sum(1 for n in urls.values() if n > 1)
    statuses = Counter(f"{h['status'] // 100}xx" for h in hits)
    expected = sum(len(hs) for hs in web.values()) * (args.pages_per_host + 1)
    bad = rate_violations(by_domain, R)
    lim1, lim10 = limits(R)
    worst1 = max(max_in_window(ts, 1.0) for ts in by_domain.values())
    worst10 = max(max_in_window(ts, 10.0) for ts in by_domain.values())
    s = r["summary"]
    sizes = Counter(len(hs) for hs in web.values())
    n_by_size = Counter()
    for d, hs in web.items():
        n_by_size[len(hs)] = max(n_by_size[len(hs)], counts.get(d, 0))
    rows = [
        ("web", f"{sum(sizes[k] * k for k in sizes)} hosts x {args.pages_per_host + 1} URLs on {len(web)} "
                f"registered domains ({', '.join(f'{sizes[k]} with {k} host(s)' for k in sorted(sizes))})"),
        ("crawl settings", f"R = {R:g} req/s per registered domain, 2 in flight per domain, {args.shards} shards, "
                           f"{args.workers} fetches per worker"),
        ("pages (artifact rows)", f"{s['rows']} of {expected} expected; statuses "
                                  + " ".join(f"{k}={v}" for k, v in s["statuses"].items()) + f"; errors {s['errors']}"),
        ("requests seen by server", f"{len(hits)} ({len(urls)} distinct, {twice} URLs fetched twice; "
                                    + " ".join(f"{k}={v}" for k, v in sorted(statuses.items())) + ")"),
        ("robots.txt requests", f"{robots}"),
        ("busiest domain", f"{busiest}: {counts[busiest]} requests ({len(web[busiest])} hosts)"),
        ("lower bound (max requests / R)", f"{lower:.1f} s"),
        ("server-side span", f"{span:.1f} s (first request {first - t0:.2f} s after crawlctl start, "
                             f"last {t1 - last:.2f} s before its exit)"),
        ("crawlctl wall time", f"{wall:.1f} s"),
        ("efficiency (a) vs server span", f"{lower / span:.3f}"),
        ("efficiency (b) vs crawlctl wall", f"{lower / wall:.3f}"),
        ("violations", f"{len(bad)} of {len(by_domain)} domains (limits {lim1}/1 s, {lim10:g}/10 s; "
                       f"worst seen {worst1}/1 s, {worst10}/10 s)"),
        ("pages/s", f"{s['rows'] / wall:.1f} over crawlctl wall, {len(hits) / span:.1f} requests/s over server span"),
        ("CPU, crawler (crawlctl+workers+reclaim)", f"{r['cpu']:.1f} s = {1000 * r['cpu'] / max(s['rows'], 1):.2f} s "
                                                    f"per 1,000 pages, {r['cpu'] / wall:.2f} cores on average"),
        ("CPU, site server / redis-server", f"{r['srv_cpu']:.1f} s / {r['redis_cpu']:.1f} s"),
    ]
    info = {"by_domain": by_domain, "counts": counts, "lower": lower, "span": span, "wall": wall,
            "first": first, "last": last, "violations": bad, "T": T}
    return rows, info


def print_table(rows: list[tuple[str, str]]) -> None:
    w = max(len(k) for k, _ in rows)
    print(f"{'metric':<{w}}  value")
    print(f"{'-' * w}  {'-' * 60}")
    for k, v in rows:
        print(f"{k:<{w}}  {v}")


def diagnose(web: dict[str, list[str]], r: dict, info: dict) -> None:
    """Where the time between the lower bound and the measured time went."""
    T, t0, t1 = info["T"], r["t0"], r["t1"]
    by_domain, counts = info["by_domain"], info["counts"]
    smp: Samples = r["samples"]
    domains = list(web)
    idx = {d: i for i, d in enumerate(domains)}
    st = smp.t

    def lost(d: str) -> tuple[float, float, float]:
        """Time by which the domain's slow gaps (longer than 1.25/R: jitter of
        a few ms is not counted) exceeded 1/R, split by the sampled frontier:
        while its queue was empty (dry: links not discovered yet), while
        entries were queued (the crawler was late), no sample in the gap."""
        ts = by_domain[d]
        dry = ready = unsampled = 0.0
        i = idx[d]
        k = 0
        for a, b in zip(ts, ts[1:]):
            excess = (b - a) - T
            if excess <= 0.25 * T:
                continue
            while k < len(st) and st[k] <= a:
                k += 1
            j = k
            qs = []
            while j < len(st) and st[j] < b:
                qs.append(smp.queued[j][i])
                j += 1
            if not qs:
                unsampled += excess
                continue
            f_dry = sum(1 for q in qs if q == 0) / len(qs)
            dry += excess * f_dry
            ready += excess * (1 - f_dry)
        return dry, ready, unsampled

    print()
    print("diagnosis")
    print(f"  end-to-end: crawlctl start -> first request {info['first'] - t0:.2f} s; "
          f"last request -> crawlctl exit {t1 - info['last']:.2f} s; "
          f"lower bound {info['lower']:.1f} s vs server span {info['span']:.1f} s")
    # domains that ended last decide the server span
    order = sorted(by_domain, key=lambda d: by_domain[d][-1], reverse=True)
    print("  domains ending last (times in s after crawlctl start; own eff = (n-1)/R / own span; lost = own span"
          " - (n-1)/R; then the time by which slow gaps (> 1.25/R) exceeded 1/R, split by the frontier state"
          " sampled during the gap: its queue empty (dry), entries queued (queued), no sample inside (short)):")
    print(f"    {'domain':<26}{'hosts':>6}{'reqs':>6}{'first':>8}{'last':>8}{'span':>8}{'own eff':>9}"
          f"{'lost':>7}{'dry':>7}{'queued':>8}{'short':>7}")
    for d in order[:6]:
        ts = by_domain[d]
        sp = ts[-1] - ts[0]
        dry, ready, uns = lost(d)
        print(f"    {d:<26}{len(web[d]):>6}{len(ts):>6}{ts[0] - t0:>8.2f}{ts[-1] - t0:>8.2f}{sp:>8.1f}"
              f"{(len(ts) - 1) * T / sp if sp else 0:>9.3f}{sp - (len(ts) - 1) * T:>7.2f}{dry:>7.2f}{ready:>8.2f}"
              f"{uns:>7.2f}")
    # all domains, by number of hosts
    by_size: dict[int, list[str]] = defaultdict(list)
    for d in by_domain:
        by_size[len(web[d])].append(d)
    print("  all domains by number of hosts (medians):")
    for size in sorted(by_size):
        ds = by_size[size]
        effs, starts, dries, readies, unss = [], [], [], [], []
        for d in ds:
            ts = by_domain[d]
            sp = ts[-1] - ts[0]
            effs.append((len(ts) - 1) * T / sp if sp else 0)
            starts.append(ts[0] - t0)
            dry, ready, uns = lost(d)
            dries.append(dry)
            readies.append(ready)
            unss.append(uns)
        med = statistics.median
        print(f"    {size} host(s): {len(ds):>3} domains, own eff median {med(effs):.3f} (min {min(effs):.3f}), "
              f"first request median {med(starts):.2f} s (max {max(starts):.2f}), slow gaps: dry queue "
              f"{med(dries):.2f} s, queued {med(readies):.2f} s, unsampled {med(unss):.2f} s")
    # how many domains were busy over time, and the frontier
    if st:
        top = max(counts.values())
        biggest = [d for d, c in counts.items() if c == top]
        print(f"  over time (each row a tenth of the server span): requests/s; mean rate of the {len(biggest)} "
              f"domains with the most requests (they set the lower bound: R = {1 / T:g} when on schedule); "
              "domains between their first and last request; domains with an empty / a non-empty queue "
              "(sampled mean); CPU cores busy on the machine (processes >= 0.05, else = everything not "
              "started by this bench):")
        n = 10
        sl = info["span"] / n
        for k in range(n):
            a = info["first"] + k * sl
            b = a + sl
            active = sum(1 for ts in by_domain.values() if ts[0] < b and ts[-1] >= a)
            sidx = [j for j, t in enumerate(st) if a <= t < b]
            if not sidx:
                continue
            q_empty = statistics.mean(sum(1 for q in smp.queued[j] if q == 0) for j in sidx)
            q_some = statistics.mean(sum(1 for q in smp.queued[j] if q > 0) for j in sidx)
            cpu = ""
            if smp.machine_busy and sidx[-1] > sidx[0]:
                j0, j1 = sidx[0], sidx[-1]
                dt = st[j1] - st[j0]
                cpu = f"{(smp.machine_busy[j1] - smp.machine_busy[j0]) / dt:.2f}"
                parts = []
                tracked = 0.0
                for label in sorted(smp.cpu[j1]):
                    v = (smp.cpu[j1].get(label, 0) - smp.cpu[j0].get(label, 0)) / dt
                    tracked += v
                    if v >= 0.05:
                        parts.append(f"{label.replace('crawler: ', '')} {v:.2f}")
                m = (smp.machine_busy[j1] - smp.machine_busy[j0]) / dt
                if m - tracked >= 0.05:
                    parts.append(f"else {m - tracked:.2f}")
                cpu += " (" + ", ".join(parts) + ")"
            reqs = sum(1 for ts in by_domain.values() for x in ts if a <= x < b)
            big = sum(1 for d in biggest for x in by_domain[d] if a <= x < b) / len(biggest) / sl
            print(f"    {a - t0:6.1f}-{b - t0:6.1f} s: {reqs / sl:6.1f} req/s, busiest domains {big:4.2f} req/s each, "
                  f"{active:>4} domains active, queues empty {q_empty:5.1f} / non-empty {q_some:5.1f}, cores {cpu}")
    if smp.cpu and smp.machine_busy:
        # busiest 1 s of each process between the first and the last request
        # (start-up excluded); a single-threaded process near 1.0 is saturated
        peaks: dict[str, float] = defaultdict(float)
        inside = [j for j in range(4, len(st)) if info["first"] <= st[j - 4] and st[j] <= info["last"]]
        for j in inside:
            dt = st[j] - st[j - 4]
            tracked = 0.0
            for label, v in smp.cpu[j].items():
                d = v - smp.cpu[j - 4].get(label, 0.0)
                tracked += d
                peaks[label] = max(peaks[label], d / dt)
            m = smp.machine_busy[j] - smp.machine_busy[j - 4]
            peaks["(machine)"] = max(peaks["(machine)"], m / dt)
            peaks["(else)"] = max(peaks["(else)"], (m - tracked) / dt)
        j0 = next((j for j, t in enumerate(st) if t >= info["first"]), 0)
        j1 = max((j for j, t in enumerate(st) if t <= info["last"]), default=len(st) - 1)
        if j1 > j0:
            dt = st[j1] - st[j0]
            m = (smp.machine_busy[j1] - smp.machine_busy[j0]) / dt
            tr = sum(smp.cpu[j1].values()) - sum(smp.cpu[j0].values())
            bench = (smp.cpu[j1].get("bench (sampler)", 0) - smp.cpu[j0].get("bench (sampler)", 0)) / dt
            steal = (smp.machine_steal[j1] - smp.machine_steal[j0]) / dt
            print(f"  CPU between first and last request (cores): machine {m:.2f} of {os.cpu_count()} on average: "
                  f"crawler, site server and redis-server {tr / dt - bench:.2f}, this bench's sampler {bench:.2f}, "
                  f"everything else {m - tr / dt:.2f}; stolen by the hypervisor {steal:.2f}")
        print("  busiest 1 s (cores): " + ", ".join(f"{k.replace('crawler: ', '')} {v:.2f}"
                                                     for k, v in sorted(peaks.items())))
    if smp.queued and not any(q > 0 for qs in smp.queued for q in qs):
        print("  note: the frontier sampler never saw a queued entry; crawld's queue key layout may have "
              "changed, so the dry/queued split above means nothing")
    if r.get("sampler_error"):
        print(f"  note: {r['sampler_error']}")


def crawld_source() -> str:
    """Which crawld is measured: its directory and, in a git checkout, the
    commit and whether crawld/ has uncommitted changes."""
    pkg = Path(crawld.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=pkg, capture_output=True,
                               text=True).stdout.strip()
    except OSError:
        sha = dirty = ""
    return f"{pkg}" + (f" at {sha}" if sha else "") + (" + uncommitted changes" if dirty else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=200, help="host names in the synthetic web (default 200)")
    p.add_argument("--pages-per-host", type=int, default=80, help="pages per host besides / (default 80)")
    p.add_argument("--rps", type=float, default=2.0, help="requests/s per registered domain (default 2)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--workers", type=int, default=64, help="concurrent fetches per shard worker (default 64)")
    p.add_argument("--no-diagnosis", action="store_true", help="print the table only")
    args = p.parse_args()
    if args.hosts < 1 or args.pages_per_host < 1 or args.rps <= 0:
        p.error("--hosts, --pages-per-host and --rps must be positive")
    web = build_web(args.hosts)
    tmp = Path(tempfile.mkdtemp(prefix="crawld-polite-"))
    try:
        r = run(args, tmp, web)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows, info = analyse(args, web, r)
    rows.insert(0, ("crawld measured", f"{crawld_source()}; {os.cpu_count()} cores"))
    print_table(rows)
    if not args.no_diagnosis:
        diagnose(web, r, info)
    if info["violations"]:
        print(f"\nVIOLATIONS (domain: most in 1 s, most in 10 s): "
              + ", ".join(f"{d}: {v}" for d, v in sorted(info["violations"].items())))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

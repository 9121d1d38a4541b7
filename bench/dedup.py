"""Dedup backends: Redis memory per visited URL, push throughput and the
Bloom filter's measured false-positive rate.

For each backend, on a private redis-server of its own
(:class:`crawld.localredis.RedisServer`), the bench pushes ``--urls``
distinct URLs (synthetic, ``http://h<i mod 1000>.example/p/<i>``, real
fingerprints and payloads) through the real push script
(:meth:`crawld.frontier.Frontier.push`, ``--batch`` URLs per call,
``--pipeline`` calls per round trip), then reports:

* ``MEMORY USAGE`` (``SAMPLES 0``) summed over the dedup keys of the crawl
  (SCAN of ``<seen>*``), per URL;
* the ``INFO memory`` ``used_memory`` delta per URL, from before the first
  push to after the fill with every non-dedup key deleted (the queue the
  pushes built is deleted as it grows, every ``--flush-every`` URLs, outside
  the timed part);
* push throughput (URLs/s, the time of the pipelined script calls only,
  URL generation excluded) and Redis CPU per URL (``INFO commandstats``);
* false positives: ``--probe`` new distinct URLs pushed after the fill *to be
  recorded without a fetch* (mode ``out_of_scope``): the script then only
  tests ``seen`` (the URLs go to the separate ``skipseen``), so the fill of
  ``seen`` stays at ``--urls`` while it is probed; a probe URL reported as a
  duplicate was wrongly in ``seen``.

The baseline, measured in the same run, is today's ``plain`` encoding (before
the dedup backends): ``seen`` a Redis set of 8-byte binary fingerprints (the
push script still uses one as such when it finds it, which is how the bench
makes one).  Ratios are against it.

    .venv/bin/python bench/dedup.py [--urls 1000000] [--backends plain,redis_set,redis_bloom]
        [--fp-rate 0.01] [--shards 1] [--probe N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawld import dedup, keys  # noqa: E402
from crawld.config import CrawlConfig  # noqa: E402
from crawld.frontier import Entry, Frontier, PushItem  # noqa: E402
from crawld.localredis import RedisServer  # noqa: E402
from crawld.urls import fingerprint  # noqa: E402

CRAWL = "bench"
HOSTS = 1000


def items(start: int, stop: int, mode: str = "") -> list[PushItem]:
    out = []
    for i in range(start, stop):
        host = f"h{i % HOSTS}.example"
        url = f"http://{host}/p/{i}"
        out.append(PushItem(fingerprint(url), host, host, "", mode, Entry(url, url, 1).to_payload()))
    return out


def shard_of(i: int, shards: int) -> int:
    return (i // HOSTS) % shards if shards > 1 else 0


def used_memory(client: redis.Redis) -> int:
    """INFO used_memory less client buffers and the script cache (the
    pipelined pushes leave a large query buffer behind)."""
    m = client.info("memory")
    return int(m["used_memory"]) - int(m.get("mem_clients_normal", 0)) - int(m.get("used_memory_scripts", 0))


def evalsha_usec(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def dedup_keys(client: redis.Redis, shards: int) -> list[bytes]:
    out = []
    for s in range(shards):
        sk = keys.shard_keys(CRAWL, s)
        for structure in (sk.seen, sk.skipseen):
            out += list(client.scan_iter(match=structure.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
    return out


def drop_frontier(client: redis.Redis, shards: int) -> None:
    """Delete everything of the crawl but the dedup structures."""
    for s in range(shards):
        sk = keys.shard_keys(CRAWL, s)
        client.delete(*[k for k in sk.all() if k not in (sk.seen, sk.skipseen)])


def run_backend(backend: str, args: argparse.Namespace) -> dict:
    n, shards = args.urls, args.shards
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        cfg = CrawlConfig.from_dict({
            "crawl_id": CRAWL, "num_shards": shards, "max_rps_per_host": 1000, "max_pages_per_host": 0,
            "max_query_variants": 0, "expected_urls": n, "bloom_fp_rate": args.fp_rate,
            "dedup": "redis_set" if backend == "plain" else backend})
        f = Frontier(client, cfg)
        if backend == "plain":
            # today's encoding: seen is a set of 8-byte fingerprints (one sentinel member)
            for s in range(shards):
                client.sadd(keys.shard_keys(CRAWL, s).seen, b"\xff" * 8)
        mem0 = used_memory(client)
        usec0 = evalsha_usec(client)
        push_s, dups, done = 0.0, 0, 0
        batch, depth = args.batch, args.pipeline
        next_flush = args.flush_every
        while done < n:
            pipe = client.pipeline(transaction=False)
            calls = []
            for _ in range(depth):
                if done >= n:
                    break
                stop = min(n, done + batch)
                by_shard: dict[int, list[PushItem]] = {}
                for j, it in zip(range(done, stop), items(done, stop)):
                    by_shard.setdefault(shard_of(j, shards), []).append(it)
                for s, its in by_shard.items():
                    f.push(s, its, client=pipe)
                    calls.append(s)
                done = stop
            t = time.perf_counter()
            res = pipe.execute()
            push_s += time.perf_counter() - t
            dups += sum(int(r[2]) for r in res)
            if done >= next_flush:
                drop_frontier(client, shards)
                next_flush += args.flush_every
            if args.progress:
                print(f"\r  {backend}: {done}/{n}", end="", file=sys.stderr, flush=True)
        if args.progress:
            print(file=sys.stderr)
        usec = evalsha_usec(client) - usec0
        drop_frontier(client, shards)
        mem = used_memory(client) - mem0
        dk = dedup_keys(client, shards)
        pipe = client.pipeline(transaction=False)
        for k in dk:
            pipe.memory_usage(k, samples=0)
        usage = sum(int(x or 0) for x in pipe.execute())
        # every redis_set bucket should be an intset
        encodings: dict[str, int] = {}
        if backend == "redis_set":
            pipe = client.pipeline(transaction=False)
            buckets = [k for k in dk if k.rsplit(b":", 1)[-1].isdigit()]
            for k in buckets:
                pipe.object("encoding", k)
            for e in pipe.execute():
                e = e.decode() if isinstance(e, bytes) else str(e)
                encodings[e] = encodings.get(e, 0) + 1
        infos = [dedup.info(client, CRAWL, s) for s in range(shards)]
        # false positives: new URLs, to be recorded, tested against seen only
        probe = args.probe if args.probe is not None else max(1, n // 10)
        fp_hits, done_p = 0, 0
        while done_p < probe:
            pipe = client.pipeline(transaction=False)
            for _ in range(depth):
                if done_p >= probe:
                    break
                stop = min(probe, done_p + batch)
                by_shard = {}
                for j, it in zip(range(n + done_p, n + stop), items(n + done_p, n + stop, "out_of_scope")):
                    by_shard.setdefault(shard_of(j, shards), []).append(it)
                for s, its in by_shard.items():
                    f.push(s, its, client=pipe)
                done_p = stop
            fp_hits += sum(int(r[2]) for r in pipe.execute())
            if done_p % (batch * depth * 50) == 0:
                client.delete(*[keys.shard_keys(CRAWL, s).skips for s in range(shards)])
        out = {
            "backend": backend, "urls": n, "shards": shards,
            "impl": ",".join(sorted({i["backend"] for i in infos if i})),
            "dedup_keys": len(dk),
            "memory_usage_bytes": usage, "memory_usage_per_url": usage / n,
            "used_memory_delta": mem, "used_memory_per_url": mem / n,
            "push_s": push_s, "urls_per_s": n / push_s if push_s else None,
            "redis_us_per_url": usec / n,
            "duplicates_in_fill": dups,
            "probe": probe, "false_positives": fp_hits, "fp_rate_measured": fp_hits / probe,
        }
        if encodings:
            out["bucket_encodings"] = encodings
        if backend == "redis_bloom":
            i = infos[0]
            out.update(m=i.get("m"), k=i.get("k"), fp_rate_configured=args.fp_rate,
                       fp_rate_est=max(x.get("fp_rate_est", 0.0) for x in infos if x))
        if backend == "redis_set":
            out["bucket_bits"] = infos[0]["bits"]
        client.close()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--urls", type=int, default=1_000_000, help="distinct URLs pushed (default 1,000,000)")
    ap.add_argument("--backends", default="plain,redis_set,redis_bloom")
    ap.add_argument("--fp-rate", type=float, default=0.01, help="bloom_fp_rate (default 0.01)")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--batch", type=int, default=200, help="URLs per push script call")
    ap.add_argument("--pipeline", type=int, default=10, help="push calls per round trip")
    ap.add_argument("--flush-every", type=int, default=500_000, help="delete the built queue every N URLs")
    ap.add_argument("--probe", type=int, default=None, help="new URLs probed for false positives (default urls/10)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    results = [run_backend(b, args) for b in args.backends.split(",")]
    base = next((r for r in results if r["backend"] == "plain"), None)
    for r in results:
        if base:
            r["memory_ratio"] = r["memory_usage_per_url"] / base["memory_usage_per_url"]
            r["used_memory_ratio"] = r["used_memory_per_url"] / base["used_memory_per_url"]
            r["throughput_ratio"] = r["urls_per_s"] / base["urls_per_s"]
    if args.json:
        print(json.dumps(results, sort_keys=True))
        return 0
    print(f"{args.urls:,} URLs, {args.shards} shard(s), {args.batch} URLs per push, pipeline {args.pipeline}")
    hdr = ("backend", "impl", "keys", "MEMORY USAGE B/URL", "used_memory B/URL", "vs plain",
           "push URLs/s", "vs plain", "Redis us/URL", "FP measured", "FP configured")
    rows = [hdr]
    for r in results:
        rows.append((r["backend"], r["impl"], f"{r['dedup_keys']:,}", f"{r['memory_usage_per_url']:.2f}",
                     f"{r['used_memory_per_url']:.2f}", f"{r.get('used_memory_ratio', 1):.3f}",
                     f"{r['urls_per_s']:,.0f}", f"{r.get('throughput_ratio', 1):.2f}",
                     f"{r['redis_us_per_url']:.2f}",
                     f"{r['fp_rate_measured']:.5f} ({r['false_positives']}/{r['probe']})",
                     f"{r['fp_rate_configured']:g} (est. {r['fp_rate_est']:.5f})" if "fp_rate_configured" in r
                     else "-"))
    w = [max(len(row[i]) for row in rows) for i in range(len(hdr))]
    for row in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(row)))
    for r in results:
        if "bucket_encodings" in r:
            print(f"redis_set: {r['bucket_bits']} bucket bits, bucket encodings {r['bucket_encodings']}")
        if "m" in r:
            print(f"redis_bloom: m={r['m']} bits ({r['m'] / 8 / r['urls']:.3f} B/URL of bitmap), k={r['k']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

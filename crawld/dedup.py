"""Dedup backends: the per-shard "visited" structures of the push script.

Each shard has two dedup structures, ``seen`` (fingerprints of URLs ever
queued for fetching) and ``skipseen`` (fingerprints of URLs ever queued to
be recorded without a fetch, so that each becomes one row).  The push script
(``crawld/lua/push.lua``) adds to them and tests them atomically with the
enqueue.  The crawl setting ``dedup`` picks the backend:

``redis_set`` (default, exact up to fingerprint collisions)
    The 64-bit fingerprint (:func:`crawld.urls.fingerprint`) is split into a
    bucket number (its top ``bits`` bits) and a 32-bit remainder (its low 32
    bits); the member stored in the Redis set ``<seen>:<bucket>`` is the
    integer ``slot * 2^32 + remainder``, where ``slot`` is the 16-bit slot
    of the URL's politeness key (:func:`crawld.sharding.key_slot`, which
    alone decides the key's shard under any shard count).  So every entry
    says which shard its domain belongs to, and ``crawlctl rebalance``
    moves exactly the entries of the domains that change shard
    (:mod:`crawld.rebalance`, :func:`member_slot`).  Redis keeps a set of
    integers with at most ``set-max-intset-entries`` (512 by default)
    members as an *intset*, a sorted array of 8-byte integers here (Redis
    documentation, "Memory optimization"), instead of a hash table of
    strings (~50-70 bytes per member): about 9 bytes per URL in all
    (``bench/dedup.py``).  ``bits`` is the smallest number making the
    expected entries per bucket ``ceil(expected_urls / num_shards) /
    2^bits`` at most :data:`BUCKET_TARGET` (256), so every bucket stays an intset until the
    shard holds about twice its expected URLs (a Poisson bucket of mean 256
    passes 512 with probability ~1e-40).
    Two URLs are confused when their fingerprints agree on those
    ``bits + 32`` bits: a new URL is wrongly taken for a duplicate with
    probability ``n / 2^(bits + 32)`` where ``n`` is the shard's URLs, i.e.
    ``entries in its bucket / 2^32`` <= 256 / 2^32 = 6e-8 at the expected
    size; over a whole shard of ``n`` URLs about ``n^2 / 2^(bits + 33)``
    pages are skipped this way (0.2 at n = 10 million in one shard).

``redis_bloom`` (fixed memory, false positives by design)
    A Bloom filter (B. H. Bloom, "Space/time trade-offs in hash coding with
    allowable errors", CACM 13(7), 1970) of ``m`` bits and ``k`` hashes per
    shard, sized for ``n = ceil(expected_urls / num_shards)`` URLs at the
    false-positive rate ``p = bloom_fp_rate``:
    ``m = ceil(-n ln p / (ln 2)^2)``, ``k = round(m / n ln 2)`` (the
    optimum; A. Broder and M. Mitzenmacher, "Network applications of Bloom
    filters: a survey", Internet Mathematics 1(4), 2004, section 2.1), about
    9.6 bits (1.2 bytes) per URL at p = 1 %.  The ``k`` bit positions come
    from the fingerprint by double hashing, ``g_i = (h1 + i h2) mod m`` for
    i = 0..k-1 with ``h1``, ``h2`` its high and low 32 bits, which keeps the
    asymptotic false-positive rate of k independent hashes (A. Kirsch and
    M. Mitzenmacher, "Less hashing, same performance: building a better
    Bloom filter", ESA 2006, LNCS 4168; Random Structures & Algorithms
    33(2), 2008).  When the RedisBloom module is loaded (detected by the
    push script when it creates the shard's filter: ``BF.EXISTS`` answers),
    the filter is RedisBloom's ``BF.RESERVE <key> p n`` / ``BF.ADD``
    instead (scaling, so an over-full filter grows instead of failing
    pushes); otherwise it is a Redis string used as a bitmap
    (``SETBIT``/``GETBIT``), allocated at its full size when created.  At
    fill ``n`` the false-positive rate is ``(1 - e^(-k n / m))^k``
    (:func:`estimated_fp_rate`): every false positive is a page silently not
    crawled, so ``crawlctl run`` reports it.

Sizing is per shard, so a crawl whose URLs crowd on one shard (one big
site) fills that shard's structure faster: set ``expected_urls`` to about
``num_shards`` times the largest shard's URLs in that case.

Each structure's parameters are recorded in Redis, in the hash at the
structure's own key (``seen`` / ``skipseen``: fields ``b`` = ``set``,
``lua`` or ``bf``, ``bits``, ``m``, ``k``, ``cap``, ``p``, and ``n`` =
fingerprints added), by the first push that uses it, and read back by every
later push: a shard's layout never changes during a crawl, whatever the
``Frontier`` that pushes passes.  Its data keys carry the shard's hash tag
(same Redis Cluster slot): ``<key>:<bucket>`` (redis_set), ``<key>:bits``
(Lua Bloom filter) or ``<key>:bf`` (RedisBloom).  A crawl created before
these backends has ``seen``/``skipseen`` as plain sets of 8-byte
fingerprints; the push script keeps using them as such (``plain``).
"""

from __future__ import annotations

import math
from typing import Any

import redis

from . import keys
from .sharding import key_slot

#: the values of the ``dedup`` crawl setting.
BACKENDS = ("redis_set", "redis_bloom")

#: expected members per redis_set bucket (half of Redis' default
#: set-max-intset-entries, 512, so a bucket stays an intset up to ~2x).
BUCKET_TARGET = 256

#: largest Redis string is 512 MiB = 2^32 bits.
MAX_BLOOM_BITS = 1 << 32

#: the two dedup structures of a shard (names in :mod:`crawld.keys`).
STRUCTURES = ("seen", "skipseen")


def per_shard(expected_urls: int, num_shards: int) -> int:
    """URLs each shard's structures are sized for."""
    return max(1, -(-int(expected_urls) // int(num_shards)))


def bucket_bits(n: int) -> int:
    """Bucket bits of a redis_set structure sized for ``n`` URLs: the
    smallest ``b`` with ``n / 2^b <= BUCKET_TARGET`` (at most 32)."""
    b = 0
    while b < 32 and n > BUCKET_TARGET << b:
        b += 1
    return b


def bloom_size(n: int, p: float) -> tuple[int, int]:
    """``(m, k)``: bits and hashes of a Bloom filter for ``n`` items at
    false-positive rate ``p``: ``m = ceil(-n ln p / (ln 2)^2)``,
    ``k = round(m / n ln 2)`` (at least 1)."""
    m = max(8, math.ceil(-n * math.log(p) / (math.log(2) ** 2)))
    k = max(1, round(m / n * math.log(2)))
    return m, k


def estimated_fp_rate(n: int, m: int, k: int) -> float:
    """False-positive rate of a Bloom filter of ``m`` bits and ``k`` hashes
    holding ``n`` items: ``(1 - e^(-k n / m))^k`` (Broder & Mitzenmacher
    2004, eq. 1)."""
    if n <= 0 or m <= 0:
        return 0.0
    return (1.0 - math.exp(-k * n / m)) ** k


def push_spec(config: Any) -> str:
    """ARGV of the push script that sizes a shard's structures when it
    creates them: ``"set <bits>"`` or ``"bloom <m> <k> <n> <p>"``."""
    n = per_shard(config.expected_urls, config.num_shards)
    if config.dedup == "redis_bloom":
        m, k = bloom_size(n, config.bloom_fp_rate)
        return f"bloom {m} {k} {n} {config.bloom_fp_rate!r}"
    return f"set {bucket_bits(n)}"


def check(config: Any) -> None:
    """Cross-setting check of a crawl config.

    Raises:
        ValueError: ``"expected_urls: ..."`` when a shard's Bloom filter
            would exceed a Redis string (2^32 bits).
    """
    if config.dedup == "redis_bloom":
        n = per_shard(config.expected_urls, config.num_shards)
        m, _ = bloom_size(n, config.bloom_fp_rate)
        if m > MAX_BLOOM_BITS:
            top = int(MAX_BLOOM_BITS * math.log(2) ** 2 / -math.log(config.bloom_fp_rate)) * config.num_shards
            raise ValueError(f"expected_urls: a shard's Bloom filter would need {m} bits, more than a Redis "
                             f"string holds (2^32); at most {top} with {config.num_shards} shard(s) and "
                             f"bloom_fp_rate {config.bloom_fp_rate:g} (use more shards)")


# -- reading (Python mirror of the push script) ----------------------------
def tagged_fingerprint(fp: bytes, pkey: str) -> bytes:
    """What the push script takes for a URL: its 8-byte fingerprint (shorter
    ones padded with zero bytes) then the 2-byte big-endian slot of its
    politeness key (:func:`crawld.sharding.key_slot`)."""
    return (bytes(fp) + b"\0" * 8)[:8] + key_slot(pkey).to_bytes(2, "big")


def words(fp: bytes) -> tuple[int, int]:
    """The high and low 32 bits of a 64-bit fingerprint (shorter ones are
    padded with zero bytes, as the push script does)."""
    fp = (bytes(fp) + b"\0" * 8)[:8]
    return int.from_bytes(fp[:4], "big"), int.from_bytes(fp[4:], "big")


def bucket_and_member(fp: bytes, bits: int, pkey: str) -> tuple[int, int]:
    """redis_set: the bucket number (top ``bits`` bits of ``fp``, the URL's
    fingerprint) and the intset member (``slot * 2^32 + low 32 bits``,
    ``slot`` that of ``pkey``, its politeness key)."""
    hi, lo = words(fp)
    return (hi >> (32 - bits) if bits else 0), (key_slot(pkey) << 32) | lo


def member_slot(member: int) -> int:
    """The politeness-key slot kept in a redis_set member."""
    return int(member) >> 32


def bloom_positions(fp: bytes, m: int, k: int) -> list[int]:
    """The ``k`` bit positions of ``fp`` in an ``m``-bit filter (double
    hashing, Kirsch & Mitzenmacher 2006)."""
    h1, h2 = words(fp)
    return [(h1 + i * h2) % m for i in range(k)]


def _meta(client: redis.Redis, key: str) -> dict[str, str] | None:
    if client.type(key) in (b"set", "set"):
        return {"b": "plain"}
    raw = client.hgetall(key)
    if not raw:
        return None
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()}


def contains(client: redis.Redis, crawl_id: str, shard: int, structure: str, fp: bytes, pkey: str) -> bool:
    """Whether ``fp``, the fingerprint of a URL of politeness key ``pkey``,
    is in ``structure`` (``seen`` or ``skipseen``) of a shard, read as the
    push script reads it (for tests and tools)."""
    key = getattr(keys.shard_keys(crawl_id, shard), structure)
    meta = _meta(client, key)
    if meta is None:
        return False
    b = meta["b"]
    if b == "plain":
        return bool(client.sismember(key, fp))
    if b == "set":
        bucket, member = bucket_and_member(fp, int(meta["bits"]), pkey)
        return bool(client.sismember(f"{key}:{bucket}", member))
    if b == "bf":
        return bool(client.execute_command("BF.EXISTS", f"{key}:bf", fp))
    pipe = client.pipeline(transaction=False)
    for pos in bloom_positions(fp, int(meta["m"]), int(meta["k"])):
        pipe.getbit(f"{key}:bits", pos)
    return all(pipe.execute())


def info(client: redis.Redis, crawl_id: str, shard: int, structure: str = "seen") -> dict[str, Any] | None:
    """The recorded layout of a shard's structure, or None before its first
    push: ``backend`` (``set``, ``lua``, ``bf`` or ``plain``), ``n``
    fingerprints added (``plain``: SCARD), and ``bits`` or ``m``, ``k``,
    ``capacity``, ``p`` and ``fp_rate_est`` (Bloom filters)."""
    key = getattr(keys.shard_keys(crawl_id, shard), structure)
    meta = _meta(client, key)
    if meta is None:
        return None
    b = meta["b"]
    if b == "plain":
        return {"backend": b, "n": int(client.scard(key))}
    out: dict[str, Any] = {"backend": b, "n": int(meta.get("n", 0))}
    if b == "set":
        out["bits"] = int(meta["bits"])
    else:
        m, k = int(meta["m"]), int(meta["k"])
        out.update(m=m, k=k, capacity=int(meta["cap"]), p=float(meta["p"]),
                   fp_rate_est=estimated_fp_rate(out["n"], m, k))
    return out


def bloom_report(client: redis.Redis, config: Any) -> dict[str, Any]:
    """For the run summary of a ``redis_bloom`` crawl: URLs held by the
    filters and the estimated false-positive rate at their current fill.

    ``urls`` / ``skip_urls`` sum the fingerprints added to the ``seen`` /
    ``skipseen`` filters of every shard; ``fp_rate_est`` is the highest
    estimate over the shards' ``seen`` filters (a new URL of that shard is
    wrongly skipped with this probability), ``fp_rate_est_skip`` the same
    for ``skipseen``; ``impl`` is ``lua`` (bitmap), ``bf`` (RedisBloom) or
    both, comma-separated."""
    rep: dict[str, Any] = {"backend": "redis_bloom", "fp_rate_configured": config.bloom_fp_rate,
                           "capacity_per_shard": per_shard(config.expected_urls, config.num_shards),
                           "urls": 0, "skip_urls": 0, "fp_rate_est": 0.0, "fp_rate_est_skip": 0.0}
    impls = set()
    for shard in range(config.num_shards):
        for structure, n_key, fp_key in (("seen", "urls", "fp_rate_est"),
                                         ("skipseen", "skip_urls", "fp_rate_est_skip")):
            i = info(client, config.crawl_id, shard, structure)
            if i is None:
                continue
            impls.add(i["backend"])
            rep[n_key] += i["n"]
            rep[fp_key] = max(rep[fp_key], i.get("fp_rate_est", 0.0))
    rep["impl"] = ",".join(sorted(impls)) or "-"
    return rep

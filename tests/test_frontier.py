"""Semantics of the frontier's Lua scripts, through crawld.frontier.Frontier,
against a real redis-server (fixture ``rds``).

Exact claim times are read back from Redis: a claim's visibility deadline is
``now + vt`` where ``now`` is the Redis TIME the claim script ran at, so
``ZSCORE claimed token - vt`` is the server time of the claim, to the
microsecond.  Politeness lower bounds are asserted on those exact times.
Host reports are applied in a claim call that also claims a fresh skip
entry (helper ``report``), so the same trick gives the exact time a
backoff or hold started.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from redis.crc import key_slot

from crawld import dedup, keys
from crawld.config import CrawlConfig
from crawld.frontier import Claim, Entry, Frontier, HostReport, PushItem, ShardSnapshot, crawl_finished
from crawld.sharding import key_slot as key_slot_of
from crawld.urls import fingerprint

CRAWL = "t"
A = "a.example"
B = "b.example"


#: settings added to every test's crawl (tests/test_frontier_bloom.py runs
#: this file again with dedup=redis_bloom)
DEDUP: dict = {}


# -- helpers -------------------------------------------------------------
def make_frontier(rds, **over) -> Frontier:
    d = {"crawl_id": CRAWL, "num_shards": 2, "max_rps_per_host": 1000, "burst": 1,
         "max_inflight_per_host": 100, "visibility_timeout_s": 60, "max_attempts": 3, **DEDUP}
    d.update(over)
    return Frontier(rds, CrawlConfig.from_dict(d))


def url_of(pkey: str, i: int) -> str:
    return f"http://{pkey}/page/{i}"


def payload_of(pkey: str, i: int, depth: int = 0) -> bytes:
    u = url_of(pkey, i)
    return Entry(u, u, depth).to_payload()


def item(pkey: str, i: int, depth: int = 0, host: str | None = None) -> PushItem:
    """A URL to fetch (mode ""), without a query (vkey "")."""
    u = url_of(pkey, i)
    return PushItem(fingerprint(u), pkey, host or pkey, "", "", Entry(u, u, depth).to_payload())


def skip_item(pkey: str, i: int, mode: str = "out_of_scope", host: str | None = None) -> PushItem:
    """The same URL as ``item(pkey, i)``, pushed to be recorded without a fetch."""
    u = url_of(pkey, i)
    return PushItem(fingerprint(u), pkey, host or pkey, "", mode, Entry(u, u, 0).to_payload())


def qurl_of(pkey: str, i: int, path: str = "search") -> str:
    return f"http://{pkey}/{path}?q={i}"


def q_item(pkey: str, i: int, path: str = "search", host: str | None = None) -> PushItem:
    """A URL with a query: its vkey is host + path."""
    u = qurl_of(pkey, i, path)
    h = host or pkey
    return PushItem(fingerprint(u), pkey, h, f"{h}/{path}", "", Entry(u, u, 0).to_payload())


def qpayload_of(pkey: str, i: int, path: str = "search") -> bytes:
    u = qurl_of(pkey, i, path)
    return Entry(u, u, 0).to_payload()


def skeys(shard: int = 0) -> keys.ShardKeys:
    return keys.shard_keys(CRAWL, shard)


def in_dedup(rds, structure: str, it: PushItem, shard: int = 0) -> bool:
    """Whether URL ``it`` is in the shard's ``seen`` or ``skipseen`` structure."""
    return dedup.contains(rds, CRAWL, shard, structure, it.fp, it.pkey)


def dedup_count(rds, structure: str, shard: int = 0) -> int:
    """Fingerprints added to the shard's ``seen`` or ``skipseen`` structure."""
    i = dedup.info(rds, CRAWL, shard, structure)
    return i["n"] if i else 0


def vt_us(f: Frontier) -> int:
    return int(f.config.visibility_timeout_s * 1_000_000)


def T_us(f: Frontier) -> int:
    return int(round(1_000_000 / f.config.max_rps_per_host))


def server_us(rds) -> int:
    s, us = rds.time()
    return int(s) * 1_000_000 + int(us)


def deadline_us(rds, c: Claim) -> int | None:
    d = rds.zscore(skeys(c.shard).claimed, c.token)
    return None if d is None else int(d)


def claim_time_us(rds, f: Frontier, c: Claim) -> int:
    """Exact Redis server time at which ``c`` was claimed (deadline - vt)."""
    d = deadline_us(rds, c)
    assert d is not None, "claim is not outstanding"
    return d - vt_us(f)


def inflight(rds, pkey: str, shard: int = 0) -> int | None:
    v = rds.hget(skeys(shard).inflight, pkey)
    return None if v is None else int(v)


def sched_score(rds, pkey: str, shard: int = 0) -> int | None:
    v = rds.zscore(skeys(shard).sched, pkey)
    return None if v is None else int(v)


def gcra_tat(rds, pkey: str, shard: int = 0) -> int | None:
    v = rds.hget(skeys(shard).gcra, pkey)
    return None if v is None else int(float(v))


def fails_of(rds, pkey: str, shard: int = 0) -> int | None:
    """Failures in a row of ``pkey`` (the stored ``n:first failure``)."""
    v = rds.hget(skeys(shard).fails, pkey)
    return None if v is None else int(v.split(b":")[0])


def parked_reason(rds, pkey: str, shard: int = 0) -> str | None:
    """Why ``pkey`` is given up (the stored ``until|why``)."""
    v = rds.hget(skeys(shard).parked, pkey)
    return None if v is None else v.decode().split("|", 1)[1]


def adapted_interval_us(rds, pkey: str, shard: int = 0) -> int | None:
    v = rds.hget(skeys(shard).adapt, pkey)
    return None if v is None else int(v.split(b":")[0])


_clock = itertools.count()


def report(f: Frontier, rds, shard: int, reports: list[HostReport]) -> int:
    """Apply host reports in a claim call; returns the exact Redis time the
    claim script ran at.

    A fresh skip entry is pushed first and the call claims just it (skips
    are handed out before anything else), so its deadline - vt is the
    script's ``now``.  The clock entry is acked again.
    """
    u = f"http://clock.example/{next(_clock)}"
    assert f.push(shard, [PushItem(fingerprint(u), "clock.example", "clock.example", "", "clock",
                                   Entry(u, u).to_payload())]) == (0, 1, 0)
    _, cl = f.claim(shard, 1, reports=reports)
    assert len(cl) == 1 and cl[0].mode == "clock", cl
    t = claim_time_us(rds, f, cl[0])
    assert f.ack(shard, [cl[0].token]) == 1
    return t


def wait_server_past(rds, t_us: int, timeout_s: float = 10.0) -> None:
    """Sleep until Redis server time is strictly past ``t_us``."""
    end = time.monotonic() + timeout_s
    while True:
        now = server_us(rds)
        if now > t_us:
            return
        if time.monotonic() > end:
            raise AssertionError("server time never passed the target")
        time.sleep(min(0.05, max(0.001, (t_us - now) / 1e6 + 0.002)))


def claim_all(f: Frontier, rds, shard: int, count: int, n: int = 1, timeout_s: float = 10.0,
              fetched_each: bool = False):
    """Claim until ``count`` claims were made, sleeping on the wait hints.

    Returns a list of (claim, exact claim time in us), in claim order.
    """
    out: list[tuple[Claim, int]] = []
    end = time.monotonic() + timeout_s
    pending: list[bytes] = []
    while len(out) < count:
        assert time.monotonic() < end, f"only {len(out)} of {count} claims within {timeout_s}s"
        wait, claims = f.claim(shard, min(n, count - len(out)), fetched=pending if fetched_each else ())
        pending = []
        for c in claims:
            out.append((c, claim_time_us(rds, f, c)))
            pending.append(c.token)
        if not claims:
            assert wait >= 0, "nothing scheduled while claims were expected"
            time.sleep(min(max(wait, 0.001), 0.2))
    return out


# -- keys ----------------------------------------------------------------
def test_every_shard_key_shares_the_shard_hash_tag_and_cluster_slot():
    for crawl_id in ("t", "crawl-2024.01_x"):
        for shard in (0, 1, 7, 4095):
            sk = keys.shard_keys(crawl_id, shard)
            tag = "{s%d}" % shard
            assert keys.shard_tag(shard) == tag
            names = sk.all()
            assert len(names) == len(keys.SHARD_KEY_NAMES) == len(set(names))
            for name, k in zip(keys.SHARD_KEY_NAMES, names):
                assert k == getattr(sk, name)
                # the first '{' ... '}' of the key is exactly the shard tag
                first = k.index("{")
                assert k[first:k.index("}", first) + 1] == tag
                assert k.endswith(":" + name)
                # a crawl's own keys name it; the politeness state does not
                assert (f":crawl:{crawl_id}:" in k) is (name not in keys.SHARED_KEY_NAMES)
            assert len({key_slot(k.encode()) for k in names}) == 1
    # different shards do not share keys
    assert not set(keys.shard_keys("t", 0).all()) & set(keys.shard_keys("t", 1).all())
    # two crawls on one shard share exactly the politeness state
    a, b = keys.shard_keys("a", 3), keys.shard_keys("b", 3)
    assert {n for n in keys.SHARD_KEY_NAMES if getattr(a, n) == getattr(b, n)} == keys.SHARED_KEY_NAMES


def test_frontier_uses_shard_keys_and_only_writes_keys_of_the_shard(rds):
    f = make_frontier(rds, visibility_timeout_s=1)
    for s in range(2):
        assert f.keys(s) == keys.shard_keys(CRAWL, s).all()
    f.push(1, [item(A, 1), item(A, 2)])
    c = claim_all(f, rds, 1, 1)[0][0]
    assert f.ack(1, [c.token]) == 1
    c = claim_all(f, rds, 1, 1)[0][0]
    assert f.nack(1, c.token, "x") == 1
    c = claim_all(f, rds, 1, 1)[0][0]
    assert f.nack(1, c.token, "x") == 1
    c = claim_all(f, rds, 1, 1)[0][0]
    wait_server_past(rds, deadline_us(rds, c))
    assert f.reclaim(1) == (0, 1)  # third attempt: dead-lettered
    assert f.snapshot(1).dead == 1
    # the newer state too: skips, budgets, query variants, rates, host outcomes
    f2 = make_frontier(rds, visibility_timeout_s=1, max_pages_per_host=1, max_query_variants=1)
    assert f2.push(1, [q_item(B, 1), q_item(B, 2, host="www." + B), q_item(B, 3, host="www." + B),
                       item(B, 4), skip_item(B, 5)]) == (2, 3, 0)
    assert f2.slow_down(1, B, 0.5) == 0.5
    assert f2.reserve(1, B) >= 0
    _, cl = f2.claim(1, 10, reports=[HostReport(B, "f", 0.5, "x"), HostReport(B, "h", 0.1, "y"),
                                     HostReport(B, "o", 0, ""), HostReport(B, "f", 0.5, "x"),
                                     HostReport(B, "p", 60, "gone")])
    assert len(cl) == 5 and all(c.mode for c in cl)
    assert f2.push(1, [skip_item(B, 6)]) == (0, 1, 0)
    written = {k.decode() for k in rds.scan_iter("*")}
    for name in ("skips", "skipseen", "rates", "fails", "parked", "budget", "variants", "gcra", "floor"):
        assert getattr(keys.shard_keys(CRAWL, 1), name) in written, name
    assert written, "nothing written"
    sk1 = keys.shard_keys(CRAWL, 1)
    # the dedup structures' data keys extend seen/skipseen (crawld.dedup)
    data = {k for k in written if k.startswith((sk1.seen + ":", sk1.skipseen + ":"))}
    assert data
    assert written - data <= set(sk1.all())
    assert all("{s1}" in k for k in written)


# -- push ----------------------------------------------------------------
def test_push_dedups_same_fingerprint_within_and_across_calls(rds):
    f = make_frontier(rds)
    assert f.push(0, [item(A, 1), item(A, 1)]) == (1, 0, 1)
    assert f.push(0, [item(A, 1)]) == (0, 0, 1)
    assert f.push(0, [item(A, 1), item(A, 2)]) == (1, 0, 1)
    snap = f.snapshot(0)
    assert snap.queued == 2
    assert snap.stats.get("pushed") == 2
    assert snap.stats.get("dup") == 3
    assert dedup_count(rds, "seen") == 2
    assert f.push(0, []) == (0, 0, 0)
    assert f.snapshot(0).skips == 0


def test_push_dedup_is_by_fingerprint_not_payload(rds):
    f = make_frontier(rds)
    fp = fingerprint("http://a.example/x")
    assert f.push(0, [PushItem(fp, A, A, "", "", Entry("http://a.example/x", "http://a.example/x", 0).to_payload())]) == (1, 0, 0)
    # same fingerprint and politeness key, different payload and host: a duplicate
    assert f.push(0, [PushItem(fp, A, B, "", "", Entry("http://b.example/y", "http://b.example/y", 3).to_payload())]) == (0, 0, 1)
    assert f.snapshot(0).queued == 1
    # the redis_set backend keeps the key's slot with the fingerprint (the
    # slot decides the shard): another slot is another entry; a Bloom
    # filter keeps the fingerprint alone
    assert key_slot_of(A) != key_slot_of(B)
    other = f.push(0, [PushItem(fp, B, B, "", "", Entry("http://b.example/y", "http://b.example/y", 3).to_payload())])
    assert other == ((1, 0, 0) if f.config.dedup == "redis_set" else (0, 0, 1))


def test_push_stays_deduped_after_the_entry_was_claimed_and_acked(rds):
    f = make_frontier(rds)
    assert f.push(0, [item(A, 1)]) == (1, 0, 0)
    _, cl = f.claim(0, 1)
    assert f.ack(0, [cl[0].token]) == 1
    assert f.push(0, [item(A, 1)]) == (0, 0, 1)
    snap = f.snapshot(0)
    assert snap.queued == 0 and snap.claimed == 0
    assert f.claim(0, 5) == (-1.0, [])


def test_push_queues_fifo_per_pkey(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1), item(B, 1), item(A, 2)])
    f.push(0, [item(A, 3), item(B, 2)])
    f.push(0, [item(A, 4)])
    got = claim_all(f, rds, 0, 6, n=10)
    by_pkey: dict[str, list[bytes]] = {A: [], B: []}
    for c, _ in got:
        e = Entry.from_payload(c.payload)
        by_pkey[e.url.split("/")[2]].append(c.payload)
    assert by_pkey[A] == [payload_of(A, i) for i in (1, 2, 3, 4)]
    assert by_pkey[B] == [payload_of(B, i) for i in (1, 2)]


def test_pkeys_that_are_prefixes_of_each_other_keep_separate_queues(rds):
    f = make_frontier(rds)
    p1, p2, p3 = "ex.com", "ex.com.au", "ex.co"
    f.push(0, [item(p2, 1), item(p1, 1), item(p3, 1), item(p1, 2), item(p2, 2)])
    got = claim_all(f, rds, 0, 5, n=10)
    seen: dict[str, list[str]] = {}
    for c, _ in got:
        pk = rds.hget(skeys(0).claims, c.token)[1:].split(b"\x1f")[0].decode()
        seen.setdefault(pk, []).append(Entry.from_payload(c.payload).url)
    assert seen == {p1: [url_of(p1, 1), url_of(p1, 2)], p2: [url_of(p2, 1), url_of(p2, 2)],
                    p3: [url_of(p3, 1)]}


def test_different_pkeys_are_scheduled_independently(rds):
    f = make_frontier(rds, max_rps_per_host=5)  # T = 200 ms
    f.push(0, [item(A, 1), item(A, 2), item(B, 1), item(B, 2)])
    snap = f.snapshot(0)
    assert snap.queued == 4 and snap.scheduled == 2
    wait, claims = f.claim(0, 10)
    # one of each pkey right away, the second of each only after T
    assert sorted(c.payload for c in claims) == sorted([payload_of(A, 1), payload_of(B, 1)])
    assert 0.1 < wait <= 0.2 + 1e-6
    rest = claim_all(f, rds, 0, 2, n=10)
    assert sorted(c.payload for c, _ in rest) == sorted([payload_of(A, 2), payload_of(B, 2)])


def test_push_to_a_pkey_at_its_inflight_cap_does_not_schedule_it(rds):
    f = make_frontier(rds, max_inflight_per_host=1)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 5)
    assert len(cl) == 1
    assert inflight(rds, A) == 1
    assert f.push(0, [item(A, 2), item(A, 3)]) == (2, 0, 0)
    assert sched_score(rds, A) is None
    snap = f.snapshot(0)
    assert snap.queued == 2 and snap.scheduled == 0
    time.sleep(0.01)
    assert f.claim(0, 5) == (-1.0, [])
    # another pkey is not blocked by A's cap
    f.push(0, [item(B, 1)])
    _, clb = f.claim(0, 5)
    assert [c.payload for c in clb] == [payload_of(B, 1)]
    # the ack gives A's slot back and puts A on the schedule again
    assert f.ack(0, [cl[0].token]) == 1
    assert sched_score(rds, A) is not None
    got = claim_all(f, rds, 0, 1, n=5)
    assert got[0][0].payload == payload_of(A, 2)


# -- claim ---------------------------------------------------------------
def test_claim_returns_claim_objects_with_token_attempts_and_payload(rds):
    f = make_frontier(rds)
    e = Entry("http://a.example/x?q=1", "http://a.example/x?q=1", 4, referrer="http://a.example/",
              redirect_chain=("http://a.example/old",))
    f.push(1, [PushItem(fingerprint(e.canonical), A, A, "", "", e.to_payload()), item(B, 1, depth=2)])
    wait, claims = f.claim(1, 10)
    assert len(claims) == 2
    for c in claims:
        assert isinstance(c, Claim)
        assert c.shard == 1
        assert isinstance(c.token, bytes) and c.token
        assert c.attempts == 1
        assert c.mode == ""
    assert len({c.token for c in claims}) == 2
    assert {c.payload for c in claims} == {e.to_payload(), payload_of(B, 1, depth=2)}
    got = {Entry.from_payload(c.payload) for c in claims}
    assert e in got
    assert wait == -1.0
    snap = f.snapshot(1)
    assert snap.claimed == 2 and snap.queued == 0 and snap.stats.get("claimed") == 2
    # claims are recorded with a visibility deadline ~ now + vt
    now = server_us(rds)
    for c in claims:
        d = deadline_us(rds, c)
        assert now + vt_us(f) - 5_000_000 < d <= now + vt_us(f)


def test_claim_of_an_empty_shard_returns_wait_minus_one(rds):
    f = make_frontier(rds)
    assert f.claim(0, 5) == (-1.0, [])
    f.push(0, [item(A, 1)])
    # the other shard is still empty
    assert f.claim(1, 5) == (-1.0, [])
    wait, claims = f.claim(0, 5)
    assert len(claims) == 1 and wait == -1.0
    assert f.claim(0, 5) == (-1.0, [])


def test_claim_n_zero_claims_nothing(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1)])
    wait, claims = f.claim(0, 0)
    assert claims == [] and wait == 0.0
    assert f.snapshot(0).queued == 1


@pytest.mark.parametrize("rps", [10, 20])
def test_gcra_burst_1_spaces_claims_of_one_pkey_by_at_least_1_over_rps(rds, rps):
    f = make_frontier(rds, max_rps_per_host=rps, burst=1)
    T = T_us(f)
    f.push(0, [item(A, i) for i in range(6)])
    got = claim_all(f, rds, 0, 6, n=10)
    assert [c.payload for c, _ in got] == [payload_of(A, i) for i in range(6)]
    times = [t for _, t in got]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g >= T for g in gaps), (T, gaps)      # politeness: never violated
    assert all(g < T + 500_000 for g in gaps), (T, gaps)  # and not absurdly slow


def test_gcra_wait_hint_is_the_remaining_interval(rds):
    f = make_frontier(rds, max_rps_per_host=5, burst=1)  # T = 200 ms
    T = T_us(f)
    # the second claim must run within T of the first; a stalled machine
    # gets another try on a fresh pkey (at most 5), never a skip
    for attempt in range(5):
        pk = A if attempt == 0 else f"a{attempt}.example"
        f.push(0, [item(pk, 1), item(pk, 2)])
        w1, cl = f.claim(0, 5)
        assert len(cl) == 1
        c1 = claim_time_us(rds, f, cl[0])
        # the pkey is due exactly T after the claim, seen from the same instant
        assert abs(w1 * 1e6 - T) <= 1
        assert sched_score(rds, pk) == c1 + T
        time.sleep(0.05)
        before = server_us(rds)
        w2, cl2 = f.claim(0, 5)
        after = server_us(rds)
        if after < c1 + T:
            break
        f.ack(0, [c.token for c in cl + cl2])
    else:
        pytest.fail("five claims in a row took longer than T = 200 ms")
    assert cl2 == []
    assert (c1 + T - after) / 1e6 - 1e-6 <= w2 <= (c1 + T - before) / 1e6 + 1e-6
    assert 0 < w2 < T / 1e6
    got = claim_all(f, rds, 0, 1)
    assert got[0][1] >= c1 + T


def test_gcra_burst_2_allows_two_back_to_back_then_spacing(rds):
    f = make_frontier(rds, max_rps_per_host=10, burst=2)  # T = 100 ms, tau = T
    T = T_us(f)
    f.push(0, [item(A, i) for i in range(6)])
    wait, first = f.claim(0, 10)
    assert [c.payload for c in first] == [payload_of(A, 0), payload_of(A, 1)]
    t0 = claim_time_us(rds, f, first[0])
    assert claim_time_us(rds, f, first[1]) == t0
    assert abs(wait * 1e6 - T) <= 1
    rest = claim_all(f, rds, 0, 4, n=10)
    assert [c.payload for c, _ in rest] == [payload_of(A, i) for i in range(2, 6)]
    times = [t0, t0] + [t for _, t in rest]
    # GCRA with tau = T: the k-th claim (0-based, k >= 1) no earlier than t0 + (k-1) T,
    # i.e. at most burst + floor(d / T) claims in any window of length d
    for k in range(1, len(times)):
        assert times[k] >= t0 + (k - 1) * T, (k, times[k] - t0)
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= 2 + (times[j] - times[i]) // T, (i, j)
    assert times[-1] - t0 < 4 * T + 1_500_000


def test_gcra_burst_2_refills_after_idle(rds):
    f = make_frontier(rds, max_rps_per_host=10, burst=2)  # T = 100 ms
    f.push(0, [item(A, i) for i in range(4)])
    _, first = f.claim(0, 10)
    assert len(first) == 2
    time.sleep(0.25)  # > 2 T: the bucket is full again
    _, second = f.claim(0, 10)
    assert [c.payload for c in second] == [payload_of(A, 2), payload_of(A, 3)]


def test_politeness_holds_with_two_workers_racing_on_one_pkey(rds):
    fs = [make_frontier(rds, max_rps_per_host=20, burst=1) for _ in range(2)]
    T = T_us(fs[0])
    fs[0].push(0, [item(A, i) for i in range(10)])
    results: list[list[Claim]] = [[], []]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        end = time.monotonic() + 10
        try:
            while time.monotonic() < end:
                wait, cl = fs[i].claim(0, 3)
                results[i].extend(cl)
                if wait < 0 and not cl:
                    if fs[i].snapshot(0).queued == 0:
                        return
                time.sleep(0.003)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    claims = results[0] + results[1]
    assert sorted(c.payload for c in claims) == sorted(payload_of(A, i) for i in range(10))
    assert len({c.token for c in claims}) == 10
    times = sorted(claim_time_us(rds, fs[0], c) for c in claims)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g >= T for g in gaps), (T, gaps)


def test_claim_rechecks_gcra_when_the_schedule_says_due_too_early(rds):
    f = make_frontier(rds, max_rps_per_host=5, burst=1)  # T = 200 ms
    T = T_us(f)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    c1 = claim_time_us(rds, f, cl[0])
    time.sleep(0.12)  # well into the interval, but not past it
    rds.zadd(skeys(0).sched, {A: 0})  # a stale schedule entry: "due long ago"
    wait, cl2 = f.claim(0, 5)
    if server_us(rds) < c1 + T:
        assert cl2 == []
        assert 0 < wait <= T / 1e6 + 1e-6
        assert sched_score(rds, A) == c1 + T
    got = [(c, claim_time_us(rds, f, c)) for c in cl2] or claim_all(f, rds, 0, 1)
    assert got[0][1] >= c1 + T


def test_claim_rechecks_inflight_cap_when_the_schedule_says_due(rds):
    f = make_frontier(rds, max_inflight_per_host=1)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    assert len(cl) == 1
    time.sleep(0.01)  # > T = 1 ms: GCRA allows A again, only the cap holds it
    rds.zadd(skeys(0).sched, {A: 0})  # a stale schedule entry for a parked pkey
    assert f.claim(0, 5) == (-1.0, [])
    assert sched_score(rds, A) is None
    assert inflight(rds, A) == 1


def test_inflight_cap_parks_a_pkey_until_ack(rds):
    f = make_frontier(rds, max_inflight_per_host=2)
    f.push(0, [item(A, i) for i in range(5)])
    got = claim_all(f, rds, 0, 2, n=10)
    assert inflight(rds, A) == 2
    assert sched_score(rds, A) is None
    time.sleep(0.02)
    assert f.claim(0, 10) == (-1.0, [])
    assert f.ack(0, [got[0][0].token]) == 1
    assert inflight(rds, A) == 1
    more = claim_all(f, rds, 0, 1, n=10)
    assert more[0][0].payload == payload_of(A, 2)
    assert inflight(rds, A) == 2
    time.sleep(0.02)
    assert f.claim(0, 10) == (-1.0, [])


def test_inflight_cap_slot_is_given_back_by_nack(rds):
    f = make_frontier(rds, max_inflight_per_host=1)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    time.sleep(0.01)
    assert f.claim(0, 5) == (-1.0, [])
    assert f.nack(0, cl[0].token, "err") == 1
    assert inflight(rds, A) is None
    got = claim_all(f, rds, 0, 1, n=5)
    # A2 first (A1 went to the back of A's queue), and only one at a time
    assert [c.payload for c, _ in got] == [payload_of(A, 2)]
    assert inflight(rds, A) == 1
    time.sleep(0.01)
    assert f.claim(0, 5) == (-1.0, [])


def test_inflight_cap_slot_is_given_back_by_reclaim(rds):
    f = make_frontier(rds, max_inflight_per_host=1, visibility_timeout_s=1)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    assert f.claim(0, 5) == (-1.0, [])
    wait_server_past(rds, deadline_us(rds, cl[0]))
    assert f.reclaim(0) == (1, 0)
    assert inflight(rds, A) is None
    _, cl2 = f.claim(0, 5)
    assert [c.payload for c in cl2] == [payload_of(A, 2)]
    assert inflight(rds, A) == 1


def test_claim_with_fetched_token_gives_the_slot_back_in_the_same_call(rds):
    f = make_frontier(rds, max_inflight_per_host=1)
    f.push(0, [item(A, 1), item(A, 2), item(A, 3)])
    _, cl1 = f.claim(0, 5)
    t1 = cl1[0].token
    time.sleep(0.005)  # > T = 1 ms
    _, cl2 = f.claim(0, 5, fetched=[t1])
    assert [c.payload for c in cl2] == [payload_of(A, 2)]
    assert inflight(rds, A) == 1
    # the first claim is still outstanding until its ack
    assert deadline_us(rds, cl1[0]) is not None
    assert f.snapshot(0).claimed == 2
    # fetch_done is idempotent: giving t1 back again frees nothing
    time.sleep(0.005)
    assert f.claim(0, 5, fetched=[t1, t1]) == (-1.0, [])
    assert inflight(rds, A) == 1
    # acking t1 after its fetch_done must not free A2's slot
    assert f.ack(0, [t1]) == 1
    assert inflight(rds, A) == 1
    time.sleep(0.005)
    assert f.claim(0, 5) == (-1.0, [])
    assert f.ack(0, [cl2[0].token]) == 1
    assert inflight(rds, A) is None
    got = claim_all(f, rds, 0, 1)
    assert got[0][0].payload == payload_of(A, 3)


def test_fetch_done_then_ack_never_double_decrements_inflight(rds):
    f = make_frontier(rds, max_inflight_per_host=2)
    f.push(0, [item(A, i) for i in range(6)])
    got = claim_all(f, rds, 0, 2, n=10)
    t1, t2 = got[0][0].token, got[1][0].token
    assert inflight(rds, A) == 2
    assert f.claim(0, 0, fetched=[t1, t1])[1] == []
    assert inflight(rds, A) == 1
    assert f.claim(0, 0, fetched=[t1])[1] == []
    assert inflight(rds, A) == 1
    assert f.ack(0, [t1]) == 1
    assert inflight(rds, A) == 1
    assert f.ack(0, [t2]) == 1
    assert inflight(rds, A) is None
    # the cap is exactly 2 again, not 3
    got = claim_all(f, rds, 0, 2, n=10)
    time.sleep(0.01)
    assert f.claim(0, 10) == (-1.0, [])
    assert inflight(rds, A) == 2
    vals = [int(v) for v in rds.hvals(skeys(0).inflight)]
    assert all(v > 0 for v in vals)


def test_fetch_done_of_unknown_or_acked_token_frees_nothing(rds):
    f = make_frontier(rds, max_inflight_per_host=1)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    assert f.claim(0, 5, fetched=[b"999999", b"nope"]) == (-1.0, [])
    assert inflight(rds, A) == 1
    assert f.ack(0, [cl[0].token]) == 1
    assert claim_all(f, rds, 0, 1)[0][0].payload == payload_of(A, 2)
    assert inflight(rds, A) == 1
    # the old (acked) token given as fetched must not free the new claim's slot
    time.sleep(0.005)
    assert f.claim(0, 5, fetched=[cl[0].token]) == (-1.0, [])
    assert inflight(rds, A) == 1


def test_fetch_done_then_reclaim_and_nack_do_not_double_free(rds):
    f = make_frontier(rds, max_inflight_per_host=3, visibility_timeout_s=1, max_attempts=5)
    f.push(0, [item(A, i) for i in range(3)])
    got = claim_all(f, rds, 0, 3, n=10)
    toks = [c.token for c, _ in got]
    assert inflight(rds, A) == 3
    f.claim(0, 0, fetched=[toks[0], toks[1]])
    assert inflight(rds, A) == 1
    assert f.nack(0, toks[0], "e") == 1
    assert inflight(rds, A) == 1
    wait_server_past(rds, max(deadline_us(rds, got[i][0]) for i in (1, 2)))
    assert f.reclaim(0) == (2, 0)
    assert inflight(rds, A) is None
    assert f.snapshot(0).queued == 3


def test_fetched_slot_release_still_respects_gcra(rds):
    f = make_frontier(rds, max_rps_per_host=5, max_inflight_per_host=1)  # T = 200 ms
    T = T_us(f)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    c1 = claim_time_us(rds, f, cl[0])
    wait, cl2 = f.claim(0, 5, fetched=[cl[0].token])
    if server_us(rds) < c1 + T:
        assert cl2 == []
        assert 0 < wait <= T / 1e6 + 1e-6
    assert sched_score(rds, A) == c1 + T
    got = claim_all(f, rds, 0, 1) if not cl2 else [(cl2[0], claim_time_us(rds, f, cl2[0]))]
    assert got[0][1] >= c1 + T


def test_ack_reschedules_parked_pkey_no_earlier_than_gcra_allows(rds):
    f = make_frontier(rds, max_rps_per_host=5, max_inflight_per_host=1)  # T = 200 ms
    T = T_us(f)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    c1 = claim_time_us(rds, f, cl[0])
    assert f.ack(0, [cl[0].token]) == 1
    assert sched_score(rds, A) == c1 + T
    got = claim_all(f, rds, 0, 1)
    assert got[0][1] >= c1 + T


# -- ack -----------------------------------------------------------------
def test_ack_returns_count_and_second_ack_is_a_noop(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1), item(B, 1), item(A, 2)])
    got = claim_all(f, rds, 0, 3, n=10)
    toks = [c.token for c, _ in got]
    assert f.ack(0, toks[:2]) == 2
    assert f.ack(0, toks[:2]) == 0
    assert f.ack(0, [toks[0], toks[2], b"424242"]) == 1
    assert f.ack(0, []) == 0
    snap = f.snapshot(0)
    assert snap.claimed == 0 and snap.queued == 0 and snap.idle
    assert snap.stats.get("acked") == 3
    assert snap.stats.get("late_ack") == 4
    assert rds.hlen(skeys(0).claims) == 0
    assert rds.hlen(skeys(0).inflight) == 0


def test_ack_of_token_from_another_shard_does_nothing(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    assert f.ack(1, [cl[0].token]) == 0
    assert f.snapshot(0).claimed == 1
    assert f.ack(0, [cl[0].token]) == 1


def test_late_ack_after_reclaim_does_not_remove_requeued_entry(rds):
    f = make_frontier(rds, visibility_timeout_s=1)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    old = cl[0]
    wait_server_past(rds, deadline_us(rds, old))
    assert f.reclaim(0) == (1, 0)
    assert f.ack(0, [old.token]) == 0
    assert f.nack(0, old.token, "late") == 0
    assert f.extend(0, [old.token]) == 0
    snap = f.snapshot(0)
    assert snap.queued == 1 and snap.claimed == 0
    _, cl2 = f.claim(0, 1)
    assert len(cl2) == 1 and cl2[0].attempts == 2 and cl2[0].payload == old.payload


def test_late_ack_racing_reclaim_does_not_touch_the_newer_claim(rds):
    f = make_frontier(rds, visibility_timeout_s=1.0, max_inflight_per_host=1)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 1)
    old = cl[0]
    assert old.attempts == 1
    wait_server_past(rds, deadline_us(rds, old))
    assert f.reclaim(0) == (1, 0)
    got = claim_all(f, rds, 0, 1)
    new = got[0][0]
    # A2 was queued before A1 came back: FIFO gives A2 first; claim again for A1
    assert new.payload == payload_of(A, 2)
    assert f.ack(0, [new.token]) == 1
    got = claim_all(f, rds, 0, 1)
    new = got[0][0]
    assert new.payload == old.payload
    assert new.token != old.token
    assert new.attempts == 2
    assert f.ack(0, [old.token]) == 0
    assert deadline_us(rds, new) is not None
    assert inflight(rds, A) == 1
    assert f.snapshot(0).claimed == 1
    assert f.ack(0, [new.token]) == 1
    snap = f.snapshot(0)
    assert snap.claimed == 0 and snap.queued == 0
    assert inflight(rds, A) is None


# -- nack ----------------------------------------------------------------
def test_nack_requeues_keeping_attempts_then_dead_letters_with_reason(rds):
    f = make_frontier(rds, max_attempts=3)
    e = Entry("http://a.example/é/x?y=\"1\"", "http://a.example/é/x?y=\"1\"", 2)
    p = e.to_payload()
    f.push(0, [PushItem(fingerprint(e.canonical), A, A, "", "", p)])
    for attempt in (1, 2):
        c = claim_all(f, rds, 0, 1)[0][0]
        assert c.attempts == attempt and c.payload == p
        assert f.nack(0, c.token, f"fail {attempt}") == 1
        snap = f.snapshot(0)
        assert snap.queued == 1 and snap.claimed == 0 and snap.dead == 0
    c = claim_all(f, rds, 0, 1)[0][0]
    assert c.attempts == 3
    before = server_us(rds)
    assert f.nack(0, c.token, "connection refused: boom") == 2
    after = server_us(rds)
    assert f.nack(0, c.token, "again") == 0
    snap = f.snapshot(0)
    assert snap.queued == 0 and snap.claimed == 0 and snap.dead == 1
    assert snap.stats.get("nacked") == 3 and snap.stats.get("dead") == 1
    dl = f.dead_letters(0)
    assert len(dl) == 1
    d = dl[0]
    assert d["reason"] == "connection refused: boom"
    assert d["attempts"] == 3
    assert d["pkey"] == A
    assert d["payload"].encode("utf-8") == p
    assert Entry.from_payload(d["payload"]) == e
    assert before - 1000 <= d["at_us"] <= after + 1000  # exactness: see the at_us test
    assert f.claim(0, 5) == (-1.0, [])


def test_dead_letter_at_us_is_exact_integer_microseconds(rds):
    f = make_frontier(rds, max_attempts=1)
    f.push(0, [item(A, 1)])
    c = claim_all(f, rds, 0, 1)[0][0]
    before = server_us(rds)
    assert f.nack(0, c.token, "x") == 2
    after = server_us(rds)
    at = f.dead_letters(0)[0]["at_us"]
    assert isinstance(at, int), f"at_us is {at!r}, not integer microseconds"
    assert before <= at <= after


def test_nack_with_a_retry_after_holds_the_host_before_the_url_is_queued_again(rds):
    """The host outcome goes with the nack, in one step: a claim that comes
    right after it (say one already under way in another task, carrying no
    report) cannot take the URL back before the Retry-After is over."""
    f = make_frontier(rds, max_rps_per_host=20, backoff_base_s=5, host_max_failures=10)
    f.push(0, [item(A, 1)])
    c = claim_all(f, rds, 0, 1)[0][0]
    before = server_us(rds)
    assert f.nack(0, c.token, "HTTP 503", report=HostReport(A, "r", 0.4, "HTTP 503 with Retry-After 0s")) == 1
    wait, claims = f.claim(0, 5)
    assert claims == [] and 0.3 < wait <= 0.4
    # a 503 is "slower", not a failure: the rate is halved (told when to come back)
    assert fails_of(rds, A) is None and adapted_interval_us(rds, A) == 100_000
    again, when = claim_all(f, rds, 0, 1)[0]
    assert again.attempts == 2 and when >= before + 400_000
    # without a report, the URL is due again at once (GCRA permitting)
    assert f.nack(0, again.token, "HTTP 500") == 1
    wait, claims = f.claim(0, 5)
    assert len(claims) == 1 or 0 <= wait <= 0.1


def test_nack_with_max_attempts_1_dead_letters_immediately(rds):
    f = make_frontier(rds, max_attempts=1)
    f.push(0, [item(A, 1), item(A, 2)])
    c = claim_all(f, rds, 0, 1)[0][0]
    assert f.nack(0, c.token, "x" * 600) == 2
    d = f.dead_letters(0)
    assert len(d) == 1 and d[0]["reason"] == "x" * 500 and d[0]["payload"].encode() == payload_of(A, 1)
    # the pkey's other entry is still claimable
    c2 = claim_all(f, rds, 0, 1)[0][0]
    assert c2.payload == payload_of(A, 2)


def test_nack_unknown_token_returns_zero_and_changes_nothing(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1)])
    assert f.nack(0, b"31337", "x") == 0
    snap = f.snapshot(0)
    assert snap.queued == 1 and snap.stats.get("nacked") is None


@pytest.mark.parametrize("code", ["r", "h"])
@pytest.mark.parametrize("cap", [1, 3])
def test_host_report_delays_the_pkey_by_its_seconds(rds, cap, code):
    """Was "nack delays the pkey by delay_s": backing off a host is now a
    host report ('r' Retry-After, 'h' hold) riding on the next claim call."""
    f = make_frontier(rds, max_rps_per_host=1000, max_inflight_per_host=cap, host_max_failures=10)
    f.push(0, [item(A, 1), item(A, 2), item(B, 1)])
    _, cl = f.claim(0, 1)
    assert cl[0].payload == payload_of(A, 1)
    delay = 0.4
    before = server_us(rds)
    assert f.nack(0, cl[0].token, "503") == 1
    wait, now_claims = f.claim(0, 10, reports=[HostReport(A, code, delay, "HTTP 503")])
    # only B: A is delayed (its other entry too)
    assert [c.payload for c in now_claims] == [payload_of(B, 1)]
    # B's claim time is the exact server time the report was applied at
    t_report = claim_time_us(rds, f, now_claims[0])
    assert t_report >= before
    assert 0 < wait <= delay + 1e-6
    assert sched_score(rds, A) == t_report + int(delay * 1e6)
    # neither counts as a failure of the host; 'r' also halves its rate
    assert fails_of(rds, A) is None
    assert adapted_interval_us(rds, A) == (2000 if code == "r" else None)
    assert parked_reason(rds, A) is None
    got = claim_all(f, rds, 0, 1, n=10)
    if cap == 1:
        assert f.ack(0, [got[0][0].token]) == 1
    got += claim_all(f, rds, 0, 1, n=10)
    assert [c.payload for c, _ in got] == [payload_of(A, 2), payload_of(A, 1)]
    assert got[1][0].attempts == 2
    assert got[0][1] >= t_report + int(delay * 1e6)
    assert got[0][1] >= before + int(delay * 1e6)
    assert got[0][1] < before + int(delay * 1e6) + 1_500_000


@pytest.mark.parametrize("code", ["r", "h"])
def test_host_report_hold_holds_with_burst_2(rds, code):
    f = make_frontier(rds, max_rps_per_host=10, burst=2, max_inflight_per_host=5)
    T = T_us(f)
    f.push(0, [item(A, i) for i in range(5)])
    _, cl = f.claim(0, 1)
    assert f.nack(0, cl[0].token, "429") == 1
    before = server_us(rds)
    t_report = report(f, rds, 0, [HostReport(A, code, 0.3, "HTTP 429")])
    assert t_report >= before
    got = claim_all(f, rds, 0, 5, n=10)
    times = [t for _, t in got]
    assert times[0] >= t_report + 300_000
    assert times[0] >= before + 300_000
    # after the delay, GCRA still applies: never more than burst in a window
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= 2 + (times[j] - times[i]) // T, (i, j)


# -- extend --------------------------------------------------------------
def test_extend_keeps_a_claim_past_its_original_deadline(rds):
    # the reclaim must run before the extended deadline; a stalled machine
    # gets another try with a longer visibility timeout, never a skip
    for vt in (2, 4, 8):
        rds.flushall()
        f = make_frontier(rds, visibility_timeout_s=vt)
        f.push(0, [item(A, 1)])
        _, cl = f.claim(0, 1)
        c = cl[0]
        d1 = deadline_us(rds, c)
        time.sleep(vt / 2)
        assert f.extend(0, [c.token]) == 1
        d2 = deadline_us(rds, c)
        assert d2 > d1 + vt * 250_000
        wait_server_past(rds, d1 + 100_000)
        before = server_us(rds)
        r = f.reclaim(0)
        if before < d2:
            break
    else:
        pytest.fail("the extended deadline passed before a reclaim could run, three times")
    assert r == (0, 0)
    snap = f.snapshot(0)
    assert snap.claimed == 1 and snap.queued == 0
    assert f.ack(0, [c.token]) == 1


def test_extend_of_unknown_or_acked_token_does_not_create_a_claim(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1), item(A, 2)])
    got = claim_all(f, rds, 0, 2, n=10)
    t1, t2 = got[0][0].token, got[1][0].token
    assert f.ack(0, [t1]) == 1
    assert f.extend(0, [t1, b"777777"]) == 0
    assert rds.zscore(skeys(0).claimed, t1) is None
    assert rds.zscore(skeys(0).claimed, b"777777") is None
    assert not rds.hexists(skeys(0).claims, t1)
    assert f.extend(0, []) == 0
    time.sleep(0.002)
    assert f.extend(0, [t1, t2]) == 1
    assert f.snapshot(0).claimed == 1
    assert f.ack(0, [t1]) == 0


# -- reclaim -------------------------------------------------------------
def test_reclaim_requeues_expired_claims_then_dead_letters_after_max_attempts(rds):
    f = make_frontier(rds, visibility_timeout_s=1, max_attempts=2)
    f.push(0, [item(A, 1), item(B, 1)])
    assert f.reclaim(0) == (0, 0)
    _, cl = f.claim(0, 10)
    assert len(cl) == 2 and all(c.attempts == 1 for c in cl)
    assert f.reclaim(0) == (0, 0)  # not expired yet
    wait_server_past(rds, max(deadline_us(rds, c) for c in cl))
    assert f.reclaim(0) == (2, 0)
    assert f.reclaim(0) == (0, 0)
    snap = f.snapshot(0)
    assert snap.queued == 2 and snap.claimed == 0 and snap.stats.get("reclaimed") == 2
    _, cl2 = f.claim(0, 10)
    assert sorted(c.payload for c in cl2) == sorted(c.payload for c in cl)
    assert all(c.attempts == 2 for c in cl2)
    assert {c.token for c in cl2}.isdisjoint({c.token for c in cl})
    wait_server_past(rds, max(deadline_us(rds, c) for c in cl2))
    assert f.reclaim(0) == (0, 2)
    snap = f.snapshot(0)
    assert snap.queued == 0 and snap.claimed == 0 and snap.dead == 2
    assert snap.stats.get("dead") == 2
    dl = f.dead_letters(0)
    assert sorted(d["pkey"] for d in dl) == [A, B]
    assert all(d["attempts"] == 2 and "visibility timeout" in d["reason"] for d in dl)
    assert sorted(d["payload"].encode() for d in dl) == sorted(c.payload for c in cl)
    assert inflight(rds, A) is None and inflight(rds, B) is None
    assert f.claim(0, 10) == (-1.0, [])


def test_reclaim_honours_limit_and_only_expired_claims(rds):
    f = make_frontier(rds, visibility_timeout_s=1, max_attempts=5)
    f.push(0, [item(A, 1), item(B, 1), item("c.example", 1)])
    _, cl = f.claim(0, 2)
    assert len(cl) == 2
    wait_server_past(rds, max(deadline_us(rds, c) for c in cl))
    _, fresh = f.claim(0, 1)
    assert len(fresh) == 1
    assert f.reclaim(0, limit=1) == (1, 0)
    assert f.reclaim(0, limit=10) == (1, 0)
    assert f.reclaim(0) == (0, 0)
    assert deadline_us(rds, fresh[0]) is not None
    snap = f.snapshot(0)
    assert snap.claimed == 1 and snap.queued == 2
    assert f.ack(0, [fresh[0].token]) == 1
    again = claim_all(f, rds, 0, 2, n=10)
    assert sorted(c.payload for c, _ in again) == sorted(c.payload for c in cl)
    assert all(c.attempts == 2 for c, _ in again)


# -- snapshot / crawl_finished --------------------------------------------
def test_snapshot_counts(rds):
    f = make_frontier(rds, max_inflight_per_host=1)
    f.push(0, [item(A, 1), item(A, 2), item(B, 1)])
    s = f.snapshot(0)
    assert (s.shard, s.queued, s.scheduled, s.claimed, s.dead) == (0, 3, 2, 0, 0)
    assert not s.idle
    _, cl = f.claim(0, 10)
    s = f.snapshot(0)
    assert (s.queued, s.scheduled, s.claimed) == (1, 0, 2)
    assert s.skips == 0
    assert s.activity() == (3, 0, 2, 0)
    assert [x.shard for x in f.snapshots()] == [0, 1]
    assert f.snapshots()[1].idle


def test_crawl_finished_needs_two_identical_idle_waves(rds):
    f = make_frontier(rds)
    w1 = f.snapshots()
    assert all(s.idle for s in w1)
    assert not crawl_finished(None, w1)
    w2 = f.snapshots()
    assert crawl_finished(w1, w2)
    assert not crawl_finished(w1, w2[:1])


def test_crawl_finished_false_while_work_is_queued_or_claimed(rds):
    f = make_frontier(rds)
    f.push(1, [item(A, 1)])
    w1, w2 = f.snapshots(), f.snapshots()
    assert not crawl_finished(w1, w2)
    _, cl = f.claim(1, 1)
    w1, w2 = f.snapshots(), f.snapshots()
    assert not w2[1].idle
    assert not crawl_finished(w1, w2)
    f.ack(1, [cl[0].token])
    w3 = f.snapshots()
    assert not crawl_finished(w2, w3)
    assert crawl_finished(w3, f.snapshots())


def test_crawl_finished_false_after_intervening_push_claim_ack(rds):
    f = make_frontier(rds)
    w1 = f.snapshots()
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    assert f.ack(0, [cl[0].token]) == 1
    w2 = f.snapshots()
    assert all(s.idle for s in w1) and all(s.idle for s in w2)
    assert not crawl_finished(w1, w2)
    w3 = f.snapshots()
    assert crawl_finished(w2, w3)


def test_crawl_finished_false_on_intervening_claim_counter_change():
    idle = ShardSnapshot(0, 0, 0, 0, 0, {"pushed": 5, "claimed": 5})
    other = ShardSnapshot(1, 0, 0, 0, 0, {"pushed": 2, "claimed": 2})
    assert crawl_finished([idle, other], [idle, other])
    claimed_more = ShardSnapshot(0, 0, 0, 0, 0, {"pushed": 5, "claimed": 6})
    pushed_more = ShardSnapshot(0, 0, 0, 0, 0, {"pushed": 6, "claimed": 5})
    assert not crawl_finished([idle, other], [claimed_more, other])
    assert not crawl_finished([idle, other], [pushed_more, other])
    busy = ShardSnapshot(0, 0, 0, 1, 0, {"pushed": 5, "claimed": 5})
    assert not crawl_finished([busy, other], [busy, other])


def test_crawl_finished_ignores_duplicate_pushes_and_dead_letters(rds):
    f = make_frontier(rds, max_attempts=1)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    assert f.nack(0, cl[0].token, "x") == 2
    w1 = f.snapshots()
    assert f.push(0, [item(A, 1)]) == (0, 0, 1)
    w2 = f.snapshots()
    assert w2[0].dead == 1
    assert crawl_finished(w1, w2)


# -- misc readers ------------------------------------------------------------
def test_commit_pushes_then_acks_in_one_round_trip(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    n, pushed = f.commit({0: [item(A, 1), item(A, 2)], 1: [item(B, 1)]}, {0: [cl[0].token, b"999"]},
                         {0: ["fetched", "error"]})
    assert n == 1 and pushed == (2, 0, 1)  # item(A, 1) was queued before: a duplicate
    assert f.snapshot(0).queued == 1 and f.snapshot(0).claimed == 0
    assert f.snapshot(1).queued == 1
    # only the acked token's outcome is counted
    assert f.snapshot(0).stats.get("rows_fetched") == 1 and "rows_error" not in f.snapshot(0).stats


def test_oldest_claim_age(rds):
    f = make_frontier(rds)
    assert f.oldest_claim_age_s(0) is None
    f.push(0, [item(A, 1)])
    f.claim(0, 1)
    time.sleep(0.05)
    age = f.oldest_claim_age_s(0)
    assert 0.04 <= age < 5


# == the newer semantics ======================================================
SEP = b"\x1f"


def pending_skips(rds, shard: int = 0) -> list[tuple[str, bytes]]:
    """(mode, payload) of the skips list, in order ("reason \\x1f payload";
    JSON payloads never hold a raw \\x1f)."""
    out = []
    for raw in rds.lrange(skeys(shard).skips, 0, -1):
        parts = raw.split(SEP)
        out.append((parts[0].decode(), parts[-1]))
    return out


# -- snapshots with skips ------------------------------------------------------
def test_snapshot_counts_skips_and_idle_needs_no_skips(rds):
    f = make_frontier(rds)
    w1 = f.snapshots()
    assert f.push(0, [skip_item(A, 1)]) == (0, 1, 0)
    s = f.snapshot(0)
    assert (s.queued, s.scheduled, s.claimed, s.skips) == (0, 0, 0, 1)
    assert not s.idle
    assert s.activity() == (0, 1, 0, 0)
    w2 = f.snapshots()
    assert not crawl_finished(w2, f.snapshots())
    _, cl = f.claim(0, 5)
    s = f.snapshot(0)
    assert (s.skips, s.claimed) == (0, 1) and not s.idle
    assert s.activity() == (0, 1, 1, 0)
    assert f.ack(0, [cl[0].token]) == 1
    w3 = f.snapshots()
    assert all(x.idle for x in w3)
    # a skip pushed and recorded between two idle waves is noticed
    assert not crawl_finished(w1, w3)
    assert crawl_finished(w3, f.snapshots())


def test_crawl_finished_false_on_intervening_skip_push_or_pending_skips():
    idle = ShardSnapshot(0, 0, 0, 0, 0, {"pushed": 5, "skip_pushed": 2, "claimed": 7})
    assert idle.idle and crawl_finished([idle], [idle])
    skip_more = ShardSnapshot(0, 0, 0, 0, 0, {"pushed": 5, "skip_pushed": 3, "claimed": 7})
    assert not crawl_finished([idle], [skip_more])
    waiting = ShardSnapshot(0, 0, 0, 0, 0, {"pushed": 5, "skip_pushed": 2, "claimed": 7}, skips=1)
    assert not waiting.idle
    assert not crawl_finished([waiting], [waiting])


# -- skip entries ----------------------------------------------------------------
def test_skip_entry_is_recorded_once(rds):
    f = make_frontier(rds)
    it = skip_item(A, 1, "out_of_scope")
    assert f.push(0, [it, it]) == (0, 1, 1)
    assert f.push(0, [it]) == (0, 0, 1)
    # another reason for the same URL: still the same URL, one row
    assert f.push(0, [skip_item(A, 1, "nofollow")]) == (0, 0, 1)
    snap = f.snapshot(0)
    assert (snap.skips, snap.queued, snap.scheduled) == (1, 0, 0)
    assert snap.stats.get("skip_pushed") == 1 and snap.stats.get("pushed") is None
    assert snap.stats.get("dup") == 3
    assert in_dedup(rds, "skipseen", it)
    assert not in_dedup(rds, "seen", it)
    assert pending_skips(rds) == [("out_of_scope", payload_of(A, 1))]
    wait, cl = f.claim(0, 10)
    assert [(c.mode, c.payload, c.attempts) for c in cl] == [("out_of_scope", payload_of(A, 1), 1)]
    assert wait == -1.0
    assert f.ack(0, [cl[0].token]) == 1
    # still recorded once after its row is written
    assert f.push(0, [it]) == (0, 0, 1)
    assert f.claim(0, 10) == (-1.0, [])
    assert f.snapshot(0).idle


def test_skip_entry_is_not_recorded_when_the_url_was_queued_for_fetching(rds):
    f = make_frontier(rds)
    assert f.push(0, [item(A, 1)]) == (1, 0, 0)
    assert f.push(0, [skip_item(A, 1, "nofollow")]) == (0, 0, 1)
    # in the same call, too
    assert f.push(0, [item(A, 2), skip_item(A, 2, "over_depth")]) == (1, 0, 1)
    got = claim_all(f, rds, 0, 2, n=10)
    assert [(c.mode, c.payload) for c, _ in got] == [("", payload_of(A, 1)), ("", payload_of(A, 2))]
    assert f.ack(0, [c.token for c, _ in got]) == 2
    # and after it was fetched
    assert f.push(0, [skip_item(A, 1, "nofollow")]) == (0, 0, 1)
    snap = f.snapshot(0)
    assert snap.skips == 0 and snap.stats.get("skip_pushed") is None
    assert dedup_count(rds, "skipseen") == 0
    assert f.claim(0, 10) == (-1.0, [])


def test_claim_hands_out_skip_entries_first_in_push_order(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1), item(B, 1)])
    assert f.push(0, [skip_item(A, 7, "out_of_scope"), skip_item(B, 8, "over_depth"),
                      skip_item(A, 9, "url_too_long")]) == (0, 3, 0)
    wait, cl = f.claim(0, 2)
    assert [(c.mode, c.payload) for c in cl] == [("out_of_scope", payload_of(A, 7)),
                                                 ("over_depth", payload_of(B, 8))]
    assert wait == 0.0  # more skips are waiting
    snap = f.snapshot(0)
    assert (snap.queued, snap.scheduled, snap.skips, snap.claimed) == (2, 2, 1, 2)
    _, cl2 = f.claim(0, 2)
    assert [c.mode for c in cl2] == ["url_too_long", ""]
    assert cl2[0].payload == payload_of(A, 9)
    assert cl2[1].payload in (payload_of(A, 1), payload_of(B, 1))
    assert all(c.attempts == 1 for c in cl + cl2)
    assert len({c.token for c in cl + cl2}) == 4
    assert f.snapshot(0).stats.get("claimed") == 4


def test_claim_wait_hint_is_zero_while_skips_wait_even_with_nothing_scheduled(rds):
    f = make_frontier(rds)
    assert f.push(0, [skip_item(A, 1), skip_item(A, 2)]) == (0, 2, 0)
    assert f.snapshot(0).scheduled == 0
    assert f.claim(0, 0) == (0.0, [])
    wait, cl = f.claim(0, 1)
    assert len(cl) == 1 and wait == 0.0
    wait, cl = f.claim(0, 1)
    assert len(cl) == 1 and wait == -1.0


def test_skip_claims_take_no_gcra_or_inflight_slot(rds):
    f = make_frontier(rds, max_rps_per_host=5, max_inflight_per_host=1)  # T = 200 ms
    T = T_us(f)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    assert [c.payload for c in cl] == [payload_of(A, 1)]
    c1 = claim_time_us(rds, f, cl[0])
    assert gcra_tat(rds, A) == c1 + T
    # A is at its in-flight cap and not due for T: its skips go out at once
    assert f.push(0, [skip_item(A, i, "over_depth") for i in range(3, 6)]) == (0, 3, 0)
    wait, sk = f.claim(0, 5)
    assert [(c.mode, c.payload) for c in sk] == [("over_depth", payload_of(A, i)) for i in range(3, 6)]
    assert wait == -1.0  # A is off the schedule (at its cap)
    assert inflight(rds, A) == 1
    assert gcra_tat(rds, A) == c1 + T
    for c in sk:
        assert rds.hget(skeys(0).claims, c.token) == b"f" + SEP + b"1" + SEP + b"over_depth" + SEP + c.payload
    # a skip claim holds no slot: reporting it fetched, or acking it, frees none
    assert f.claim(0, 5, fetched=[c.token for c in sk]) == (-1.0, [])
    assert inflight(rds, A) == 1
    assert f.ack(0, [c.token for c in sk]) == 3
    assert inflight(rds, A) == 1
    assert sched_score(rds, A) is None
    assert f.ack(0, [cl[0].token]) == 1
    assert inflight(rds, A) is None
    got = claim_all(f, rds, 0, 1)
    assert got[0][0].payload == payload_of(A, 2) and got[0][1] >= c1 + T


def test_reclaim_puts_an_expired_skip_claim_back_on_the_skips_list(rds):
    f = make_frontier(rds, visibility_timeout_s=1, max_attempts=3)
    f.push(0, [skip_item(A, 1, "nofollow"), item(B, 1)])
    _, cl = f.claim(0, 10)
    assert [(c.mode, c.payload) for c in cl] == [("nofollow", payload_of(A, 1)), ("", payload_of(B, 1))]
    wait_server_past(rds, max(deadline_us(rds, c) for c in cl))
    assert f.reclaim(0) == (2, 0)
    snap = f.snapshot(0)
    assert (snap.skips, snap.queued, snap.claimed) == (1, 1, 0)
    assert pending_skips(rds) == [("nofollow", payload_of(A, 1))]
    assert inflight(rds, B) is None
    # a late ack of the expired skip claim is a no-op
    assert f.ack(0, [cl[0].token]) == 0
    _, cl2 = f.claim(0, 10)
    assert [(c.mode, c.payload) for c in cl2] == [("nofollow", payload_of(A, 1)), ("", payload_of(B, 1))]
    assert cl2[1].attempts == 2
    assert f.ack(0, [c.token for c in cl2]) == 2
    assert f.snapshot(0).idle


def test_a_reclaimed_skip_claim_counts_its_attempts_and_is_dead_lettered_at_max(rds):
    # Claim.attempts "counts claims of this entry including this one", and a
    # URL that keeps killing its worker must not kill workers forever
    f = make_frontier(rds, visibility_timeout_s=1, max_attempts=2)
    f.push(0, [skip_item(A, 1, "nofollow")])
    _, cl = f.claim(0, 1)
    assert cl[0].attempts == 1
    wait_server_past(rds, deadline_us(rds, cl[0]))
    assert f.reclaim(0) == (1, 0)
    _, cl = f.claim(0, 1)
    assert cl[0].mode == "nofollow"
    assert cl[0].attempts == 2, "the second claim of a reclaimed skip entry reports attempts 1"
    wait_server_past(rds, deadline_us(rds, cl[0]))
    assert f.reclaim(0) == (0, 1)
    snap = f.snapshot(0)
    assert snap.dead == 1 and snap.skips == 0


def test_a_nacked_skip_claim_is_dead_lettered_after_max_attempts(rds):
    # the worker nacks a claim whose payload it cannot parse ("bad_entry"):
    # that must end in the dead-letter list, skip entry or not
    f = make_frontier(rds, max_attempts=3)
    f.push(0, [skip_item(A, 1, "nofollow")])
    results = []
    for _ in range(3):
        _, cl = f.claim(0, 1)
        assert len(cl) == 1 and cl[0].mode == "nofollow"
        results.append((cl[0].attempts, f.nack(0, cl[0].token, "bad_entry: boom")))
    assert results == [(1, 1), (2, 1), (3, 2)]
    snap = f.snapshot(0)
    assert snap.dead == 1 and snap.skips == 0 and snap.claimed == 0


def test_nack_of_a_skip_claim_requeues_it_as_a_skip_or_dead_letters_it(rds):
    f = make_frontier(rds, max_attempts=2)
    f.push(0, [skip_item(A, 1, "over_depth")])
    _, cl = f.claim(0, 1)
    assert f.nack(0, cl[0].token, "disk full") == 1
    snap = f.snapshot(0)
    assert (snap.skips, snap.queued, snap.claimed, snap.dead) == (1, 0, 0, 0)
    assert pending_skips(rds) == [("over_depth", payload_of(A, 1))]
    _, cl = f.claim(0, 1)
    assert [(c.mode, c.payload) for c in cl] == [("over_depth", payload_of(A, 1))]
    f1 = make_frontier(rds, max_attempts=1)
    before = server_us(rds)
    assert f1.nack(0, cl[0].token, "disk full") == 2
    after = server_us(rds)
    dl = f1.dead_letters(0)
    assert len(dl) == 1
    assert (dl[0]["pkey"], dl[0]["reason"], dl[0]["payload"].encode()) == ("", "disk full", payload_of(A, 1))
    assert before <= dl[0]["at_us"] <= after
    snap = f.snapshot(0)
    assert (snap.skips, snap.claimed, snap.dead) == (0, 0, 1)


# -- page budget and query variants ------------------------------------------------
def test_page_budget_turns_the_4th_url_of_a_host_into_an_over_budget_skip(rds):
    f = make_frontier(rds, max_pages_per_host=3)
    assert f.push(0, [item(A, i) for i in range(1, 5)] + [item(B, i) for i in range(1, 4)]) == (6, 1, 0)
    # duplicates use no budget, the 4th of B is over too, another host is fine
    assert f.push(0, [item(A, 1), item(A, 3)]) == (0, 0, 2)
    assert f.push(0, [item(B, 4), item("c.example", 1)]) == (1, 1, 0)
    snap = f.snapshot(0)
    assert (snap.queued, snap.skips) == (7, 2)
    assert snap.stats.get("pushed") == 7 and snap.stats.get("skip_pushed") == 2
    # the refused URL is recorded once: pushed again, for fetching or not, it is a duplicate
    assert f.push(0, [item(A, 4), skip_item(A, 4, "nofollow")]) == (0, 0, 2)
    assert in_dedup(rds, "skipseen", item(A, 4))
    _, cl = f.claim(0, 2)
    assert [(c.mode, c.payload) for c in cl] == [("over_budget", payload_of(A, 4)),
                                                 ("over_budget", payload_of(B, 4))]
    got = claim_all(f, rds, 0, 7, n=10)
    assert sorted(c.payload for c, _ in got) == sorted(
        [payload_of(A, i) for i in (1, 2, 3)] + [payload_of(B, i) for i in (1, 2, 3)] + [payload_of("c.example", 1)])
    assert all(c.mode == "" for c, _ in got)


def test_page_budget_counts_host_names_not_politeness_keys_nor_skips(rds):
    f = make_frontier(rds, max_pages_per_host=3)
    www, cdn = "www." + A, "cdn." + A
    assert f.push(0, [item(A, 1, host=www), item(A, 2, host=cdn), item(A, 3, host=www),
                      item(A, 4, host=cdn), item(A, 5, host=www), item(A, 7, host=www)]) == (5, 1, 0)
    # URLs pushed with a skip reason use no budget
    assert f.push(0, [skip_item(A, 9, "nofollow", host=cdn)]) == (0, 1, 0)
    assert f.push(0, [item(A, 6, host=cdn)]) == (1, 0, 0)
    assert f.push(0, [item(A, 8, host=cdn)]) == (0, 1, 0)
    _, cl = f.claim(0, 3)
    assert [(c.mode, c.payload) for c in cl] == [("over_budget", payload_of(A, 7)),
                                                 ("nofollow", payload_of(A, 9)),
                                                 ("over_budget", payload_of(A, 8))]
    assert f.snapshot(0).queued == 6


def test_page_budget_zero_means_no_limit(rds):
    f = make_frontier(rds, max_pages_per_host=0)
    assert f.push(0, [item(A, i) for i in range(60)]) == (60, 0, 0)
    assert not rds.exists(skeys(0).budget)


def test_query_variant_limit_turns_the_3rd_variant_into_a_skip(rds):
    f = make_frontier(rds, max_query_variants=2)
    assert f.push(0, [q_item(A, 1), q_item(A, 2), q_item(A, 3), q_item(A, 1, path="cal"),
                      q_item(B, 3)]) == (4, 1, 0)
    # URLs without a query (vkey "") never count
    assert f.push(0, [item(A, i) for i in range(10)]) == (10, 0, 0)
    assert not rds.hexists(skeys(0).variants, "")
    # a duplicate of a queued variant is a duplicate, not another variant
    assert f.push(0, [q_item(A, 1)]) == (0, 0, 1)
    assert f.push(0, [q_item(A, 2, path="cal"), q_item(A, 3, path="cal"), q_item(A, 4)]) == (1, 2, 0)
    assert sorted(rds.hkeys(skeys(0).variants)) == sorted(
        [f"{A}/search".encode(), f"{A}/cal".encode(), f"{B}/search".encode()])
    _, cl = f.claim(0, 3)
    assert [(c.mode, c.payload) for c in cl] == [
        ("too_many_query_variants", qpayload_of(A, 3)),
        ("too_many_query_variants", qpayload_of(A, 3, path="cal")),
        ("too_many_query_variants", qpayload_of(A, 4))]
    snap = f.snapshot(0)
    assert (snap.queued, snap.skips) == (15, 0)


def test_urls_refused_for_query_variants_do_not_use_up_the_page_budget(rds):
    # max_pages_per_host is "URLs queued per host name at most"; a URL refused
    # for its query variants is not queued
    f = make_frontier(rds, max_pages_per_host=3, max_query_variants=1)
    assert f.push(0, [q_item(A, 1), q_item(A, 2), q_item(A, 3)]) == (1, 2, 0)
    # one URL of A is queued: there is room for two more
    assert f.push(0, [item(A, 1), item(A, 2)]) == (2, 0, 0)


# -- host reports ------------------------------------------------------------------
@pytest.mark.parametrize("jitter", [0.0, 0.999])
def test_failure_reports_back_off_exponentially_with_equal_jitter_and_a_ceiling(rds, jitter):
    base, ceiling = 0.2, 0.5
    f = make_frontier(rds, max_rps_per_host=20, backoff_base_s=base, backoff_max_s=ceiling,
                      host_max_failures=10)
    f.push(0, [item(A, i) for i in range(4)])
    for k in range(1, 5):
        t = report(f, rds, 0, [HostReport(A, "f", jitter, "HTTP 503")])
        assert fails_of(rds, A) == k
        assert parked_reason(rds, A) is None
        full = min(base * 2 ** (k - 1), ceiling) * 1e6   # before jitter
        held = sched_score(rds, A) - t
        assert gcra_tat(rds, A) == sched_score(rds, A)   # burst 1: tau = 0
        assert full * 0.5 - 2 <= held <= full + 2, (k, held, full)
        if jitter == 0.0:
            assert abs(held - full * 0.5) <= 2, (k, held)
        else:
            assert held >= full * 0.999, (k, held)
        c, when = claim_all(f, rds, 0, 1)[0]
        assert c.payload == payload_of(A, k - 1)
        assert when >= t + held, (k, when - t, held)
        assert when >= t + full * 0.5
        assert when < t + full + 1_500_000
        assert f.ack(0, [c.token]) == 1


def test_success_report_resets_the_failure_count_and_the_give_up_clock(rds):
    f = make_frontier(rds, max_rps_per_host=20, backoff_base_s=0.2, backoff_max_s=10, host_max_failures=3,
                      host_give_up_s=0.5)
    f.push(0, [item(A, 1)])
    fail = HostReport(A, "f", 0.0, "HTTP 503")
    report(f, rds, 0, [fail, fail])
    assert fails_of(rds, A) == 2
    report(f, rds, 0, [HostReport(A, "o", 0.0, "")])
    assert fails_of(rds, A) is None
    wait_server_past(rds, sched_score(rds, A))
    # the next failure is a first failure again: base / 2, not 4 * base / 2
    t = report(f, rds, 0, [fail])
    assert fails_of(rds, A) == 1
    assert abs(sched_score(rds, A) - (t + 100_000)) <= 2
    # many failures in a row are not a give-up by themselves...
    report(f, rds, 0, [fail] * 5)
    assert fails_of(rds, A) == 6 and parked_reason(rds, A) is None
    # ...failing for host_give_up_s since the first failure of the run is
    wait_server_past(rds, t + 500_000)
    report(f, rds, 0, [fail])
    assert parked_reason(rds, A) == "HTTP 503"


def test_retry_after_report_holds_for_its_seconds_and_slows_the_host_down(rds):
    f = make_frontier(rds, max_rps_per_host=20, backoff_base_s=5, host_max_failures=10)
    f.push(0, [item(A, 1)])
    t = report(f, rds, 0, [HostReport(A, "r", 0.35, "HTTP 429 with Retry-After 0s")])
    # the hold is the Retry-After, not the exponential backoff (base 5 s)
    assert sched_score(rds, A) == t + 350_000
    assert fails_of(rds, A) is None and adapted_interval_us(rds, A) == 100_000
    c, when = claim_all(f, rds, 0, 1)[0]
    assert when >= t + 350_000
    assert when < t + 350_000 + 1_500_000


def test_hold_report_holds_without_counting_a_failure(rds):
    f = make_frontier(rds, max_rps_per_host=20, host_max_failures=1)
    f.push(0, [item(A, 1), item(A, 2)])
    t = report(f, rds, 0, [HostReport(A, "h", 0.3, "robots.txt unreachable")] * 3)
    assert fails_of(rds, A) is None
    assert parked_reason(rds, A) is None  # host_max_failures=1, yet not given up
    assert sched_score(rds, A) == t + 300_000
    c, when = claim_all(f, rds, 0, 1)[0]
    assert c.mode == "" and c.payload == payload_of(A, 1)
    assert when >= t + 300_000
    assert when < t + 300_000 + 1_500_000


def test_a_hold_also_applies_to_urls_pushed_later(rds):
    f = make_frontier(rds, max_rps_per_host=20)
    # nothing of A queued when the report comes in
    t = report(f, rds, 0, [HostReport(A, "r", 0.3, "HTTP 503 with Retry-After 0s")])
    assert sched_score(rds, A) is None
    f.push(0, [item(A, 1)])
    assert sched_score(rds, A) == t + 300_000
    c, when = claim_all(f, rds, 0, 1)[0]
    assert when >= t + 300_000


def test_a_host_failing_for_host_give_up_s_is_parked_and_its_urls_become_rows(rds):
    f = make_frontier(rds, max_rps_per_host=5, max_inflight_per_host=1, backoff_base_s=0.05,
                      backoff_max_s=0.05, host_max_failures=3, host_give_up_s=0.4)
    f.push(0, [item(A, i) for i in range(4)] + [item(B, 1), item(B, 2)])
    _, first = f.claim(0, 1)
    a0 = first[0]
    assert a0.payload == payload_of(A, 0) and inflight(rds, A) == 1
    fail = HostReport(A, "f", 0.5, "connection refused")
    t = report(f, rds, 0, [fail, fail])
    assert fails_of(rds, A) == 2 and parked_reason(rds, A) is None
    tat = gcra_tat(rds, A)
    wait_server_past(rds, t + 400_000)
    wait, cl = f.claim(0, 10, reports=[HostReport(A, "f", 0.5, "HTTP 503")])
    assert parked_reason(rds, A) == "HTTP 503"
    assert f.snapshot(0).stats.get("parked") == 1
    # A's URLs come out at once, as rows, though A is at its in-flight cap
    # and held by backoff and GCRA; B is fetched as usual
    parked = [c for c in cl if c.mode]
    assert [(c.mode, c.payload, c.attempts) for c in parked] == [
        ("host_parked: HTTP 503", payload_of(A, i), 1) for i in (1, 2, 3)]
    assert [(c.mode, c.payload) for c in cl if not c.mode] == [("", payload_of(B, 1))]
    assert len({claim_time_us(rds, f, c) for c in cl}) == 1
    assert inflight(rds, A) == 1
    assert gcra_tat(rds, A) == tat
    for c in parked:
        assert rds.hget(skeys(0).claims, c.token) == (
            b"f" + A.encode() + SEP + b"1" + SEP + b"host_parked: HTTP 503" + SEP + c.payload)
    # a parked host counts no more failures
    f.claim(0, 0, reports=[fail])
    assert fails_of(rds, A) == 3
    # URLs pushed later are rows at once too
    f.push(0, [item(A, 9)])
    _, late = f.claim(0, 1)
    assert [(c.mode, c.payload) for c in late] == [("host_parked: HTTP 503", payload_of(A, 9))]
    # their acks give back no in-flight slot; A0's ack does
    assert f.ack(0, [c.token for c in parked + late]) == 4
    assert inflight(rds, A) == 1
    assert f.ack(0, [a0.token]) == 1
    assert inflight(rds, A) is None
    snap = f.snapshot(0)
    assert snap.queued == 1 and snap.claimed == 1  # B2 waiting, B1 claimed
    # given up for host_give_up_s: then the host is tried afresh
    until = int(rds.hget(skeys(0).parked, A).split(b"|")[0])
    assert until >= t + 800_000
    wait_server_past(rds, until)
    f.push(0, [item(A, 10)])
    again = claim_all(f, rds, 0, 1, n=10)
    assert [(c.mode, c.payload) for c, _ in again] == [("", payload_of(A, 10))]
    assert parked_reason(rds, A) is None and fails_of(rds, A) is None


def test_a_host_failing_host_max_failures_times_is_probed_one_request_at_a_time(rds):
    f = make_frontier(rds, max_rps_per_host=10000, max_inflight_per_host=3, backoff_base_s=0.01,
                      backoff_max_s=0.01, host_max_failures=2, host_give_up_s=3600)
    f.push(0, [item(A, i) for i in range(8)])

    def in_flight_at_most() -> list:
        got = []
        for _ in range(40):  # GCRA hands out one per 100 us: collect what the cap lets through
            got += f.claim(0, 10)[1]
            time.sleep(0.001)
        return got

    fail = HostReport(A, "f", 0.0, "connection refused")
    t = report(f, rds, 0, [fail])
    wait_server_past(rds, t + 20_000)
    first = in_flight_at_most()
    assert len(first) == 3  # one failure: the cap is still 3
    t = report(f, rds, 0, [fail])
    assert fails_of(rds, A) == 2
    wait_server_past(rds, t + 20_000)
    f.claim(0, 0, fetched=[c.token for c in first])  # their fetches are over
    probe = in_flight_at_most()
    assert len(probe) == 1  # failing host_max_failures times in a row: one probe at a time
    # the probe's success lifts the cap at once
    f.claim(0, 0, fetched=[probe[0].token], reports=[HostReport(A, "o", 0.0, "")])
    assert fails_of(rds, A) is None
    assert len(in_flight_at_most()) == 3


def test_park_report_gives_the_host_up_at_once(rds):
    f = make_frontier(rds, max_rps_per_host=5, host_max_failures=10)
    f.push(0, [item(A, 1), item(A, 2)])
    reason = "Retry-After 99999s over max_retry_after_s " + "x" * 400
    wait, cl = f.claim(0, 10, reports=[HostReport(A, "p", 99999.0, reason)])
    assert parked_reason(rds, A) == reason[:300]
    assert fails_of(rds, A) is None
    assert [(c.mode, c.payload) for c in cl] == [("host_parked: " + reason[:300], payload_of(A, i)) for i in (1, 2)]
    assert wait == -1.0
    assert f.snapshot(0).queued == 0


def test_a_parked_host_stays_due_after_a_hold_report(rds):
    # schedule(): "a given-up pkey is always due"; 'f' and 'r' skip parked
    # keys, a late 'h' (robots.txt of an in-flight fetch) must not delay its rows
    f = make_frontier(rds, max_rps_per_host=5, host_max_failures=10)
    f.push(0, [item(A, 1), item(A, 2)])
    report(f, rds, 0, [HostReport(A, "p", 600.0, "gone")])
    wait, cl = f.claim(0, 10, reports=[HostReport(A, "h", 60.0, "robots.txt unreachable")])
    assert [(c.mode, c.payload) for c in cl] == [("host_parked: gone", payload_of(A, i)) for i in (1, 2)]


def test_reclaim_of_a_parked_row_puts_it_on_the_skips_list(rds):
    f = make_frontier(rds, visibility_timeout_s=1, max_attempts=3)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1, reports=[HostReport(A, "p", 600.0, "gone")])
    assert [(c.mode, c.attempts) for c in cl] == [("host_parked: gone", 1)]
    wait_server_past(rds, deadline_us(rds, cl[0]))
    assert f.reclaim(0) == (1, 0)
    snap = f.snapshot(0)
    assert (snap.queued, snap.skips, snap.claimed) == (0, 1, 0)
    _, cl2 = f.claim(0, 1)
    assert [(c.mode, c.payload) for c in cl2] == [("host_parked: gone", payload_of(A, 1))]
    assert f.ack(0, [cl2[0].token]) == 1
    assert f.snapshot(0).idle


def test_dead_letter_of_a_parked_row_keeps_its_pkey(rds):
    f = make_frontier(rds, max_attempts=1)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1, reports=[HostReport(A, "p", 600.0, "gone")])
    assert f.nack(0, cl[0].token, "disk full") == 2
    dl = f.dead_letters(0)
    assert [(d["pkey"], d["attempts"], d["reason"], d["payload"].encode()) for d in dl] == [
        (A, 1, "disk full", payload_of(A, 1))]


# -- reserve -----------------------------------------------------------------------
def test_reserve_charges_gcra_like_a_claim(rds):
    f = make_frontier(rds, max_rps_per_host=5, burst=1)  # T = 200 ms
    T = T_us(f)
    f.push(0, [item(A, 1)])
    before = server_us(rds)
    w1 = f.reserve(0, A)
    tat1 = gcra_tat(rds, A)
    w2 = f.reserve(0, A)
    after = server_us(rds)
    tat2 = gcra_tat(rds, A)
    r1 = tat1 - T  # the server time of the first reserve
    assert before <= r1 <= after
    assert w1 == 0.0
    # the second booking is due T after the first: ~1/R from now
    assert tat2 == tat1 + T
    assert 0 < w2 <= T / 1e6
    assert w2 >= (tat1 - after) / 1e6 - 1e-6
    # the queued URL waits its turn: T after the second booking
    assert sched_score(rds, A) == tat2
    wait, cl = f.claim(0, 5)
    if server_us(rds) < tat2:
        assert cl == [] and 0 < wait <= 2 * T / 1e6
    got = [(c, claim_time_us(rds, f, c)) for c in cl] or claim_all(f, rds, 0, 1)
    when = got[0][1]
    requests = [r1 + int(w1 * 1e6), tat1, when]
    assert all(b - a >= T for a, b in zip(requests, requests[1:])), requests
    assert when < tat2 + 1_500_000


def test_reserve_after_a_claim_books_the_next_slot(rds):
    f = make_frontier(rds, max_rps_per_host=5, burst=1)  # T = 200 ms
    T = T_us(f)
    f.push(0, [item(A, 1), item(A, 2)])
    _, cl = f.claim(0, 5)
    c1 = claim_time_us(rds, f, cl[0])
    before = server_us(rds)
    w = f.reserve(0, A)
    after = server_us(rds)
    assert (c1 + T - after) / 1e6 - 1e-6 <= w <= (c1 + T - before) / 1e6 + 1e-6
    assert gcra_tat(rds, A) == c1 + 2 * T
    got = claim_all(f, rds, 0, 1)
    assert got[0][1] >= c1 + 2 * T


def test_reserve_of_an_idle_pkey_does_not_schedule_it(rds):
    f = make_frontier(rds, max_rps_per_host=5)
    T = T_us(f)
    before = server_us(rds)
    assert f.reserve(0, A) == 0.0
    after = server_us(rds)
    tat = gcra_tat(rds, A)
    assert before <= tat - T <= after
    assert sched_score(rds, A) is None
    assert f.claim(0, 5) == (-1.0, [])
    f.push(0, [item(A, 1)])
    assert sched_score(rds, A) == tat
    got = claim_all(f, rds, 0, 1)
    # the booked request was at tat - T; the URL comes T later
    assert got[0][1] >= tat


def test_reserve_with_burst_2(rds):
    f = make_frontier(rds, max_rps_per_host=10, burst=2)  # T = 100 ms, tau = T
    waits = [f.reserve(0, A) for _ in range(3)]
    assert waits[0] == 0.0 and waits[1] == 0.0
    assert 0 < waits[2] <= 0.1


# -- slow_down -----------------------------------------------------------------------
def test_slow_down_never_speeds_up_and_the_largest_interval_wins(rds):
    f = make_frontier(rds, max_rps_per_host=20)  # T0 = 50 ms
    assert f.slow_down(0, A, 0.01) == 0.05
    assert not rds.hexists(skeys(0).rates, A)
    assert f.slow_down(0, A, 0.3) == 0.3
    assert f.slow_down(0, A, 0.2) == 0.3
    assert f.slow_down(0, A, 0.05) == 0.3
    assert f.slow_down(0, A, 0.35) == 0.35
    assert int(rds.hget(skeys(0).rates, A)) == 350_000
    # per pkey and per shard
    assert not rds.hexists(skeys(0).rates, B)
    assert not rds.exists(skeys(1).rates)


def test_slow_down_spaces_claims_of_one_pkey_by_the_new_interval(rds):
    f = make_frontier(rds, max_rps_per_host=20)  # T0 = 50 ms
    T0 = T_us(f)
    assert f.slow_down(0, A, 0.35) == 0.35
    assert f.slow_down(0, A, 0.2) == 0.35
    f.push(0, [item(A, i) for i in range(3)] + [item(B, i) for i in range(3)])
    got = claim_all(f, rds, 0, 6, n=10)
    ta = [t for c, t in got if Entry.from_payload(c.payload).url.startswith(f"http://{A}/")]
    tb = [t for c, t in got if Entry.from_payload(c.payload).url.startswith(f"http://{B}/")]
    assert len(ta) == 3 and len(tb) == 3
    gaps_a = [b - a for a, b in zip(ta, ta[1:])]
    gaps_b = [b - a for a, b in zip(tb, tb[1:])]
    assert all(g >= 350_000 for g in gaps_a), gaps_a
    assert all(g < 350_000 + 1_500_000 for g in gaps_a), gaps_a
    # B keeps the crawl's rate
    assert all(g >= T0 for g in gaps_b), gaps_b
    assert tb[-1] < ta[-1]


def test_an_interval_below_the_crawls_is_never_used(rds):
    # rate.lua never stores one; a stray entry (written here directly) must
    # not make a pkey faster than max_rps_per_host either
    f = make_frontier(rds, max_rps_per_host=10)  # T0 = 100 ms
    T0 = T_us(f)
    rds.hset(skeys(0).rates, A, 1000)
    f.push(0, [item(A, i) for i in range(3)])
    times = [t for _, t in claim_all(f, rds, 0, 3, n=10)]
    assert all(b - a >= T0 for a, b in zip(times, times[1:])), times


def test_slow_down_with_burst_2_scales_the_tolerance_too(rds):
    f = make_frontier(rds, max_rps_per_host=20, burst=2)  # T0 = 50 ms
    f.slow_down(0, A, 0.3)
    f.push(0, [item(A, i) for i in range(4)])
    got = claim_all(f, rds, 0, 4, n=10)
    times = [t for _, t in got]
    T = 300_000
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= 2 + (times[j] - times[i]) // T, (i, j, times)


# -- nack(count=False) -------------------------------------------------------------
def test_nack_without_count_does_not_count_the_attempt(rds):
    f = make_frontier(rds, max_attempts=1)
    f.push(0, [item(A, 1)])
    c = claim_all(f, rds, 0, 1)[0][0]
    assert c.attempts == 1
    # max_attempts=1, yet an uncounted nack requeues it
    assert f.nack(0, c.token, "robots.txt unreachable", count=False) == 1
    snap = f.snapshot(0)
    assert (snap.queued, snap.claimed, snap.dead) == (1, 0, 0)
    assert snap.stats.get("nacked") == 1
    c = claim_all(f, rds, 0, 1)[0][0]
    assert c.attempts == 1
    assert f.nack(0, c.token, "robots.txt unreachable", count=False) == 1
    c = claim_all(f, rds, 0, 1)[0][0]
    assert c.attempts == 1
    # counted (the default): dead-lettered as attempt 1
    assert f.nack(0, c.token, "HTTP 500") == 2
    dl = f.dead_letters(0)
    assert [(d["attempts"], d["reason"]) for d in dl] == [(1, "HTTP 500")]


def test_nack_without_count_keeps_earlier_attempts(rds):
    f = make_frontier(rds, max_attempts=5)
    f.push(0, [item(A, 1)])
    seen = []
    for count in (True, False, False, True):
        c = claim_all(f, rds, 0, 1)[0][0]
        seen.append(c.attempts)
        assert f.nack(0, c.token, "e", count=count) == 1
    c = claim_all(f, rds, 0, 1)[0][0]
    seen.append(c.attempts)
    assert seen == [1, 2, 2, 2, 3]


# -- claim values, dead letters and reclaim with the new format ---------------------
def test_claims_hash_values_carry_state_pkey_attempts_mode_payload(rds):
    f = make_frontier(rds, max_attempts=5)
    f.push(0, [item(A, 1)])
    c = claim_all(f, rds, 0, 1)[0][0]
    assert rds.hget(skeys(0).claims, c.token) == b"c" + A.encode() + SEP + b"1" + SEP + SEP + payload_of(A, 1)
    assert f.claim(0, 0, fetched=[c.token])[1] == []
    assert rds.hget(skeys(0).claims, c.token) == b"f" + A.encode() + SEP + b"1" + SEP + SEP + payload_of(A, 1)
    assert f.nack(0, c.token, "x") == 1
    c = claim_all(f, rds, 0, 1)[0][0]
    assert c.attempts == 2
    assert rds.hget(skeys(0).claims, c.token) == b"c" + A.encode() + SEP + b"2" + SEP + SEP + payload_of(A, 1)


def test_reclaim_after_fetch_done_requeues_and_dead_letters_with_the_new_format(rds):
    f = make_frontier(rds, visibility_timeout_s=1, max_attempts=2, max_inflight_per_host=2)
    e = Entry("http://a.example/é?x=\"1\"", "http://a.example/é?x=\"1\"", 3, referrer="http://a.example/")
    f.push(0, [PushItem(fingerprint(e.canonical), A, A, "", "", e.to_payload()), item(A, 2)])
    got = claim_all(f, rds, 0, 2, n=10)
    toks = [c.token for c, _ in got]
    f.claim(0, 0, fetched=[toks[0]])  # one fetch over, the other not
    assert inflight(rds, A) == 1
    wait_server_past(rds, max(deadline_us(rds, c) for c, _ in got))
    assert f.reclaim(0) == (2, 0)
    assert inflight(rds, A) is None
    again = claim_all(f, rds, 0, 2, n=10)
    assert sorted(c.payload for c, _ in again) == sorted([e.to_payload(), payload_of(A, 2)])
    assert all(c.attempts == 2 and c.mode == "" for c, _ in again)
    wait_server_past(rds, max(deadline_us(rds, c) for c, _ in again))
    assert f.reclaim(0) == (0, 2)
    dl = f.dead_letters(0)
    assert sorted(d["payload"].encode() for d in dl) == sorted([e.to_payload(), payload_of(A, 2)])
    assert all(d["pkey"] == A and d["attempts"] == 2 and "visibility timeout" in d["reason"] for d in dl)
    assert Entry.from_payload(next(d["payload"] for d in dl if "é" in d["payload"])) == e
    assert inflight(rds, A) is None
    snap = f.snapshot(0)
    assert (snap.queued, snap.claimed, snap.dead, snap.skips) == (0, 0, 2, 0)

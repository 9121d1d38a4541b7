"""Semantics of the frontier's Lua scripts, through crawld.frontier.Frontier,
against a real redis-server (fixture ``rds``).

Exact claim times are read back from Redis: a claim's visibility deadline is
``now + vt`` where ``now`` is the Redis TIME the claim script ran at, so
``ZSCORE claimed token - vt`` is the server time of the claim, to the
microsecond.  Politeness lower bounds are asserted on those exact times.
"""

from __future__ import annotations

import threading
import time

import pytest
from redis.crc import key_slot

from crawld import keys
from crawld.config import CrawlConfig
from crawld.frontier import Claim, Entry, Frontier, ShardSnapshot, crawl_finished
from crawld.urls import fingerprint

CRAWL = "t"
A = "a.example"
B = "b.example"


# -- helpers -------------------------------------------------------------
def make_frontier(rds, **over) -> Frontier:
    d = {"crawl_id": CRAWL, "num_shards": 2, "max_rps_per_host": 1000, "burst": 1,
         "max_inflight_per_host": 100, "visibility_timeout_s": 60, "max_attempts": 3}
    d.update(over)
    return Frontier(rds, CrawlConfig.from_dict(d))


def url_of(pkey: str, i: int) -> str:
    return f"http://{pkey}/page/{i}"


def payload_of(pkey: str, i: int, depth: int = 0) -> bytes:
    u = url_of(pkey, i)
    return Entry(u, u, depth).to_payload()


def item(pkey: str, i: int, depth: int = 0) -> tuple[bytes, str, bytes]:
    u = url_of(pkey, i)
    return (fingerprint(u), pkey, Entry(u, u, depth).to_payload())


def skeys(shard: int = 0) -> keys.ShardKeys:
    return keys.shard_keys(CRAWL, shard)


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
            tag = "{%s:%d}" % (crawl_id, shard)
            assert keys.shard_tag(crawl_id, shard) == tag
            names = sk.all()
            assert len(names) == len(keys.SHARD_KEY_NAMES) == len(set(names))
            for name, k in zip(keys.SHARD_KEY_NAMES, names):
                assert k == getattr(sk, name)
                # the first '{' ... '}' of the key is exactly the shard tag
                first = k.index("{")
                assert k[first:k.index("}", first) + 1] == tag
                assert k.endswith(":" + name)
            assert len({key_slot(k.encode()) for k in names}) == 1
    # different shards do not share keys
    assert not set(keys.shard_keys("t", 0).all()) & set(keys.shard_keys("t", 1).all())


def test_frontier_uses_shard_keys_and_only_writes_keys_of_the_shard(rds):
    f = make_frontier(rds, visibility_timeout_s=1)
    for s in range(2):
        assert f.keys(s) == keys.shard_keys(CRAWL, s).all()
    f.push(1, [item(A, 1), item(A, 2)])
    c = claim_all(f, rds, 1, 1)[0][0]
    assert f.ack(1, [c.token]) == 1
    c = claim_all(f, rds, 1, 1)[0][0]
    assert f.nack(1, c.token, 0, "x") == 1
    c = claim_all(f, rds, 1, 1)[0][0]
    assert f.nack(1, c.token, 0, "x") == 1
    c = claim_all(f, rds, 1, 1)[0][0]
    wait_server_past(rds, deadline_us(rds, c))
    assert f.reclaim(1) == (0, 1)  # third attempt: dead-lettered
    assert f.snapshot(1).dead == 1
    written = {k.decode() for k in rds.scan_iter("*")}
    assert written, "nothing written"
    assert written <= set(keys.shard_keys(CRAWL, 1).all())
    assert all("{t:1}" in k for k in written)


# -- push ----------------------------------------------------------------
def test_push_dedups_same_fingerprint_within_and_across_calls(rds):
    f = make_frontier(rds)
    assert f.push(0, [item(A, 1), item(A, 1)]) == 1
    assert f.push(0, [item(A, 1)]) == 0
    assert f.push(0, [item(A, 1), item(A, 2)]) == 1
    snap = f.snapshot(0)
    assert snap.queued == 2
    assert snap.stats.get("pushed") == 2
    assert snap.stats.get("dup") == 3
    assert rds.scard(skeys(0).seen) == 2
    assert f.push(0, []) == 0


def test_push_dedup_is_by_fingerprint_not_payload(rds):
    f = make_frontier(rds)
    fp = fingerprint("http://a.example/x")
    assert f.push(0, [(fp, A, Entry("http://a.example/x", "http://a.example/x", 0).to_payload())]) == 1
    # same fingerprint, different payload and pkey: still a duplicate
    assert f.push(0, [(fp, B, Entry("http://b.example/y", "http://b.example/y", 3).to_payload())]) == 0
    assert f.snapshot(0).queued == 1


def test_push_stays_deduped_after_the_entry_was_claimed_and_acked(rds):
    f = make_frontier(rds)
    assert f.push(0, [item(A, 1)]) == 1
    _, cl = f.claim(0, 1)
    assert f.ack(0, [cl[0].token]) == 1
    assert f.push(0, [item(A, 1)]) == 0
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
    assert f.push(0, [item(A, 2), item(A, 3)]) == 2
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
    f.push(1, [(fingerprint(e.canonical), A, e.to_payload()), item(B, 1, depth=2)])
    wait, claims = f.claim(1, 10)
    assert len(claims) == 2
    for c in claims:
        assert isinstance(c, Claim)
        assert c.shard == 1
        assert isinstance(c.token, bytes) and c.token
        assert c.attempts == 1
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
    f.push(0, [item(A, 1), item(A, 2)])
    w1, cl = f.claim(0, 5)
    assert len(cl) == 1
    c1 = claim_time_us(rds, f, cl[0])
    # the pkey is due exactly T after the claim, seen from the same instant
    assert abs(w1 * 1e6 - T) <= 1
    assert sched_score(rds, A) == c1 + T
    time.sleep(0.05)
    before = server_us(rds)
    w2, cl2 = f.claim(0, 5)
    after = server_us(rds)
    if after >= c1 + T:
        pytest.skip("machine too slow to observe the wait hint")
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
    assert f.nack(0, cl[0].token, 0, "err") == 1
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
    assert f.nack(0, toks[0], 0, "e") == 1
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
    assert f.nack(0, old.token, 0, "late") == 0
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
    f.push(0, [(fingerprint(e.canonical), A, p)])
    for attempt in (1, 2):
        c = claim_all(f, rds, 0, 1)[0][0]
        assert c.attempts == attempt and c.payload == p
        assert f.nack(0, c.token, 0, f"fail {attempt}") == 1
        snap = f.snapshot(0)
        assert snap.queued == 1 and snap.claimed == 0 and snap.dead == 0
    c = claim_all(f, rds, 0, 1)[0][0]
    assert c.attempts == 3
    before = server_us(rds)
    assert f.nack(0, c.token, 0, "connection refused: boom") == 2
    after = server_us(rds)
    assert f.nack(0, c.token, 0, "again") == 0
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
    assert f.nack(0, c.token, 0, "x") == 2
    after = server_us(rds)
    at = f.dead_letters(0)[0]["at_us"]
    assert isinstance(at, int), f"at_us is {at!r}, not integer microseconds"
    assert before <= at <= after


def test_nack_with_max_attempts_1_dead_letters_immediately(rds):
    f = make_frontier(rds, max_attempts=1)
    f.push(0, [item(A, 1), item(A, 2)])
    c = claim_all(f, rds, 0, 1)[0][0]
    assert f.nack(0, c.token, 0, "x" * 600) == 2
    d = f.dead_letters(0)
    assert len(d) == 1 and d[0]["reason"] == "x" * 500 and d[0]["payload"].encode() == payload_of(A, 1)
    # the pkey's other entry is still claimable
    c2 = claim_all(f, rds, 0, 1)[0][0]
    assert c2.payload == payload_of(A, 2)


def test_nack_unknown_token_returns_zero_and_changes_nothing(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1)])
    assert f.nack(0, b"31337", 0, "x") == 0
    snap = f.snapshot(0)
    assert snap.queued == 1 and snap.stats.get("nacked") is None


@pytest.mark.parametrize("cap", [1, 3])
def test_nack_delays_the_pkey_by_delay_s(rds, cap):
    f = make_frontier(rds, max_rps_per_host=1000, max_inflight_per_host=cap)
    f.push(0, [item(A, 1), item(A, 2), item(B, 1)])
    _, cl = f.claim(0, 1)
    assert cl[0].payload == payload_of(A, 1)
    delay = 0.4
    before = server_us(rds)
    assert f.nack(0, cl[0].token, delay, "503") == 1
    wait, now_claims = f.claim(0, 10)
    # only B: A is delayed (its other entry too)
    assert [c.payload for c in now_claims] == [payload_of(B, 1)]
    assert 0 < wait <= delay + 1e-6
    got = claim_all(f, rds, 0, 1, n=10)
    if cap == 1:
        assert f.ack(0, [got[0][0].token]) == 1
    got += claim_all(f, rds, 0, 1, n=10)
    assert [c.payload for c, _ in got] == [payload_of(A, 2), payload_of(A, 1)]
    assert got[1][0].attempts == 2
    assert got[0][1] >= before + int(delay * 1e6)
    assert got[0][1] < before + int(delay * 1e6) + 1_500_000


def test_nack_delay_holds_with_burst_2(rds):
    f = make_frontier(rds, max_rps_per_host=10, burst=2, max_inflight_per_host=5)
    T = T_us(f)
    f.push(0, [item(A, i) for i in range(5)])
    _, cl = f.claim(0, 1)
    before = server_us(rds)
    assert f.nack(0, cl[0].token, 0.3, "429") == 1
    got = claim_all(f, rds, 0, 5, n=10)
    times = [t for _, t in got]
    assert times[0] >= before + 300_000
    # after the delay, GCRA still applies: never more than burst in a window
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= 2 + (times[j] - times[i]) // T, (i, j)


# -- extend --------------------------------------------------------------
def test_extend_keeps_a_claim_past_its_original_deadline(rds):
    f = make_frontier(rds, visibility_timeout_s=2)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    c = cl[0]
    d1 = deadline_us(rds, c)
    time.sleep(1.0)
    assert f.extend(0, [c.token]) == 1
    d2 = deadline_us(rds, c)
    assert d2 > d1 + 500_000
    wait_server_past(rds, d1 + 100_000)
    before = server_us(rds)
    r = f.reclaim(0)
    if before >= d2:
        pytest.skip("machine too slow: the extended deadline passed too")
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
    assert s.activity() == (3, 2)
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
    assert f.nack(0, cl[0].token, 0, "x") == 2
    w1 = f.snapshots()
    assert f.push(0, [item(A, 1)]) == 0
    w2 = f.snapshots()
    assert w2[0].dead == 1
    assert crawl_finished(w1, w2)


# -- misc readers ------------------------------------------------------------
def test_commit_pushes_then_acks_in_one_round_trip(rds):
    f = make_frontier(rds)
    f.push(0, [item(A, 1)])
    _, cl = f.claim(0, 1)
    n = f.commit({0: [item(A, 2)], 1: [item(B, 1)]}, {0: [cl[0].token, b"999"]})
    assert n == 1
    assert f.snapshot(0).queued == 1 and f.snapshot(0).claimed == 0
    assert f.snapshot(1).queued == 1


def test_oldest_claim_age(rds):
    f = make_frontier(rds)
    assert f.oldest_claim_age_s(0) is None
    f.push(0, [item(A, 1)])
    f.claim(0, 1)
    time.sleep(0.05)
    age = f.oldest_claim_age_s(0)
    assert 0.04 <= age < 5

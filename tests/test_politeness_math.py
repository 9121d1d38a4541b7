"""The politeness arithmetic of crawld/politeness.py and its Lua mirror in
crawld/lua/_lib.lua, run on the same tables (STYLE: keep the rate math pure,
mirror it in Lua, test both on one table), plus the properties the design
promises of it: GCRA never lets more than ``window / T + burst`` requests
into a window, the adaptation to a host that answers 429 above a fixed rate
finds that rate with few 429s, and the first cut of a fresh host goes
straight to 1 request/s."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from crawld import keys, politeness
from crawld.frontier import _LUA_DIR
from crawld.politeness import Adapt, Floor

PKEY = "example.com"
SK = keys.shard_keys("mirror", 0)


@pytest.fixture
def probe(rds):
    src = (_LUA_DIR / "_lib.lua").read_text() + "\n" + (Path(__file__).parent / "lua" / "politeness_probe.lua").read_text()
    script = rds.register_script(src)

    def run(own_us: int, op: str, now: int, max_interval: int = 0, told: bool = False):
        r = script(keys=SK.all(), args=[own_us, 0, 2, op, PKEY, now, max_interval, "1" if told else "0"])
        return int(r[0]), Adapt.decode(r[1]), Floor.decode(r[2])
    return run


# (own interval, crawl-delay interval, adapt interval, floor (interval, until), now) -> interval in force
INTERVALS = [
    (500_000, None, None, None, 10, 500_000),
    (500_000, 2_000_000, None, None, 10, 2_000_000),            # Crawl-delay 2 s
    (500_000, None, Adapt(800_000, 400_000, 0), None, 10, 800_000),
    (500_000, 100_000, Adapt(300_000, 150_000, 0), None, 10, 500_000),  # own is the largest
    (100_000, None, None, Floor(500_000, 20), 10, 500_000),     # a slower crawl's live floor
    (100_000, None, None, Floor(500_000, 10), 10, 100_000),     # ... expired at now
    (100_000, 300_000, Adapt(200_000, 100_000, 0), Floor(250_000, 99), 10, 300_000),
]


@pytest.mark.parametrize("own,delay,adapt,floor,now,expect", INTERVALS)
def test_interval_in_force_python_and_lua(rds, probe, own, delay, adapt, floor, now, expect):
    assert politeness.interval(own, delay, adapt, floor, now) == expect
    rds.delete(SK.rates, SK.adapt, SK.floor)
    if delay is not None:
        rds.hset(SK.rates, PKEY, delay)
    if adapt is not None:
        rds.hset(SK.adapt, PKEY, adapt.encode())
    if floor is not None:
        rds.hset(SK.floor, PKEY, floor.encode())
    assert probe(own, "interval", now)[0] == expect


def _events(seed: int, n: int = 400):
    """A reproducible mix of slow-downs (with and without Retry-After) and
    successes at increasing times."""
    rnd = random.Random(seed)
    t = 1_000_000
    out = []
    for _ in range(n):
        t += rnd.choice((1_000, 50_000, 400_000, 2_000_000))
        r = rnd.random()
        out.append((t, "slowdown" if r < 0.08 else "told" if r < 0.1 else "success"))
    return out


@pytest.mark.parametrize("own", [1_000, 500_000, 3_000_000])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_adaptation_python_and_lua_agree_step_by_step(rds, probe, own, seed):
    rds.delete(SK.rates, SK.adapt, SK.floor)
    adapt = None
    max_interval = 300_000_000
    for t, ev in _events(seed):
        current = politeness.interval(own, None, adapt, None, t)
        if ev == "success":
            adapt = politeness.on_success(adapt, own)
            got = probe(own, "success", t)
        else:
            adapt = politeness.on_slowdown(adapt, current, t, max_interval, told=ev == "told")
            got = probe(own, "slowdown", t, max_interval, told=ev == "told")
        assert got[1] == adapt, (t, ev)
        assert got[0] == politeness.interval(own, None, adapt, None, t)


@pytest.mark.parametrize("steps", [
    # (own interval, now) claims by crawls of different rates; the floor kept
    [(500_000, 0), (100_000, 1_000), (100_000, 30_000_000), (100_000, 61_000_000)],
    [(100_000, 0), (500_000, 10), (100_000, 20), (2_000_000, 30), (100_000, 7_000_000)],
])
def test_floor_python_and_lua_agree(rds, probe, steps):
    rds.delete(SK.rates, SK.adapt, SK.floor)
    floor = None
    for own, now in steps:
        nxt = politeness.next_floor(floor, own, now)
        floor = nxt or floor
        got = probe(own, "floor", now)
        assert got[2] == floor, (own, now)
        assert got[0] == politeness.interval(own, None, None, floor, now)


def test_first_cut_of_a_fresh_host_goes_to_one_request_per_second():
    a = politeness.on_slowdown(None, 1_000, 5, 300_000_000)
    assert a == Adapt(politeness.FIRST_CUT_US, 1_000, 5)
    # with a Retry-After the host said when to come back: only halved
    assert politeness.on_slowdown(None, 1_000, 5, 300_000_000, told=True).interval == 2_000
    # one reaction per interval: a second 429 of a request sent together is ignored
    assert politeness.on_slowdown(a, politeness.FIRST_CUT_US, 5 + 999_999, 300_000_000) == a
    assert politeness.on_slowdown(a, politeness.FIRST_CUT_US, 5 + 1_000_000, 300_000_000).interval == 2_000_000
    # never above the cap (but never below what was in force)
    assert politeness.on_slowdown(a, 200_000_000, 10**9, 300_000_000).interval == 300_000_000


def test_recovery_drops_the_adaptation_at_the_crawls_own_interval():
    a = Adapt(1_000_000, 400_000, 0)
    n = 0
    while a is not None:
        a = politeness.on_success(a, 500_000)
        n += 1
    # fast (K_FAST) while far from the ceiling: about 32 * ln 2 steps from 1 s to 0.5 s
    assert 20 <= n <= 30


def _limit_req_run(pages: int, limit_us: int, own_us: int, seed: int = 7) -> tuple[int, int, int]:
    """A host that accepts a request only ``limit_us`` after the last one it
    accepted (nginx limit_req with burst 0), crawled one request at a time
    with GCRA at the interval in force and the adaptation; requests arrive
    with up to 2 ms of jitter.  Returns (requests, 429s, time in us)."""
    rnd = random.Random(seed)
    adapt, tat, last_ok, done, n429, reqs, t = None, 0, -10**12, 0, 0, 0, 0
    while done < pages:
        T = politeness.interval(own_us, None, adapt, None, t)
        t = max(t, tat)
        tat = t + T
        reqs += 1
        arrive = t + rnd.randrange(2_000)
        if arrive - last_ok >= limit_us:
            last_ok, done = arrive, done + 1
            adapt = politeness.on_success(adapt, own_us)
        else:
            n429 += 1
            adapt = politeness.on_slowdown(adapt, T, t, 300_000_000)
            tat = max(tat, t + politeness.interval(own_us, None, adapt, None, t))
        t += 3_000
    return reqs, n429, t


@pytest.mark.parametrize("pages,limit_us,own_us", [
    (1000, 500_000, 1_000),     # 2 r/s host, crawled at 1000 r/s
    (3000, 50_000, 1_000),      # 20 r/s host
    (1000, 500_000, 500_000),   # crawled at exactly its limit: jitter only
])
def test_adaptation_to_a_limit_req_host_costs_under_one_percent_429s(pages, limit_us, own_us):
    reqs, n429, t = _limit_req_run(pages, limit_us, own_us)
    assert n429 / reqs < 0.01, (n429, reqs)
    # and keeps most of the host's rate (the lower bound is pages * limit)
    assert pages * limit_us / t > 0.6


def test_the_send_pacer_spaces_a_domains_requests_as_they_leave():
    p = politeness.SendPacer(max_keys=4)
    # two requests granted together (a late one and the next on time) leave a gap apart
    assert p.send_at("a.com", 10.0, 0.5) == 10.0
    assert p.send_at("a.com", 10.1, 0.5) == 10.5
    assert p.send_at("a.com", 10.2, 0.5) == 11.0  # booked: concurrent requests queue up
    assert p.send_at("b.com", 10.2, 0.5) == 10.2  # another domain is not held
    assert p.send_at("a.com", 20.0, 0.5) == 20.0  # long after: at once
    # bounded memory: the oldest half is forgotten when full
    for i in range(10):
        p.send_at(f"d{i}.com", 30.0, 1.0)
    assert len(p._last) <= 4

"""crawld.sharding: politeness keys (registered domains) and Jump Consistent Hash."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap

import pytest

from crawld import sharding
from crawld.config import CrawlConfig
from crawld.scope import Router
from crawld.sharding import jump_hash, key_hash, politeness_key, registered_domain, shard_of

POLITENESS = [
    ("docs.python.org", "python.org"),
    ("python.org", "python.org"),
    ("www.python.org", "python.org"),
    ("Docs.Python.ORG", "python.org"),
    ("docs.python.org.", "python.org"),
    ("a.b.co.uk", "b.co.uk"),
    ("www.bbc.co.uk", "bbc.co.uk"),
    ("a.b.c.d.example.org", "example.org"),
    ("xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("shop.xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("www.example.com.au", "example.com.au"),
    # no public suffix: the host itself
    ("localhost", "localhost"),
    ("localhost.", "localhost"),
    ("intranet", "intranet"),
    ("wiki.corp", "wiki.corp"),
    ("build.wiki.corp", "build.wiki.corp"),
    ("nas.lan", "nas.lan"),
    # IP literals: normalised address
    ("127.0.0.1", "127.0.0.1"),
    ("192.168.0.1.", "192.168.0.1"),
    ("[::1]", "::1"),
    ("::1", "::1"),
    ("[2001:DB8::1]", "2001:db8::1"),
    ("[2001:db8:0:0:0:0:0:1]", "2001:db8::1"),
    # a host that is a public suffix is its own key
    ("co.uk", "co.uk"),
    ("com", "com"),
]


@pytest.mark.parametrize("host, key", POLITENESS, ids=[p[0] for p in POLITENESS])
def test_politeness_key(host, key):
    assert politeness_key(host) == key


@pytest.mark.parametrize("host", [p[0] for p in POLITENESS] + ["a.", "x.y.z.", "co.uk.", "[::1]", "0x7f.1"])
def test_politeness_key_never_empty_nor_trailing_dot(host):
    k = politeness_key(host)
    assert k and not k.endswith(".") and k == k.strip() and k == k.lower()


@pytest.mark.parametrize("host", ["", "   ", ".", "..", "[]"])
def test_politeness_key_rejects_empty_host(host):
    with pytest.raises(ValueError):
        politeness_key(host)


def test_subdomains_share_a_shard():
    hosts = ["docs.python.org", "www.python.org", "bugs.python.org", "python.org"]
    assert len({shard_of(politeness_key(h), 16) for h in hosts}) == 1


# The PSL's private section (publicsuffix.org: "===BEGIN PRIVATE DOMAINS===",
# suffixes under which others register their own sites) --------------------

# (host, key with the private section (the default), key with ICANN alone)
PRIVATE_SECTION = [
    ("a.github.io", "a.github.io", "github.io"),
    ("b.github.io", "b.github.io", "github.io"),
    ("docs.a.github.io", "a.github.io", "github.io"),
    ("github.io", "github.io", "github.io"),            # a suffix itself: its own key
    ("www.example.uk.com", "example.uk.com", "uk.com"),
    ("uk.com", "uk.com", "uk.com"),
    ("someone.blogspot.com", "someone.blogspot.com", "blogspot.com"),
    ("bucket.s3.amazonaws.com", "bucket.s3.amazonaws.com", "amazonaws.com"),
    # ICANN suffixes and the fallbacks are the same either way
    ("docs.python.org", "python.org", "python.org"),
    ("a.b.co.uk", "b.co.uk", "b.co.uk"),
    ("co.uk", "co.uk", "co.uk"),
    ("www.example.com.au", "example.com.au", "example.com.au"),
    ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
    ("[::1]", "::1", "::1"),
    ("localhost", "localhost", "localhost"),
    ("build.wiki.corp", "build.wiki.corp", "build.wiki.corp"),
]


@pytest.mark.parametrize("host, private_key, icann_key", PRIVATE_SECTION, ids=[p[0] for p in PRIVATE_SECTION])
def test_politeness_key_private_section(host, private_key, icann_key):
    assert politeness_key(host) == private_key
    assert politeness_key(host, private=True) == private_key
    assert politeness_key(host, private=False) == icann_key


def test_two_sites_of_one_hosting_domain_are_two_sites():
    assert politeness_key("a.github.io") != politeness_key("b.github.io")
    assert politeness_key("a.github.io", private=False) == politeness_key("b.github.io", private=False)
    # seeding one puts its own hosts in scope, not its neighbours
    router = Router(CrawlConfig.from_dict({"crawl_id": "t", "seeds": ["https://a.github.io/"]}))
    assert router.route("https://docs.a.github.io/x").in_scope
    assert not router.route("https://b.github.io/x").in_scope
    assert not router.route("https://github.io/").in_scope


# (host, private, registered domain): publicsuffix.org's algorithm, None
# where there is none (crawld does not apply the default rule "*" to a
# top-level label the list does not have)
REGISTERED = [
    ("a.github.io", True, "a.github.io"),
    ("a.github.io", False, "github.io"),
    ("github.io", True, None),
    ("github.io", False, "github.io"),
    ("example.uk.com", True, "example.uk.com"),
    ("uk.com", True, None),
    ("WWW.Example.COM.", True, "example.com"),
    ("com", True, None),
    ("co.uk", False, None),
    ("c.mm", True, None),                 # *.mm: every second-level name is a suffix
    ("b.c.mm", True, "b.c.mm"),
    ("test.ck", True, None),              # *.ck ...
    ("www.ck", True, "www.ck"),           # ... except !www.ck
    ("a.b.test.ck", True, "b.test.ck"),
    ("www.xn--85x722f.xn--55qx5d.cn", True, "xn--85x722f.xn--55qx5d.cn"),
    ("xn--55qx5d.cn", True, None),
    ("127.0.0.1", True, None),
    ("[2001:db8::1]", True, None),
    ("localhost", True, None),
    ("wiki.corp", True, None),
    (".example.com", True, None),         # an empty label is no host name
    ("a..example.com", True, None),
]


@pytest.mark.parametrize("host, private, domain", REGISTERED)
def test_registered_domain(host, private, domain):
    assert registered_domain(host, private) == domain


@pytest.mark.parametrize("host", ["", "  ", ".", "[]"])
def test_registered_domain_rejects_empty_host(host):
    with pytest.raises(ValueError):
        registered_domain(host)


# Jump Consistent Hash -------------------------------------------------------

# Reference values of JumpConsistentHash(key, buckets) from the published
# C++ code (Lamping & Veach 2014), as used by ClickHouse's
# jumpConsistentHash test (tests/queries/0_stateless/00580_*) and go-jump.
JUMP_VECTORS = [
    (1, 1, 0),
    (42, 57, 43),
    (256, 1024, 520),
    (0xDEAD10CC, 1, 0),
    (0xDEAD10CC, 666, 361),
    (16045690984833335023, 255, 237),
]


@pytest.mark.parametrize("key, buckets, expected", JUMP_VECTORS)
def test_jump_hash_reference_values(key, buckets, expected):
    assert jump_hash(key, buckets) == expected


def test_jump_hash_range_and_determinism():
    for n in (1, 2, 3, 7, 8, 100, 4096):
        for k in range(0, 2 ** 64, 2 ** 64 // 997):
            b = jump_hash(k, n)
            assert 0 <= b < n
            assert jump_hash(k, n) == b


def test_jump_hash_one_bucket_is_zero():
    assert {jump_hash(k * 0x9E3779B97F4A7C15, 1) for k in range(1000)} == {0}


def test_jump_hash_key_is_taken_mod_2_64():
    for n in (5, 1000):
        assert jump_hash(-1, n) == jump_hash(2 ** 64 - 1, n)
        assert jump_hash(2 ** 64 + 42, n) == jump_hash(42, n)


@pytest.mark.parametrize("n", [0, -1])
def test_jump_hash_rejects_no_buckets(n):
    with pytest.raises(ValueError):
        jump_hash(1, n)


def test_key_hash_is_64_bit_and_stable():
    h = key_hash("python.org")
    assert 0 <= h < 2 ** 64
    assert h == key_hash("python.org")
    assert key_hash("python.org") != key_hash("python.com")


def _domains(n: int) -> list[str]:
    tlds = ["com", "org", "net", "de", "co.uk", "io", "fr", "com.au"]
    return [politeness_key(f"www.site-{i}.{tlds[i % len(tlds)]}") for i in range(n)]


DOMAINS = _domains(20_000)


def test_synthetic_domains_are_distinct_registered_domains():
    assert len(set(DOMAINS)) == 20_000
    assert DOMAINS[4] == "site-4.co.uk"


def test_spread_over_8_shards():
    counts = collections.Counter(shard_of(d, 8) for d in DOMAINS)
    assert set(counts) == set(range(8))
    mean = len(DOMAINS) / 8
    for shard, c in counts.items():
        assert abs(c - mean) <= 0.10 * mean, (shard, c, mean)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_minimal_movement(n):
    moved = 0
    for d in DOMAINS:
        before, after = shard_of(d, n), shard_of(d, n + 1)
        if before != after:
            moved += 1
            assert after == n, f"{d} moved {before} -> {after}, not to the new shard {n}"
    frac = moved / len(DOMAINS)
    assert 0.5 / (n + 1) <= frac <= 1.5 / (n + 1), frac


def test_shrinking_moves_only_the_last_shards_keys():
    for d in DOMAINS[:5000]:
        s9 = shard_of(d, 9)
        if s9 != 8:
            assert shard_of(d, 8) == s9


# tldextract stays offline ---------------------------------------------------

def test_extractor_configured_offline():
    ext = sharding._EXTRACT
    assert tuple(ext.suffix_list_urls) == ()
    assert ext.fallback_to_snapshot is True


def test_politeness_key_without_network_or_cache_in_fresh_process(tmp_path):
    # a fresh interpreter, so the suffix list is loaded under the block;
    # every way out to the network raises, and the cache directories point
    # into tmp_path so that any cache file written would be seen
    code = textwrap.dedent("""
        import socket

        attempts = []

        def refuse(*a, **k):
            attempts.append(a)  # recorded even if a caller swallows the error
            raise AssertionError("network access attempted")

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse

        from crawld.sharding import politeness_key
        assert politeness_key("docs.python.org") == "python.org"
        assert politeness_key("a.b.co.uk") == "b.co.uk"
        assert politeness_key("wiki.corp") == "wiki.corp"
        assert politeness_key("a.github.io") == "a.github.io"
        assert politeness_key("a.github.io", private=False) == "github.io"
        assert attempts == [], attempts
        print("ok")
    """)
    env = dict(os.environ)
    env.update({"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                "TLDEXTRACT_CACHE": str(tmp_path / "tldcache")})
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
    written = [str(f) for f in tmp_path.rglob("*") if f.is_file()]
    assert written == [], f"tldextract wrote cache files: {written}"


def test_politeness_key_in_process_with_sockets_blocked(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("network access attempted")

    import socket
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    # hosts not seen before in this process, so the lru_cache cannot answer
    assert politeness_key("never-seen-before.example.co.jp") == "example.co.jp"
    assert politeness_key("x.y.never-seen.gov.uk") == "never-seen.gov.uk"
    assert politeness_key("never-seen.blogspot.com") == "never-seen.blogspot.com"
    assert politeness_key("never-seen-2.blogspot.com", private=False) == "blogspot.com"

"""Politeness keys and shard assignment.

A URL's politeness key is its host's registered domain (the public suffix
and the label just below it), from tldextract's bundled Public Suffix List
snapshot; crawld never lets tldextract reach the network or write a cache
file.  Hosts with no registered domain (IP addresses, ``localhost``, intranet
names such as ``wiki.corp``, a public suffix itself) are their own politeness
key.

The PSL has an ICANN section (``com``, ``co.uk``) and a private one, where
companies list the domains under which others register their own sites
(``github.io``, ``blogspot.com``, ``uk.com``).  By default both count
(``private=True``), as in the PSL's own registrable-domain algorithm and
the browsers' notion of a site: ``a.github.io`` and ``b.github.io`` are two
sites of two owners, and seeding one does not put the other in scope.
``private=False`` reads the ICANN section alone (one ``github.io`` site).

The shard of a politeness key is Jump Consistent Hash (Lamping and Veach,
"A Fast, Minimal Memory, Consistent Hash Algorithm", 2014, arXiv:1406.2294)
of the key's *slot*, the top :data:`SLOT_BITS` (16) bits of its 64-bit
blake2b digest: growing ``num_shards`` from n to n+1 moves only about
1/(n+1) of the keys, all of them to the new shard.  Routing by slot (as
Redis Cluster routes keys by one of 16,384 hash slots) lets a structure
that keeps only a URL's slot, not its domain, still tell which shard each
entry belongs to under any shard count: the ``redis_set`` dedup backend
stores the slot in every fingerprint it keeps (:mod:`crawld.dedup`), so
``crawlctl rebalance`` moves exactly the visited state of the domains that
change shard.  The 65,536 slots split over n shards as evenly as
random keys would: a shard's share of the slots is within 1 % of 1/n for
n <= 16, 5 % for n = 64 (binomial spread, 1/sqrt(65536 / n)).

A crawl may pin known-large registered domains to chosen shards with its
``shard_overrides`` setting (see :func:`shard_for`); every other key keeps
its hashed shard, so pinning one domain moves nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from typing import Mapping

import tldextract

_MASK64 = (1 << 64) - 1

# suffix_list_urls=() and cache_dir=None: use the snapshot bundled with the
# package, never download a newer list, never write a cache file.
_EXTRACT = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)


def jump_hash(key: int, num_buckets: int) -> int:
    """Jump Consistent Hash: map a 64-bit ``key`` to ``[0, num_buckets)``.

    Raises:
        ValueError: if ``num_buckets`` < 1.
    """
    if num_buckets < 1:
        raise ValueError("num_buckets must be >= 1")
    b, j = -1, 0
    key &= _MASK64
    while j < num_buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def key_hash(politeness_key: str) -> int:
    """64-bit blake2b digest of a politeness key, as an int."""
    return int.from_bytes(hashlib.blake2b(politeness_key.encode("utf-8"), digest_size=8).digest(), "big")


#: bits of a politeness key's slot (65,536 slots)
SLOT_BITS = 16


@functools.lru_cache(maxsize=65536)
def key_slot(politeness_key: str) -> int:
    """The slot of a politeness key, in ``[0, 2**SLOT_BITS)``: the top
    :data:`SLOT_BITS` bits of :func:`key_hash`."""
    return key_hash(politeness_key) >> (64 - SLOT_BITS)


def shard_of_slot(slot: int, num_shards: int) -> int:
    """The shard (0-based) of every unpinned politeness key of ``slot``
    among ``num_shards``: Jump Consistent Hash of the slot.

    Raises:
        ValueError: if ``num_shards`` < 1.
    """
    return jump_hash(slot, num_shards)


def shard_of(politeness_key: str, num_shards: int) -> int:
    """The shard (0-based) that owns ``politeness_key`` among ``num_shards``
    (:func:`shard_of_slot` of its :func:`key_slot`)."""
    return jump_hash(key_slot(politeness_key), num_shards)


def shard_for(politeness_key: str, num_shards: int, overrides: Mapping[str, int] | None = None) -> int:
    """The shard that owns ``politeness_key``, honouring a crawl's overrides.

    ``overrides`` maps registered domains to pinned shards (the crawl setting
    ``shard_overrides``, validated by :mod:`crawld.config`); a key not in it
    gets :func:`shard_of`.  Every place that routes a URL to its shard (the
    :class:`crawld.scope.Router`: seeds, discovered links, redirects,
    sitemaps) and ``crawlctl shard-balance`` go through this function.

    Raises:
        ValueError: a pinned shard is not in ``[0, num_shards)``.
    """
    if overrides:
        pinned = overrides.get(politeness_key)
        if pinned is not None:
            if not 0 <= pinned < num_shards:
                raise ValueError(f"shard_overrides: shard {pinned} of {politeness_key!r} is not below "
                                 f"num_shards ({num_shards})")
            return pinned
    return shard_of(politeness_key, num_shards)


#: the default of ``private`` (see the module docstring)
PSL_PRIVATE_DEFAULT = True


def _normal_host(host: str) -> str:
    h = host.strip().rstrip(".").lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if not h:
        raise ValueError("empty host")
    return h


def _ip(h: str) -> str | None:
    if not (h[-1].isdigit() or ":" in h):
        return None  # neither IPv4 (ends in a digit) nor IPv6: skip the slow parse
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        return None


def _registered(h: str, private: bool) -> str | None:
    if h.startswith(".") or ".." in h:
        return None  # an empty label: no host name, no registered domain
    return _EXTRACT.extract_str(h, include_psl_private_domains=private).top_domain_under_public_suffix or None


def registered_domain(host: str, private: bool = PSL_PRIVATE_DEFAULT) -> str | None:
    """The registered (registrable) domain of a host name by the Public
    Suffix List (publicsuffix.org "Algorithm"), lower case, or None when it
    has none: an IP address, a public suffix itself (``co.uk``, and
    ``github.io`` when ``private``), a name whose top-level label the PSL
    does not list (``localhost``, ``wiki.corp``: crawld does not apply the
    PSL's default rule ``*`` to them), or a name with an empty label.

    ``private``: also read the PSL's private section (``a.github.io`` ->
    ``a.github.io``; without it, ``github.io``).  ``host`` is as in
    :func:`politeness_key`.  Not cached: the hot path is
    :func:`politeness_key`.

    Raises:
        ValueError: for an empty host.
    """
    h = _normal_host(host)
    return None if _ip(h) is not None else _registered(h, private)


@functools.lru_cache(maxsize=65536)
def politeness_key(host: str, private: bool = PSL_PRIVATE_DEFAULT) -> str:
    """The politeness key of a host name: its registered domain
    (:func:`registered_domain`), else the host itself.

    ``host`` is a lower-case host as found in a canonical URL (IDNA labels
    in their ``xn--`` form; IPv6 literals may keep their brackets).
    Examples: ``docs.python.org`` -> ``python.org``; ``a.b.co.uk`` ->
    ``b.co.uk``; ``a.github.io`` -> ``a.github.io`` (``github.io`` with
    ``private=False``); ``127.0.0.1`` -> ``127.0.0.1``; ``[::1]`` ->
    ``::1``; ``localhost`` -> ``localhost``; ``wiki.corp`` -> ``wiki.corp``
    (no public suffix: the host itself); ``co.uk`` -> ``co.uk``.

    ``private`` is a property of the crawl: every process routing its URLs
    must use the same value, or a domain's URLs would go to two shards.

    Raises:
        ValueError: for an empty host.
    """
    h = _normal_host(host)
    ip = _ip(h)
    if ip is not None:
        return ip
    return _registered(h, private) or h

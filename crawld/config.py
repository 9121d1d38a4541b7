"""Crawl configuration: every crawl setting, its unit, default and check.

A crawl's config is written to Redis once, by ``crawlctl seed`` or
``crawlctl run`` (key :func:`crawld.keys.crawl_config`), and every worker of
the fleet reads it from there, so machines cannot disagree on ``num_shards``
or on limits.  :data:`SETTINGS` is the single documented list; ``crawlctl
settings`` prints it.

Errors are :class:`ConfigError` whose message starts with the setting's name,
so that the CLI can print it as a one-line error.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from . import __version__
from .dedup import BACKENDS
from .dedup import check as check_dedup
from .keys import check_crawl_id
from .sharding import politeness_key
from .urls import valid_host

#: schema version of the config JSON stored in Redis.  2: URLs are sharded
#: by the 16-bit slot of their registered domain (crawld.sharding); a crawl
#: stored with schema 1 was sharded by the full 64-bit hash, so this crawld
#: would send its URLs to other shards than the ones holding their queues
#: and visited state: it is refused, not served.  3: a shard's keys are
#: hash-tagged by the shard number and a domain's politeness state is
#: shared by every crawl (crawld.keys); a schema-2 crawl keeps its queues
#: and politeness state under other keys: it is refused too.
CONFIG_VERSION = 3

#: query parameters removed during canonicalisation by default: the common
#: campaign-tracking parameters (Google Analytics ``utm_*``, Google Ads,
#: Facebook, Microsoft, Mailchimp, HubSpot).  ``*`` is a prefix wildcard.
DEFAULT_STRIP_PARAMS = (
    "utm_*", "gclid", "dclid", "gbraid", "wbraid", "fbclid", "msclkid",
    "mc_cid", "mc_eid", "_hsenc", "_hsmi",
)


class ConfigError(ValueError):
    """An invalid setting; ``str(err)`` is ``"<setting>: <what is wrong>"``."""


class OutdatedConfig(ConfigError):
    """A stored crawl config of an older schema this crawld cannot serve;
    the message names the crawl and what to do."""


@dataclass(frozen=True)
class Setting:
    """One documented crawl setting."""

    name: str
    unit: str
    doc: str
    check: Callable[[Any], Any]


def number_check(lo: float, hi: float, integer: bool = False) -> Callable[[Any], Any]:
    """A check accepting numbers (or numeric strings) in [lo, hi]."""
    def check(v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a number")
        if isinstance(v, str):
            v = v.strip()
            try:
                v = int(v) if integer else float(v)
            except ValueError:
                raise ValueError(f"must be {'an integer' if integer else 'a number'}, got {v!r}") from None
        if integer:
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if not isinstance(v, int):
                raise ValueError(f"must be an integer, got {v!r}")
        elif not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}, got {v:g}")
        return int(v) if integer else float(v)
    return check


def _string(max_len: int = 1000) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, str) or not v.strip() or len(v) > max_len:
            raise ValueError(f"must be a non-empty string of at most {max_len} characters")
        return v.strip()
    return check


def _string_list(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [p for p in v.replace(",", " ").split() if p]
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) and p for p in v):
        raise ValueError("must be a list of non-empty strings")
    return tuple(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v.strip().lower() in ("1", "true", "yes", "on")
    raise ValueError(f"must be true or false, got {v!r}")


def _choice(*choices: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, str) or v.strip() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {v!r}")
        return v.strip()
    return check


def _crawl_id(v: Any) -> str:
    return check_crawl_id(v)


def _header_value(v: Any) -> str:
    v = _string(300)(v)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError("must not contain control characters (CR, LF, ...)")
    return v


def _domain_list(v: Any) -> tuple[str, ...]:
    out = []
    for d in _string_list(v):
        d = d.strip().lower().rstrip(".")
        if not valid_host(d) or ":" in d:
            raise ValueError(f"{d!r} is not a domain name")
        out.append(d)
    return tuple(out)


def _shard_overrides(v: Any) -> tuple[tuple[str, int], ...]:
    """Registered domain -> pinned shard, as a JSON object (or its text, as
    given to ``--set``); normalised to sorted ``(domain, shard)`` pairs.
    Shards are checked against ``num_shards`` in :meth:`CrawlConfig.from_dict`."""
    if isinstance(v, str):
        text = v.strip()
        try:
            v = json.loads(text) if text else {}
        except ValueError:
            raise ValueError("must be a JSON object of registered domain -> shard, e.g. "
                             f"'{{\"example.com\": 3}}', got {text[:80]!r}") from None
    if isinstance(v, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in v):
        v = dict(v)
    if not isinstance(v, dict):
        raise ValueError("must be a JSON object of registered domain -> shard, e.g. {\"example.com\": 3}")
    out = {}
    for d, s in v.items():
        if not isinstance(d, str) or not d:
            raise ValueError(f"{d!r} is not a domain name")
        if d != d.lower() or d != d.strip():
            raise ValueError(f"{d!r} must be a lower-case registered domain (no spaces)")
        if not valid_host(d):
            raise ValueError(f"{d!r} is not a domain name")
        key = politeness_key(d)
        if key != d:
            raise ValueError(f"{d!r} is not a registered domain (use {key!r})")
        if isinstance(s, float) and s.is_integer():
            s = int(s)
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"shard of {d!r} must be an integer >= 0, got {s!r}")
        out[d] = s
    return tuple(sorted(out.items()))


def _family(v: Any) -> str:
    """A crawl family name: any printable text, empty meaning the default
    (the seeds' registered domains, see :func:`default_family`)."""
    if not isinstance(v, str) or len(v) > 1000:
        raise ValueError("must be a string of at most 1000 characters")
    v = v.strip()
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError("must not contain control characters")
    return v


def default_family(seeds: Any) -> str:
    """The default crawl family of ``seeds``: their registered domains
    (politeness keys, :func:`crawld.sharding.politeness_key`), sorted,
    deduplicated and joined by ``,``; for many domains (over 200
    characters) the first three, how many more, and a 64-bit blake2b digest
    of the whole list (``a.com,b.org,c.net +297 #1f2e...``), so that crawls
    of the same sites still compare.  Seeds that are not URLs are ignored."""
    from urllib.parse import urlsplit

    from .sharding import politeness_key

    domains = set()
    for seed in seeds or ():
        try:
            host = urlsplit(str(seed).strip()).hostname
        except ValueError:
            host = None
        if host:
            domains.add(politeness_key(host))
    joined = ",".join(sorted(domains))
    if len(joined) <= 200:
        return joined
    import hashlib

    digest = hashlib.blake2b(joined.encode("utf-8"), digest_size=8).hexdigest()
    return f"{','.join(sorted(domains)[:3])} +{len(domains) - 3} #{digest}"


def _utc_time(v: Any) -> str:
    """An ISO-8601 time, normalised to UTC ``YYYY-MM-DDTHH:MM:SSZ``."""
    if not isinstance(v, str):
        raise ValueError("must be an ISO-8601 time string")
    try:
        t = datetime.fromisoformat(v.strip())
    except ValueError:
        raise ValueError(f"must be an ISO-8601 time like 2026-11-29T19:30:00Z, got {v!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


#: every crawl setting, in documentation order.
SETTINGS: tuple[Setting, ...] = (
    Setting("crawl_id", "", "name of the crawl; namespaces its Redis keys and artifact", _crawl_id),
    Setting("seeds", "URLs", "start URLs; their registered domains are in scope", _string_list),
    Setting("num_shards", "shards", "number of frontier shards (consistent hash of registered domain)", number_check(1, 4096, True)),
    Setting("shard_overrides", "domain->shard", "JSON object pinning registered domains to shards, "
            "e.g. {\"example.com\": 3} (the others keep their hashed shard)", _shard_overrides),
    Setting("max_rps_per_host", "requests/s", "rate limit per registered domain (GCRA)", number_check(0.001, 10000)),
    Setting("burst", "requests", "GCRA bucket capacity: back-to-back requests allowed after idle (1-2)", number_check(1, 2)),
    Setting("max_inflight_per_host", "requests", "fetches in flight at once per registered domain", number_check(1, 1000, True)),
    Setting("max_depth", "links", "link distance from a seed beyond which URLs are not fetched", number_check(0, 10000, True)),
    Setting("allow_domains", "domains", "registered domains in scope besides the seeds' own", _domain_list),
    Setting("psl_private_domains", "", "treat the Public Suffix List's private section (github.io, blogspot.com, "
            "uk.com) as public suffixes, so a.github.io and b.github.io are separate sites for scope and "
            "politeness", _bool),
    Setting("strip_params", "names", "query parameters dropped from canonical URLs ('*' = prefix)", _string_list),
    Setting("user_agent", "", "User-Agent header sent on every request", _header_value),
    Setting("connect_timeout_s", "s", "TCP connect timeout per request", number_check(0.1, 600)),
    Setting("read_timeout_s", "s", "timeout between two reads of a response", number_check(0.1, 600)),
    Setting("fetch_deadline_s", "s", "total time allowed for one request, body included", number_check(0.1, 3600)),
    Setting("max_body_bytes", "bytes", "response bodies are cut at this size", number_check(1024, 1 << 31, True)),
    Setting("max_redirects", "hops", "longest redirect chain followed from one URL", number_check(0, 100, True)),
    Setting("visibility_timeout_s", "s", "a claim not acked or extended within this is reclaimed", number_check(1, 86400)),
    Setting("max_attempts", "attempts", "claims of one URL before it is dead-lettered", number_check(1, 100, True)),
    Setting("max_deferrals", "times", "times a URL may be put back without spending an attempt (429, 503, a "
            "connection that could not be made); later ones count as attempts", number_check(0, 10000, True)),
    Setting("backoff_base_s", "s", "first per-host backoff after a 5xx, 429 or connection error; doubles per failure", number_check(0, 3600)),
    Setting("backoff_max_s", "s", "ceiling of the per-host backoff (before jitter)", number_check(0, 86400)),
    Setting("host_max_failures", "failures", "failures in a row (5xx, connection errors, time-outs) after which a "
            "host is probed with one request at a time, still backing off", number_check(1, 1000, True)),
    Setting("host_give_up_s", "s", "a host failing in a row for this long (from its first failure) is given up for as "
            "long: its URLs are recorded as host_parked, not fetched (0 = never)", number_check(0, 86400 * 7)),
    Setting("max_retry_after_s", "s", "a Retry-After longer than this parks the host", number_check(0, 86400 * 7)),
    Setting("robots_ttl_s", "s", "how long a fetched robots.txt is trusted before it is fetched again", number_check(1, 86400 * 30)),
    Setting("robots_retry_s", "s", "an unreachable robots.txt answer (5xx, time-out, no connection) is trusted this "
            "long; the host's failure backoff spaces the next tries, host_give_up_s ends them", number_check(0.1, 86400)),
    Setting("honour_nofollow", "", "do not follow rel=nofollow links (they are recorded as skipped)", _bool),
    Setting("honour_robots_meta", "", "obey nofollow in <meta name=robots> and X-Robots-Tag", _bool),
    Setting("sitemaps", "", "seed the URLs of robots.txt Sitemap: lines and /sitemap.xml", _bool),
    Setting("max_pages_per_host", "pages", "URLs queued per host name at most; later ones are skipped (0 = no limit)", number_check(0, 1 << 40, True)),
    Setting("max_url_length", "characters", "longer URLs are skipped (traps)", number_check(64, 1 << 20, True)),
    Setting("max_query_variants", "URLs", "distinct queries per host and path at most (calendars, session ids; 0 = no limit)", number_check(0, 1 << 40, True)),
    Setting("max_path_repeats", "segments", "a path repeating one segment more than this is a loop and is skipped", number_check(1, 1000, True)),
    Setting("dedup", "", "visited-URL structure of each shard: redis_set (exact, compact intset buckets) or "
            "redis_bloom (Bloom filter, fixed memory; RedisBloom's BF.* when loaded, else a bitmap)", _choice(*BACKENDS)),
    Setting("expected_urls", "URLs", "URLs the crawl is expected to hold; sizes each shard's dedup structures "
            "(expected_urls / num_shards each)", number_check(1, 10 ** 11, True)),
    Setting("bloom_fp_rate", "share", "redis_bloom: false-positive rate at expected_urls (a false positive is a "
            "page not crawled)", number_check(1e-9, 0.5)),
    Setting("allow_loopback", "", "allow fetching loopback addresses (127.0.0.0/8, ::1, localhost)", _bool),
    Setting("allow_private_networks", "", "allow fetching private addresses (RFC 1918, RFC 4193, CGNAT)", _bool),
    Setting("memory_high_watermark", "share", "share of Redis maxmemory above which workers stop expanding the "
            "frontier: new links are recorded as skipped (memory_backpressure) instead of queued; 0 = off "
            "(also off when Redis has no maxmemory)", number_check(0, 1)),
    Setting("output", "path", "where parts and the artifact are written: a directory, or s3://bucket/prefix", _string(4096)),
    Setting("created_at", "UTC ISO-8601", "when the crawl was created; dates the artifact path", _utc_time),
    Setting("family", "", "crawls of the same family are compared by 'crawlctl verify' (row count vs the "
            "previous one); empty = the seeds' registered domains, sorted, joined by ','", _family),
)

_SETTING_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class CrawlConfig:
    """The immutable settings of one crawl, shared by the whole fleet.

    Build it with :meth:`from_dict` (validating) rather than the constructor.
    Units are in :data:`SETTINGS`; times are seconds, sizes bytes, rates
    requests/s per registered domain.
    """

    crawl_id: str
    seeds: tuple[str, ...] = ()
    num_shards: int = 4
    shard_overrides: tuple[tuple[str, int], ...] = ()
    max_rps_per_host: float = 2.0
    burst: float = 1.0
    max_inflight_per_host: int = 2
    max_depth: int = 20
    allow_domains: tuple[str, ...] = ()
    psl_private_domains: bool = True
    strip_params: tuple[str, ...] = DEFAULT_STRIP_PARAMS
    user_agent: str = f"crawld/{__version__}"
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0
    fetch_deadline_s: float = 60.0
    max_body_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 10
    visibility_timeout_s: float = 120.0
    max_attempts: int = 3
    max_deferrals: int = 50
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    host_max_failures: int = 10
    host_give_up_s: float = 1800.0
    max_retry_after_s: float = 3600.0
    robots_ttl_s: float = 86400.0
    robots_retry_s: float = 1.0
    honour_nofollow: bool = True
    honour_robots_meta: bool = True
    sitemaps: bool = False
    max_pages_per_host: int = 50_000
    max_url_length: int = 2048
    max_query_variants: int = 1000
    max_path_repeats: int = 3
    dedup: str = "redis_set"
    expected_urls: int = 1_000_000
    bloom_fp_rate: float = 0.01
    allow_loopback: bool = False
    allow_private_networks: bool = False
    memory_high_watermark: float = 0.85
    output: str = "crawl-output"
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    family: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CrawlConfig":
        """Validate ``data`` (unknown keys rejected, missing keys defaulted).

        Raises:
            ConfigError: naming the first invalid or unknown setting.
        """
        if not isinstance(data, dict):
            raise ConfigError("config: must be a JSON object")
        values: dict[str, Any] = {}
        for name, raw in data.items():
            if name == "version":
                continue
            setting = _SETTING_BY_NAME.get(name)
            if setting is None:
                raise ConfigError(f"{name}: unknown setting")
            try:
                values[name] = setting.check(raw)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        if "crawl_id" not in values:
            raise ConfigError("crawl_id: missing")
        cfg = cls(**values)
        if cfg.fetch_deadline_s < cfg.read_timeout_s:
            raise ConfigError("fetch_deadline_s: must be at least read_timeout_s")
        try:
            check_dedup(cfg)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for domain, shard in cfg.shard_overrides:
            if shard >= cfg.num_shards:
                raise ConfigError(f"shard_overrides: shard {shard} of {domain!r} must be below num_shards "
                                  f"({cfg.num_shards})")
        return cfg

    def replace(self, **changes: Any) -> "CrawlConfig":
        """A validated copy with ``changes`` applied."""
        data = self.to_dict()
        data.update(changes)
        return CrawlConfig.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        d = dataclasses.asdict(self)
        d["shard_overrides"] = dict(self.shard_overrides)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @property
    def shard_override_map(self) -> dict[str, int]:
        """``shard_overrides`` as a dict (registered domain -> shard)."""
        return dict(self.shard_overrides)

    def to_json(self) -> str:
        """The JSON stored in Redis, with a schema version."""
        return json.dumps({"version": CONFIG_VERSION, **self.to_dict()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "CrawlConfig":
        """Parse and validate the stored JSON.

        Raises:
            ConfigError: invalid JSON, a newer schema version or a bad setting.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"config: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError("config: must be a JSON object")
        version = data.get("version", CONFIG_VERSION)
        if version in (1, 2):
            cid = data.get("crawl_id", "?")
            how = "sharded URLs otherwise" if version == 1 else "kept its queues and politeness state under other keys"
            raise OutdatedConfig(f"version: crawl {cid} was created by an older crawld (config schema {version}) that "
                                 f"{how}; finish it with that crawld, or delete it (crawlctl purge "
                                 f"--crawl-id {cid} --force)")
        if version != CONFIG_VERSION:
            raise ConfigError(f"version: config schema {version} is not supported by crawld {__version__}")
        return cls.from_dict(data)

    @property
    def family_name(self) -> str:
        """``family``, or when empty the default of the seeds
        (:func:`default_family`)."""
        return self.family or default_family(self.seeds)

    @property
    def emission_interval_ms(self) -> float:
        """GCRA emission interval T = 1000 / max_rps_per_host, in ms."""
        return 1000.0 / self.max_rps_per_host

    @property
    def burst_tolerance_ms(self) -> float:
        """GCRA tolerance tau = (burst - 1) * T, in ms."""
        return (self.burst - 1.0) * self.emission_interval_ms


def settings_table() -> str:
    """The documented settings as aligned text (for ``crawlctl settings``)."""
    defaults = CrawlConfig(crawl_id="x").to_dict()
    rows = [("setting", "default", "unit", "meaning")]
    for s in SETTINGS:
        default = defaults.get(s.name)
        if s.name in ("crawl_id", "seeds"):
            default = "(required)"
        elif s.name == "created_at":
            default = "(now)"
        elif s.name == "family":
            default = "(seed domains)"
        elif isinstance(default, list):
            default = ",".join(default) or "(none)"
        elif isinstance(default, dict):
            default = json.dumps(default, separators=(",", ":")) if default else "(none)"
        elif isinstance(default, bool):
            default = str(default).lower()
        rows.append((s.name, str(default), s.unit, s.doc))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows)

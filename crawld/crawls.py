"""Creating and seeding crawls in Redis.

A crawl exists once its config is stored (``SET NX``, so two operators
cannot create the same crawl with different settings) and its id is in the
crawl registry.  Seeds are pushed like any discovered link: canonicalised,
routed to the shard of their registered domain, deduplicated.
"""

from __future__ import annotations

import dataclasses
import time

import redis

from . import keys
from .config import ConfigError, CrawlConfig, OutdatedConfig
from .frontier import Entry, Frontier, PushItem
from .output import DEAD_LETTER_PART, write_dead_letter_part
from .rows import dead_letter_row
from .scope import Router, scope_keys, variant_key
from .sharding import politeness_key, shard_for
from .urls import BadURL, canonicalize, fingerprint, resolve, without_userinfo


#: seeds (and scope domains) written per Redis call
SEED_BATCH = 1000


class NoSuchCrawl(ConfigError):
    """No crawl has the given id in this Redis (``crawlctl`` exits 66)."""


class CrawlExists(RuntimeError):
    """A crawl with this id already has a config in Redis."""


def check_seeds(seeds: list[str]) -> list[str]:
    """Validate seed URLs; returns them stripped.

    Raises:
        BadURL: naming the first seed that is not an absolute http(s) URL.
    """
    out = []
    for s in seeds:
        try:
            canonicalize(s)
        except BadURL as exc:
            raise BadURL(f"seed {s!r}: {exc}") from None
        out.append(s.strip())
    if not out:
        raise BadURL("no seed URL given")
    return out


class SharedDomainConflict(ConfigError):
    """Another live crawl routes a domain of this crawl's scope to another
    shard number: the two could not share the domain's politeness state
    (crawld.keys), so this crawl is refused; the message names the crawl
    and what to do."""


def scope_domains(config: CrawlConfig, seeds: list[str] | tuple[str, ...] = (),
                  router: Router | None = None) -> set[str]:
    """The registered domains ``seeds`` (and ``config``'s own seeds and
    ``allow_domains``) put in scope; ``router`` (default a new one) may be
    shared with the caller's other uses of the seeds (its caches).

    Raises:
        BadURL: a seed is not a crawlable URL.
    """
    out = set(scope_keys(config))
    router = router or Router(config)
    for u in seeds:
        canon = router.canonical(u)
        if canon is None:
            raise BadURL(f"seed {u!r}: not a crawlable URL")
        out.add(router.route(canon).pkey)
    return out


def load_scope(client: redis.Redis, crawl_id: str) -> set[str]:
    """The registered domains recorded in a crawl's scope set."""
    return {m.decode() if isinstance(m, bytes) else m for m in client.smembers(keys.crawl_scope(crawl_id))}


def _idle(client: redis.Redis, config: CrawlConfig) -> bool:
    frontier = Frontier(client, config)
    return all(frontier.snapshot(s).idle for s in range(config.num_shards))


def record_scope(client: redis.Redis, config: CrawlConfig, domains: set[str], *, lock_ttl_s: float = 30.0,
                 then=None) -> int:
    """Add ``domains`` to the crawl's scope set, once no other live crawl
    routes one of them to another shard number; returns how many were new.

    Every crawl keeps a domain's queues on the shard number its own routing
    gives (``num_shards``, ``shard_overrides``) and shares the domain's
    politeness state on that shard with the other crawls; two crawls that
    route a shared domain differently would each have their own, so the
    domain would get both crawls' rates.  A crawl with nothing queued or
    claimed does not count (it fetches nothing); a cancelled one neither.
    The check and the write are serialised by :data:`crawld.keys.SCOPE_LOCK`;
    ``then()``, if given, runs under it between the two (creating the crawl).

    Raises:
        SharedDomainConflict: naming the other crawl, the domain and both
            routings.
    """
    lock = keys.SCOPE_LOCK
    token = f"{config.crawl_id}:{id(domains)}:{time.time()}"
    deadline = time.monotonic() + lock_ttl_s
    while not client.set(lock, token, nx=True, px=int(lock_ttl_s * 1000)):
        if time.monotonic() >= deadline:
            break  # a holder that died: its TTL is about to end anyway
        time.sleep(0.05)
    try:
        check_shared_routing(client, config, domains)
        if then is not None:
            then()
        added, ds = 0, sorted(domains)
        for i in range(0, len(ds), SEED_BATCH):
            added += client.sadd(keys.crawl_scope(config.crawl_id), *ds[i:i + SEED_BATCH])
        return int(added)
    finally:
        if client.get(lock) == token.encode():
            client.delete(lock)


def check_shared_routing(client: redis.Redis, config: CrawlConfig, domains: set[str]) -> None:
    """Refuse ``config`` if another live crawl routes one of ``domains`` to
    another shard number (see :func:`record_scope`).

    Raises:
        SharedDomainConflict: naming the other crawl and the domain.
    """
    mine = config.shard_override_map
    for raw in sorted(client.smembers(keys.CRAWLS)):
        other_id = raw.decode() if isinstance(raw, bytes) else raw
        if other_id == config.crawl_id:
            continue
        if (client.get(keys.crawl_state(other_id)) or b"") == b"cancelled":
            continue
        try:
            other = load_crawl(client, other_id)
        except ConfigError:
            continue
        theirs_scope = load_scope(client, other_id) | set(scope_keys(other))
        if other.psl_private_domains != config.psl_private_domains:
            # one of them sees a.github.io as a site, the other github.io:
            # their politeness keys differ for the same servers
            overlap = {politeness_key(d, other.psl_private_domains) for d in domains} & theirs_scope
            overlap |= {politeness_key(d, config.psl_private_domains) for d in theirs_scope} & domains
            if overlap and not _idle(client, other):
                d = sorted(overlap)[0]
                raise SharedDomainConflict(
                    f"psl_private_domains: crawl {other_id} is crawling {d} with psl_private_domains="
                    f"{str(other.psl_private_domains).lower()}; crawls of the same sites must agree on it (their "
                    f"registered domains, the politeness keys, differ otherwise), or wait until crawl {other_id} "
                    "is finished or cancelled")
            continue
        if other.num_shards == config.num_shards and other.shard_overrides == config.shard_overrides:
            continue  # the same routing for every domain
        shared = domains & theirs_scope
        theirs = other.shard_override_map
        clash = [d for d in sorted(shared)
                 if shard_for(d, config.num_shards, mine) != shard_for(d, other.num_shards, theirs)]
        if clash and not _idle(client, other):
            d = clash[0]
            more = f" (and {len(clash) - 1} more domain(s))" if len(clash) > 1 else ""
            raise SharedDomainConflict(
                f"num_shards: crawl {other_id} is crawling {d}{more} on shard "
                f"{shard_for(d, other.num_shards, theirs)} of {other.num_shards}, this crawl would put it on "
                f"shard {shard_for(d, config.num_shards, mine)} of {config.num_shards}; a domain's politeness "
                f"state is shared by every crawl on one shard number, so use --shards {other.num_shards} "
                f"(and the same shard_overrides), or wait until crawl {other_id} is finished or cancelled")


def read_seeds_file(name: str) -> list[str]:
    """Seed URLs from a text file (``-``: standard input): one a line,
    blank lines and lines starting with ``#`` skipped.

    Raises:
        OSError: the file cannot be read.
        BadURL: naming the file, line and the first seed that is not a URL.
    """
    import sys

    stream = sys.stdin if name == "-" else open(name, encoding="utf-8", errors="replace")
    out = []
    try:
        for n, line in enumerate(stream, 1):
            u = line.strip()
            if not u or u.startswith("#"):
                continue
            try:
                canonicalize(u)
            except BadURL as exc:
                raise BadURL(f"{'stdin' if name == '-' else name}:{n}: seed {u[:200]!r}: {exc}") from None
            out.append(u)
    finally:
        if stream is not sys.stdin:
            stream.close()
    return out


def create_crawl(client: redis.Redis, config: CrawlConfig, seeds: list[str] | tuple[str, ...] = (),
                 router: Router | None = None) -> None:
    """Store ``config``, record its scope (its own seeds', ``allow_domains``
    and those of ``seeds``: :func:`record_scope`) and register the crawl.

    Storing the same settings again (``created_at`` aside) is a no-op.

    Raises:
        CrawlExists: the crawl id is taken by a crawl with other settings.
        SharedDomainConflict: see :func:`record_scope`.
        BadURL: a seed is not a crawlable URL.
    """
    record_scope(client, config, scope_domains(config, seeds, router), then=lambda: _store_config(client, config))


def _store_config(client: redis.Redis, config: CrawlConfig) -> None:
    key = keys.crawl_config(config.crawl_id)
    if not client.set(key, config.to_json(), nx=True):
        existing = client.get(key)
        old = CrawlConfig.from_json(existing).replace(created_at=config.created_at) if existing is not None else None
        if old == config:
            return  # the same crawl again (re-running a seed command is harmless)
        differ = [f.name for f in dataclasses.fields(CrawlConfig)
                  if old is not None and getattr(old, f.name) != getattr(config, f.name)]
        raise CrawlExists(f"crawl_id: crawl {config.crawl_id!r} already exists in Redis with other settings"
                          + (f" ({', '.join(differ)} differ)" if differ else "")
                          + "; pick another id, or seed it with the same settings")
    client.sadd(keys.CRAWLS, config.crawl_id)


def load_crawl(client: redis.Redis, crawl_id: str) -> CrawlConfig:
    """The stored config of ``crawl_id``.

    Raises:
        NoSuchCrawl: no crawl has that id in this Redis.
        ConfigError: an invalid stored config (the message names the crawl).
    """
    raw = client.get(keys.crawl_config(keys.check_crawl_id(crawl_id)))
    if raw is None:
        raise NoSuchCrawl(f"crawl_id: no crawl {crawl_id!r} in this Redis ('crawlctl list' shows its crawls)")
    try:
        return CrawlConfig.from_json(raw)
    except OutdatedConfig:
        raise  # it names the crawl and what to do
    except ConfigError as exc:
        raise ConfigError(f"crawl {crawl_id}: its stored {exc} ('crawlctl purge --crawl-id {crawl_id} --force' "
                          "deletes what is left of it)") from None


def seed(client: redis.Redis, config: CrawlConfig, urls: list[str], router: Router | None = None) -> int:
    """Push ``urls`` at depth 0, their registered domains recorded in the
    crawl's scope first (:func:`record_scope`); returns how many were new.
    ``router`` as for :func:`scope_domains`.

    Raises:
        BadURL, SharedDomainConflict.
    """
    frontier = Frontier(client, config)
    router = router or Router(config, max_cache=max(200_000, 2 * len(urls)))
    record_scope(client, config, scope_domains(config, urls, router))
    by_shard: dict[int, list] = {}
    for u in urls:
        canon = router.canonical(u)
        if canon is None:
            raise BadURL(f"seed {u!r}: not a crawlable URL")
        r = router.route(canon)
        fp = fingerprint(canon)
        # the seed as it is fetched: the WHATWG serialisation, without
        # credentials or fragment (crawld.urls.resolve_link)
        payload = Entry(resolve(None, u) or without_userinfo(u), canon, 0).to_payload()
        by_shard.setdefault(r.shard, []).append(PushItem(fp, r.pkey, r.host, variant_key(canon), "", payload))
    # in batches: one script call runs alone on its Redis
    return sum(frontier.push(s, items[i:i + SEED_BATCH])[0]
               for s, items in by_shard.items() for i in range(0, len(items), SEED_BATCH))


def export_dead_letters(client: redis.Redis, config: CrawlConfig) -> int:
    """Write every shard's dead-lettered entries as rows (outcome
    ``dead_letter``) into the crawl's parts, so the artifact accounts for
    them.  Idempotent.  Returns the number of dead letters.

    With an ``s3://`` output each shard's dead-letter part is written to a
    temporary directory and uploaded (replacing the stored one; deleted when
    there are none).  Raises :class:`crawld.storage.StorageError` (an
    ``OSError``) when that fails."""
    from .storage import is_remote

    if is_remote(config.output):
        return _export_dead_letters_remote(client, config)
    frontier = Frontier(client, config)
    total = 0
    for shard in range(config.num_shards):
        rows = [dead_letter_row(config.crawl_id, shard, d) for d in frontier.dead_letters(shard)]
        write_dead_letter_part(config.output, config.crawl_id, shard, rows)
        total += len(rows)
    return total


def _export_dead_letters_remote(client: redis.Redis, config: CrawlConfig) -> int:
    import tempfile

    from .storage import list_remote_parts, open_storage, part_key

    frontier = Frontier(client, config)
    storage = open_storage(config.output)
    stored = {o.key for o in list_remote_parts(storage, config.crawl_id) if o.key.endswith(DEAD_LETTER_PART)}
    total = 0
    with tempfile.TemporaryDirectory(prefix="crawld-dead-letters-") as tmp:
        for shard in range(config.num_shards):
            rows = [dead_letter_row(config.crawl_id, shard, d) for d in frontier.dead_letters(shard)]
            path = write_dead_letter_part(tmp, config.crawl_id, shard, rows)
            if path is not None:
                storage.upload(path, part_key(tmp, path))
            elif f"parts/{config.crawl_id}/shard-{shard:04d}/{DEAD_LETTER_PART}" in stored:
                storage.delete(f"parts/{config.crawl_id}/shard-{shard:04d}/{DEAD_LETTER_PART}")
            total += len(rows)
    return total

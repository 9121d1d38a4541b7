"""Creating and seeding crawls in Redis.

A crawl exists once its config is stored (``SET NX``, so two operators
cannot create the same crawl with different settings) and its id is in the
crawl registry.  Seeds are pushed like any discovered link: canonicalised,
routed to the shard of their registered domain, deduplicated.
"""

from __future__ import annotations

import dataclasses

import redis

from . import keys
from .config import ConfigError, CrawlConfig, OutdatedConfig
from .frontier import Entry, Frontier, PushItem
from .output import DEAD_LETTER_PART, write_dead_letter_part
from .rows import dead_letter_row
from .scope import Router, variant_key
from .urls import BadURL, canonicalize, fingerprint, resolve, without_userinfo


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


def create_crawl(client: redis.Redis, config: CrawlConfig) -> None:
    """Store ``config`` and register the crawl.

    Storing the same settings again (``created_at`` aside) is a no-op.

    Raises:
        CrawlExists: the crawl id is taken by a crawl with other settings.
    """
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


def seed(client: redis.Redis, config: CrawlConfig, urls: list[str]) -> int:
    """Push ``urls`` at depth 0; returns how many were new."""
    frontier = Frontier(client, config)
    router = Router(config)
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
    return sum(frontier.push(s, items)[0] for s, items in by_shard.items())


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

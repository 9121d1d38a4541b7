"""Connecting to Redis and checking that it is fit to hold a frontier.

``REDIS_URL`` may be ``redis://[user:password@]host:port/db`` or
``rediss://`` (TLS; ``ssl_ca_certs`` and friends as URL query parameters,
as redis-py accepts them).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import redis

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class RedisUnfit(RuntimeError):
    """Redis is unreachable, refuses us, or is configured unsafely.
    ``str(err)`` is a one-line explanation for the operator."""


def redis_url(explicit: str | None = None) -> str | None:
    """The Redis URL to use: ``explicit``, else ``$REDIS_URL``, else None."""
    return explicit or os.environ.get("REDIS_URL") or None


def connect(url: str, max_connections: int = 64) -> redis.Redis:
    """A client for ``url`` returning bytes, with a bounded blocking pool.

    Raises:
        RedisUnfit: the URL is malformed.
    """
    try:
        pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=30,
            socket_connect_timeout=5, socket_timeout=30, health_check_interval=30,
            retry_on_timeout=False)
    except ValueError as exc:
        raise RedisUnfit(f"REDIS_URL {redact(url)!s} is not valid: {exc}") from None
    return redis.Redis(connection_pool=pool)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    except ValueError:
        return "<unparseable REDIS_URL>"


def check(client: redis.Redis, url: str = "") -> dict:
    """Check that Redis answers, lets this user run Lua scripts, and will
    never evict frontier keys.

    Returns the ``INFO server`` and ``INFO memory`` fields.

    Raises:
        RedisUnfit: unreachable, authentication failed, scripting not
            permitted (ACL), or
            ``maxmemory-policy`` is not ``noeviction`` (an evicting Redis
            would silently lose queued URLs and visited state).
    """
    where = redact(url) if url else "Redis"
    try:
        info = client.info("server")
        info.update(client.info("memory"))
    except redis.AuthenticationError as exc:
        raise RedisUnfit(f"{where}: authentication failed ({exc})") from None
    except redis.ResponseError as exc:
        raise RedisUnfit(f"{where}: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RedisUnfit(f"cannot reach Redis at {where}: {msg}") from None
    try:
        # the frontier is Lua scripts run by SHA: a user without @scripting
        # would leave every worker crash-looping
        sha = client.script_load("return 1")
        client.evalsha(sha, 0)
    except redis.exceptions.NoPermissionError as exc:
        raise RedisUnfit(f"{where}: this user may not run the frontier's Lua scripts "
                         f"(needs SCRIPT LOAD and EVALSHA, ACL category @scripting): {exc}") from None
    except redis.ResponseError as exc:
        raise RedisUnfit(f"{where}: cannot run the frontier's Lua scripts: {exc}") from None
    policy = info.get("maxmemory_policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    if policy != "noeviction":
        raise RedisUnfit(
            f"{where} has maxmemory-policy {policy!r}; crawld needs 'noeviction' "
            "(an evicting Redis silently loses queued URLs). Set it with "
            "'CONFIG SET maxmemory-policy noeviction' and in redis.conf")
    return info

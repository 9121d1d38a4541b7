"""Connecting to Redis and checking that it is fit to hold a frontier.

``REDIS_URL`` may be ``redis://[user:password@]host:port/db`` or
``rediss://`` (TLS; ``ssl_ca_certs`` and friends as URL query parameters,
as redis-py accepts them).

It may also name any node of a Redis Cluster: :func:`connect` asks the
node (``INFO cluster``) and, when ``cluster_enabled:1``, returns a
``redis.cluster.RedisCluster`` built from the same URL (same credentials,
TLS, timeouts; database 0 only), which discovers the other nodes and routes
every command and script by the hash slot of its keys.  Every crawld key is
hash-tagged (:mod:`crawld.keys`), so each script touches one slot; the few
places that differ on a cluster ask :func:`is_cluster`.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

DEFAULT_URL = "redis://127.0.0.1:6379/0"


#: what a Redis call may raise: redis-py's cluster client raises
#: RedisClusterException (SlotNotCoveredError, ...) outside RedisError, e.g.
#: during a failover; long-running loops catch both and retry.
ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, RedisClusterException)


class RedisUnfit(RuntimeError):
    """Redis is unreachable, refuses us, or is configured unsafely.
    ``str(err)`` is a one-line explanation for the operator."""


def redis_url(explicit: str | None = None) -> str | None:
    """The Redis URL to use: ``explicit``, else ``$REDIS_URL``, else None."""
    return explicit or os.environ.get("REDIS_URL") or None


#: connection settings shared by single-Redis and cluster clients
_CONN_KW = dict(socket_connect_timeout=5, socket_timeout=30, health_check_interval=30, retry_on_timeout=False)


def connect(url: str, max_connections: int = 64) -> "redis.Redis | RedisCluster":
    """A client for ``url`` returning bytes, with a bounded blocking pool
    (per node on a cluster).

    When the server answers ``INFO cluster`` with ``cluster_enabled:1``,
    the client is a ``RedisCluster`` seeded with that node.  When it does
    not answer at all, a single-Redis client is returned and
    :func:`check` reports why.

    Raises:
        RedisUnfit: the URL is malformed, or names a cluster that cannot
            be used (a database other than 0, nodes unreachable).
    """
    try:
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=30, **_CONN_KW)
    except ValueError as exc:
        raise RedisUnfit(f"REDIS_URL {redact(url)!s} is not valid: {exc}") from None
    client = redis.Redis(connection_pool=pool)
    try:
        clustered = int(client.info("cluster").get("cluster_enabled", 0)) == 1
    except redis.ResponseError as exc:
        if "cluster mode" in str(exc):  # SELECT n on a cluster node
            raise RedisUnfit(f"{redact(url)} is a Redis Cluster node: a cluster has only database 0; "
                             "drop the /n from REDIS_URL") from None
        return client
    except (redis.RedisError, OSError, ValueError):
        return client  # unreachable, refused, not allowed: check() says why
    if not clustered:
        return client
    client.close()
    try:
        return RedisCluster.from_url(url, max_connections=max_connections, timeout=30,
                                     connection_pool_class=redis.BlockingConnectionPool, **_CONN_KW)
    except (redis.RedisError, RedisClusterException, OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RedisUnfit(f"{redact(url)} is a Redis Cluster node, but the cluster cannot be used: {msg}") from None


def is_cluster(client) -> bool:
    """True when ``client`` is a Redis Cluster client (or one of its pipelines)."""
    return isinstance(client, RedisCluster)


def primaries_info(client, section: str) -> dict[str, dict]:
    """``INFO section`` of every master: node name -> fields (one entry,
    named "redis", on a single Redis)."""
    if is_cluster(client):
        return client.info(section, target_nodes=RedisCluster.PRIMARIES)
    return {"redis": client.info(section)}


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
    never evict frontier keys; on a cluster, that every slot is served
    (``cluster_state:ok``) and that every master is ``noeviction``.

    Returns the ``INFO server`` and ``INFO memory`` fields (of the first
    master on a cluster, plus ``cluster_masters``: how many).

    Raises:
        RedisUnfit: unreachable, authentication failed, scripting not
            permitted (ACL), or
            ``maxmemory-policy`` is not ``noeviction`` (an evicting Redis
            would silently lose queued URLs and visited state).
    """
    where = redact(url) if url else "Redis"
    try:
        nodes = primaries_info(client, "server")
        for name, mem in primaries_info(client, "memory").items():
            nodes.setdefault(name, {}).update(mem)
        info = dict(next(iter(nodes.values())))
        if is_cluster(client):
            info["cluster_masters"] = len(nodes)
            state = client.cluster_info().get("cluster_state")
            if state != "ok":
                raise RedisUnfit(f"Redis Cluster at {where} is not serving every slot (cluster_state:{state}); "
                                 "see 'redis-cli cluster info'")
    except redis.AuthenticationError as exc:
        raise RedisUnfit(f"{where}: authentication failed ({exc})") from None
    except redis.ResponseError as exc:
        raise RedisUnfit(f"{where}: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RedisUnfit(f"cannot reach Redis at {where}: {msg}") from None
    except redis.RedisError as exc:  # e.g. an HTTP server at that port: InvalidResponse
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RedisUnfit(f"{where} does not answer as Redis: {msg}") from None
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
    for name, fields in nodes.items():
        policy = fields.get("maxmemory_policy")
        if isinstance(policy, bytes):
            policy = policy.decode()
        if policy != "noeviction":
            node = f"{where} (cluster master {name})" if is_cluster(client) else where
            raise RedisUnfit(
                f"{node} has maxmemory-policy {policy!r}; crawld needs 'noeviction' "
                "(an evicting Redis silently loses queued URLs). Set it with "
                "'CONFIG SET maxmemory-policy noeviction' and in redis.conf"
                + (" on every master" if is_cluster(client) else ""))
    return info

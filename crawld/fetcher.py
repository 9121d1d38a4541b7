"""HTTP fetching with requests: one request, no automatic redirects.

Each fetch has a connect timeout, a read timeout (between two reads), a
total deadline (gevent.Timeout around the whole exchange, body included) and
a body size cap.  Redirects are never followed here: the worker turns a 3xx
into a new frontier entry, scheduled, deduplicated and rate-limited on the
shard of its own host.

Call from a gevent-patched process (crawld.worker patches at start).
"""

from __future__ import annotations

import http.client
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

import gevent
import requests
import urllib3

from .config import CrawlConfig
from .errors import exception_chain
from .netpolicy import AddressPolicy, BlockedAddress, guard_session, is_blocked_address
from .urls import location_reference

_CHUNK = 64 * 1024


class FetchDeadline(Exception):
    """The total fetch deadline passed (raised by gevent.Timeout)."""


@dataclass
class FetchResult:
    """The outcome of one HTTP request.

    ``status`` is None when no response arrived; then ``error`` says why and
    ``error_kind`` is one of ``connect``, ``timeout``, ``deadline``,
    ``protocol``, ``invalid_url``, ``blocked`` (address policy), ``other``;
    ``retryable`` tells whether another attempt may succeed; ``unsent``
    that the request never left (no connection could be made: refused,
    unreachable, connect time-out, name not resolved).  ``started_at`` is
    Unix time (s) when the request began; ``elapsed_ms`` runs until the body was read.  ``body`` is
    at most ``max_body_bytes`` (``truncated`` when cut), after
    Content-Encoding decoding.

    ``headers`` maps lower-case names to values, the values of a repeated
    field joined with ", " (requests' reading, RFC 9110 section 5.3);
    ``x_robots_tag`` keeps the X-Robots-Tag field lines one by one, as
    received: joining them changes what they say
    (:func:`crawld.links.robots_directives`).
    """

    url: str
    started_at: float
    elapsed_ms: float = 0.0
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    truncated: bool = False
    error: str | None = None
    error_kind: str | None = None
    retryable: bool = False
    unsent: bool = False
    x_robots_tag: list[str] = field(default_factory=list)


def make_session(config: CrawlConfig, concurrency: int, proxy: str | None = None) -> requests.Session:
    """A pooled session for one worker.

    ``proxy`` (``http://host:port``) is used for http and https; without it
    requests reads the standard HTTP_PROXY/HTTPS_PROXY/NO_PROXY variables.
    Direct connections are checked against the crawl's address policy
    (:mod:`crawld.netpolicy`) at connect time.
    """
    s = requests.Session()
    pool = dict(pool_connections=256, pool_maxsize=max(concurrency, 4), max_retries=0)
    guard_session(s, AddressPolicy(config.allow_loopback, config.allow_private_networks), **pool)
    s.headers.update({
        "User-Agent": config.user_agent,
        "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8",
    })
    if proxy:
        s.proxies.update({"http": proxy, "https": proxy})
    return s


def _classify(exc: BaseException) -> tuple[str, bool]:
    """``(error kind, retryable)`` of a fetch exception, from what happened
    underneath requests' wrappers."""
    chain = list(exception_chain(exc))
    if any(isinstance(e, BlockedAddress) for e in chain):
        return "blocked", False
    if isinstance(exc, (FetchDeadline, gevent.Timeout)):
        return "deadline", True
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.InvalidSchema,
                        requests.exceptions.MissingSchema, requests.exceptions.InvalidHeader,
                        urllib3.exceptions.LocationParseError, UnicodeError)):
        return "invalid_url", False
    for e in chain:
        if isinstance(e, (requests.exceptions.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError,
                          requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError,
                          socket.timeout)):
            return "timeout", True
    for e in chain:
        # the server answered, but not in HTTP: bad status line, header
        # lines too long or too many, chunking or content-encoding broken
        if isinstance(e, (http.client.HTTPException, requests.exceptions.ChunkedEncodingError,
                          requests.exceptions.ContentDecodingError, urllib3.exceptions.DecodeError)) \
                and not isinstance(e, http.client.RemoteDisconnected):
            return "protocol", True
    if isinstance(exc, (requests.exceptions.ConnectionError, urllib3.exceptions.HTTPError, OSError)):
        return "connect", True
    return "other", False


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (RFC 9110 section 10.2.3:
    delay-seconds or an HTTP-date), never negative; None if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now_dt = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    return max(0.0, (when - now_dt).total_seconds())


def _location(value: str) -> str:
    # http.client decodes header bytes as latin-1: each byte >= 0x80 is
    # percent-encoded as received (crawld.urls.location_reference), so that
    # UTF-8 gives what browsers request and other bytes are not re-encoded
    return location_reference(value)


def _field_lines(resp: requests.Response, name: str) -> list[str]:
    """The values of every ``name`` field line of a response, in order and
    unjoined (urllib3's header dict keeps them apart; requests' joins them)."""
    raw = getattr(resp.raw, "headers", None)
    if raw is not None and hasattr(raw, "getlist"):
        return list(raw.getlist(name))
    value = resp.headers.get(name)
    return [value] if value is not None else []


def _send(session: requests.Session, url: str, config: CrawlConfig) -> requests.Response:
    # through the adapter, not Session.send: even with allow_redirects=False
    # Session.send reads the whole body of any 3xx (resolve_redirects), with
    # no size cap, and a malformed Location there loses the response
    prep = session.prepare_request(requests.Request("GET", url))
    settings = session.merge_environment_settings(prep.url, {}, True, None, None)
    adapter = session.get_adapter(prep.url)
    return adapter.send(prep, stream=True, timeout=(config.connect_timeout_s, config.read_timeout_s),
                        verify=settings["verify"], cert=settings["cert"], proxies=settings["proxies"])


def fetch(session: requests.Session, url: str, config: CrawlConfig, *,
          max_bytes: int | None = None) -> FetchResult:
    """GET ``url`` once; redirects are not followed (the caller schedules
    each hop on its own politeness slot).  Never raises: failures are in
    the result.

    ``max_bytes`` caps the body (default the crawl's ``max_body_bytes``).
    When the body breaks off (time-out, reset, deadline) after the headers,
    what arrived is kept and ``truncated`` is set.
    """
    res = FetchResult(url=url, started_at=time.time())
    t0 = time.monotonic()
    resp = None
    chunks: list[bytes] = []
    try:
        with gevent.Timeout(config.fetch_deadline_s, FetchDeadline):
            resp = _send(session, url, config)
            res.status = resp.status_code
            res.headers = {k.lower(): v for k, v in resp.headers.items()}
            if "location" in res.headers:
                res.headers["location"] = _location(res.headers["location"])
            res.x_robots_tag = _field_lines(resp, "x-robots-tag")
            cap = max_bytes or config.max_body_bytes
            size = 0
            for chunk in resp.iter_content(_CHUNK):
                size += len(chunk)
                if size > cap:
                    chunks.append(chunk[: len(chunk) - (size - cap)])
                    res.truncated = True
                    break
                chunks.append(chunk)
            res.body = b"".join(chunks)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a row
        if isinstance(exc, (KeyboardInterrupt, SystemExit, gevent.GreenletExit)):
            raise
        kind, retryable = _classify(exc)
        res.error_kind, res.retryable = kind, retryable
        res.unsent = res.status is None and any(
            isinstance(e, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
                           requests.exceptions.ConnectTimeout)) for e in exception_chain(exc))
        blocked = is_blocked_address(exc)
        if blocked is not None:
            res.error = "address_blocked: " + str(blocked).split("address_blocked: ", 1)[-1][:300]
        else:
            msg = str(exc).splitlines()[0] if str(exc) else ""
            res.error = f"{kind}: {type(exc).__name__}{': ' + msg[:300] if msg else ''}"
        if res.status is not None:
            # headers arrived but the body did not: keep what came, flag it
            res.body = b"".join(chunks)
            res.truncated = True
    finally:
        if resp is not None:
            resp.close()
        res.elapsed_ms = (time.monotonic() - t0) * 1000.0
    return res

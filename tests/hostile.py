"""A hostile web for tests: a raw-socket HTTP server that is also the
crawler's HTTP proxy.

:class:`HostileServer` listens on 127.0.0.1 (port 0: any free port) and
serves every connection in a thread of its own.  It reads one request (the
request line, in absolute form as sent to a proxy, ``GET http://host/path
HTTP/1.1``, or in origin form with a Host header, and the headers), records
it, and dispatches on ``(host, path)`` to a *behaviour*: a plain function
``behaviour(conn, request) -> None`` that writes whatever bytes it likes to
the socket, so it can answer as http.server never would (garbage, a status
line one byte a second, a body that never ends, a reset mid-body...).  The
connection is closed when the behaviour returns.

Routes are looked up in this order: the exact target path with its query,
the path without its query, then the longest registered prefix
(:meth:`HostileServer.route_prefix`).  ``/robots.txt`` without a route is
404 (allow all); any other unrouted path is 404.

Stopping (:meth:`HostileServer.stop`, or leaving the ``with`` block) closes
the listening socket and every open connection, wakes the behaviours that
stall (they wait with :meth:`Request.sleep`, which returns True once the
server stops), and joins every thread; :attr:`HostileServer.leftover_threads`
lists the ones that did not end.

Helpers build normal responses: :func:`response` and :func:`head` (raw
bytes), :func:`html`, and the behaviour factories :func:`respond`,
:func:`page`, :func:`redirect` and :func:`sequence` (a stateful behaviour:
the n-th request gets the n-th behaviour).  Hostile behaviours: :func:`hold`
(accept, never answer), :func:`raw` (any bytes), :func:`drip` and
:func:`then_drip` (slow), :func:`endless` (a body that never ends),
:func:`reset_after` (a TCP reset mid-response).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from html import escape
from typing import Callable, Iterable
from urllib.parse import urlsplit

#: the most a request head may hold before the connection is dropped
MAX_REQUEST_HEAD = 64 * 1024

REASONS = {
    200: "OK", 204: "No Content", 206: "Partial Content", 301: "Moved Permanently", 302: "Found",
    303: "See Other", 307: "Temporary Redirect", 308: "Permanent Redirect", 400: "Bad Request",
    403: "Forbidden", 404: "Not Found", 410: "Gone", 429: "Too Many Requests",
    500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
}

Headers = Iterable[tuple[str, str]] | dict[str, str] | None


@dataclass
class Request:
    """One request as the server read it.  ``path`` keeps the query;
    ``headers`` are lower-cased names.  ``t`` is Unix time (s)."""

    t: float
    method: str
    target: str
    host: str
    path: str
    version: str
    headers: dict[str, str]
    server: "HostileServer" = field(repr=False)

    @property
    def stopping(self) -> bool:
        """True once the server is stopping: stalling behaviours end."""
        return self.server.stopping.is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; True if the server stopped meanwhile."""
        return self.server.stopping.wait(seconds)


@dataclass(frozen=True)
class Hit:
    """A request the server received: time (Unix s), host, path (with query)."""

    t: float
    host: str
    path: str
    method: str


Behaviour = Callable[[socket.socket, Request], None]


# -- building responses -------------------------------------------------------
def _header_items(headers: Headers) -> list[tuple[str, str]]:
    if headers is None:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return list(headers)


def response(status: int = 200, body: bytes | str = b"", *, content_type: str | None = "text/html; charset=utf-8",
             headers: Headers = None, reason: str | None = None, content_length: bool = True,
             close: bool = True) -> bytes:
    """A complete HTTP/1.1 response as bytes.

    ``content_type`` None sends no Content-Type; ``content_length`` False
    sends no Content-Length (the body then ends when the connection does);
    ``close`` adds ``Connection: close`` so that clients never reuse the
    connection (the server closes it after every response).
    """
    if isinstance(body, str):
        body = body.encode("utf-8")
    lines = [f"HTTP/1.1 {status} {reason if reason is not None else REASONS.get(status, 'Status')}"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if content_length:
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in _header_items(headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def head(status: int = 200, *, content_type: str | None = "text/html; charset=utf-8", headers: Headers = None,
         content_length: int | None = None, chunked: bool = False) -> bytes:
    """Only the status line and headers of a response (the body is the
    behaviour's to write): ``content_length`` as given, or chunked."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in _header_items(headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def html(title: str | None = None, links: Iterable[str] = (), *, head_extra: str = "", body_extra: str = "",
         charset: str | None = "utf-8") -> str:
    """A small HTML document linking to ``links`` (raw href values,
    attribute-escaped)."""
    meta = f'<meta charset="{charset}">' if charset else ""
    t = f"<title>{escape(title)}</title>" if title is not None else ""
    items = "".join(f'<li><a href="{escape(h, quote=True)}">link</a></li>' for h in links)
    return (f"<!doctype html><html><head>{meta}{t}{head_extra}</head>"
            f"<body><ul>{items}</ul>{body_extra}</body></html>")


def send(conn: socket.socket, data: bytes) -> bool:
    """``sendall`` that reports a closed peer as False instead of raising."""
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False


def reset(conn: socket.socket) -> None:
    """Close ``conn`` with a TCP RST (SO_LINGER 0) instead of a FIN."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        conn.close()
    except OSError:
        pass


def respond(status: int = 200, body: bytes | str = b"", **kw) -> Behaviour:
    """A behaviour sending one fixed response (see :func:`response`)."""
    data = response(status, body, **kw)

    def behaviour(conn: socket.socket, req: Request) -> None:
        send(conn, data)
    return behaviour


def page(title: str | None = None, links: Iterable[str] = (), *, headers: Headers = None, status: int = 200,
         **kw) -> Behaviour:
    """A behaviour sending an HTML page (see :func:`html`)."""
    return respond(status, html(title, list(links), **kw), headers=headers)


def redirect(location: str, status: int = 302) -> Behaviour:
    """A behaviour answering ``status`` with ``Location: location`` (sent
    as given, latin-1, whatever it holds)."""
    return respond(status, b"", headers=[("Location", location)], content_type=None)


def sequence(*behaviours: Behaviour) -> Behaviour:
    """A stateful behaviour: request n gets ``behaviours[n]``; the last
    one answers every request after that."""
    lock = threading.Lock()
    count = [0]

    def behaviour(conn: socket.socket, req: Request) -> None:
        with lock:
            n = count[0]
            count[0] += 1
        behaviours[min(n, len(behaviours) - 1)](conn, req)
    return behaviour


def http_date(t: float) -> str:
    """An IMF-fixdate (RFC 9110 section 5.6.7) for Unix time ``t``."""
    return formatdate(t, usegmt=True)


# -- hostile behaviours -------------------------------------------------------------
def hold(conn: socket.socket, req: Request, max_s: float = 60.0) -> None:
    """Say nothing until the peer closes, the server stops or ``max_s``."""
    end = time.monotonic() + max_s
    while time.monotonic() < end and not req.stopping:
        r, _, _ = select.select([conn], [], [], 0.1)
        if r:
            try:
                if not conn.recv(4096):
                    return
            except OSError:
                return


def raw(data: bytes, then: Behaviour | None = None) -> Behaviour:
    """Send ``data`` as is, then run ``then(conn, req)`` (default: close)."""
    def behaviour(conn, req):
        send(conn, data)
        if then is not None:
            then(conn, req)
    return behaviour


def drip(data: bytes, every_s: float = 1.0, chunk: int = 1) -> Behaviour:
    """Send ``data`` ``chunk`` bytes at a time, one chunk every ``every_s``."""
    def behaviour(conn, req):
        for i in range(0, len(data), chunk):
            if not send(conn, data[i:i + chunk]) or req.sleep(every_s):
                return
    return behaviour


def then_drip(first: bytes, piece: bytes, every_s: float, count: int = 10**9) -> Behaviour:
    """Send ``first``, then ``piece`` every ``every_s`` (``count`` times)."""
    def behaviour(conn, req):
        if not send(conn, first):
            return
        for _ in range(count):
            if req.sleep(every_s) or not send(conn, piece):
                return
    return behaviour


def endless(first: bytes, piece: bytes) -> Behaviour:
    """Send ``first``, then ``piece`` as fast as the client reads, forever."""
    def behaviour(conn, req):
        if not send(conn, first):
            return
        while not req.stopping and send(conn, piece):
            pass
    return behaviour


def reset_after(data: bytes, pause_s: float = 0.3) -> Behaviour:
    """Send ``data``, wait (the client reads it and blocks), then RST."""
    def behaviour(conn, req):
        send(conn, data)
        req.sleep(pause_s)
        reset(conn)
    return behaviour


def not_found(conn: socket.socket, req: Request) -> None:
    send(conn, response(404, "<html><head><title>404</title></head><body>not found</body></html>"))


# -- the server ---------------------------------------------------------------
class HostileServer:
    """The server (see the module docstring).  ``routes`` maps ``(host,
    path)`` to a behaviour; :meth:`route` and :meth:`route_prefix` add more.
    Thread-safe accessors: :meth:`hits`, :meth:`count`, :meth:`saw`."""

    def __init__(self, routes: dict[tuple[str, str], Behaviour] | None = None, *, read_timeout_s: float = 5.0):
        self._routes: dict[tuple[str, str], Behaviour] = {}
        self._prefixes: dict[tuple[str, str], Behaviour] = {}
        for (host, path), b in (routes or {}).items():
            self.route(host, path, b)
        self.read_timeout_s = read_timeout_s
        self.stopping = threading.Event()
        self.errors: list[str] = []  # behaviours that raised (a bug of the test)
        self.leftover_threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._acceptor: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- routes ---------------------------------------------------------------
    def route(self, host: str, path: str, behaviour: Behaviour) -> None:
        """Serve ``path`` (exact, with its query if it has one) of ``host``."""
        self._routes[(host.lower(), path)] = behaviour

    def route_prefix(self, host: str, prefix: str, behaviour: Behaviour) -> None:
        """Serve every path of ``host`` that starts with ``prefix``."""
        self._prefixes[(host.lower(), prefix)] = behaviour

    def behaviour_for(self, host: str, path: str) -> Behaviour:
        b = self._routes.get((host, path)) or self._routes.get((host, path.split("?", 1)[0]))
        if b is not None:
            return b
        best = None
        for (h, prefix), pb in self._prefixes.items():
            if h == host and path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, pb)
        if best is not None:
            return best[1]
        return not_found

    # -- hits -----------------------------------------------------------------
    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def count(self, host: str, path: str | None = None) -> int:
        """Requests received for ``host`` (and ``path``, with its query)."""
        host = host.lower()
        return sum(1 for h in self.hits() if h.host == host and (path is None or h.path == path))

    def saw(self, host: str, path: str | None = None) -> bool:
        return self.count(host, path) > 0

    def times(self, host: str, path: str) -> list[float]:
        return [h.t for h in self.hits() if h.host == host.lower() and h.path == path]

    # -- serving --------------------------------------------------------------
    def start(self) -> "HostileServer":
        self._acceptor = threading.Thread(target=self._accept_loop, name="hostile-accept", daemon=True)
        self._acceptor.start()
        return self

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            t = threading.Thread(target=self._serve, args=(conn,), name="hostile-conn", daemon=True)
            with self._lock:
                if self.stopping.is_set():
                    conn.close()
                    break
                self._conns.add(conn)
                self._threads.add(t)
            t.start()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        conn.settimeout(self.read_timeout_s)
        buf = b""
        while b"\r\n\r\n" not in buf:
            if len(buf) > MAX_REQUEST_HEAD or self.stopping.is_set():
                return None
            try:
                chunk = conn.recv(8192)
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf.split(b"\r\n\r\n", 1)[0]

    def _parse(self, raw: bytes) -> Request | None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return None
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if target.startswith(("http://", "https://")):
            split = urlsplit(target)
            host = split.hostname or ""
            path = (split.path or "/") + (f"?{split.query}" if split.query else "")
        else:
            host = urlsplit("//" + headers.get("host", "")).hostname or ""
            path = target
        return Request(time.time(), method, target, host.lower(), path, version, headers, self)

    def _serve(self, conn: socket.socket) -> None:
        try:
            raw = self._read_head(conn)
            req = self._parse(raw) if raw is not None else None
            if req is None:
                return
            with self._lock:
                self._hits.append(Hit(req.t, req.host, req.path, req.method))
            conn.settimeout(None)  # behaviours decide how long they take
            try:
                self.behaviour_for(req.host, req.path)(conn, req)
            except OSError:
                pass  # the client went away: that is its right
            except Exception as exc:  # noqa: BLE001 - recorded, the test checks errors
                with self._lock:
                    self.errors.append(f"{req.host}{req.path}: {type(exc).__name__}: {exc}")
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection, wake stalled behaviours
        and join every thread (those still alive after ``timeout_s`` are in
        :attr:`leftover_threads`)."""
        self.stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout_s)
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.01))
        self.leftover_threads = [t for t in threads if t.is_alive()]
        if self._acceptor is not None and self._acceptor.is_alive():
            self.leftover_threads.append(self._acceptor)

    def __enter__(self) -> "HostileServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""A multi-host static site server that is also an HTTP proxy, for the demo,
the tests and the benchmarks.

It serves several sites from one loopback port: static directories (e.g.
the Python documentation of Debian's ``python3-doc``) and generated
synthetic sites, each under its own host name.  It reads the host from an
absolute-form request target (``GET http://docs.example.org/x HTTP/1.1``, as
sent to a proxy, RFC 9112 section 3.2.2) or else from the Host header, so a
crawler pointed at it as its HTTP proxy reaches every made-up host name.

Every request is recorded (server time, host, path, status) in memory and,
optionally, as NDJSON lines in a log file: the tests and benchmarks count
fetches and measure rates on the server's side, as a site owner would.

    python -m crawld.sitesrv --site python.docs-demo.org=/usr/share/doc/python3-doc/html \\
        --synthetic shop.example-web.com=500 --port 8080 --log requests.ndjson
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import random
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit


@dataclass
class SyntheticSite:
    """A generated site of ``pages`` HTML pages at ``/`` and ``/p/<n>.html``.

    Page n links to pages 2n+1 and 2n+2 (so every page is reachable from
    ``/``, depth about log2(pages)), to ``extra_links`` pseudo-random pages of
    the same site and to the home pages of ``peers`` (other host names);
    with ``private_links`` also to ``/private/<n>.html`` (served too: a
    robots.txt may forbid them).  ``seed`` fixes the pseudo-random links.
    """

    pages: int
    peers: list[str] = field(default_factory=list)
    extra_links: int = 3
    seed: int = 0
    private_links: bool = False

    def paths(self) -> list[str]:
        """Every path the site serves."""
        return ["/"] + [f"/p/{n}.html" for n in range(self.pages)]

    def render(self, host: str, path: str) -> bytes | None:
        if self.private_links and path.startswith("/private/"):
            return f"<!doctype html><title>{host} private</title><p>private</p>".encode()
        if path in ("/", "/index.html"):
            n, targets = -1, [0]
        elif path.startswith("/p/") and path.endswith(".html"):
            try:
                n = int(path[3:-5])
            except ValueError:
                return None
            if not 0 <= n < self.pages:
                return None
            rnd = random.Random(zlib.crc32(f"{self.seed}:{host}:{n}".encode()))
            targets = [t for t in (2 * n + 1, 2 * n + 2) if t < self.pages]
            targets += [rnd.randrange(self.pages) for _ in range(self.extra_links)]
        else:
            return None
        links = "".join(f'<li><a href="/p/{t}.html">page {t}</a></li>' for t in targets)
        if self.private_links:
            links += f'<li><a href="/private/{n + 1}.html">private</a></li>'

        links += "".join(f'<li><a href="http://{p}/">{p}</a></li>' for p in self.peers)
        return (f"<!doctype html><html><head><meta charset=utf-8><title>{host} page {n}</title></head>"
                f"<body><h1>{host} {n}</h1><ul>{links}</ul></body></html>").encode()


@dataclass(frozen=True)
class Hit:
    """One request as the server saw it (``t``: Unix time, s)."""

    t: float
    host: str
    path: str
    status: int


class RateLimit:
    """nginx ``limit_req`` with ``burst=0`` (ngx_http_limit_req_module): a
    request is accepted when at least ``1 / rps`` seconds have passed since
    the last *accepted* one, else answered 429 (rejections do not count)."""

    def __init__(self, rps: float):
        self.interval = 1.0 / rps
        self._last = -1e18
        self._lock = threading.Lock()

    def accept(self, now: float) -> bool:
        with self._lock:
            if now - self._last >= self.interval:
                self._last = now
                return True
            return False


class SiteServer(ThreadingHTTPServer):
    """The server; ``sites`` maps host -> directory, ``synthetic`` host ->
    :class:`SyntheticSite`, ``files`` (host, path) -> (status, body,
    content type[, headers]) for single documents served before either
    (robots.txt, sitemaps, redirects).  ``redirect_hosts`` maps a host to the host every one of its
    paths redirects to (301, as a bare domain to its ``www.``), after
    ``files``; ``limits`` a host to the requests/s above which it answers 429
    (:class:`RateLimit`).  ``delay_s`` is added before every response.

    Thread-safe accessors: :meth:`hits` (list of :class:`Hit`),
    :meth:`counts` (Counter of ``(host, path)``).
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], sites: dict[str, str | os.PathLike] | None = None,
                 synthetic: dict[str, SyntheticSite] | None = None, log_path: str | None = None,
                 delay_s: float = 0.0, handler: Callable | None = None,
                 files: dict[tuple[str, str], tuple[int, bytes, str]] | None = None,
                 redirect_hosts: dict[str, str] | None = None, limits: dict[str, float] | None = None):
        self.redirect_hosts = {h.lower(): t for h, t in (redirect_hosts or {}).items()}
        self.limits = {h.lower(): RateLimit(r) for h, r in (limits or {}).items()}
        self.sites = {h.lower(): Path(d).resolve() for h, d in (sites or {}).items()}
        self.synthetic = {h.lower(): s for h, s in (synthetic or {}).items()}
        self.delay_s = delay_s
        self.files = {(h.lower(), p): v for (h, p), v in (files or {}).items()}
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._log = open(log_path, "a", buffering=1) if log_path else None
        super().__init__(addr, handler or SiteHandler)

    def record(self, host: str, path: str, status: int) -> None:
        hit = Hit(time.time(), host, path, status)
        with self._lock:
            self._hits.append(hit)
            if self._log:
                self._log.write(json.dumps({"t": hit.t, "host": host, "path": path, "status": status}) + "\n")

    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def counts(self) -> Counter:
        with self._lock:
            return Counter((h.host, h.path) for h in self._hits)

    def reset(self) -> None:
        with self._lock:
            self._hits.clear()

    def server_close(self) -> None:
        super().server_close()
        if self._log:
            self._log.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def serve_in_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="sitesrv", daemon=True)
        t.start()
        return t

    def __enter__(self) -> "SiteServer":
        """Serve in a background thread until the ``with`` block ends."""
        self.serve_in_thread()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class SiteHandler(BaseHTTPRequestHandler):
    """Serves GET and HEAD for the server's sites; everything else is 405."""

    protocol_version = "HTTP/1.1"
    server: SiteServer

    def log_message(self, format, *args):  # quiet: the server records hits itself
        pass

    def _target(self) -> tuple[str, str]:
        raw = self.path
        if raw.startswith(("http://", "https://")):
            parts = urlsplit(raw)
            host, path = (parts.hostname or ""), parts.path or "/"
        else:
            hdr = self.headers.get("Host") or ""
            host = urlsplit(f"//{hdr}").hostname or ""
            path = raw.split("?", 1)[0].split("#", 1)[0] or "/"
        return host.lower(), path

    def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8",
              head: bool = False, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self, head: bool = False) -> None:
        host, path = self._target()
        if self.server.delay_s:
            time.sleep(self.server.delay_s)
        headers = None
        limit = self.server.limits.get(host)
        if limit is not None and not limit.accept(time.time()):
            status, body, ctype = 429, b"too many requests", "text/plain"
        elif host in self.server.redirect_hosts and (host, path) not in self.server.files:
            status, body, ctype = 301, b"", "text/html"
            headers = {"Location": f"http://{self.server.redirect_hosts[host]}{path}"}
        else:
            status, body, ctype, *more = self.resolve(host, path)
            headers = more[0] if more else None
        self.server.record(host, path, status)
        self._send(status, body, ctype, head, headers)

    def do_HEAD(self) -> None:
        self.do_GET(head=True)

    def resolve(self, host: str, path: str) -> tuple:
        """``(status, body, content type)`` for a request, or from ``files``
        also the response's extra headers (a dict) if its entry has them."""
        doc = self.server.files.get((host, path))
        if doc is not None:
            return doc
        syn = self.server.synthetic.get(host)
        if syn is not None:
            body = syn.render(host, path)
            return (200, body, "text/html; charset=utf-8") if body is not None else (404, b"not found", "text/plain")
        root = self.server.sites.get(host)
        if root is None:
            return 502, f"no site {host!r} here".encode(), "text/plain"
        rel = unquote(path).lstrip("/")
        target = (root / rel).resolve() if rel else root
        if target != root and root not in target.parents:
            return 403, b"forbidden", "text/plain"
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            return 404, b"<html><head><title>404</title></head><body>not found</body></html>", "text/html"
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return 200, target.read_bytes(), ctype


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m crawld.sitesrv", description=__doc__.split("\n\n")[0])
    p.add_argument("--site", action="append", default=[], metavar="HOST=DIR", help="serve DIR as HOST")
    p.add_argument("--synthetic", action="append", default=[], metavar="HOST=PAGES",
                   help="a generated site of PAGES pages as HOST; all synthetic hosts link to each other")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port")
    p.add_argument("--port-file", help="write the port here once listening")
    p.add_argument("--log", help="append one NDJSON line per request to this file")
    p.add_argument("--delay", type=float, default=0.0, help="seconds added to every response")
    args = p.parse_args(argv)
    sites = {}
    for s in args.site:
        host, _, d = s.partition("=")
        if not d or not Path(d).is_dir():
            print(f"sitesrv: error: --site {s!r}: not HOST=DIR with an existing DIR", file=sys.stderr)
            return 2
        sites[host] = d
    syn_hosts = [s.partition("=")[0] for s in args.synthetic]
    synthetic = {}
    for s in args.synthetic:
        host, _, n = s.partition("=")
        synthetic[host] = SyntheticSite(int(n), peers=[h for h in syn_hosts if h != host][:5])
    srv = SiteServer((args.bind, args.port), sites, synthetic, args.log, args.delay)
    port = srv.server_address[1]
    if args.port_file:
        Path(args.port_file).write_text(str(port))
    print(f"sitesrv: listening on {args.bind}:{port} for {', '.join([*sites, *synthetic])}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

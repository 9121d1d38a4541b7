"""A private ``redis-server`` on a free loopback port, in a temporary dir.

Used by ``crawlctl run`` when no REDIS_URL is given, and by the tests (each
kill/restart test gets its own).  Nothing is persisted (``save ""``,
``appendonly no``) and ``maxmemory-policy`` is ``noeviction``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


_PR_SET_PDEATHSIG = 1
try:  # resolved here, in the parent: the child must not dlopen between fork and exec
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent() -> None:
    """``preexec_fn``: ask Linux to SIGTERM this child when its parent dies
    (prctl(2) ``PR_SET_PDEATHSIG``)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class RedisServerError(RuntimeError):
    """redis-server is missing or did not start; message is one line."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server child process.

    ``start()`` returns once it answers PING (or raises
    :class:`RedisServerError` after ``timeout_s``); ``stop()`` shuts it
    down.  Usable as a context manager.  ``extra_args`` are appended to the
    command line (e.g. ``["--cluster-enabled", "yes"]``).  With
    ``die_with_parent`` the server is stopped by the kernel if the process
    that started it dies (Linux ``PR_SET_PDEATHSIG``).
    """

    def __init__(self, port: int | None = None, extra_args: list[str] | None = None,
                 binary: str | None = None, dir: str | os.PathLike | None = None,
                 die_with_parent: bool = False):
        self.binary = binary or shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self._own_dir = dir is None
        self.dir = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="crawld-redis-"))
        self.proc: subprocess.Popen | None = None
        # a private server must not outlive a crawlctl killed with SIGKILL
        self.die_with_parent = die_with_parent

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        if not os.path.exists(self.binary):
            raise RedisServerError("redis-server not found; install it (apt-get install redis-server) or set REDIS_URL")
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(self.dir), "--maxmemory-policy", "noeviction",
               "--logfile", str(self.dir / "redis.log"), "--daemonize", "no", *self.extra_args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent if self.die_with_parent else None,
                                     # its own session: a Ctrl-C in the terminal goes to crawlctl and
                                     # its workers, which still need Redis to drain
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log")
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                raise RedisServerError(f"redis-server exited with {self.proc.returncode}: {' '.join(tail)}")
            if self._ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within {timeout_s:g}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (fault tests); it can be started again."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """Stop the server and remove its directory (if we made it)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

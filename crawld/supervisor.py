"""The supervisor: keeps one process per local shard, plus the reclaimer, alive.

Modelled on gunicorn's arbiter: signal handlers only enqueue the signal and
wake the main loop through a pipe; the loop dispatches to ``handle_<sig>``
and does all logging, killing and reaping.  Children are started with
fork+exec (``python -m crawld.worker ...``) so each one monkey-patches gevent
in a fresh interpreter.

* A child that exits unexpectedly is restarted after a backoff that doubles
  with each quick failure (``backoff_base_s`` .. ``backoff_max_s``); a child
  that ran ``stable_after_s`` resets its count.  After ``crash_loop_limit``
  quick failures in a row the child is given up and reported
  (:attr:`Supervisor.gave_up`), not restarted forever.
* Two-stage stop: SIGTERM to every child, wait for them to drain until
  ``drain_timeout_s`` + ``kill_grace_s``, then SIGKILL and reap the
  stragglers (their claims come back through reclaim).
* Children get SIGTERM from the kernel if the supervisor dies
  (``PR_SET_PDEATHSIG``), so a supervisor killed with SIGKILL leaves no
  orphans: they drain and exit.
* SIGTERM, SIGINT and SIGQUIT stop; SIGHUP restarts the children one by one
  so they reload the crawl config.

``crawld`` (the daemon) and ``crawlctl run`` both drive this class: there is
one way to run workers.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from . import logs
from .localredis import die_with_parent


@dataclass
class ChildSpec:
    """How to start one child: ``argv`` and extra ``env`` entries."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen | None = None
    started: float = 0.0
    failures: int = 0
    restarts: int = 0
    next_start: float = 0.0
    gave_up: bool = False
    reloading: bool = False


def python_child(name: str, module: str, args: list[str], env: dict[str, str] | None = None) -> ChildSpec:
    """A spec running ``python -m module args`` with this interpreter."""
    return ChildSpec(name, [sys.executable, "-m", module, *args], dict(env or {}))


def crawl_children(shards: list[int], worker_args: list[str], reclaim_args: list[str],
                   env: dict[str, str]) -> list[ChildSpec]:
    """The children of a crawld supervisor: one worker per shard, then the
    reclaimer.  Each worker gets a lease token naming this machine, this
    supervisor and its shard, kept across restarts so that a restarted
    worker resumes its shard's leases at once."""
    nonce = uuid.uuid4().hex[:8]
    host = socket.gethostname()
    specs = [python_child(f"worker-{s}", "crawld.worker", [*worker_args, "--shard", str(s)],
                          {**env, "CRAWLD_LEASE_TOKEN": f"{host}:{os.getpid()}:{nonce}:{s}"})
             for s in shards]
    specs.append(python_child("reclaim", "crawld.reclaim", reclaim_args, env))
    return specs


class Supervisor:
    """Runs and watches child processes (see the module docstring).

    Times are seconds.  :meth:`run` blocks until a stop signal or until the
    ``until`` callable returns true, then stops every child.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD)

    def __init__(self, specs: list[ChildSpec], *, drain_timeout_s: float = 30.0,
                 backoff_base_s: float = 0.5, backoff_max_s: float = 30.0, crash_loop_limit: int = 5,
                 stable_after_s: float = 30.0, kill_grace_s: float = 5.0,
                 reload: Callable[[], list[ChildSpec]] | None = None,
                 on_exit: Callable[[int], None] | None = None, log=None):
        self.children = [_Child(s) for s in specs]
        self.drain_timeout_s = drain_timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.crash_loop_limit = crash_loop_limit
        self.stable_after_s = stable_after_s
        self.kill_grace_s = kill_grace_s
        self.reload = reload
        self.on_exit = on_exit  # called with the pid of every reaped child
        self.log = log or logs.setup(proc="supervisor")
        self.stopping = False
        self.stop_signal: int | None = None
        self._sigq: list[int] = []
        self._rfd = self._wfd = -1
        self._old_handlers: dict[int, object] = {}

    # -- signals ---------------------------------------------------------------
    def _signal(self, signum, frame) -> None:
        # only enqueue and wake the loop; all work happens in the loop
        if len(self._sigq) < 16:
            self._sigq.append(signum)
        try:
            os.write(self._wfd, b".")
        except OSError:
            pass

    def install_signals(self) -> None:
        """Route the supervisor's signals into its loop (main thread only)."""
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        for s in self.SIGNALS:
            self._old_handlers[s] = signal.signal(s, self._signal)

    def restore_signals(self) -> None:
        """Put back the handlers found by :meth:`install_signals`."""
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        self._old_handlers.clear()
        for fd in (self._rfd, self._wfd):
            if fd >= 0:
                os.close(fd)
        self._rfd = self._wfd = -1

    def handle_term(self, signum: int) -> None:
        self.log.warning("stop_requested", signal=signal.Signals(signum).name,
                         drain_timeout_s=self.drain_timeout_s)
        self.stopping = True
        self.stop_signal = signum

    handle_int = handle_quit = handle_term

    def handle_hup(self, signum: int) -> None:
        """Reload: new child specs from ``reload`` (if given; on error the
        old ones stay), then restart every child (drained, not counted as a
        failure; a given-up child gets another chance)."""
        self.log.info("reload_requested")
        if self.reload is not None:
            try:
                specs = {s.name: s for s in self.reload()}
            except Exception as exc:  # noqa: BLE001 - a bad reload must not stop the daemon
                self.log.error("reload_failed", error=str(exc), action="kept the running configuration")
                return
            for c in self.children:
                c.spec = specs.get(c.spec.name, c.spec)
        for c in self.children:
            c.failures, c.gave_up, c.next_start = 0, False, 0.0
            if c.proc and c.proc.poll() is None:
                c.reloading = True
                c.proc.send_signal(signal.SIGTERM)

    def handle_chld(self, signum: int) -> None:
        pass  # reaping happens every tick

    # -- children ----------------------------------------------------------------
    def _spawn(self, c: _Child) -> None:
        env = dict(os.environ)
        env.update(c.spec.env)
        c.proc = subprocess.Popen(c.spec.argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        c.started = time.monotonic()
        self.log.info("child_started", child=c.spec.name, pid=c.proc.pid)

    def _reap(self) -> None:
        now = time.monotonic()
        for c in self.children:
            if c.proc is None or c.proc.poll() is None:
                continue
            code, pid = c.proc.returncode, c.proc.pid
            ran = now - c.started
            c.proc = None
            self._exited(pid)
            if self.stopping:
                continue
            if c.reloading:
                c.reloading = False
                c.next_start = now
                self.log.info("child_reloaded", child=c.spec.name, pid=pid, exit_code=code)
                continue
            if ran >= self.stable_after_s:
                c.failures = 0
            c.failures += 1
            c.restarts += 1
            if c.failures > self.crash_loop_limit:
                c.gave_up = True
                self.log.error("child_crash_loop", child=c.spec.name, pid=pid, exit_code=code,
                               failures=c.failures - 1, action="given up")
                continue
            delay = min(self.backoff_base_s * 2 ** (c.failures - 1), self.backoff_max_s)
            c.next_start = now + delay
            self.log.warning("child_exited", child=c.spec.name, pid=pid, exit_code=code,
                             ran_s=round(ran, 3), restart_in_s=delay)

    def _exited(self, pid: int) -> None:
        if self.on_exit is not None:
            try:
                self.on_exit(pid)
            except Exception as exc:  # noqa: BLE001 - bookkeeping must not stop supervision
                self.log.warning("on_exit_failed", pid=pid, error=str(exc))

    def _spawn_due(self) -> None:
        now = time.monotonic()
        for c in self.children:
            if c.proc is None and not c.gave_up and now >= c.next_start:
                self._spawn(c)

    @property
    def gave_up(self) -> list[str]:
        """Names of children stopped for crash-looping."""
        return [c.spec.name for c in self.children if c.gave_up]

    def pids(self) -> dict[str, int]:
        """Running children by name."""
        return {c.spec.name: c.proc.pid for c in self.children if c.proc and c.proc.poll() is None}

    def state(self) -> dict[str, dict]:
        """Per child: pid (None when down), restarts, given up."""
        return {c.spec.name: {"pid": c.proc.pid if c.proc and c.proc.poll() is None else None,
                              "restarts": c.restarts, "gave_up": c.gave_up} for c in self.children}

    # -- loop --------------------------------------------------------------------
    def _sleep(self, timeout: float) -> None:
        if self._sigq:
            return
        try:
            ready, _, _ = select.select([self._rfd], [], [], max(timeout, 0.0))
        except InterruptedError:
            return
        if ready:
            try:
                while os.read(self._rfd, 512):
                    pass
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise

    def tick(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a signal, then dispatch signals,
        reap dead children and start the ones due."""
        self._sleep(timeout)
        while self._sigq:
            signum = self._sigq.pop(0)
            name = signal.Signals(signum).name[3:].lower()
            getattr(self, f"handle_{name}")(signum)
        self._reap()
        if not self.stopping:
            self._spawn_due()

    def start(self) -> None:
        """Install signal handlers and start every child."""
        if self._rfd < 0:
            self.install_signals()
        self._spawn_due()

    def run(self, until: Callable[[], bool] | None = None, every_s: float = 0.5) -> None:
        """Supervise until stopped by a signal or ``until()`` returns true
        (checked every ``every_s``), then :meth:`stop`."""
        self.start()
        try:
            while not self.stopping:
                self.tick(every_s)
                if until is not None and not self.stopping and until():
                    break
        finally:
            self.stop()

    def stop(self) -> float:
        """SIGTERM every child, wait up to ``drain_timeout_s`` +
        ``kill_grace_s`` for them to exit, SIGKILL the rest.  Returns the
        drain time in seconds."""
        self.stopping = True
        t0 = time.monotonic()
        running = [c for c in self.children if c.proc and c.proc.poll() is None]
        for c in running:
            try:
                c.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        # children drain within drain_timeout_s themselves; the grace period
        # covers their exit and the reaping
        deadline = t0 + self.drain_timeout_s + self.kill_grace_s
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in running):
            time.sleep(0.02)
        for c in running:
            if c.proc.poll() is None:
                self.log.warning("child_killed", child=c.spec.name, pid=c.proc.pid,
                                 reason=f"not drained within {self.drain_timeout_s + self.kill_grace_s:g}s")
                c.proc.kill()
                c.proc.wait()
            elif c.proc.returncode != 0:
                self.log.warning("child_exit_code", child=c.spec.name, exit_code=c.proc.returncode)
        for c in self.children:
            if c.proc is not None:
                self._exited(c.proc.pid)
            c.proc = None
        drain = time.monotonic() - t0
        self.log.info("stopped", drain_s=round(drain, 3))
        if self._rfd >= 0:
            self.restore_signals()
        return drain

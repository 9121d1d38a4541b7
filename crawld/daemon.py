"""``crawld``: the daemon; serves a set of shards on this machine.

``crawld --shards 0-3`` (under systemd ``crawld@0-3.service``: the instance
name is the shard set) runs one worker process per listed shard, serving
that shard of every active crawl (or of ``CRAWL_ID`` only), plus one
reclaim process, under :class:`crawld.supervisor.Supervisor`, until
SIGTERM.  Settings come from ``/etc/crawl-workers/shard_config.json`` and
the environment (:mod:`crawld.settings`).

Start-up checks, each a one-line error and a named exit code: ``--shards``
a shard set (64), settings valid (78), Redis reachable and ``noeviction``
(69), the crawl known and covering the shards (78), its output writable
(73).

Under systemd (``Type=notify``) it reports READY once its children are
started, STATUS lines (what it serves, children given up), STOPPING on
SIGTERM and a WATCHDOG ping from its main loop.  It publishes its state to
Redis (``crawld:supervisors``) for ``crawlctl``.  SIGHUP re-reads the
settings file and restarts the children with it (a bad file is reported
and the running configuration kept).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time

import redis

from . import __version__, exitcodes, keys, logs, metrics, settings
from .cliargs import Parser, crawl_id_arg
from .config import ConfigError
from .crawls import load_crawl
from .frontier import Frontier
from .output import check_writable
from .storage import StorageError, check_output, is_remote
from .redisconn import RedisUnfit, check, connect, redact
from .sdnotify import Notifier
from .supervisor import ChildSpec, Supervisor, crawl_children
from .redisconn import ERRORS as REDIS_ERRORS

#: the largest num_shards a crawl may have (see crawld.config).
MAX_SHARDS = 4096


def parse_shard_set(text: str, name: str = "shards") -> list[int]:
    """Shards named like ``0-3``, ``0,2,5`` or ``0-3,8`` (systemd instance
    names too), sorted and unique.  ``name`` is where the text came from
    (``--shards``, ``CRAWLD_SHARDS``); errors start with it.

    Raises:
        ConfigError: malformed text, or a shard outside 0..4095.
    """
    out: set[int] = set()
    try:
        for part in text.replace(" ", "").split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            if not 0 <= lo_i <= hi_i < MAX_SHARDS:
                raise ValueError
            out.update(range(lo_i, hi_i + 1))
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not a shard set like '0-3' or '0,2,5' "
                          f"(shards are 0..{MAX_SHARDS - 1})") from None
    if not out:
        raise ConfigError(f"{name}: {text!r} names no shard; give a shard set like '0-3' or '0,2,5'")
    return sorted(out)


def shard_label(shards: list[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``0-3,7``."""
    runs, start = [], None
    for i, s in enumerate(shards):
        if start is None:
            start = s
        if i + 1 == len(shards) or shards[i + 1] != s + 1:
            runs.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ",".join(runs)


class Daemon:
    """One crawld: the supervisor of this machine's shard workers."""

    def __init__(self, machine: settings.MachineSettings, shards: list[int], redis_url: str,
                 crawl_id: str | None, client: redis.Redis, config_path: str | None, log):
        self.machine = machine
        self.shards = shards
        self.redis_url = redis_url
        self.crawl_id = crawl_id
        self.client = client
        self.config_path = config_path
        self.log = log
        self.notifier = Notifier()
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.started_at = time.time()
        self.metrics_dir = self._metrics_dir(machine)
        self.sup = Supervisor(self._specs(machine), drain_timeout_s=machine["DRAIN_TIMEOUT_S"],
                              crash_loop_limit=machine["CRASH_LOOP_LIMIT"], reload=self._reload,
                              on_exit=lambda pid: metrics.process_dead(self.metrics_dir, pid), log=log)
        self._frontiers: dict[str, Frontier] = {}
        self._status = ""

    @staticmethod
    def _metrics_dir(m: settings.MachineSettings) -> str | None:
        """The multiprocess metrics directory (wiped): $PROMETHEUS_MULTIPROC_DIR
        if set, else a private one under $RUNTIME_DIRECTORY or the temp dir."""
        if not m["METRICS_PORT"]:
            return None
        path = os.environ.get(metrics.ENV_DIR) or tempfile.mkdtemp(
            prefix="crawld-metrics-", dir=os.environ.get("RUNTIME_DIRECTORY") or None)
        return metrics.prepare_dir(path)

    def _crawls(self) -> dict[str, Frontier]:
        """Frontiers of the crawls served (for the scrape-time gauges)."""
        ids = [self.crawl_id] if self.crawl_id else sorted(x.decode() for x in self.client.smembers(keys.CRAWLS))
        for cid in ids:
            if cid not in self._frontiers:
                try:
                    self._frontiers[cid] = Frontier(self.client, load_crawl(self.client, cid))
                except ConfigError:
                    continue
        return {cid: f for cid, f in self._frontiers.items() if cid in ids}

    def _serve_metrics(self) -> None:
        port = self.machine["METRICS_PORT"]
        if not port:
            return
        try:
            metrics.serve(port, self.metrics_dir, [metrics.SupervisorCollector(self.sup.state),
                                                   metrics.RedisCollector(self.client, self._crawls, self.shards)])
            self.log.info("metrics_serving", port=port, path="/metrics")
        except OSError as exc:
            # crawling matters more than being watched: keep going, loudly
            self.log.error("metrics_unavailable", port=port, error=exc.strerror or str(exc),
                           hint="set METRICS_PORT per instance when several crawld run on one machine")

    def _specs(self, m: settings.MachineSettings) -> list[ChildSpec]:
        env = {"REDIS_URL": self.redis_url, "LEASE_TTL_S": str(m["LEASE_TTL_S"]),
               "CRAWLD_LOG_LEVEL": m["CRAWLD_LOG_LEVEL"], "CRAWLD_SPOOL_DIR": m["CRAWLD_SPOOL_DIR"]}
        if self.metrics_dir:
            env[metrics.ENV_DIR] = self.metrics_dir
        wargs = ["--concurrency", str(m["NUM_WORKERS"]), "--drain-timeout", str(m["DRAIN_TIMEOUT_S"])]
        if self.crawl_id:
            wargs += ["--crawl-id", self.crawl_id]
        if m["CRAWLD_PROXY"]:
            wargs += ["--proxy", m["CRAWLD_PROXY"]]
        return crawl_children(self.shards, wargs, ["--crawl-id", self.crawl_id] if self.crawl_id else [], env)

    def _reload(self) -> list[ChildSpec]:
        m = settings.load(path=self.config_path)
        self.machine = m
        self.sup.drain_timeout_s = m["DRAIN_TIMEOUT_S"]
        self.sup.crash_loop_limit = m["CRASH_LOOP_LIMIT"]
        self.log.info("settings_reloaded", source=m.source or "environment")
        return self._specs(m)

    def _publish(self) -> None:
        state = {"host": socket.gethostname(), "pid": os.getpid(), "shards": shard_label(self.shards),
                 "crawl_id": self.crawl_id, "version": __version__, "started_at": self.started_at,
                 "updated_at": time.time(), "children": self.sup.state(), "gave_up": self.sup.gave_up}
        try:
            self.client.hset(keys.SUPERVISORS, self.name, json.dumps(state))
        except REDIS_ERRORS as exc:
            self.log.warning("publish_failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        status = f"serving shards {shard_label(self.shards)} of {self.crawl_id or 'every crawl'}"
        if self.sup.gave_up:
            status += f"; given up (crash loop): {', '.join(self.sup.gave_up)}"
        if status != self._status:
            self._status = status
            self.notifier.status(status)

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT (exit 0) or until every worker is
        crash-looping (exit 70)."""
        workers = {f"worker-{s}" for s in self.shards}
        self._serve_metrics()
        self.sup.start()
        self._publish()
        self.notifier.ready(self._status)
        self.log.info("crawld_started", shards=shard_label(self.shards), crawl_id=self.crawl_id,
                      redis=redact(self.redis_url), version=__version__)
        tick = min(1.0, self.notifier.watchdog_interval_s or 1.0)
        last_publish = 0.0
        reported = 0
        try:
            while not self.sup.stopping:
                self.sup.tick(tick)
                self.notifier.watchdog()
                if time.monotonic() - last_publish >= 5.0 or len(self.sup.gave_up) != reported:
                    reported = len(self.sup.gave_up)
                    self._publish()
                    last_publish = time.monotonic()
                if workers <= set(self.sup.gave_up):
                    self.log.error("crawld_failed", reason="every worker is crash-looping", gave_up=self.sup.gave_up)
                    break
        finally:
            self.notifier.stopping("draining")
            drain = self.sup.stop()
            self.log.info("crawld_stopped", drain_s=round(drain, 3))
            if self.metrics_dir and not os.environ.get(metrics.ENV_DIR):
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
            try:
                self.client.hdel(keys.SUPERVISORS, self.name)
            except REDIS_ERRORS:
                pass
        return exitcodes.SOFTWARE if workers <= set(self.sup.gave_up) else exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="crawld", description="Serve shards of the crawls in Redis on this machine: one worker "
               "process per shard, one reclaim process, restarted when they die.",
               epilog="Settings: /etc/crawl-workers/shard_config.json (or $CRAWLD_CONFIG), overridden by the "
                      "environment (REDIS_URL, CRAWL_ID, NUM_WORKERS, DRAIN_TIMEOUT_S, LEASE_TTL_S, ...); "
                      "'crawlctl settings' lists them all. Exit codes: 0 stopped, 64 usage, 69 Redis "
                      "unavailable, 70 every worker crash-looping, 73 output not writable, 78 bad setting.")
    p.add_argument("--version", action="version", version=f"crawld {__version__}")
    p.add_argument("--shards", help="shard set, e.g. 0-3 or 0,2,5 (systemd: the instance name); "
                   "default $CRAWLD_SHARDS")
    p.add_argument("--crawl-id", type=crawl_id_arg, help="serve only this crawl (default $CRAWL_ID, "
                   "else every crawl in Redis)")
    p.add_argument("--redis-url", help="default $REDIS_URL")
    p.add_argument("--config", metavar="FILE", help="settings file (default $CRAWLD_CONFIG or "
                   "/etc/crawl-workers/shard_config.json)")
    p.add_argument("--check", action="store_true", help="run the start-up checks, print the result, exit")
    args = p.parse_args(argv)
    if args.shards is not None:
        # a bad command-line argument (or systemd instance name) is a usage
        # error (64); a bad $CRAWLD_SHARDS is a bad setting (78), below
        try:
            parse_shard_set(args.shards, name="--shards")
        except ConfigError as exc:
            print(f"crawld: error: {exc}", file=sys.stderr)
            return exitcodes.USAGE
    try:
        if args.config and not os.path.exists(args.config):
            raise ConfigError(f"--config {args.config}: no such file")
        machine = settings.load(path=args.config)
    except ConfigError as exc:
        print(f"crawld: error: {exc}", file=sys.stderr)
        return exitcodes.CONFIG
    os.environ.setdefault("CRAWLD_LOG_STREAM", "stdout")  # journald; children inherit it
    log = logs.setup(machine["CRAWLD_LOG_LEVEL"], proc="crawld")
    try:
        shards_text = args.shards or machine["CRAWLD_SHARDS"]
        if not shards_text:
            raise ConfigError("shards: give --shards (e.g. 0-3), the systemd instance, or $CRAWLD_SHARDS")
        shards = parse_shard_set(shards_text, name="--shards" if args.shards else "CRAWLD_SHARDS")
        crawl_id = args.crawl_id or machine["CRAWL_ID"]
        url = args.redis_url or machine["REDIS_URL"]
        if not url:
            raise ConfigError("REDIS_URL: not set (in /etc/crawl-workers/env, the environment or --redis-url)")
        client = connect(url)
        check(client, url)
        if crawl_id:
            config = load_crawl(client, crawl_id)
            bad = [s for s in shards if s >= config.num_shards]
            if bad:
                raise ConfigError(f"shards: {shard_label(bad)} not in 0..{config.num_shards - 1} "
                                  f"(crawl {crawl_id} has {config.num_shards})")
            check_output(config.output)
            if is_remote(config.output):
                check_writable(machine["CRAWLD_SPOOL_DIR"])
    except ConfigError as exc:
        print(f"crawld: error: {exc}", file=sys.stderr)
        return exitcodes.CONFIG
    except RedisUnfit as exc:
        print(f"crawld: error: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except StorageError as exc:
        print(f"crawld: error: {exc}", file=sys.stderr)
        return exitcodes.CANTCREAT
    except OSError as exc:
        print(f"crawld: error: output {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return exitcodes.CANTCREAT
    if args.check:
        print(f"crawld: ok: shards {shard_label(shards)} of {crawl_id or 'every crawl'}, Redis {redact(url)} "
              f"(noeviction), settings from {machine.source or 'the environment'}")
        return exitcodes.OK
    return Daemon(machine, shards, url, crawl_id, client, args.config, log).run()


if __name__ == "__main__":
    sys.exit(main())

"""crawld, the daemon, as a real process: worker restarts, SIGTERM drain,
crash loops, systemd notifications, SIGHUP reload, and shard leases
between two daemons."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import redis as redis_mod

from conftest import MACHINE_ENV, crawlctl
from crawld import keys
from crawld.config import CrawlConfig
from crawld.frontier import Frontier, crawl_finished
from crawld.ratecheck import rate_violations
from crawld.redisconn import connect
from crawld.sharding import politeness_key
from crawld.sitesrv import SiteServer, SyntheticSite

CRAWLD = str(Path(sys.executable).with_name("crawld"))


def start_daemon(redis_url: str, shards: str, log: Path, **env: str) -> subprocess.Popen:
    e = {k: v for k, v in os.environ.items() if k not in MACHINE_ENV}
    e.update({"REDIS_URL": redis_url, "CRAWLD_CONFIG": "/nonexistent/crawld.json", "CRAWLD_LOG_LEVEL": "info",
              "NUM_WORKERS": "8", "LEASE_TTL_S": "3", "DRAIN_TIMEOUT_S": "10",
              "METRICS_PORT": "0"})  # tests run in parallel: metrics only where asked for
    e.update(env)
    with open(log, "ab") as f:
        return subprocess.Popen([CRAWLD, "--shards", shards], env=e, stdout=f, stderr=f, start_new_session=True)


def seed(redis_url: str, crawl_id: str, out: Path, seeds: list[str], *args: str) -> CrawlConfig:
    proc = crawlctl("seed", *seeds, "--crawl-id", crawl_id, "--redis-url", redis_url, "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    return CrawlConfig.from_json(connect(redis_url).get(keys.crawl_config(crawl_id)))


def wait_finished(client, config, timeout=120.0) -> float:
    f = Frontier(client, config)
    prev, t0 = None, time.monotonic()
    while time.monotonic() - t0 < timeout:
        snaps = f.snapshots()
        if crawl_finished(prev, snaps):
            return time.monotonic() - t0
        prev = snaps
        time.sleep(0.3)
    pytest.fail(f"crawl {config.crawl_id} did not finish in {timeout:g}s: {snaps}")


def stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def children(proc: subprocess.Popen, module: str) -> dict[str, int]:
    out = {}
    for c in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmd = c.cmdline()
        except psutil.NoSuchProcess:
            continue
        if module in cmd:
            out[cmd[cmd.index("--shard") + 1] if "--shard" in cmd else module] = c.pid
    return out


def events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def artifact_rows(redis_url: str, crawl_id: str) -> list[dict]:
    proc = crawlctl("merge", "--crawl-id", crawl_id, "--redis-url", redis_url)
    assert proc.returncode == 0, proc.stderr
    return pq.read_table(proc.stdout.split("artifact=")[1].split()[0]).to_pylist()


HOSTS = ["www.alpha-daemon.com", "www.beta-daemon.org", "www.gamma-daemon.net", "www.delta-daemon.io"]


def test_a_killed_worker_is_restarted_and_the_crawl_completes(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    with SiteServer(("127.0.0.1", 0), synthetic={h: SyntheticSite(pages=30) for h in HOSTS}) as srv:
        cfg = seed(own_redis.url, "restart", tmp_path / "out", [f"http://{h}/" for h in HOSTS], "--shards", "2",
                   "--max-rps-per-host", "10", "--visibility-timeout", "3")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url)
        try:
            deadline = time.monotonic() + 30
            while len(srv.hits()) < 20 and time.monotonic() < deadline:
                time.sleep(0.1)
            victim = children(d, "crawld.worker")["0"]
            os.kill(victim, signal.SIGKILL)
            wait_finished(client, cfg)
            assert children(d, "crawld.worker")["0"] != victim
        finally:
            assert stop(d) == 0
    rows = artifact_rows(own_redis.url, "restart")
    assert sorted(r["url"] for r in rows if r["status"] == 200) == sorted(
        f"http://{h}{p}" for h in HOSTS for p in SyntheticSite(pages=30).paths())
    evs = events(tmp_path / "log")
    assert any(e["event"] == "child_exited" and e.get("child") == "worker-0" for e in evs)
    k = keys.shard_keys("restart", 0)
    assert client.zcard(k.claimed) == 0


def test_sigterm_drains_in_flight_work_with_nothing_left_claimed(tmp_path, own_redis):
    client = redis_mod.Redis.from_url(own_redis.url)
    hosts = [f"www.drain{i}-daemon.com" for i in range(8)]
    with SiteServer(("127.0.0.1", 0), synthetic={h: SyntheticSite(pages=100) for h in hosts}, delay_s=0.8) as srv:
        cfg = seed(own_redis.url, "drain", tmp_path / "out", [f"http://{h}/" for h in hosts], "--shards", "2",
                   "--max-rps-per-host", "20", "--max-inflight-per-host", "2")
        d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRAWLD_PROXY=srv.url, DRAIN_TIMEOUT_S="20")
        f = Frontier(client, cfg)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and sum(s.claimed for s in f.snapshots()) < 10:
                time.sleep(0.05)
            in_flight = sum(s.claimed for s in f.snapshots())
            assert in_flight >= 10, "not loaded"
            t0 = time.monotonic()
            d.send_signal(signal.SIGTERM)
            code = d.wait(60)
            drain_s = time.monotonic() - t0
        finally:
            stop(d)
    assert code == 0
    snaps = f.snapshots()
    assert sum(s.claimed for s in snaps) == 0 and sum(s.stats.get("reclaimed", 0) for s in snaps) == 0
    assert all(s.stats.get("acked", 0) == s.stats.get("claimed", 0) for s in snaps)
    assert all(f.leaseholder(s) is None for s in range(2))  # leases given up at the stop
    print(f"\nSIGTERM drain under load: {in_flight} claims in flight, exited 0 after {drain_s:.2f} s")
    assert drain_s < 0.8 * 3 + 5


def test_a_crash_looping_worker_is_given_up_and_reported(tmp_path, own_redis):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.2)
    messages: list[str] = []

    def listen():  # as systemd does: read every notification as it comes
        while not done.is_set():
            try:
                messages.append(sock.recv(4096).decode())
            except OSError:
                pass
    done = threading.Event()
    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    # every worker process dies at boot (as a broken install would): a
    # sitecustomize on the children's path exits any crawld.worker at once
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os, sys\nif 'crawld.worker' in getattr(sys, 'orig_argv', []):\n    os._exit(3)\n")
    seed(own_redis.url, "doomed", tmp_path / "out", ["http://www.doomed.com/"], "--shards", "2")
    d = start_daemon(own_redis.url, "0-1", tmp_path / "log", CRASH_LOOP_LIMIT="2",
                     NOTIFY_SOCKET=str(sock_path), WATCHDOG_USEC="2000000", PYTHONPATH=str(inject))
    try:
        code = d.wait(60)
    finally:
        stop(d)
        time.sleep(0.3)
        done.set()
        listener.join()
        sock.close()
    assert code == 70
    evs = events(tmp_path / "log")
    gave_up = {e["child"] for e in evs if e["event"] == "child_crash_loop"}
    assert gave_up == {"worker-0", "worker-1"}
    assert any(e["event"] == "crawld_failed" for e in evs)
    text = "\n".join(messages)
    assert "READY=1" in text and "WATCHDOG=1" in text and "STOPPING=1" in text
    assert "given up (crash loop): worker-0" in text or "given up (crash loop): worker-1" in text


def test_sighup_reloads_the_settings_file(tmp_path, own_redis):
    conf = tmp_path / "shard_config.json"
    conf.write_text(json.dumps({"num_workers": 3}))
    seed(own_redis.url, "reload", tmp_path / "out", ["http://www.reload-daemon.com/"], "--shards", "1")
    d = start_daemon(own_redis.url, "0", tmp_path / "log", CRAWLD_CONFIG=str(conf), NUM_WORKERS="")
    try:
        def started(n):
            return [e for e in events(tmp_path / "log") if e["event"] == "worker_started" and e["concurrency"] == n]
        deadline = time.monotonic() + 20
        while not started(3) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started(3)
        conf.write_text(json.dumps({"num_workers": 7}))
        d.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not started(7) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started(7)
        conf.write_text("{broken")
        d.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert d.poll() is None
        assert any(e["event"] == "reload_failed" for e in events(tmp_path / "log"))
    finally:
        assert stop(d) == 0


def _lease_tokens(client, crawl_id: str, shards: int) -> list[str | None]:
    return [(v.decode() if v else None) for v in (client.get(keys.shard_keys(crawl_id, s).lease) for s in range(shards))]


def _takeover(client, crawl_id, pid_b: int, timeout: float = 30) -> float:
    host = socket.gethostname()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(t and t.startswith(f"{host}:{pid_b}:") for t in _lease_tokens(client, crawl_id, 2)):
            return time.monotonic() - t0
        time.sleep(0.05)
    pytest.fail(f"no takeover within {timeout}s: {_lease_tokens(client, crawl_id, 2)}")


@pytest.mark.parametrize("how", ["supervisor", "machine"])
def test_a_standby_daemon_takes_over_the_shards_of_a_killed_one(how, tmp_path, own_redis):
    """Two daemons for the same shards: one serves, the other stands by.
    Killing the serving daemon's supervisor (its workers then drain and give
    their leases up) hands the shards over at once; killing its whole
    process group (the machine died) hands them over when the leases lapse.
    Either way no domain exceeds its rate, and with a clean hand-over no URL
    is fetched twice."""
    client = redis_mod.Redis.from_url(own_redis.url)
    rps = 5.0
    with SiteServer(("127.0.0.1", 0), synthetic={h: SyntheticSite(pages=30) for h in HOSTS}) as srv:
        cfg = seed(own_redis.url, f"lease-{how}", tmp_path / "out", [f"http://{h}/" for h in HOSTS], "--shards", "2",
                   "--max-rps-per-host", str(rps), "--visibility-timeout", "4")
        a = start_daemon(own_redis.url, "0-1", tmp_path / "a.log", CRAWLD_PROXY=srv.url)
        b = None
        try:
            deadline = time.monotonic() + 30
            while len(srv.hits()) < 25 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert all(t and t.startswith(f"{socket.gethostname()}:{a.pid}:")
                       for t in _lease_tokens(client, cfg.crawl_id, 2))
            b = start_daemon(own_redis.url, "0-1", tmp_path / "b.log", CRAWLD_PROXY=srv.url)
            # b is up and standing by: its workers say so (an event, not a sleep:
            # a loaded machine may take a while to start them)
            deadline = time.monotonic() + 60
            while not any(e["event"] == "lease_held_elsewhere" for e in events(tmp_path / "b.log")):
                assert time.monotonic() < deadline, "the second daemon never stood by"
                assert b.poll() is None, f"crawld b exited {b.returncode}"
                time.sleep(0.1)
            assert all(t.startswith(f"{socket.gethostname()}:{a.pid}:") for t in _lease_tokens(client, cfg.crawl_id, 2))
            if how == "supervisor":
                os.kill(a.pid, signal.SIGKILL)
            else:
                os.killpg(a.pid, signal.SIGKILL)
            takeover_s = _takeover(client, cfg.crawl_id, b.pid)
            wait_finished(client, cfg)
            hits = srv.hits()
        finally:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
            a.wait()
            if b is not None:
                assert stop(b) == 0
    print(f"\ntakeover after the {how} was killed: {takeover_s:.2f} s (lease TTL 3 s)")
    by_domain: dict[str, list[float]] = {}
    for h in hits:
        by_domain.setdefault(politeness_key(h.host), []).append(h.t)
    assert rate_violations(by_domain, rps) == {}
    counts: dict[tuple, int] = {}
    for h in hits:
        counts[(h.host, h.path)] = counts.get((h.host, h.path), 0) + 1
    expected = {(h, p) for h in HOSTS for p in SyntheticSite(pages=30).paths()}
    assert expected <= set(counts)
    if how == "supervisor":
        assert takeover_s < 3.0  # leases were given up, no wait for them to lapse
        assert max(counts.values()) == 1, {k: n for k, n in counts.items() if n > 1}
    else:
        assert takeover_s < 3.0 + 3.0 / 3 + 2.0  # the TTL, then b's next renewal
    rows = artifact_rows(own_redis.url, cfg.crawl_id)
    assert {(r["host"], r["url"].split(r["host"], 1)[1]) for r in rows if r["status"] == 200} >= expected

"""REDIS_URL forms against real redis-server processes of the test's own:
a password (``requirepass``), ACL users (one without the scripting
commands the frontier needs) and TLS (``rediss://`` with a private CA made
here with the openssl CLI), for ``crawlctl``, ``crawld --check``, the
daemon's start-up and a real crawl.

Never the machine's Redis on 6379: every server listens on a free loopback
port and is stopped by its fixture.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest
import redis

from conftest import MACHINE_ENV, crawlctl, summary_of
from crawld import keys
from crawld.localredis import RedisServer, free_port
from crawld.sitesrv import SiteServer, SyntheticSite

#: distinctive secrets: a substring search for them in any output is meaningful
PASSWORD = "Pw-requirepass-7f3a9c"
WRONG_PASSWORD = "Pw-wrong-guess-51d0e2"
ACL_PASSWORD = "Pw-acl-crawler-c4b18e"
NOSCRIPT_PASSWORD = "Pw-acl-noscript-93e7aa"
SECRETS = (PASSWORD, WRONG_PASSWORD, ACL_PASSWORD, NOSCRIPT_PASSWORD)


class CheckedRedisServer(RedisServer):
    """A :class:`RedisServer` whose readiness is checked with redis-py at
    ``client_url(port)``: its own check is an unauthenticated plaintext
    PING, which ``requirepass``, a disabled default user or a TLS-only
    server refuse."""

    def __init__(self, client_url, **kw):
        super().__init__(**kw)
        self.client_url = client_url(self.port)

    def _ping(self) -> bool:
        client = redis.Redis.from_url(self.client_url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.client_url)


def _started(srv: CheckedRedisServer):
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _env(extra: dict | None = None) -> dict:
    """The environment of a crawld process: machine settings isolated."""
    e = {k: v for k, v in os.environ.items() if k not in MACHINE_ENV}
    e["CRAWLD_CONFIG"] = "/nonexistent/crawld-test-config.json"
    e.update(extra or {})
    return e


def crawld(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawld.daemon", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(env))


def one_line_error(proc: subprocess.CompletedProcess, prog: str = "crawlctl") -> str:
    """The single ``prog: error: ...`` line on stderr (and nothing else)."""
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr[-3000:]
    return lines[0]


def assert_no_secret(*procs: subprocess.CompletedProcess) -> None:
    for p in procs:
        for secret in SECRETS:
            assert secret not in p.stdout and secret not in p.stderr, (p.args, p.stdout, p.stderr)


def seed_and_depth(url: str, crawl_id: str, out: Path, host: str) -> tuple:
    """``crawlctl seed`` with ``--redis-url``, ``queue-depth`` with ``$REDIS_URL``."""
    s = crawlctl("seed", "--crawl-id", crawl_id, f"http://{host}/", f"http://{host}/about.html",
                 "--shards", "2", "--out", str(out), "--redis-url", url)
    q = crawlctl("queue-depth", "--crawl-id", crawl_id, "--json", env={"REDIS_URL": url})
    return s, q


def assert_seeded(s: subprocess.CompletedProcess, q: subprocess.CompletedProcess, crawl_id: str) -> None:
    assert s.returncode == 0, s.stderr
    assert s.stdout.strip() == f"crawl {crawl_id}: 2 new seed(s) queued across 2 shard(s)"
    assert q.returncode == 0, q.stderr
    depth = json.loads(q.stdout)
    assert depth["crawl_id"] == crawl_id and depth["total"] == 2 and depth["claimed"] == 0
    assert len(depth["shards"]) == 2


# -- requirepass ---------------------------------------------------------------

@pytest.fixture
def pw_redis():
    yield from _started(CheckedRedisServer(lambda p: f"redis://:{PASSWORD}@127.0.0.1:{p}/0",
                                           extra_args=["--requirepass", PASSWORD]))


def test_password_url_seeds_and_reads_queue_depth(pw_redis, tmp_path):
    url = f"redis://:{PASSWORD}@127.0.0.1:{pw_redis.port}/0"
    s, q = seed_and_depth(url, "auth-pw", tmp_path, "www.pw-site.com")
    assert_seeded(s, q, "auth-pw")
    assert_no_secret(s, q)
    client = pw_redis.client()
    assert client.smembers(keys.CRAWLS) == {b"auth-pw"}
    client.close()


@pytest.mark.parametrize("url_form", ["wrong", "none"])
def test_wrong_or_missing_password_is_exit_69_one_line(url_form, pw_redis, tmp_path):
    auth = f":{WRONG_PASSWORD}@" if url_form == "wrong" else ""
    url = f"redis://{auth}127.0.0.1:{pw_redis.port}/0"
    s, q = seed_and_depth(url, "auth-wrong", tmp_path, "www.pw-site.com")
    for p in (s, q):
        assert p.returncode == 69, (p.returncode, p.stderr)
        line = one_line_error(p)
        assert "authentication failed" in line, line
        assert f"127.0.0.1:{pw_redis.port}" in line, line
        if url_form == "wrong":
            assert f"redis://:***@127.0.0.1:{pw_redis.port}/0" in line, line
        assert p.stdout == ""
    assert_no_secret(s, q)
    client = pw_redis.client()
    assert client.dbsize() == 0  # nothing was written
    client.close()


def test_crawld_check_with_password(pw_redis):
    url = f"redis://:{PASSWORD}@127.0.0.1:{pw_redis.port}/0"
    ok = crawld("--check", "--shards", "0-1", "--redis-url", url)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crawld: ok: shards 0-1 of every crawl"), ok.stdout
    assert f"redis://:***@127.0.0.1:{pw_redis.port}/0" in lines[0]
    # the same through $REDIS_URL
    ok_env = crawld("--check", "--shards", "0-1", env={"REDIS_URL": url})
    assert ok_env.returncode == 0 and ok_env.stdout == ok.stdout, ok_env.stderr
    bad = crawld("--check", "--shards", "0-1",
                 "--redis-url", f"redis://:{WRONG_PASSWORD}@127.0.0.1:{pw_redis.port}/0")
    assert bad.returncode == 69, bad.stderr
    assert "authentication failed" in one_line_error(bad, "crawld")
    assert_no_secret(ok, ok_env, bad)


# -- ACL users -----------------------------------------------------------------

def _acl_args() -> list[str]:
    everything = ["~*", "&*", "+@all"]
    return ["--user", "default", "off",  # no anonymous access at all
            "--user", "crawler", "on", f">{ACL_PASSWORD}", *everything,
            "--user", "noscript", "on", f">{NOSCRIPT_PASSWORD}", *everything, "-@scripting"]


@pytest.fixture
def acl_redis():
    yield from _started(CheckedRedisServer(lambda p: f"redis://crawler:{ACL_PASSWORD}@127.0.0.1:{p}/0",
                                           extra_args=_acl_args()))


def test_acl_user_url_works(acl_redis, tmp_path):
    url = f"redis://crawler:{ACL_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
    s, q = seed_and_depth(url, "auth-acl", tmp_path, "www.acl-site.com")
    assert_seeded(s, q, "auth-acl")
    ok = crawld("--check", "--shards", "0-1", "--redis-url", url)
    assert ok.returncode == 0, ok.stderr
    assert f"redis://crawler:***@127.0.0.1:{acl_redis.port}/0" in ok.stdout
    # the default user is off: no credentials, or a wrong password, is refused
    anon = crawlctl("queue-depth", "--crawl-id", "auth-acl", "--redis-url", f"redis://127.0.0.1:{acl_redis.port}/0")
    wrong = crawlctl("queue-depth", "--crawl-id", "auth-acl",
                     "--redis-url", f"redis://crawler:{WRONG_PASSWORD}@127.0.0.1:{acl_redis.port}/0")
    for p in (anon, wrong):
        assert p.returncode == 69, p.stderr
        assert "authentication failed" in one_line_error(p)
    assert "redis://crawler:***@" in wrong.stderr
    assert_no_secret(s, q, ok, anon, wrong)


def test_acl_user_without_scripting_cannot_seed(acl_redis, tmp_path):
    """The frontier is Lua scripts (EVALSHA): a user without @scripting gets
    a one-line error, not a traceback."""
    url = f"redis://noscript:{NOSCRIPT_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
    s = crawlctl("seed", "--crawl-id", "auth-noscript", "http://www.acl-site.com/", "--shards", "2",
                 "--out", str(tmp_path), "--redis-url", url)
    assert s.returncode == 69, s.stderr
    line = one_line_error(s)
    assert "evalsha" in line.lower() and "permission" in line.lower(), line
    assert_no_secret(s)


def test_crawld_check_refuses_user_without_scripting(acl_redis, tmp_path):
    """``crawld --check`` must not say ok for a user whose workers cannot
    run a single frontier script."""
    url = f"redis://noscript:{NOSCRIPT_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
    p = crawld("--check", "--shards", "0-1", "--redis-url", url)
    assert_no_secret(p)
    assert p.returncode == 69, f"crawld --check exited {p.returncode}: {p.stdout.strip()}"
    line = one_line_error(p, "crawld")
    assert "permission" in line.lower() or "script" in line.lower(), line


def test_crawld_with_user_without_scripting_fails_with_one_line_error(acl_redis, tmp_path):
    """With a crawl to serve, the daemon must refuse such a user at start-up
    (exit 69, one line), not crash-loop its workers with tracebacks."""
    admin = f"redis://crawler:{ACL_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
    s = crawlctl("seed", "--crawl-id", "auth-noscript-d", "http://www.acl-site.com/", "--shards", "2",
                 "--out", str(tmp_path), "--redis-url", admin)
    assert s.returncode == 0, s.stderr
    url = f"redis://noscript:{NOSCRIPT_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
    proc = subprocess.Popen([sys.executable, "-m", "crawld.daemon", "--shards", "0-1"],
                            env=_env({"REDIS_URL": url, "CRASH_LOOP_LIMIT": "2", "LEASE_TTL_S": "5"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"crawld kept running with a user that cannot run scripts:\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for secret in SECRETS:
        assert secret not in out and secret not in err
    tracebacks = err.count("Traceback")
    assert proc.returncode == 69 and tracebacks == 0, (
        f"exit {proc.returncode}, {tracebacks} traceback(s); stderr:\n{err[-3000:]}")
    errors = [line for line in err.splitlines() if line.startswith("crawld: error: ")]
    assert len(errors) == 1 and ("permission" in errors[0] or "script" in errors[0]), err[-3000:]


# -- TLS ---------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert p.returncode == 0, f"openssl {' '.join(args)}: {p.stderr}"


def _make_ca(d: Path, name: str) -> Path:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=crawld test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    return d / f"{name}.pem"


@pytest.fixture(scope="module")
def tls_certs(tmp_path_factory) -> dict[str, Path]:
    """A private CA, a server certificate it signed for 127.0.0.1 and
    localhost, and an unrelated second CA."""
    if not shutil.which("openssl"):
        pytest.fail("the openssl command is missing (Debian package openssl)")
    d = tmp_path_factory.mktemp("tls")
    ca = _make_ca(d, "ca")
    other_ca = _make_ca(d, "other-ca")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
    return {"ca": ca, "other_ca": other_ca, "cert": d / "server.pem", "key": d / "server.key"}


def _tls_args(certs: dict[str, Path], port: int, extra: list[str] = ()) -> list[str]:
    # "--port 0" after RedisServer's own "--port N": no plaintext listener at all
    return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs["cert"]),
            "--tls-key-file", str(certs["key"]), "--tls-ca-cert-file", str(certs["ca"]),
            "--tls-auth-clients", "no", *extra]


def tls_url(port: int, ca: Path | None, auth: str = "") -> str:
    q = f"?ssl_ca_certs={quote(str(ca), safe='/')}" if ca else ""
    return f"rediss://{auth}127.0.0.1:{port}/0{q}"


@pytest.fixture
def tls_redis(tls_certs):
    port = free_port()
    yield from _started(CheckedRedisServer(lambda p: tls_url(p, tls_certs["ca"]), port=port,
                                           extra_args=_tls_args(tls_certs, port)))


def test_tls_url_seeds_and_reads_queue_depth(tls_redis, tls_certs, tmp_path):
    s, q = seed_and_depth(tls_url(tls_redis.port, tls_certs["ca"]), "auth-tls", tmp_path, "www.tls-site.com")
    assert_seeded(s, q, "auth-tls")


@pytest.mark.parametrize("ca", ["none", "other_ca"])
def test_tls_with_unknown_ca_is_exit_69_one_line(ca, tls_redis, tls_certs, tmp_path):
    url = tls_url(tls_redis.port, tls_certs.get(ca))
    s, q = seed_and_depth(url, "auth-tls-bad", tmp_path, "www.tls-site.com")
    for p in (s, q):
        assert p.returncode == 69, (p.returncode, p.stderr)
        line = one_line_error(p)
        assert "certificate" in line.lower(), line
    d = crawld("--check", "--shards", "0-1", "--redis-url", url)
    assert d.returncode == 69, d.stderr
    assert "certificate" in one_line_error(d, "crawld").lower()


def test_plaintext_url_to_the_tls_port_is_exit_69_one_line(tls_redis, tmp_path):
    p = crawlctl("queue-depth", "--crawl-id", "auth-tls", "--redis-url", f"redis://127.0.0.1:{tls_redis.port}/0")
    assert p.returncode == 69, p.stderr
    assert "cannot reach Redis" in one_line_error(p)


def test_crawld_check_with_tls(tls_redis, tls_certs):
    url = tls_url(tls_redis.port, tls_certs["ca"])
    ok = crawld("--check", "--shards", "0-1", "--redis-url", url)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crawld: ok: shards 0-1 of every crawl"), ok.stdout
    assert f"Redis {url} (noeviction)" in lines[0]


def test_crawld_check_with_tls_and_password(tls_certs):
    """Both at once: the password is redacted, the TLS query kept."""
    port = free_port()
    gen = _started(CheckedRedisServer(lambda p: tls_url(p, tls_certs["ca"], f":{PASSWORD}@"), port=port,
                                      extra_args=_tls_args(tls_certs, port, ["--requirepass", PASSWORD])))
    next(gen)
    try:
        ok = crawld("--check", "--shards", "0-1", "--redis-url", tls_url(port, tls_certs["ca"], f":{PASSWORD}@"))
        bad = crawld("--check", "--shards", "0-1",
                     "--redis-url", tls_url(port, tls_certs["ca"], f":{WRONG_PASSWORD}@"))
    finally:
        gen.close()
    assert ok.returncode == 0, ok.stderr
    assert f"Redis {tls_url(port, tls_certs['ca'], ':***@')} (noeviction)" in ok.stdout
    assert bad.returncode == 69 and "authentication failed" in one_line_error(bad, "crawld")
    assert_no_secret(ok, bad)


def test_real_crawl_over_tls(tls_redis, tls_certs, tmp_path):
    """``crawlctl run --redis-url rediss://...``: the workers (gevent-patched
    ssl) and the reclaimer speak TLS too; the artifact has every page."""
    host = "www.tls-crawl-site.com"
    url = tls_url(tls_redis.port, tls_certs["ca"])
    with SiteServer(("127.0.0.1", 0), synthetic={host: SyntheticSite(pages=5)}) as srv:
        summary = summary_of(crawlctl(
            "run", f"http://{host}/", "--crawl-id", "tls-run", "--shards", "2", "--max-rps-per-host", "50",
            "--proxy", srv.url, "--redis-url", url, "--out", str(tmp_path), "--json", timeout=120))
        counts = srv.counts()
    expected = {f"http://{host}{p}" for p in SyntheticSite(pages=5).paths()}
    assert summary["rows"] == len(expected) == 6 and summary["statuses"] == {"2xx": 6}
    rows = pq.read_table(summary["artifact"]).to_pylist()
    assert sorted(r["url"] for r in rows) == sorted(expected)  # one row per page
    assert {(r["outcome"], r["status"], r["crawl_id"]) for r in rows} == {("fetched", 200, "tls-run")}
    assert Path(summary["artifact"]).resolve().is_relative_to(tmp_path.resolve())
    assert max(counts.values()) == 1 and sum(counts.values()) == 6 + 1  # + robots.txt
    client = tls_redis.client()
    acked = sum(int(client.hget(keys.shard_keys("tls-run", s).stats, "acked") or 0) for s in range(2))
    client.close()
    assert acked == 6

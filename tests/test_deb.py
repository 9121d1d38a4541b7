"""The .deb, built from this tree by ``make deb``, installed into a clean
Debian 12 root made by debootstrap: the commands run from their installed
paths, the crawld user and state directory exist, the settings are
conffiles, the units verify, and removal and purge clean up."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def run(*cmd: str, timeout: float = 900, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def deb() -> Path:
    if os.geteuid() != 0:
        pytest.fail("the .deb install test needs root (debootstrap, chroot)")
    run("make", "-C", str(ROOT), "deb", timeout=1500)
    debs = sorted((ROOT / "dist").glob("crawld_*_amd64.deb")) or sorted((ROOT / "dist").glob("crawld_*.deb"))
    assert debs, "make deb produced no package"
    return debs[-1]


@pytest.fixture(scope="module")
def debian_root(tmp_path_factory, deb) -> Path:
    if not shutil.which("debootstrap"):
        run("apt-get", "install", "-y", "-qq", "debootstrap")
    root = tmp_path_factory.mktemp("bookworm") / "root"
    run("debootstrap", "--variant=minbase", "bookworm", str(root), "http://deb.debian.org/debian", timeout=1200)
    shutil.copy(deb, root / "tmp" / "crawld.deb")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    run("chroot", str(root), "apt-get", "update", "-qq", env=env)
    run("chroot", str(root), "apt-get", "install", "-y", "-qq", "/tmp/crawld.deb", env=env, timeout=1200)
    # what every Debian 12 host has, for verifying the units against it
    run("chroot", str(root), "apt-get", "install", "-y", "-qq", "--no-install-recommends", "systemd", "procps",
        env=env, timeout=1200)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def chroot(root: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
    return run("chroot", str(root), *cmd, env=env, check=check)


def test_commands_run_from_their_installed_paths(debian_root):
    version = chroot(debian_root, "/usr/bin/crawld", "--version").stdout
    assert version.startswith("crawld ")
    helptext = chroot(debian_root, "/usr/bin/crawlctl", "--help").stdout
    for word in ("run", "seed", "queue-depth", "merge", "settings", "status", "verify", "drain", "reclaim",
                 "shard-balance"):
        assert word in helptext
    # the alerts and the dashboard ship with the package
    assert (debian_root / "usr/share/crawld/prometheus/crawld-alerts.yml").is_file()
    assert (debian_root / "usr/share/crawld/grafana/crawld-dashboard.json").is_file()
    assert "NUM_WORKERS" in chroot(debian_root, "/usr/bin/crawlctl", "settings").stdout
    # the interpreter is Debian's, not the build machine's
    assert os.readlink(debian_root / "opt/venvs/crawld/bin/python3") == "/usr/bin/python3"


def test_user_state_dirs_and_conffiles(debian_root):
    passwd = (debian_root / "etc/passwd").read_text()
    assert any(line.startswith("crawld:") for line in passwd.splitlines())
    st = (debian_root / "var/lib/crawld/output").stat()
    uid = int(next(line for line in passwd.splitlines() if line.startswith("crawld:")).split(":")[2])
    assert st.st_uid == uid and oct(st.st_mode & 0o777) == "0o750"
    env = debian_root / "etc/crawl-workers/env"
    assert oct(env.stat().st_mode & 0o777) == "0o640"
    conffiles = chroot(debian_root, "dpkg-query", "-W", "-f=${Conffiles}", "crawld").stdout
    assert "/etc/crawl-workers/env" in conffiles and "/etc/crawl-workers/shard_config.json" in conffiles
    # the daemon refuses to start without a reachable Redis: one line, exit 69
    proc = chroot(debian_root, "/usr/bin/crawld", "--shards", "0-3", "--redis-url", "redis://127.0.0.1:1/0",
                  check=False)
    assert proc.returncode == 69 and proc.stderr.startswith("crawld: error: cannot reach Redis")


def test_installed_units_verify(debian_root):
    for unit in ("crawld@0-3.service", "crawld.target", "crawld-merge@audit.service"):
        proc = run("systemd-analyze", "verify", "--man=no", f"--root={debian_root}", unit, check=False)
        assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    sec = run("systemd-analyze", "security", "--offline=true", "--no-pager", f"--root={debian_root}",
              "crawld@0-3.service")
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", sec.stdout).group(1))
    assert exposure <= 2.0, sec.stdout[-3000:]


def test_remove_then_purge(debian_root):
    chroot(debian_root, "apt-get", "remove", "-y", "-qq", "crawld")
    assert not (debian_root / "usr/bin/crawld").exists()
    assert (debian_root / "etc/crawl-workers/env").exists()  # conffiles stay until purge
    chroot(debian_root, "apt-get", "purge", "-y", "-qq", "crawld")
    assert not (debian_root / "etc/crawl-workers").exists()
    assert not (debian_root / "var/lib/crawld").exists()
    assert not (debian_root / "opt/venvs/crawld").exists()

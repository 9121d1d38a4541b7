"""The systemd units as shipped: systemd-analyze verify is clean (but for
the binaries, which only the installed package has: see test_deb.py) and
the service's security exposure is at most 2.0."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"


@pytest.fixture(autouse=True)
def _need_systemd_analyze():
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is missing (Debian package systemd)")


@pytest.mark.parametrize("unit", ["crawld@.service", "crawld.target", "crawld-merge@.service"])
def test_units_verify(unit):
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(UNITS / unit)],
                          capture_output=True, text=True)
    problems = [line for line in proc.stderr.splitlines() if "is not executable" not in line and line.strip()]
    assert not problems, proc.stderr


@pytest.mark.parametrize("unit", ["crawld@.service", "crawld-merge@.service"])
def test_security_exposure_at_most_2(unit):
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNITS / unit)],
                         capture_output=True, text=True).stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    assert exposure <= 2.0, out


def test_service_contract():
    text = (UNITS / "crawld@.service").read_text()
    settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify" and settings["KillSignal"] == "SIGTERM"
    assert settings["Restart"] == "on-failure" and settings["User"] == "crawld"
    assert settings["EnvironmentFile"] == "/etc/crawl-workers/env"
    assert "--shards %i" in settings["ExecStart"]
    # the stop timeout leaves room for the drain (30 s by default) and the kill grace
    assert int(settings["TimeoutStopSec"]) >= 30 + 5 + 30
    assert int(settings["WatchdogSec"]) > 0

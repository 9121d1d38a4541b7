"""The supervisor's handlers, unit-tested directly, and its behaviour with
real child processes: restart with backoff, crash-loop limit, two-stage
stop."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from crawld.supervisor import ChildSpec, Supervisor


def py(name: str, code: str) -> ChildSpec:
    return ChildSpec(name, [sys.executable, "-c", code])


SLEEPER = "import time\nwhile True: time.sleep(0.1)"
# exits 0 on SIGTERM after a short "drain"
DRAINER = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.2), sys.exit(0)))\n"
           "while True: time.sleep(0.1)")
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)"


def test_signal_handler_only_enqueues():
    sup = Supervisor([py("a", SLEEPER)])
    sup.install_signals()
    try:
        sup._signal(signal.SIGTERM, None)
        assert sup._sigq == [signal.SIGTERM] and not sup.stopping
        sup.tick(0)
        assert sup.stopping and sup.stop_signal == signal.SIGTERM
    finally:
        sup.restore_signals()


def test_restart_with_backoff_then_give_up_on_crash_loop():
    sup = Supervisor([py("crasher", "import sys; sys.exit(3)"), py("ok", SLEEPER)],
                     backoff_base_s=0.05, backoff_max_s=0.2, crash_loop_limit=3, drain_timeout_s=2)
    sup.start()
    try:
        deadline = time.monotonic() + 20
        while not sup.gave_up and time.monotonic() < deadline:
            sup.tick(0.05)
        assert sup.gave_up == ["crasher"]
        crasher = sup.children[0]
        assert crasher.restarts == 4 and crasher.proc is None
        # not restarted once given up; the healthy child keeps running
        for _ in range(10):
            sup.tick(0.05)
        assert crasher.proc is None and "ok" in sup.pids()
    finally:
        sup.stop()


def test_killed_child_is_restarted():
    sup = Supervisor([py("w", SLEEPER)], backoff_base_s=0.05)
    sup.start()
    try:
        first = sup.pids()["w"]
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sup.pids().get("w") in (None, first):
            sup.tick(0.05)
        assert sup.pids().get("w") not in (None, first)
    finally:
        sup.stop()


def test_two_stage_stop_drains_then_kills_stragglers():
    sup = Supervisor([py("drainer", DRAINER), py("stubborn", STUBBORN)], drain_timeout_s=0.5, kill_grace_s=0.5)
    sup.start()
    time.sleep(0.5)  # let the children install their handlers
    procs = {c.spec.name: c.proc for c in sup.children}
    t0 = time.monotonic()
    drain = sup.stop()
    assert 0.9 <= drain <= 5.0 and time.monotonic() - t0 < 6
    assert procs["drainer"].returncode == 0
    assert procs["stubborn"].returncode == -signal.SIGKILL


def test_sigterm_to_supervisor_process_stops_run():
    sup = Supervisor([py("d", DRAINER)], drain_timeout_s=5)
    threading.Timer(0.8, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    sup.run(every_s=0.1)
    assert sup.stopping and sup.stop_signal == signal.SIGTERM
    assert time.monotonic() - t0 < 5
    assert signal.getsignal(signal.SIGTERM) is not sup._signal


def test_run_until_condition():
    sup = Supervisor([py("d", DRAINER)])
    t0 = time.monotonic()
    sup.run(until=lambda: time.monotonic() - t0 > 0.5, every_s=0.05)
    assert not sup.pids() and sup.stop_signal is None

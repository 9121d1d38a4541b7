"""systemd's service notification protocol (sd_notify(3)), for Type=notify.

A datagram of ``KEY=value`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (an abstract socket when it starts with ``@``).  Without
that variable (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends READY, STOPPING, STATUS and WATCHDOG notifications.

    ``watchdog_interval_s`` is half of ``$WATCHDOG_USEC`` (as sd_watchdog_enabled(3)
    advises), or None when systemd set no watchdog.
    """

    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET") or ""
        self.address = ("\0" + addr[1:]) if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        ok = usec and usec.isdigit() and (not pid or pid == str(os.getpid()))
        self.watchdog_interval_s = int(usec) / 2e6 if ok else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, **fields: str) -> bool:
        """Send ``fields`` (READY="1", STATUS="..."); False if not sent."""
        if not self.address:
            return False
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                # never block the supervisor on a notification: a full
                # receiver queue drops it (EAGAIN)
                s.setblocking(False)
                s.connect(self.address)
                s.send(msg)
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify(READY="1", STATUS=status) if status else self.notify(READY="1")

    def stopping(self, status: str = "") -> bool:
        return self.notify(STOPPING="1", STATUS=status) if status else self.notify(STOPPING="1")

    def status(self, status: str) -> bool:
        return self.notify(STATUS=status)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG="1")

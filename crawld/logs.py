"""Logging: structlog, configured once per process (after the fork).

JSON lines when not attached to a terminal (journald, CI logs), a human
console format on a terminal.  The stream is ``$CRAWLD_LOG_STREAM``:
``stdout`` for the daemon and its children (journald), ``stderr`` (the
default) for ``crawlctl``, whose stdout carries results.  Every line carries ``event``,
``level``, ``timestamp`` (UTC ISO-8601) and whatever context the process
bound (``crawl_id``, ``shard``, ``proc``).
"""

from __future__ import annotations

import logging
import os
import sys

import structlog


def setup(level: str | None = None, **context) -> structlog.stdlib.BoundLogger:
    """Configure structlog for this process; returns a logger bound to ``context``.

    ``level`` defaults to ``$CRAWLD_LOG_LEVEL`` or ``info``.
    """
    level_name = (level or os.environ.get("CRAWLD_LOG_LEVEL") or "info").lower()
    lvl = getattr(logging, level_name.upper(), logging.INFO)
    stream = sys.stdout if os.environ.get("CRAWLD_LOG_STREAM") == "stdout" else sys.stderr
    tty = stream.isatty()
    renderer = structlog.dev.ConsoleRenderer(colors=False) if tty else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # one write() per line: processes sharing the journald stream (or a
        # log file) never interleave inside a line (print() writes the line
        # and its newline apart)
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger().bind(**context)

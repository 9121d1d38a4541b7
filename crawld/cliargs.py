"""Command-line plumbing shared by ``crawlctl``, ``crawld`` and the worker:
a parser whose usage errors exit 64 (EX_USAGE), and argument types that
reject bad values with a message naming the value."""

from __future__ import annotations

import argparse
import sys
from urllib.parse import urlsplit

from . import exitcodes, keys


class Parser(argparse.ArgumentParser):
    """argparse with the documented usage exit code (64, EX_USAGE)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message}\n")


def int_range(lo: int, hi: int):
    """Type: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is not between {lo} and {hi}")
        return v
    return parse


def percent(text: str) -> float:
    """Type: a percentage, a number in [0, 1000]."""
    try:
        v = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (a percentage)") from None
    if not 0 <= v <= 1000:
        raise argparse.ArgumentTypeError(f"{text} must be between 0 and 1000 (%)")
    return v


def positive_float(text: str) -> float:
    """Type: a number > 0 (seconds, usually)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v < 1e9:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return v


def crawl_id_arg(text: str) -> str:
    """Type: a crawl id usable in key names (see crawld.keys)."""
    try:
        return keys.check_crawl_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def proxy_url(text: str) -> str:
    """Type: an ``http://HOST:PORT`` proxy URL."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http://HOST:PORT proxy URL")
    return text


def nonempty_path(text: str) -> str:
    """Type: a non-empty path."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text

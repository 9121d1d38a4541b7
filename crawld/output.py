"""Per-shard NDJSON parts: append, make durable, rotate.

Layout under the crawl's output directory::

    parts/<crawl_id>/shard-<NNNN>/part-<UTC time>-<hostname>-<pid>-<n>.ndjson
    parts/<crawl_id>/shard-<NNNN>/skip-<UTC time>-<hostname>-<pid>-<n>.ndjson
    parts/<crawl_id>/shard-<NNNN>/dead-letters.ndjson

``part-`` files hold the rows of URLs worked on (fetched, redirected,
failed, blocked at fetch time), ``skip-`` files the rows of URLs recorded
without a fetch (out of scope, over depth, ...), ``dead-letters`` the
dead-lettered ones.  :func:`list_parts` returns them in that order, which is
the merge's order of preference when a URL has rows of several kinds.

A part being written ends in ``.ndjson.open`` and is renamed to
``.ndjson`` when closed (size or age rotation, or worker exit).  Rows are
written in batches that end with ``fdatasync``: the worker acks a claim only
after its row is on disk, so a killed worker can leave at most an unacked,
partly written last line, which ``crawlctl merge`` skips (that URL is
fetched again after the visibility timeout).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable

OPEN_SUFFIX = ".ndjson.open"
CLOSED_SUFFIX = ".ndjson"


def check_writable(output: str | os.PathLike) -> Path:
    """Create ``output`` if needed and prove a file can be written there.

    Raises:
        OSError: with ``filename`` set, when it cannot.
    """
    path = Path(output)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".crawld-write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
    return path


def parts_dir(output: str | os.PathLike, crawl_id: str) -> Path:
    """Directory holding every part of ``crawl_id``."""
    return Path(output) / "parts" / crawl_id


def shard_dir(output: str | os.PathLike, crawl_id: str, shard: int) -> Path:
    """Directory holding the parts of one shard."""
    return parts_dir(output, crawl_id) / f"shard-{shard:04d}"


#: file name prefixes, in the merge's order of preference
PART_KINDS = ("part", "dead-letters", "skip")


def list_parts(output: str | os.PathLike, crawl_id: str) -> list[Path]:
    """Every part of a crawl, closed or still open: fetch parts, then
    dead letters, then skip parts, each group sorted."""
    root = parts_dir(output, crawl_id)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("shard-*/*") if p.name.endswith((CLOSED_SUFFIX, OPEN_SUFFIX))
             and p.name.split("-", 1)[0] in ("part", "skip", "dead")]

    def rank(p: Path) -> tuple[int, str]:
        kind = 1 if p.name.startswith("dead-letters") else (2 if p.name.startswith("skip-") else 0)
        return kind, str(p)
    return sorted(found, key=rank)


_PART_SEQ = itertools.count(1)


class PartWriter:
    """Appends rows to the current part of one shard.

    ``max_bytes`` and ``max_age_s`` bound a part before it is closed and a
    new one opened.  ``sync`` is called with the file descriptor to make a
    batch durable (default ``os.fdatasync``; the worker passes one that runs
    in a thread so the event loop is not blocked).

    ``on_close(path)``, when given, is called with each closed part (e.g. to
    ship it); :meth:`rotate_if_old` closes a part past ``max_age_s`` even
    when no row comes (the worker calls it periodically).

    Raises ``OSError`` when the directory cannot be created or written.
    """

    def __init__(self, output: str | os.PathLike, crawl_id: str, shard: int,
                 max_bytes: int = 64 * 1024 * 1024, max_age_s: float = 300.0,
                 sync: Callable[[int], Any] = os.fdatasync, kind: str = "part",
                 on_close: Callable[[Path], Any] | None = None):
        if kind not in ("part", "skip"):
            raise ValueError(f"part kind must be 'part' or 'skip', not {kind!r}")
        self.kind = kind
        self.dir = shard_dir(output, crawl_id, shard)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._sync = sync
        self._on_close = on_close
        self._seq = 0
        self._file = None
        self._path: Path | None = None
        self._size = 0
        self._opened = 0.0
        self.rows_written = 0

    def _open(self) -> None:
        # unique in the process, not only in this writer: a crawl served
        # again after a rebalance gets new writers for the same shard
        self._seq = next(_PART_SEQ)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"{self.kind}-{stamp}-{socket.gethostname()}-{os.getpid()}-{self._seq:05d}{OPEN_SUFFIX}"
        self._path = self.dir / name
        self._file = open(self._path, "ab", buffering=0)
        self._size = 0
        self._opened = time.monotonic()

    def write(self, rows: Iterable[dict[str, Any]]) -> int:
        """Append rows, then make them durable.  Returns bytes written.

        Raises:
            OSError: nothing of this batch is left in the part (it is cut
                back), so the caller may retry the same batch.
        """
        data = b"".join(
            json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n" for r in rows
        )
        if not data:
            return 0
        if self._file is None:
            self._open()
        view = memoryview(data)
        try:
            while view:
                n = self._file.write(view)
                view = view[n:]
            self._sync(self._file.fileno())
        except OSError:
            # a failed batch (e.g. ENOSPC) must not leave a torn line that
            # the retried batch would be glued to: cut back to the last
            # durable end
            try:
                os.ftruncate(self._file.fileno(), self._size)
            except OSError:
                pass
            raise
        self._size += len(data)
        self.rows_written += data.count(b"\n")
        if self._size >= self.max_bytes or time.monotonic() - self._opened >= self.max_age_s:
            self.close()
        return len(data)

    def close(self) -> Path | None:
        """Close the current part (renamed to ``.ndjson``); returns its path."""
        if self._file is None:
            return None
        self._file.close()
        self._file = None
        assert self._path is not None
        final = self._path.with_name(self._path.name[: -len(OPEN_SUFFIX)] + CLOSED_SUFFIX)
        os.replace(self._path, final)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if self._on_close is not None:
            self._on_close(final)
        return final

    def rotate_if_old(self) -> Path | None:
        """Close the current part if it is older than ``max_age_s`` (rows
        in it are durable already); returns the closed path, else None."""
        if self._file is not None and time.monotonic() - self._opened >= self.max_age_s:
            return self.close()
        return None


#: name of the part holding a shard's dead-lettered entries; rewritten whole
#: at each export (see :func:`list_parts` for its place in the merge order).
DEAD_LETTER_PART = "dead-letters" + CLOSED_SUFFIX


def write_dead_letter_part(output: str | os.PathLike, crawl_id: str, shard: int,
                           rows: list[dict[str, Any]]) -> Path | None:
    """Atomically (re)write the dead-letter part of a shard; None if no rows."""
    d = shard_dir(output, crawl_id, shard)
    path = d / DEAD_LETTER_PART
    if not rows:
        path.unlink(missing_ok=True)
        return None
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{DEAD_LETTER_PART}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path

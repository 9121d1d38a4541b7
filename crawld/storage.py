"""Where a crawl's parts and artifact live: a local directory or S3.

A crawl's ``output`` (crawl setting; machine default ``OUTPUT_BUCKET``) is
either a local directory or ``s3://bucket[/prefix]``.  :func:`open_storage`
gives one interface for both, addressed by *keys*: ``/``-separated paths
relative to the output root, the same layout in both::

    parts/<crawl_id>/shard-<NNNN>/<part name>.ndjson     (crawld.output)
    crawls/YYYY/MM/DD/<crawl_id>.parquet                 (crawld.merge)

S3 goes through boto3 with its standard configuration: credentials from the
environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), the shared
files (``~/.aws``, ``AWS_PROFILE``) or an instance role; the region from
``AWS_REGION``/``AWS_DEFAULT_REGION`` (default ``us-east-1``); any
S3-compatible endpoint from ``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3``,
which botocore (>= 1.31) reads itself.  boto3 is imported only when an
``s3://`` output is used.

With an ``s3://`` output, workers write parts to a local spool directory
(machine setting ``CRAWLD_SPOOL_DIR``, same layout) and ship each closed
part to the bucket (:class:`PartShipper`), deleting the local copy only
after a successful upload; a part left in the spool (worker killed, upload
failing at exit) is shipped when a worker of that shard starts again
(:func:`recover_spool`), or by ``crawlctl run`` before its merge
(:func:`ship_spool`).  Acks never wait for an upload: they follow the local
fdatasync as with a local output.

The merge (:func:`merged`) downloads the parts into a temporary directory
mirroring the layout, runs :func:`crawld.merge.merge_crawl` there and uploads
the artifact.

Errors: every failure is a :class:`StorageError` (an ``OSError``) whose
``str()`` is one line naming the location (``s3://bucket/prefix`` or the
directory) and what went wrong; the CLI prints it and exits with
:data:`crawld.exitcodes.CANTCREAT` (73).
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator

from .output import CLOSED_SUFFIX, OPEN_SUFFIX, shard_dir

S3_SCHEME = "s3://"
#: default of the machine setting CRAWLD_SPOOL_DIR (the unit's StateDirectory)
DEFAULT_SPOOL_DIR = "/var/lib/crawld/spool"


class StorageError(OSError):
    """A storage operation failed; ``str(err)`` is one line naming the
    location.  ``retryable`` is False for errors that waiting will not fix
    (no such bucket, access denied)."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable

    def __str__(self) -> str:
        return str(self.args[0])


def is_remote(location: str | os.PathLike) -> bool:
    """Whether ``location`` is an ``s3://`` URL (else a local directory)."""
    return str(location).startswith(S3_SCHEME)


@dataclass(frozen=True)
class ObjectInfo:
    """One stored file: ``key`` relative to the output root, ``size`` in bytes."""

    key: str
    size: int


class Storage(abc.ABC):
    """The operations crawld needs from an output location.  ``url`` is the
    location as given (``s3://bucket/prefix`` or an absolute directory).
    Implemented by :class:`LocalStorage` and :class:`S3Storage`."""

    url: str

    @abc.abstractmethod
    def location_of(self, key: str) -> str:
        """The full location of ``key``: a path, or ``s3://bucket/prefix/key``."""

    @abc.abstractmethod
    def check_writable(self) -> None:
        """Prove a file can be written (and deleted) at the location.
        Raises :class:`StorageError`."""

    @abc.abstractmethod
    def upload(self, local: str | os.PathLike, key: str) -> int:
        """Copy the local file to ``key`` (replacing it); returns its size in
        bytes.  The stored file appears whole or not at all."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def download(self, key: str, local: str | os.PathLike) -> int:
        """Copy ``key`` to the local file (parents created); returns bytes."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""


class LocalStorage(Storage):
    """A local directory (created on demand)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*PurePosixPath(key).parts)

    def location_of(self, key: str) -> str:
        return str(self._path(key))

    def check_writable(self) -> None:
        from .output import check_writable

        try:
            check_writable(self.root)
        except OSError as exc:
            raise StorageError(f"output {self.root}: not writable ({exc.strerror or exc})", False) from None

    def upload(self, local: str | os.PathLike, key: str) -> int:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        shutil.copyfile(local, tmp)
        os.replace(tmp, dest)
        return dest.stat().st_size

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        if not base.is_dir():
            return []
        out = []
        for p in base.rglob("*"):
            if p.is_file():
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    out.append(ObjectInfo(key, p.stat().st_size))
        return sorted(out, key=lambda o: o.key)

    def download(self, key: str, local: str | os.PathLike) -> int:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(key), local)
        return Path(local).stat().st_size

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``.

    Raises:
        StorageError: no bucket name.
    """
    rest = url[len(S3_SCHEME):] if url.startswith(S3_SCHEME) else url
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise StorageError(f"output {url}: no bucket name (expected s3://bucket/prefix)", False)
    return bucket, prefix.strip("/")


class S3Storage(Storage):
    """``s3://bucket/prefix`` through boto3 (see the module doc for its
    configuration).  ``connect_timeout_s``/``read_timeout_s`` bound each
    request; ``attempts`` is botocore's total tries per request (standard
    retry mode, with its own backoff)."""

    def __init__(self, url: str, connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0,
                 attempts: int = 3):
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"{S3_SCHEME}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._opts = (connect_timeout_s, read_timeout_s, attempts)
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            ct, rt, attempts = self._opts
            self._client = boto3.session.Session().client(
                "s3", config=Config(connect_timeout=ct, read_timeout=rt,
                                    retries={"mode": "standard", "total_max_attempts": attempts}))
        return self._client

    @property
    def endpoint(self) -> str:
        return self.client.meta.endpoint_url

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def location_of(self, key: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self._key(key)}"

    def _error(self, what: str, exc: BaseException) -> StorageError:
        """One line naming the bucket for a boto3/botocore exception."""
        from botocore import exceptions as bex

        where = f"output {self.url}"
        if isinstance(exc, bex.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchBucket",) or (code == "404" and what == "check"):
                return StorageError(f"{where}: bucket {self.bucket!r} does not exist (at {self.endpoint})", False)
            if code in ("AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
                        "SignatureDoesNotMatch") or status == 403:
                return StorageError(f"{where}: {what} refused: {code} {err.get('Message', '')}".rstrip(), False)
            return StorageError(f"{where}: {what} failed: {code} {err.get('Message', '')}".rstrip())
        if isinstance(exc, bex.NoCredentialsError):
            return StorageError(f"{where}: no AWS credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                                "AWS_PROFILE or an instance role)", False)
        if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError, bex.ReadTimeoutError,
                            bex.ConnectionClosedError)):
            return StorageError(f"{where}: endpoint {self.endpoint} not reachable ({_one_line(exc)})")
        return StorageError(f"{where}: {what} failed: {_one_line(exc)}")

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            raise self._error(what, exc) from None
        except Boto3Error as exc:  # S3UploadFailedError wraps the ClientError
            cause = exc.__cause__ or exc.__context__
            raise self._error(what, cause if isinstance(cause, (BotoCoreError, ClientError)) else exc) from None

    def check_writable(self) -> None:
        probe = self._key(f".crawld-write-test-{socket.gethostname()}-{os.getpid()}")
        with self._errors("check"):
            self.client.put_object(Bucket=self.bucket, Key=probe, Body=b"")
        try:
            self.client.delete_object(Bucket=self.bucket, Key=probe)
        except Exception:  # noqa: BLE001 - writing is what matters; a lingering probe is harmless
            pass

    def upload(self, local: str | os.PathLike, key: str) -> int:
        from boto3.s3.transfer import TransferConfig

        size = os.path.getsize(local)
        with self._errors(f"upload of {key}"):
            # no transfer threads: called from a greenlet, the (monkey-
            # patched) sockets yield; multipart above 64 MiB
            self.client.upload_file(str(local), self.bucket, self._key(key),
                                    Config=TransferConfig(use_threads=False,
                                                          multipart_threshold=64 * 1024 * 1024))
        return size

    def list(self, prefix: str) -> list[ObjectInfo]:
        out = []
        strip = len(self._key(""))
        with self._errors(f"listing of {prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                        Prefix=self._key(prefix))
            for page in pages:
                for obj in page.get("Contents", ()):
                    out.append(ObjectInfo(obj["Key"][strip:], int(obj["Size"])))
        return sorted(out, key=lambda o: o.key)

    def download(self, key: str, local: str | os.PathLike) -> int:
        from boto3.s3.transfer import TransferConfig

        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with self._errors(f"download of {key}"):
            self.client.download_file(self.bucket, self._key(key), str(local),
                                      Config=TransferConfig(use_threads=False))
        return Path(local).stat().st_size

    def delete(self, key: str) -> None:
        with self._errors(f"delete of {key}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def open_storage(location: str | os.PathLike, **s3_options: Any) -> Storage:
    """The storage of an output location (``s3://...`` or a directory)."""
    if is_remote(location):
        return S3Storage(str(location), **s3_options)
    return LocalStorage(location)


def check_output(location: str | os.PathLike) -> Storage:
    """Start-up check: the output location is reachable and writable (a
    probe file is written and deleted).  For S3 each request gets a short
    time-out and two tries, so an unreachable endpoint fails within seconds.

    Raises:
        StorageError: one line naming the bucket or directory.
    """
    storage = open_storage(location, connect_timeout_s=5.0, read_timeout_s=15.0, attempts=2) \
        if is_remote(location) else open_storage(location)
    storage.check_writable()
    return storage


# -- parts ------------------------------------------------------------------------

def parts_prefix(crawl_id: str) -> str:
    """Key prefix of every part of ``crawl_id``."""
    return f"parts/{crawl_id}/"


def part_key(root: str | os.PathLike, path: str | os.PathLike) -> str:
    """The key of a local part under ``root`` (a spool or output dir), with
    ``.ndjson.open`` named as closed (``.ndjson``)."""
    key = Path(path).relative_to(root).as_posix()
    if key.endswith(OPEN_SUFFIX):
        key = key[: -len(OPEN_SUFFIX)] + CLOSED_SUFFIX
    return key


def list_remote_parts(storage: Storage, crawl_id: str) -> list[ObjectInfo]:
    """The parts of ``crawl_id`` stored at ``storage`` (part, skip and
    dead-letter files; paginated listing)."""
    return [o for o in storage.list(parts_prefix(crawl_id))
            if o.key.rsplit("/", 1)[-1].split("-", 1)[0] in ("part", "skip", "dead")
            and o.key.endswith(CLOSED_SUFFIX) and o.key.count("/") == 3]


def spool_dir(environ: dict[str, str] | None = None) -> Path:
    """The local spool of parts bound for remote outputs:
    ``$CRAWLD_SPOOL_DIR``, default :data:`DEFAULT_SPOOL_DIR`."""
    env = os.environ if environ is None else environ
    return Path(env.get("CRAWLD_SPOOL_DIR") or DEFAULT_SPOOL_DIR)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_spool(spool: str | os.PathLike, crawl_id: str, shard: int) -> list[Path]:
    """Parts of ``crawl_id``/``shard`` left in the spool by an earlier worker
    (killed, or its upload failed): closed parts, and open parts whose writer
    (this host's pid in the name) is gone, which are closed (renamed) first.
    A killed worker's open part may end in a torn line; the merge skips it.
    Returns the closed paths to ship, oldest name first."""
    d = shard_dir(spool, crawl_id, shard)
    if not d.is_dir():
        return []
    host = socket.gethostname()
    out = []
    for p in sorted(d.iterdir()):
        if p.name.endswith(OPEN_SUFFIX):
            # <kind>-<stamp>-<host>-<pid>-<seq>.ndjson.open; the host may hold '-'
            stem = p.name[: -len(OPEN_SUFFIX)]
            try:
                _, rest = stem.split("-", 1)
                _, rest = rest.split("-", 1)
                owner, pid_text, _ = rest.rsplit("-", 2)
                pid = int(pid_text)
            except ValueError:
                continue
            if pid == os.getpid() or (owner == host and _pid_alive(pid)):
                continue
            final = p.with_name(stem + CLOSED_SUFFIX)
            try:
                os.replace(p, final)
            except FileNotFoundError:
                continue
            out.append(final)
        elif p.name.endswith(CLOSED_SUFFIX) and p.name.split("-", 1)[0] in ("part", "skip"):
            out.append(p)
    return sorted(out)


def ship_spool(spool: str | os.PathLike, output: str, crawl_id: str, num_shards: int) -> tuple[int, int]:
    """Ship (synchronously) every part of ``crawl_id`` left in the spool to
    ``output``, deleting each local copy after its upload.  Returns (parts,
    bytes).  Raises :class:`StorageError` on the first failed upload."""
    storage = open_storage(output)
    n = size = 0
    for shard in range(num_shards):
        for p in recover_spool(spool, crawl_id, shard):
            size += storage.upload(p, part_key(spool, p))
            p.unlink(missing_ok=True)
            n += 1
    return n, size


class PartShipper:
    """Ships closed parts from the spool to their remote output, in the
    background of a gevent worker.

    :meth:`add` queues a closed part (``on_ship(nbytes)`` and
    ``on_failure()`` are called after each upload and failed try, for the
    metrics); :meth:`run` (a greenlet) uploads them in order, deletes the
    local copy after each success, and on failure waits ``backoff_s``
    doubling up to ``backoff_max_s`` before trying again (the part stays
    spooled).  With monkey-patched sockets an upload yields to the event
    loop while it waits for the network.  :meth:`flush` waits until the
    queue is empty or a deadline passes (worker exit)."""

    def __init__(self, log, backoff_s: float = 1.0, backoff_max_s: float = 60.0):
        import gevent.event

        self.log = log
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._queue: list[tuple[Path, Storage, str, Callable[[int], None], Callable[[], None]]] = []
        self._queued: set[Path] = set()
        self._ready = gevent.event.Event()
        self._idle = gevent.event.Event()
        self._idle.set()
        self.shipped = 0
        self.failures = 0

    def pending(self) -> int:
        return len(self._queue)

    def add(self, path: Path, storage: Storage, key: str, on_ship: Callable[[int], None] = lambda n: None,
            on_failure: Callable[[], None] = lambda: None) -> None:
        if path in self._queued:
            return
        self._queued.add(path)
        self._queue.append((path, storage, key, on_ship, on_failure))
        self._idle.clear()
        self._ready.set()

    def run(self) -> None:
        import gevent

        delay = self.backoff_s
        while True:
            if not self._queue:
                self._idle.set()
                self._ready.clear()
                self._ready.wait()
                continue
            path, storage, key, on_ship, on_failure = self._queue[0]
            try:
                if path.exists():
                    n = storage.upload(path, key)
                    path.unlink(missing_ok=True)
                    on_ship(n)
                    self.shipped += 1
                    self.log.info("part_shipped", part=key, bytes=n, to=storage.location_of(key))
            except Exception as exc:  # noqa: BLE001 - never lose the shipper: retry
                if not path.exists():  # shipped and removed by another worker meanwhile
                    pass
                else:
                    self.failures += 1
                    on_failure()
                    self.log.error("part_ship_failed", part=key, error=_one_line(exc),
                                   retry_in_s=round(delay, 2))
                    gevent.sleep(delay)
                    delay = min(delay * 2, self.backoff_max_s)
                    continue
            delay = self.backoff_s
            self._queue.pop(0)
            self._queued.discard(path)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued part is shipped; False on time-out
        (the rest stays in the spool for the next start)."""
        return self._idle.wait(timeout=timeout_s) and not self._queue


# -- merge ------------------------------------------------------------------------

@contextlib.contextmanager
def merged(output: str, crawl_id: str, created_at: str, workdir: str | os.PathLike | None = None):
    """Merge the parts of ``crawl_id`` at ``output`` into its artifact.

    Yields ``(result, artifact)``: the :class:`crawld.merge.MergeResult`
    (whose ``path`` is a local file, readable inside the ``with`` block) and
    the artifact's location (a path, or its ``s3://`` URL once uploaded).
    For a remote output, the parts are downloaded one by one into a
    temporary directory (under ``workdir``, default ``$TMPDIR``) that
    mirrors the layout, merged there with :func:`crawld.merge.merge_crawl`,
    and the artifact is uploaded to ``crawls/YYYY/MM/DD/<crawl_id>.parquet``;
    the directory is removed on exit.  Needs local disk for the parts and
    the artifact.

    Raises:
        StorageError: listing, a download or the upload failed.
        FileNotFoundError: no parts of the crawl (``filename`` is the place
            looked at).
    """
    from .merge import artifact_path, merge_crawl
    from .output import list_parts

    if not is_remote(output):
        if not list_parts(output, crawl_id):
            raise FileNotFoundError(2, "no parts", f"{output}/parts/{crawl_id}")
        res = merge_crawl(output, crawl_id, created_at)
        yield res, str(res.path)
        return
    storage = open_storage(output)
    parts = list_remote_parts(storage, crawl_id)
    if not parts:
        raise FileNotFoundError(2, "no parts", storage.location_of(parts_prefix(crawl_id)))
    tmp = Path(tempfile.mkdtemp(prefix=f"crawld-merge-{crawl_id}-", dir=workdir))
    try:
        for o in parts:
            storage.download(o.key, tmp.joinpath(*PurePosixPath(o.key).parts))
        res = merge_crawl(tmp, crawl_id, created_at)
        key = Path(artifact_path(tmp, crawl_id, created_at)).relative_to(tmp).as_posix()
        storage.upload(res.path, key)
        yield res, storage.location_of(key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def local_copy(location: str) -> Iterator[Path]:
    """A local path to read the file at ``location`` (a path, or an
    ``s3://bucket/key`` URL downloaded to a temporary file removed on exit).

    Raises:
        FileNotFoundError: no such file or object.
        StorageError: the download failed otherwise.
    """
    if not is_remote(location):
        yield Path(location)
        return
    bucket, key = parse_s3_url(location)
    storage = S3Storage(f"{S3_SCHEME}{bucket}")
    tmp = Path(tempfile.mkdtemp(prefix="crawld-artifact-"))
    try:
        try:
            storage.download(key, tmp / PurePosixPath(key).name)
        except StorageError as exc:
            if "404" in str(exc) or "Not Found" in str(exc) or "NoSuchKey" in str(exc):
                raise FileNotFoundError(2, "no such object", location) from None
            raise
        yield tmp / PurePosixPath(key).name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)



def with_location(result: Any, location: str) -> Any:
    """A copy of a :class:`crawld.merge.MergeResult` whose ``path`` is the
    artifact's location (e.g. its ``s3://`` URL), for the merge record."""
    import copy
    import dataclasses

    if dataclasses.is_dataclass(result):
        return dataclasses.replace(result, path=location)
    out = copy.copy(result)
    out.path = location
    return out

"""Machine settings of crawld and crawlctl: the one documented list.

Read from ``/etc/crawl-workers/shard_config.json`` (or ``$CRAWLD_CONFIG``)
and then from the environment (``/etc/crawl-workers/env`` is the systemd
``EnvironmentFile``); the environment overrides the file.  In the JSON file
a setting is spelt in lower case (``"num_workers": 64``); its ``"crawl"``
object holds defaults for the crawl settings of crawls created on this
machine (``crawlctl seed`` / ``run``; see ``crawlctl settings``).

Every invalid value is a :class:`crawld.config.ConfigError` whose message
starts with the setting's name, e.g. ``NUM_WORKERS: must be between 1 and
1000, got 0``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .config import SETTINGS as CRAWL_SETTINGS
from .config import ConfigError, number_check
from .keys import check_crawl_id

#: the JSON file read when $CRAWLD_CONFIG is not set
DEFAULT_CONFIG_PATH = "/etc/crawl-workers/shard_config.json"


def _url(v: Any) -> str:
    from .redisconn import redact

    v = str(v).strip()
    if not v.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {redact(v)!r}")
    return v


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(v: Any) -> Any:
        return None if v in (None, "") else check(v)
    return run


def _crawl_id(v: Any) -> str:
    return check_crawl_id(str(v).strip())


def _shard_set(v: Any) -> str:
    from .daemon import parse_shard_set

    try:
        parse_shard_set(str(v))
    except ConfigError as exc:
        raise ValueError(str(exc).split(": ", 1)[1]) from None
    return str(v)


def _proxy(v: Any) -> str:
    from .cliargs import proxy_url

    try:
        return proxy_url(str(v).strip())
    except Exception as exc:  # argparse.ArgumentTypeError
        raise ValueError(str(exc)) from None


def _level(v: Any) -> str:
    v = str(v).strip().lower()
    if v not in ("debug", "info", "warning", "error"):
        raise ValueError(f"must be debug, info, warning or error, got {v!r}")
    return v


def _text(v: Any) -> str:
    v = str(v).strip()
    if not v:
        raise ValueError("must not be empty")
    return v


def _output(v: Any) -> str:
    v = _text(v)
    if v.startswith("s3://") and not v[5:].split("/", 1)[0]:
        raise ValueError(f"must name a bucket: s3://bucket/prefix, got {v!r}")
    return v


@dataclass(frozen=True)
class MachineSetting:
    """One machine setting: its environment variable, unit, default, meaning."""

    env: str
    unit: str
    default: Any
    doc: str
    check: Callable[[Any], Any]

    @property
    def key(self) -> str:
        """Its spelling in the JSON file."""
        return self.env.lower()


#: every machine setting, in documentation order
MACHINE_SETTINGS: tuple[MachineSetting, ...] = (
    MachineSetting("REDIS_URL", "URL", None, "the frontier's Redis: redis://[user:password@]host:port/db, "
                   "rediss://... for TLS (ssl_ca_certs=... in the query for a private CA)", _optional(_url)),
    MachineSetting("CRAWL_ID", "", None, "serve only this crawl (default: every crawl in Redis)",
                   _optional(_crawl_id)),
    MachineSetting("CRAWLD_SHARDS", "shards", None, "shard set served when neither --shards nor the systemd "
                   "instance gives one (0-3, 0,2,5)", _optional(_shard_set)),
    MachineSetting("NUM_WORKERS", "fetches", 32, "concurrent fetches per shard worker process",
                   number_check(1, 1000, True)),
    MachineSetting("DRAIN_TIMEOUT_S", "s", 30.0, "time a worker gets on SIGTERM to finish fetches and commit",
                   number_check(0.1, 3600)),
    MachineSetting("LEASE_TTL_S", "s", 15.0, "a shard lease not renewed within this lapses (standbys take over)",
                   number_check(1, 3600)),
    MachineSetting("CRASH_LOOP_LIMIT", "restarts", 5, "quick restarts in a row before a child is given up",
                   number_check(1, 1000, True)),
    MachineSetting("CRAWLD_PROXY", "URL", None, "HTTP proxy for every request (else HTTP_PROXY/HTTPS_PROXY)",
                   _optional(_proxy)),
    MachineSetting("OUTPUT_BUCKET", "path or URL", None, "output location of crawls created on this machine "
                   "(crawl setting 'output'): a directory, or s3://bucket/prefix (boto3: AWS_* credentials, "
                   "AWS_ENDPOINT_URL for any S3-compatible endpoint)", _optional(_output)),
    MachineSetting("CRAWLD_SPOOL_DIR", "path", "/var/lib/crawld/spool", "local directory where workers write "
                   "the parts of s3:// outputs until each closed part is uploaded", _text),
    MachineSetting("MAX_RPS_PER_HOST", "requests/s", None, "rate limit of crawls created on this machine "
                   "(crawl setting 'max_rps_per_host')", _optional(number_check(0.001, 10000))),
    MachineSetting("METRICS_PORT", "port", 9410, "port of the Prometheus /metrics endpoint (0 = off)",
                   number_check(0, 65535, True)),
    MachineSetting("CRAWLD_LOG_LEVEL", "", "info", "log level: debug, info, warning or error", _level),
)

_BY_ENV = {s.env: s for s in MACHINE_SETTINGS}
_CRAWL_NAMES = {s.name for s in CRAWL_SETTINGS} - {"crawl_id", "seeds", "created_at"}


@dataclass(frozen=True)
class MachineSettings:
    """The validated machine settings (see :data:`MACHINE_SETTINGS`);
    ``crawl_defaults`` are crawl settings for crawls created here."""

    values: dict[str, Any]
    crawl_defaults: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def __getitem__(self, env_name: str) -> Any:
        return self.values[env_name]


def load(environ: Mapping[str, str] | None = None, path: str | os.PathLike | None = None) -> MachineSettings:
    """Read the JSON file (if it exists), then the environment over it.

    Raises:
        ConfigError: an unreadable file, an unknown key or an invalid value,
            naming the setting.
    """
    env = os.environ if environ is None else environ
    path = Path(path or env.get("CRAWLD_CONFIG") or DEFAULT_CONFIG_PATH)
    raw: dict[str, Any] = {}
    crawl: dict[str, Any] = {}
    source = ""
    if path.exists():
        source = str(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: cannot be read as JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: must hold a JSON object")
        for key, value in data.items():
            if key == "crawl":
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: 'crawl' must be an object of crawl settings")
                unknown = set(value) - _CRAWL_NAMES
                if unknown:
                    raise ConfigError(f"{sorted(unknown)[0]}: unknown crawl setting in {path}")
                crawl = dict(value)
            elif key.upper() in _BY_ENV:
                raw[key.upper()] = value
            else:
                raise ConfigError(f"{key}: unknown setting in {path}")
    for name in _BY_ENV:
        if env.get(name) not in (None, ""):
            raw[name] = env[name]
    values = {}
    for s in MACHINE_SETTINGS:
        try:
            values[s.env] = s.check(raw[s.env]) if s.env in raw else s.default
        except ValueError as exc:
            raise ConfigError(f"{s.env}: {exc}") from None
    if values["OUTPUT_BUCKET"] is not None:
        crawl["output"] = values["OUTPUT_BUCKET"]
    if values["MAX_RPS_PER_HOST"] is not None:
        crawl["max_rps_per_host"] = values["MAX_RPS_PER_HOST"]
    return MachineSettings(values, crawl, source)


def settings_table() -> str:
    """The machine settings as aligned text (for ``crawlctl settings``)."""
    rows = [("variable", "default", "unit", "meaning")]
    for s in MACHINE_SETTINGS:
        rows.append((s.env, "(none)" if s.default is None else str(s.default), s.unit, s.doc))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows)

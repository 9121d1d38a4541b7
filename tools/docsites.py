"""The real documentation sites of the demo and benchmarks.

Each is a documentation set from a Debian package, served under a made-up
host name with a real public suffix (so each is its own registered domain).
"""

from __future__ import annotations

from pathlib import Path

#: host name -> (Debian package, directory, seed path); the names are picked
#: so that the four registered domains land on four different shards of 4
#: (crawld.sharding.shard_of), so that the demo uses every shard
SITES = {
    "docs.pyref-demo.org": ("python3-doc", "/usr/share/doc/python3-doc/html", "/index.html"),
    "www.pgdocs-demo.co.uk": ("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html", "/index.html"),
    "sqlite.dbmanual-demo.net": ("sqlite3-doc", "/usr/share/doc/sqlite3", "/index.html"),
    "git.scm-demo.io": ("git-doc", "/usr/share/doc/git-doc", "/index.html"),
}


def missing_packages() -> list[str]:
    """Debian packages whose documentation directory is absent."""
    return [pkg for pkg, d, _ in SITES.values() if not Path(d).is_dir()]


def seeds() -> list[str]:
    """The seed URL of every site."""
    return [f"http://{h}{seed}" for h, (_, _, seed) in SITES.items()]


def site_dirs() -> dict[str, str]:
    """host -> directory, for crawld.sitesrv."""
    return {h: d for h, (_, d, _) in SITES.items()}

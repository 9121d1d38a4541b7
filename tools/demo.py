#!/usr/bin/env python3
"""``make demo``: a real multi-shard crawl of real documentation sites.

Serves four documentation sets installed from Debian packages, each under a
made-up host name with a real public suffix, from one loopback server that
is also the crawler's HTTP proxy; runs ``crawlctl run`` over them across
four shards; prints the artifact path, the crawl summary and what the server
saw (requests, URLs fetched twice).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from crawld.ratecheck import limits, max_in_window, rate_violations  # noqa: E402
from crawld.sharding import politeness_key  # noqa: E402
from crawld.sitesrv import SiteServer  # noqa: E402
from docsites import SITES, missing_packages, seeds, site_dirs  # noqa: E402


#: the demo's rate limit per registered domain (requests/s)
RPS = 50.0


def main() -> int:
    missing = missing_packages()
    if missing:
        print(f"demo: missing Debian packages: {' '.join(missing)} (run 'make demo', which installs them)",
              file=sys.stderr)
        return 1
    out = ROOT / "demo-output"
    srv = SiteServer(("127.0.0.1", 0), site_dirs())
    with srv:
        rc = crawl(srv.url, out)
        counts = srv.counts()
        hits = srv.hits()
    twice = sum(1 for n in counts.values() if n > 1)
    print(f"server       {sum(counts.values())} requests, {len(counts)} distinct URLs, {twice} fetched twice")
    by_domain: dict[str, list[float]] = {}
    for h in hits:
        by_domain.setdefault(politeness_key(h.host), []).append(h.t)
    lim1, _ = limits(RPS)
    busiest = {d: max_in_window(ts, 1.0) for d, ts in by_domain.items()}
    print(f"politeness   most requests in any 1 s window per site (limit {lim1} at {RPS:g}/s): "
          + ", ".join(f"{d}={n}" for d, n in sorted(busiest.items()))
          + f"; violations: {len(rate_violations(by_domain, RPS))}")
    return rc


def crawl(proxy: str, out: Path) -> int:
    """Run ``crawlctl run`` over the sites; returns its exit code."""
    cmd = [str(Path(sys.executable).with_name("crawlctl")), "run", *seeds(),
           "--shards", "4", "--workers", "16", "--max-rps-per-host", str(RPS), "--max-depth", "30",
           "--proxy", proxy, "--out", str(out)]
    env = dict(os.environ)
    env.pop("REDIS_URL", None)  # the demo uses a private redis-server
    print("demo: serving", ", ".join(f"{h} ({p})" for h, (p, _, _) in SITES.items()), f"via proxy {proxy}")
    print("demo: $", " ".join(cmd[1:]), flush=True)
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Public Suffix List conformance: crawld's registered domains against the
PSL's own test cases.

Each ``checkPublicSuffix(host, registrable_domain);`` line of
``test_psl.txt`` (publicsuffix/list ``tests/test_psl.txt``; ``null`` = no
registrable domain; commented-out lines are skipped) is run against

* :func:`crawld.sharding.registered_domain` (None for ``null``), and
* :func:`crawld.sharding.politeness_key`, which is the registered domain or,
  when there is none, the host itself,

both with the PSL's private section (``private=True``, crawld's default)
or, with ``--icann-only``, without it.  A result that differs from the
test on purpose is counted apart as "fallback, by design", with its reason
(see FALLBACKS); every other difference is a failure, listed.

It also times :func:`~crawld.sharding.politeness_key` on 100,000
distinct synthetic hosts (half under ICANN suffixes, half under
``github.io``): a cache miss (the cache cleared first) and a cache hit,
against a bare tldextract ``extract_str`` of the same hosts measured in
the same run (the baseline).

    .venv/bin/python bench/conformance_psl.py [--corpora DIR] [--icann-only] [--no-speed]

Exits 1 when a case fails (a by-design fallback is no failure).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import inspect  # noqa: E402

from crawld import sharding  # noqa: E402
from crawld.sharding import politeness_key  # noqa: E402

# an older crawld (before the private section was a choice) has neither
registered_domain = getattr(sharding, "registered_domain", None)
HAS_PRIVATE = "private" in inspect.signature(politeness_key).parameters

_CHECK = re.compile(r"checkPublicSuffix\((null|'[^']*'),\s*(null|'[^']*')\);")


def cases(path: Path) -> list[tuple[str | None, str | None]]:
    """``(host, registrable domain)`` of every active check line."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _CHECK.match(line.strip())  # "//checkPublicSuffix(...)" does not match: skipped
        if m:
            out.append(tuple(None if g == "null" else g[1:-1] for g in m.groups()))  # type: ignore[arg-type]
    return out


def _unlisted_tld(host: str) -> bool:
    """Is the host's top-level label missing from the PSL (so only the PSL's
    default rule ``*`` would make it a public suffix)?"""
    return sharding._EXTRACT.extract_str(host.lower().rstrip(".")).suffix == ""


# Where crawld departs from the PSL on purpose: (applies to (host, expected,
# got, function name), reason).
FALLBACKS: list[tuple[Callable[[str | None, str | None, object, str], bool], str]] = [
    (lambda host, want, got, fn: host is None and got == "ValueError",
     "no host: crawld refuses an empty host name (ValueError) instead of answering"),
    (lambda host, want, got, fn: fn == "politeness_key" and want is None and host is not None
     and got == host.strip().rstrip(".").lower(),
     "no registrable domain (a public suffix itself, an unlisted name, a leading dot): the host is "
     "its own politeness key"),
    (lambda host, want, got, fn: host is not None and want is not None and _unlisted_tld(host)
     and got in (None, host.lower()),
     "top-level label not in the PSL (an intranet name such as wiki.corp): crawld does not apply the "
     "PSL's default rule '*', so the name has no registered domain and the host is its own politeness key"),
]


def run(name: str, fn: Callable[[str], object], checks, private: bool) -> int:
    passed, apart, failed = 0, [], []
    for host, want in checks:
        try:
            got = fn(host) if host is not None else fn("")
        except ValueError:
            got = "ValueError"
        if got == want:
            passed += 1
            continue
        reason = next((why for pred, why in FALLBACKS if pred(host, want, got, name)), None)
        (apart if reason else failed).append((host, want, got, reason))
    total = len(checks)
    print(f"{name} (private={private}): {passed}/{total} pass ({100.0 * passed / total:.1f} %), "
          f"{len(apart)} fallback by design, {len(failed)} failed "
          f"({100.0 * (passed + len(apart)) / total:.1f} % pass or by design)")
    by_reason: dict[str, list] = {}
    for host, want, got, reason in apart:
        by_reason.setdefault(reason, []).append((host, want, got))
    for reason, rows in by_reason.items():
        print(f"  fallback, by design ({len(rows)}): {reason}")
        for host, want, got in rows:
            print(f"    {host!r}: PSL {want!r}, crawld {got!r}")
    for host, want, got, _ in failed:
        print(f"  FAILED {host!r}: PSL {want!r}, crawld {got!r}")
    return len(failed)


def speed(private: bool) -> None:
    import time

    hosts = [f"www.site-{i}.example.co.uk" for i in range(50_000)] + [f"s{i}.github.io" for i in range(50_000)]
    hot = hosts[:1000]

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    key = (lambda h: politeness_key(h, private)) if HAS_PRIVATE else politeness_key
    best = [float("inf")] * 3
    for _ in range(3):
        base = timed(lambda: [sharding._EXTRACT.extract_str(h) for h in hosts]) / len(hosts)
        politeness_key.cache_clear()
        miss = timed(lambda: [key(h) for h in hosts]) / len(hosts)
        hit = timed(lambda: [key(h) for _ in range(100) for h in hot]) / (100 * len(hot))
        best = [min(a, b) for a, b in zip(best, (base, miss, hit))]
    base, miss, hit = best
    print(f"\nspeed (best of 3, {len(hosts)} hosts): tldextract extract_str {base * 1e6:.2f} µs/host (baseline); "
          f"politeness_key miss {miss * 1e6:.2f} µs ({miss / base:.2f}), hit {hit * 1e9:.0f} ns ({hit / base:.3f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora",
                    help="directory holding test_psl.txt (default: <repo>/../shared/corpora)")
    ap.add_argument("--icann-only", action="store_true", help="without the PSL's private section")
    ap.add_argument("--no-speed", action="store_true", help="conformance only")
    args = ap.parse_args(argv)
    private = not args.icann_only
    checks = cases(args.corpora / "test_psl.txt")
    print(f"{len(checks)} checks from test_psl.txt\n")
    failed = 0
    if registered_domain is not None:
        failed += run("registered_domain", lambda h: registered_domain(h, private), checks, private)
        print()
    if HAS_PRIVATE:
        failed += run("politeness_key", lambda h: politeness_key(h, private), checks, private)
    else:  # the ICANN section only
        failed += run("politeness_key", politeness_key, checks, False)
    if not args.no_speed:
        speed(private)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: link resolution and canonicalisation over the hrefs of real
pages, this tree's crawld.urls against a baseline revision's.

The hrefs are those of every page of the Python documentation
(``/usr/share/doc/python3-doc/html``, Debian's python3-doc), parsed with
crawld.extract.parse_html, each page served as
``https://docs.example.org/3/<path>``.  Two loops, each run over every
(page, href) in order:

* ``resolve+canonicalize``: ``canonicalize(resolve(base, href))`` for every
  href, no memo (the worst case);
* ``resolve+memo``: ``resolve`` for every href, ``canonicalize`` memoised
  per absolute URL as crawld.scope.Router does (what a worker pays).

Both implementations run in the same process, alternating, ``--rounds``
times; the best round of each is kept and the ratio new / baseline printed
(< 1: the new code is faster).  The baseline is ``crawld/urls.py`` of a git
revision (``--baseline``, default the last one with urljoin + w3lib + idna)
imported as a module of its own.

    .venv/bin/python bench/urls_speed.py [--rounds 5] [--baseline REV] [--docs DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from conformance_urls import BASELINE_REV, load_revision  # noqa: E402

from crawld.config import DEFAULT_STRIP_PARAMS  # noqa: E402
from crawld.extract import parse_html  # noqa: E402

DOCS = Path("/usr/share/doc/python3-doc/html")


def links(docs: Path) -> list[tuple[str, str]]:
    """(base, href) of every href of every page under ``docs``."""
    out = []
    for path in sorted(docs.rglob("*.html")):
        page = parse_html(path.read_bytes(), "utf-8")
        base = "https://docs.example.org/3/" + path.relative_to(docs).as_posix()
        out.extend((base, h) for h in page.hrefs)
    return out


def run_plain(urls, pairs, strip) -> int:
    resolve, canonicalize, bad = urls.resolve, urls.canonicalize, urls.BadURL
    n = 0
    for base, href in pairs:
        u = resolve(base, href)
        if u is not None:
            try:
                canonicalize(u, strip)
                n += 1
            except bad:
                pass
    return n


def run_memo(urls, pairs, strip) -> int:
    resolve, canonicalize, bad = urls.resolve, urls.canonicalize, urls.BadURL
    memo: dict[str, str | None] = {}
    n = 0
    for base, href in pairs:
        u = resolve(base, href)
        if u is None:
            continue
        c = memo.get(u, False)
        if c is False:
            try:
                c = canonicalize(u, strip)
            except bad:
                c = None
            memo[u] = c
        n += c is not None
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=BASELINE_REV)
    ap.add_argument("--docs", default=str(DOCS))
    args = ap.parse_args(argv)
    docs = Path(args.docs)
    if not docs.is_dir():
        print(f"{docs}: not found (apt install python3-doc)", file=sys.stderr)
        return 1
    pairs = links(docs)
    old = load_revision(args.baseline)
    from crawld import urls as new

    impls = {"baseline": old, "new": new}
    strips = {name: m.compile_strip(DEFAULT_STRIP_PARAMS) for name, m in impls.items()}
    best: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], int] = {}
    for _ in range(args.rounds):
        for loop_name, loop in (("resolve+canonicalize", run_plain), ("resolve+memo", run_memo)):
            for name, mod in impls.items():
                t0 = time.perf_counter()
                counts[loop_name, name] = loop(mod, pairs, strips[name])
                dt = time.perf_counter() - t0
                best[loop_name, name] = min(best.get((loop_name, name), dt), dt)
    distinct = len({h for _, h in pairs})
    print(f"{len(pairs)} hrefs ({distinct} distinct) on {len(list(docs.rglob('*.html')))} pages of {docs}; "
          f"best of {args.rounds} rounds")
    print(f"{'loop':22} {'baseline ' + args.baseline:>22} {'new (WHATWG, ada)':>20} {'new / baseline':>15}")
    for loop_name in ("resolve+canonicalize", "resolve+memo"):
        b, n = best[loop_name, "baseline"], best[loop_name, "new"]
        per = len(pairs) / 1e6
        print(f"{loop_name:22} {b * 1e3:10.1f} ms {b / per:6.2f} us/link {n * 1e3:8.1f} ms {n / per:5.2f} us/link"
              f" {n / b:9.2f}")
    for loop_name in ("resolve+canonicalize", "resolve+memo"):
        print(f"links kept ({loop_name}): baseline {counts[loop_name, 'baseline']}, new {counts[loop_name, 'new']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

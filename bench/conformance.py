#!/usr/bin/env python3
"""Every public conformance corpus of ``../shared/corpora`` in one run: the
WHATWG URL tests (``conformance_urls.py``), Google's robots.txt decisions
(``conformance_robots.py``) and the Public Suffix List tests
(``conformance_psl.py``), each script's figures printed in turn (without
their speed parts).  Exits 1 if any script reports a real failure.

    .venv/bin/python bench/conformance.py [--corpora DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = [
    ("WHATWG URL (urltestdata.json)", "conformance_urls.py", []),
    ("robots.txt (Google's robots_test.cc decisions)", "conformance_robots.py", ["--no-speed"]),
    ("Public Suffix List (test_psl.txt)", "conformance_psl.py", ["--no-speed"]),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpora", help="the corpora directory (default <repo>/../shared/corpora)")
    args = p.parse_args()
    extra = ["--corpora", args.corpora] if args.corpora else []
    worst = 0
    for title, script, opts in RUNS:
        print(f"== {title}: bench/{script}", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / script), *opts, *extra])
        worst = max(worst, rc)
        print(flush=True)
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())

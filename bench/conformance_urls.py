#!/usr/bin/env python3
"""Conformance of crawld.urls with the WHATWG URL parser tests.

Reads ``urltestdata.json`` (web-platform-tests ``url/resources``; see
``shared/corpora/README.md``) and runs every entry through crawld's link
resolution, for the code of this tree and, in the same run, for the code of
a baseline revision (``--baseline``, default the last revision before the
WHATWG parser: ``crawld/urls.py`` of that revision imported as a module).

What is counted:

* **Success entries** whose expected ``protocol`` is ``http:`` or ``https:``.
  crawld reads ``input`` as a link found on a page at ``base`` (or, without
  a base, as a seed): ``fetched = resolve(base, input)``.  The entry is
  **right** when both hold:

  1. ``fetched`` equals the expected ``href`` without its fragment (a
     fragment is never sent) and without userinfo (crawld drops
     credentials found in a link); an entry whose expected href has
     userinfo is right on these terms and is also counted apart;
  2. ``canonicalize(fetched) == canonicalize(expected href)`` (with no
     strip list): dedup sees the URL the standard names.

  Entries where crawld differs on purpose are counted apart, not as
  misses: an empty or fragment-only input (not a link: it names the page
  it is on), a host with a trailing dot (fetched without it), and a host
  or port crawld refuses although the standard accepts it (an empty DNS
  label, a label over 63 octets, a character no DNS host name has, port 0).  Every other entry is a miss,
  listed.
  The count of entries meeting condition 2 alone (the right canonical URL,
  whatever URL is fetched) is printed too.
* **Failure entries** (``failure: true``) whose input has an http(s)
  scheme: crawld must reject them: ``resolve`` returns None, or
  ``canonicalize`` of what it returns raises (crawld then drops or records
  the link, never fetches it).  The accepted ones are listed.
* Everything else (other schemes, relative inputs on non-http bases) does
  not apply to a crawler and is counted as skipped.

    .venv/bin/python bench/conformance_urls.py [--corpora DIR] [--baseline REV] [--no-baseline]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the last revision whose crawld/urls.py resolved links with
#: urllib.parse.urljoin and canonicalised with w3lib + idna alone
BASELINE_REV = "cd6e971"

_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):")
_C0_SPACE = "".join(chr(c) for c in range(0x21))


def load_revision(rev: str) -> types.ModuleType:
    """``crawld/urls.py`` of git revision ``rev`` as a module of its own."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:crawld/urls.py"], check=True,
                         capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(f"urls_{rev}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(src, f"{rev}:crawld/urls.py", "exec"), mod.__dict__)
    return mod


def _strip_userinfo(href: str) -> str:
    scheme, sep, rest = href.partition("://")
    if not sep:
        return href
    end = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    at = rest.rfind("@", 0, end)
    return href if at < 0 else f"{scheme}://{rest[at + 1:]}"


def _deliberate(entry: dict) -> str | None:
    """Why crawld differs from the standard on purpose for a success entry,
    or None."""
    text = entry["input"].strip(_C0_SPACE).replace("\t", "").replace("\n", "").replace("\r", "")
    if not text or text.startswith("#"):
        return "empty or fragment-only reference: not a link"
    host = entry["hostname"]
    if host.startswith("["):
        return None
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if not name or any(not label or len(label) > 63 for label in labels) or len(name) > 253 \
            or not re.match(r"^[a-z0-9_~.-]+$", name):
        return "host DNS cannot resolve (empty label, label over 63 octets, a character outside [a-z0-9_~.-]): " \
            "invalid link"
    if name != host:
        return "trailing dot of the host dropped"
    if entry["port"] == "0":
        return "port 0: invalid link"
    return None


def judge(urls: types.ModuleType, entries: list) -> dict:
    """Figures of one implementation over the corpus."""
    out = {"right": 0, "canonical_right": 0, "userinfo": [], "deliberate": [], "misses": [], "success": 0,
           "failure": 0, "rejected": 0, "accepted": [], "skipped": 0}
    for e in entries:
        if not isinstance(e, dict):
            continue  # a comment line of the corpus
        base = e.get("base")
        if e.get("failure"):
            m = _SCHEME.match(e["input"].replace("\t", "").replace("\n", "").replace("\r", ""))
            if not (m and m.group(1).lower() in ("http", "https")):
                out["skipped"] += 1
                continue
            out["failure"] += 1
            fetched = _resolve(urls, base, e["input"])
            canon = _canon(urls, fetched) if fetched is not None else None
            if fetched is None or canon is None:
                out["rejected"] += 1
            else:
                out["accepted"].append((e["input"], base, fetched))
            continue
        if e.get("protocol") not in ("http:", "https:"):
            out["skipped"] += 1
            continue
        out["success"] += 1
        expected = e["href"].split("#", 1)[0]
        expected_fetch = _strip_userinfo(expected)
        fetched = _resolve(urls, base, e["input"])
        c_got = _canon(urls, fetched) if fetched is not None else None
        c_exp = _canon(urls, e["href"])
        canon_ok = c_got is not None and c_got == c_exp
        out["canonical_right"] += canon_ok
        if canon_ok and fetched == expected_fetch:
            out["right"] += 1
            if expected_fetch != expected:
                out["userinfo"].append((e["input"], base, e["href"]))
            continue
        why = _deliberate(e)
        if why:
            out["deliberate"].append((why, e["input"], base, e["href"], fetched))
        else:
            out["misses"].append((e["input"], base, e["href"], fetched, c_got, c_exp))
    return out


def _resolve(urls, base, href):
    try:
        if base is None:
            # a seed: the URL as crawld would fetch it
            if hasattr(urls, "resolve_link"):
                return urls.resolve(None, href)
            urls.canonicalize(href)  # the old seed path: the seed as given if it canonicalises
            return urls.without_userinfo(href).strip(_C0_SPACE).split("#", 1)[0]
        return urls.resolve(base, href)
    except Exception:  # noqa: BLE001 - a crash counts as a rejection
        return None


def _canon(urls, url):
    try:
        return urls.canonicalize(url)
    except Exception:  # noqa: BLE001 - BadURL, or a crash of the old code
        return None


def report(name: str, r: dict, verbose: bool) -> None:
    print(f"== {name}")
    print(f"success entries (http/https): {r['success']}: right {r['right']} "
          f"(of which {len(r['userinfo'])} with userinfo dropped), "
          f"deliberately different {len(r['deliberate'])}, misses {len(r['misses'])}; "
          f"right canonical URL (condition 2 alone) {r['canonical_right']}")
    reasons: dict[str, int] = {}
    for d in r["deliberate"]:
        reasons[d[0]] = reasons.get(d[0], 0) + 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  deliberately different, {why}: {n}")
    print(f"  right or deliberately different: {r['right'] + len(r['deliberate'])} of {r['success']}")
    print(f"failure entries with an http(s) input: {r['failure']}: rejected {r['rejected']}, "
          f"accepted {len(r['accepted'])}")
    print(f"entries that do not apply (other schemes): {r['skipped']}")
    if verbose:
        for why, inp, base, href, got in r["deliberate"]:
            print(f"  deliberate: {why}: input {inp!r} base {base!r}: standard {href!r}, crawld {got!r}")
        for inp, base, href in r["userinfo"]:
            print(f"  userinfo dropped: input {inp!r} base {base!r}: standard {href!r}")
    for inp, base, href, got, c_got, c_exp in r["misses"]:
        print(f"  MISS input {inp!r} base {base!r}: expected {href!r}, fetched {got!r}"
              + (f", canonical {c_got!r} vs {c_exp!r}" if got and c_got != c_exp else ""))
    for inp, base, got in r["accepted"]:
        print(f"  ACCEPTED failure input {inp!r} base {base!r}: fetched {got!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", default=str(ROOT.parent / "shared" / "corpora"),
                    help="directory holding urltestdata.json (default: <repo>/../shared/corpora)")
    ap.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare with")
    ap.add_argument("--no-baseline", action="store_true", help="only this tree's code")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list the deliberate differences")
    args = ap.parse_args(argv)
    path = Path(args.corpora) / "urltestdata.json"
    entries = json.loads(path.read_text(encoding="utf-8"))
    if not args.no_baseline:
        report(f"baseline {args.baseline} (urllib.parse.urljoin + w3lib + idna)",
               judge(load_revision(args.baseline), entries), args.verbose)
    from crawld import urls
    report("this tree (WHATWG URL via ada)", judge(urls, entries), args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""robots.txt conformance and speed: crawld's RobotsPolicy against Google's
robots.txt test decisions, with plain protego for comparison.

Conformance: every case of ``robots_cases.json`` (the allow/disallow
decisions of google/robotstxt ``robots_test.cc``; ``ID_*`` tests follow
RFC 9309, ``GoogleOnly_*`` are Google's extensions) is decided by

* ``crawld``: :class:`crawld.robots.RobotsPolicy` (a 200 response with the
  case's body, the case's agent as product token, ``allowed(url)``);
* ``protego``: plain ``Protego.parse(body).can_fetch(url, agent)`` (what
  RobotsPolicy was before :mod:`crawld.robotstxt`);
* ``protego+normalised`` (when :mod:`crawld.robotstxt` is importable):
  protego's matcher fed a normalised file, the alternative design:
  crawld's parser reads the file (BOM, groups, product tokens, cut lines)
  and writes it out again in a form protego reads right (one clean group
  per group, agents that do not bind crawld renamed so that protego's
  substring match cannot bind them), and the URL is passed as crawld's
  request target (dot segments removed, percent-normalised).

A body is given as crawld's fetcher gives it: the bytes decoded as UTF-8
with errors replaced.  Where crawld departs from a case on purpose, the
case is counted apart as "deliberate", with the reason (see DELIBERATE);
every other miss is a failure, listed by test name and case id.

Speed: ``allowed()`` per URL (it runs for every discovered link) on a
synthetic mid-sized robots.txt (a ``*`` group of plain, wildcard and
``$`` rules, a few other groups) over synthetic URLs of the shapes links
have, ``allowed()`` on a file of 20,000 rules (near the 500 KiB cap), the
one-off parse of a policy, and one ``allowed()`` of a hostile
wildcard pattern, each against plain protego measured in the same run
(the baseline, ratio 1.00); the best of ``--rounds`` interleaved rounds.

    .venv/bin/python bench/conformance_robots.py [--corpora DIR] [--rounds 7] [--urls 20000] [--no-speed]

To measure another commit's crawld: ``git archive <rev> crawld | tar -x -C
/tmp/snap``, copy this file to ``/tmp/snap/bench/`` and run it from there
with ``--corpora`` (it imports the crawld beside it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from protego import Protego  # noqa: E402

from crawld import robots  # noqa: E402
from crawld.robots import RobotsPolicy, RobotsRecord  # noqa: E402

try:
    from crawld import robotstxt
except ImportError:  # an older crawld, before the module existed
    robotstxt = None
if robotstxt is not None and Path(robotstxt.__file__).parent != Path(robots.__file__).parent:
    robotstxt = None  # an editable install's module beside an older crawld: not the one measured

Decide = Callable[[str, str, str], bool]


# Cases where crawld's decision differs from Google's test on purpose, as
# (predicate on the case, reason).  A case counts here only when crawld
# gets it "wrong"; one it passes is a pass.
def _non_ascii_url(c: dict) -> bool:
    return c["test"] == "ID_Encoding" and not c["url"].isascii()


def _escaped_unreserved_rule(c: dict) -> bool:
    return c["test"] == "ID_Encoding" and "%62%61%7A" in c["robots_b"] and c["url"].endswith("/baz")


DELIBERATE: list[tuple[Callable[[dict], bool], str]] = [
    (_non_ascii_url, "RFC 9309 2.2.2: octets outside US-ASCII in the URI are percent-encoded before "
                     "comparison (a client sends /ツ as /%E3%83%84); Google's test passes the raw URL, "
                     "leaving the encoding to its caller"),
    (_escaped_unreserved_rule, "RFC 9309 2.2.2 (its table) and RFC 3986 6.2.2.2: %62%61%7A is the "
                               "unreserved 'baz', so the rule matches /baz; Google's matcher compares "
                               "strings without decoding"),
    (lambda c: c["test"] == "GoogleOnly_IndexHTMLisDirectory",
     "Google extension, not in RFC 9309: Allow .../index.html also allowing .../; crawld allows "
     "only what the file says"),
    (lambda c: c["test"] == "GoogleOnly_LineTooLong",
     "Google cuts lines at 16,664 bytes; RFC 9309 sets no line limit, so crawld matches the rule "
     "as written"),
]


def body_of(case: dict) -> str:
    """The case's robots.txt as crawld's fetcher decodes it."""
    return case["robots_b"].encode("latin-1").decode("utf-8", errors="replace")


def decide_crawld(body: str, agent: str, url: str) -> bool:
    return RobotsPolicy(RobotsRecord(time.time(), 200, body), agent).allowed(url)


def decide_protego(body: str, agent: str, url: str) -> bool:
    return bool(Protego.parse(body).can_fetch(url, agent))


class ProtegoNormalised:
    """protego's matcher behind crawld's parser (the wrap-protego design)."""

    _OTHER = "0"  # a name no product token can contain, so it binds no one

    def __init__(self, body: str, agent: str, cut: bool = False):
        parsed = robotstxt.parse(body, cut=cut)
        token = agent.strip().lower()
        out: list[str] = []
        for g in parsed.groups:
            for a in g.agents or [self._OTHER]:
                out.append(f"User-agent: {a if a in ('*', token) else self._OTHER}")
            for r in g.rules:
                out.append(f"{'Allow' if r.allow else 'Disallow'}: {r.pattern}")
            if not g.rules:
                out.append("Disallow:")  # ends the group, as the original's rule lines did
        self.agent = agent
        self.parser = Protego.parse("\n".join(out) + "\n")

    def allowed(self, url: str) -> bool:
        return bool(self.parser.can_fetch(robotstxt.request_target(url), self.agent))


def decide_wrapped(body: str, agent: str, url: str) -> bool:
    return ProtegoNormalised(body, agent).allowed(url)


def conformance(cases: list[dict], name: str, decide: Decide, deliberate: bool) -> None:
    passed: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    apart: list[tuple[str, dict, str]] = []
    failed: list[tuple[str, dict, str]] = []
    for c in cases:
        kind = "ID" if c["test"].startswith("ID_") else "GoogleOnly"
        total[kind] += 1
        try:
            got = decide(body_of(c), c["agent"], c["url"])
        except Exception as exc:  # noqa: BLE001 - a crash is a failure, reported
            failed.append((kind, c, f"raised {type(exc).__name__}: {exc}"))
            continue
        if got == c["expected"]:
            passed[kind] += 1
            continue
        reason = next((why for pred, why in DELIBERATE if pred(c)), None) if deliberate else None
        (apart if reason else failed).append((kind, c, reason or f"got {got}, expected {c['expected']}"))
    print(f"{name}")
    for kind in ("ID", "GoogleOnly"):
        n_apart = sum(1 for k, _, _ in apart if k == kind)
        n_failed = sum(1 for k, _, _ in failed if k == kind)
        extra = f", {n_apart} deliberate" if deliberate else ""
        print(f"  {kind + '_*':<13} {passed[kind]:>3}/{total[kind]} pass{extra}, {n_failed} failed")
    for label, rows in (("deliberate", apart), ("failed", failed)):
        for _, c, why in rows:
            print(f"    {label:<10} {c['test']} #{c['id']} agent={c['agent']!r} url={c['url'][:60]!r}: {why}")


# --- speed --------------------------------------------------------------------------------------

def speed_corpus(n_urls: int, seed: int = 9309) -> tuple[str, list[str]]:
    """A mid-sized robots.txt and ``n_urls`` link URLs (seeded)."""
    rnd = random.Random(seed)
    sections = ["docs", "library", "reference", "tutorial", "howto", "whatsnew", "c-api", "extending",
                "wiki", "blog", "search", "account", "cart", "api", "static"]
    lines = ["# a synthetic robots.txt of the usual shape", "User-agent: Googlebot", "Disallow: /nogoogle/", "",
             "User-agent: *"]
    for s in sections[8:]:
        lines.append(f"Disallow: /{s}/private/")
        lines.append(f"Allow: /{s}/private/public-")
    for i in range(30):
        lines.append(f"Disallow: /{rnd.choice(sections)}/old-{i}/")
    lines += ["Disallow: /*?action=edit", "Disallow: /*?sessionid=", "Disallow: /*.pdf$", "Disallow: /*/print$",
              "Allow: /static/*.css$", "Disallow: /search", "Disallow: /cart", "Allow: /$", "Crawl-delay: 1",
              "", "User-agent: BadBot", "Disallow: /", "", "Sitemap: https://www.example.org/sitemap.xml"]
    body = "\n".join(lines) + "\n"
    urls = []
    for i in range(n_urls):
        path = "/" + "/".join(rnd.choice(sections) if j < 2 else f"page-{rnd.randrange(1000)}.html"
                              for j in range(rnd.randint(1, 3)))
        r = rnd.random()
        if r < 0.10:
            path += f"?id={rnd.randrange(100)}&action={rnd.choice(['view', 'edit'])}"
        elif r < 0.15:
            path = path.rsplit("/", 1)[0] + "/caf%C3%A9%20menu.html"
        elif r < 0.18:
            path = path + "/../index.html"
        urls.append("https://www.example.org" + path)
    return body, urls


def large_corpus(n_rules: int = 20000, n_urls: int = 200, seed: int = 2) -> tuple[str, list[str]]:
    """A robots.txt near the 500 KiB cap: ``n_rules`` plain Allow lines
    under ``Disallow: /``, and URLs under and outside them (seeded)."""
    rnd = random.Random(seed)
    lines = ["User-agent: *", "Disallow: /", "Disallow: /*.pdf$"]
    lines += [f"Allow: /{rnd.choice('abcdefgh')}{i}/x{rnd.randrange(10 ** 6)}" for i in range(n_rules)]
    urls = [f"https://www.example.org/{rnd.choice('abcdefgh')}{rnd.randrange(n_rules)}/x{rnd.randrange(10)}"
            for _ in range(n_urls)]
    return "\n".join(lines) + "\n", urls


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def speed(rounds: int, n_urls: int) -> None:
    body, urls = speed_corpus(n_urls)
    agent = "crawld"
    hostile = "User-agent: *\nDisallow: /" + "*a" * 40 + "*b$\n"
    long_url = "https://www.example.org/" + "a" * 4000
    large, large_urls = large_corpus()
    # (name, make a policy of a body, allowed of a policy); the first is the baseline
    impls: list[tuple[str, Callable[[str], object], Callable[[object, str], bool]]] = [
        ("protego (baseline)", Protego.parse, lambda p, u: p.can_fetch(u, agent)),
        ("crawld RobotsPolicy", lambda b: RobotsPolicy(RobotsRecord(0.0, 200, b), agent), lambda p, u: p.allowed(u)),
    ]
    if robotstxt is not None:
        impls.append(("protego+normalised", lambda b: ProtegoNormalised(b, agent), lambda p, u: p.allowed(u)))
    policies = {name: (make(body), make(hostile), make(large)) for name, make, _ in impls}
    best: dict[str, list[float]] = {name: [float("inf")] * 4 for name, _, _ in impls}
    # rounds interleave the implementations, so a noisy neighbour slows all alike
    for _ in range(rounds):
        for name, make, allowed in impls:
            pol, hostile_pol, large_pol = policies[name]
            t = (timed(lambda: [allowed(pol, u) for u in urls]) / len(urls),
                 timed(lambda: [make(body) for _ in range(20)]) / 20,
                 timed(lambda: allowed(hostile_pol, long_url)),
                 timed(lambda: [allowed(large_pol, u) for u in large_urls]) / len(large_urls))
            best[name] = [min(a, b) for a, b in zip(best[name], t)]
    print(f"\nspeed: robots.txt of {len(body.splitlines())} lines, {len(urls)} URLs, best of {rounds} rounds; "
          f"hostile: one pattern of 40 wildcards against a 4,000-character URL; large: 20,000 Allow lines "
          f"under Disallow: / ({len(large) // 1024} KiB), {len(large_urls)} URLs")
    print(f"  {'implementation':<22} {'allowed() µs/URL':>17} {'ratio':>6} {'parse µs':>9} {'ratio':>6} "
          f"{'hostile ms':>10} {'large µs/URL':>12} {'allowed':>8}")
    base = best[impls[0][0]]
    decisions = {name: [allowed(policies[name][0], u) for u in urls] for name, _, allowed in impls}
    for name, _, _ in impls:
        a, p, h, g = best[name]
        print(f"  {name:<22} {a * 1e6:>17.2f} {a / base[0]:>6.2f} {p * 1e6:>9.0f} {p / base[1]:>6.2f} "
              f"{h * 1e3:>10.3f} {g * 1e6:>12.1f} {sum(decisions[name]):>8}")
    names = list(decisions)
    for other in names[1:]:
        diff = [u for u, a, b in zip(urls, decisions[names[0]], decisions[other]) if a != b]
        print(f"  {other}: {len(diff)} URLs decided otherwise than by {names[0]}"
              + (f", e.g. {diff[0]}" if diff else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora",
                    help="directory holding robots_cases.json (default: <repo>/../shared/corpora)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--urls", type=int, default=20000)
    ap.add_argument("--no-speed", action="store_true", help="conformance only")
    args = ap.parse_args(argv)
    data = json.loads((args.corpora / "robots_cases.json").read_text(encoding="utf-8"))
    cases = data["cases"]
    print(f"{len(cases)} decisions from {data.get('source', 'robots_cases.json')} "
          f"(bodies decoded as UTF-8, errors replaced, as crawld's fetcher does)\n")
    conformance(cases, "crawld RobotsPolicy", decide_crawld, deliberate=True)
    conformance(cases, "protego (plain)", decide_protego, deliberate=False)
    if robotstxt is not None:
        conformance(cases, "protego+normalised (crawld's parser, protego's matcher)", decide_wrapped,
                    deliberate=True)
    if not args.no_speed:
        speed(args.rounds, args.urls)
    return 0


if __name__ == "__main__":
    sys.exit(main())

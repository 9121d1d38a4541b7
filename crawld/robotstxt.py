"""robots.txt as RFC 9309 (Robots Exclusion Protocol) says: parse, match.

Pure functions and values, no I/O: :func:`parse` turns a robots.txt body
into groups, :meth:`RobotsTxt.rules_for` picks and combines the groups that
bind one crawler, and :meth:`AgentRules.allowed` decides on a request
target (path and query) made comparable by :func:`request_target`.

crawld used protego for this and now uses this module instead, because
protego departs from the RFC where it matters to a site owner (it reads a
UTF-8 byte-order mark as part of the first line, binds a group
``User-agent: crawl`` to a crawler called ``crawld``, lets an unknown line
or a ``Crawl-delay`` end a group, and normalises ``%3F`` and ``?`` alike).

What follows the RFC, section by section:

* 2.1, 2.2: a line is ``key: value``; ``#`` starts a comment; lines end at
  CR, LF or CRLF; keys are case-insensitive.  A group is one or more
  ``User-agent`` lines followed by rules; only an ``Allow``/``Disallow``
  line closes the user-agent lines of a group, so other records (2.2.4:
  ``Sitemap``, ``Crawl-delay``, unknown keys) never end one.  Rules before
  the first ``User-agent`` line belong to no group.
* 2.2.1: a group binds a crawler when one of its user-agent values, cut to
  its product token (the leading run of letters, ``_`` and ``-``), equals
  the crawler's product token case-insensitively; all binding groups are
  combined; with none, the ``*`` groups apply; with no ``*`` group either,
  nothing is disallowed.  A group that binds but has no rules allows all.
* 2.2.2: the most specific (longest) matching rule wins and ``Allow`` wins
  a tie; an empty pattern matches nothing; ``/robots.txt`` is always
  allowed.  Rule patterns and request targets are compared in one
  percent-encoded form (:func:`normalize_octets`).
* 2.2.3: ``*`` matches any sequence of characters, ``$`` at the end of a
  pattern anchors it to the end of the target.
* 2.5: a body cut at the parsing limit is parsed up to its last complete
  line (``cut=True``).

``Crawl-delay`` and ``Request-rate`` are no part of RFC 9309; they are read
as records of their group (the longer interval of the groups that bind the
crawler applies) and, like ``Sitemap``, never end a group.

Leniencies of Google's parser (github.com/google/robotstxt ``robots.cc``)
that site owners test their files against, and that RFC 9309 2.2.4 allows
("crawlers MAY be lenient"): a leading UTF-8 byte-order mark is skipped,
whole or cut short; keys are recognised by their prefix, with the common
misspellings of ``Disallow`` (``dissallow``, ``disalow`` ...) and
``useragent`` / ``user agent``; a line ``key value`` without a colon is
read when it has exactly two words; ``User-agent: * anything`` is the
``*`` group.  Google's other extensions are left out on purpose, since
they allow what the file does not: ``Allow: /d/index.html`` also allowing
``/d/``, and lines cut at 16,664 bytes.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from dataclasses import dataclass, field

#: RFC 3986 2.3 unreserved characters: a percent-encoded one is decoded
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

# Characters left as they are: unreserved and reserved (RFC 3986 2.2).  A
# string made of these alone needs no work (the fast path of every URL).
_PLAIN = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]*")
# What the normalisation rewrites: an escape, a stray "%", or a character
# that is neither unreserved nor reserved (non-ASCII, controls, space, "<").
_REWRITE = re.compile(r"%[0-9A-Fa-f]{2}|[^A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]")

_LINE_END = re.compile(r"\r\n|\r|\n")
# Google's parser strips ASCII whitespace only
_WS = " \t\v\f"
# RFC 3986 3: [scheme ":"] ["//" authority] path-and-query ["#" fragment]
_TARGET = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.\-]*:)?(?://[^/?#]*)?([^#]*)")
_TOKEN = re.compile(r"[A-Za-z_\-]*")

USER_AGENT, ALLOW, DISALLOW, SITEMAP, CRAWL_DELAY, REQUEST_RATE = (
    "user-agent", "allow", "disallow", "sitemap", "crawl-delay", "request-rate")

# Key prefixes (lower case) and what they mean, after Google's
# ParsedRobotsKey (prefix match, frequent typos) plus the two non-standard
# group records crawld honours.
_KEYS = (
    (("user-agent", "useragent", "user agent"), USER_AGENT),
    (("allow",), ALLOW),
    (("disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"), DISALLOW),
    (("sitemap", "site-map"), SITEMAP),
    (("crawl-delay", "crawl delay", "crawldelay"), CRAWL_DELAY),
    (("request-rate", "request rate", "requestrate"), REQUEST_RATE),
)

_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*([smhd]?)(?:\s.*)?", re.IGNORECASE | re.DOTALL)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _rewrite(m: re.Match) -> str:
    s = m.group()
    if len(s) == 3 and s[0] == "%":
        c = chr(int(s[1:], 16))
        return c if c in _UNRESERVED else s.upper()
    if s == "%":
        return "%25"
    return "".join(f"%{b:02X}" for b in s.encode("utf-8", "surrogatepass"))


def normalize_octets(s: str) -> str:
    """``s`` in the one percent-encoded form in which rule patterns and
    request targets are compared (RFC 9309 2.2.2, RFC 3986 2.1 and 6.2.2):

    * an escape of an unreserved character is decoded (``%7E`` -> ``~``,
      ``%62`` -> ``b``); any other escape is kept, upper-cased
      (``%2f`` -> ``%2F``), so ``%2F`` and ``/``, ``%3F`` and ``?`` stay
      different;
    * a character outside US-ASCII is percent-encoded as UTF-8
      (``ツ`` -> ``%E3%83%84``), and so are controls, space and the ASCII
      characters URIs may not hold (``"<>\\^`{|}``);
    * a ``%`` not followed by two hex digits becomes ``%25``.

    Reserved characters are left as they are (encoding them, as the
    example table of 2.2.2 suggests for a query value, would also encode
    the ``/`` and ``?`` that every pattern holds); both sides are
    normalised alike, so a rule and a URL written the same way match.
    """
    if _PLAIN.fullmatch(s):
        return s
    return _REWRITE.sub(_rewrite, s)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 "Remove Dot Segments" of an absolute path
    (``/a/b/../c/./d`` -> ``/a/c/d``; ``/..`` -> ``/``)."""
    if "." not in path:
        return path
    out: list[str] = []
    segments = path.split("/")
    for seg in segments:
        if seg == "..":
            if len(out) > 1:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/".join(out) or "/"


def request_target(url: str) -> str:
    """The path and query that a request for ``url`` sends, in the form
    rules are matched against (RFC 9309 2.2.2).

    ``url`` may be absolute (``http://h/a/../b?q``), scheme-relative
    (``//h/p``) or a path (``/p?q``); the fragment is dropped, an empty
    path is ``/``, dot segments are removed from the path (RFC 3986 5.2.4:
    ``http://h/a/../admin`` is requested as ``/admin``), and the whole is
    percent-normalised by :func:`normalize_octets`.  The query is kept:
    rules match against it too.  Never raises.
    """
    target = _TARGET.match(url).group(1)  # type: ignore[union-attr]
    if not target.startswith("/"):
        target = "/" + target
    target = normalize_octets(target)
    if "/." in target:
        q = target.find("?")
        if q < 0:
            target = remove_dot_segments(target)
        elif "/." in target[:q]:
            target = remove_dot_segments(target[:q]) + target[q:]
    return target


def product_token(value: str) -> str:
    """The product token of a ``User-agent`` value: its leading run of
    letters, ``_`` and ``-`` (RFC 9309 2.2.1's token characters; Google's
    ``ExtractUserAgent``): ``crawld/1.0`` and ``crawld bot`` -> ``crawld``.
    May be empty (``*bot``, ``2bot``), which binds no crawler."""
    return _TOKEN.match(value).group()  # type: ignore[union-attr]


@dataclass(frozen=True)
class Rule:
    """One ``Allow``/``Disallow`` line: ``pattern`` is normalised
    (:func:`normalize_pattern`); ``line`` is its 1-based line number."""

    allow: bool
    pattern: str
    line: int = 0


def normalize_pattern(value: str) -> str:
    """A rule's path pattern in comparable form: each literal run between
    ``*`` wildcards goes through :func:`normalize_octets` (so non-ASCII is
    percent-encoded as UTF-8), runs of ``*`` collapse to one, and a final
    ``$`` stays the end anchor (RFC 9309 2.2.2, 2.2.3)."""
    anchor = value.endswith("$")
    body = value[:-1] if anchor else value
    parts = [normalize_octets(p) for p in body.split("*")]
    out = "*".join(parts)
    while "**" in out:
        out = out.replace("**", "*")
    return out + ("$" if anchor else "")


@dataclass
class Group:
    """A group (RFC 9309 2.1): the product tokens of its ``User-agent``
    lines (lower case; ``*`` for the global group), its rules in file
    order, and its ``Crawl-delay`` (s) and ``Request-rate`` (s per request)
    when given."""

    agents: list[str] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    crawl_delay_s: float | None = None
    request_interval_s: float | None = None


#: up to this many plain patterns, one ``str.startswith`` of them all
#: first rules out a target that none prefixes (the usual case)
_FEW_PREFIXES = 64


class AgentRules:
    """The combined rules that bind one crawler, ready to match.

    The most specific (longest) matching pattern decides, ``Allow`` winning
    a tie (RFC 9309 2.2.2).  Plain patterns (no ``*``, no final ``$``) are
    prefixes: they sit in a dict, and the longest one that prefixes a
    target is found by looking up the target's prefixes of the lengths the
    patterns have, longest first, so a file of 20,000 rules costs a few
    dict look-ups per URL, not 20,000 comparisons.  Wildcard patterns are
    tried longest first (``Allow`` first among equals) and only while they
    could still beat the plain match.
    """

    __slots__ = ("_plain", "_lengths", "_prefixes", "_wild", "crawl_delay_s")

    def __init__(self, rules: list[Rule], crawl_delay_s: float | None = None):
        plain: dict[str, bool] = {}
        wild = []
        for r in rules:
            p = r.pattern
            if not p:
                continue  # an empty pattern matches nothing
            if "*" in p or p.endswith("$"):
                anchored = p.endswith("$")
                parts = (p[:-1] if anchored else p).split("*")
                if len(parts) == 1:  # "/page$": the whole target
                    wild.append((len(p), r.allow, parts[0], None, "", True))
                else:
                    wild.append((len(p), r.allow, parts[0], tuple(parts[1:-1]), parts[-1], anchored))
            else:
                plain[p] = plain.get(p, False) or r.allow
        wild.sort(key=lambda w: (-w[0], not w[1]))
        self._plain = plain
        self._lengths = tuple(sorted({len(p) for p in plain}))
        self._prefixes = tuple(plain) if len(plain) <= _FEW_PREFIXES else None
        self._wild = wild
        #: the Crawl-delay / Request-rate interval that applies (s), or None
        self.crawl_delay_s = crawl_delay_s

    def allowed(self, target: str) -> bool:
        """May the request target ``target`` (from :func:`request_target`)
        be fetched?  ``/robots.txt`` always may (RFC 9309 2.2.2)."""
        if target == "/robots.txt":
            return True
        best, verdict = 0, True
        plain = self._plain
        if plain and (self._prefixes is None or target.startswith(self._prefixes)):
            lengths = self._lengths
            i = bisect_right(lengths, len(target))
            while i:
                i -= 1
                a = plain.get(target[:lengths[i]])
                if a is not None:
                    best, verdict = lengths[i], a
                    break
        # Wildcards: each literal run is found leftmost after the previous
        # one, which is exact for "*"-only globs and linear in the target,
        # so a hostile "/*a*a*a*a*b" cannot stall a worker as a
        # backtracking regular expression would.
        for length, allow, first, middle, last, anchored in self._wild:
            if length < best or (length == best and verdict):
                break  # cannot beat the plain match (an equal one only if it allows)
            if not target.startswith(first):
                continue
            if middle is None:
                if len(target) == len(first):
                    return allow
                continue
            pos = len(first)
            for part in middle:
                pos = target.find(part, pos)
                if pos < 0:
                    break
                pos += len(part)
            else:
                if anchored:
                    if target.endswith(last) and len(target) - len(last) >= pos:
                        return allow
                elif target.find(last, pos) >= 0:
                    return allow
        return verdict


@dataclass
class RobotsTxt:
    """A parsed robots.txt: its groups in file order and its ``Sitemap``
    URLs (as written, in file order)."""

    groups: list[Group] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)

    def rules_for(self, agent: str) -> AgentRules:
        """The rules that bind the crawler whose product token is ``agent``
        (RFC 9309 2.2.1): every group naming it (case-insensitively),
        combined; else every ``*`` group, combined; else none.

        The crawl delay is the longest ``Crawl-delay`` or ``Request-rate``
        interval among those groups (when a file gives several, the politer
        one)."""
        token = agent.strip().lower()
        chosen = [g for g in self.groups if token and token in g.agents]
        if not chosen:
            chosen = [g for g in self.groups if "*" in g.agents]
        rules = [r for g in chosen for r in g.rules]
        delays = [d for g in chosen for d in (g.crawl_delay_s, g.request_interval_s) if d]
        return AgentRules(rules, max(delays) if delays else None)


def _key_value(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of one line after Google's GetKeyAndValueFrom: the
    comment cut, ASCII whitespace stripped, split at the first ``:``, or at
    whitespace when there is no colon and exactly two words."""
    hash_at = line.find("#")
    if hash_at >= 0:
        line = line[:hash_at]
    line = line.strip(_WS)
    if not line:
        return None
    sep = line.find(":")
    if sep < 0:
        words = line.split()
        if len(words) != 2:
            return None
        return words[0], words[1]
    key = line[:sep].strip(_WS)
    if not key:
        return None
    return key, line[sep + 1:].strip(_WS)


def _kind(key: str) -> str | None:
    k = key.lower()
    for prefixes, kind in _KEYS:
        if k.startswith(prefixes):
            return kind
    return None


def _seconds(value: str) -> float | None:
    """A ``Crawl-delay`` value in seconds, or None when malformed."""
    try:
        v = float(value)
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _request_interval(value: str) -> float | None:
    """A ``Request-rate: n/m[smhd] [HHMM-HHMM]`` value as seconds per
    request (``1/10`` -> 10.0, ``2/1m`` -> 30.0), or None when malformed.
    The time-of-day window is ignored: the rate holds all day."""
    m = _RATE.fullmatch(value)
    if not m:
        return None
    n, per = int(m.group(1)), int(m.group(2))
    if n <= 0 or per <= 0:
        return None
    return per * _UNIT_S[m.group(3).lower()] / n


def parse(text: str, cut: bool = False) -> RobotsTxt:
    """Parse a robots.txt body (already decoded to ``str``) into groups
    (RFC 9309 2.1, 2.2) and sitemaps.

    ``cut``: the body was cut at the parsing limit (2.5), so its last
    line is incomplete and is dropped: the rules up to the last complete
    line apply.  Never raises: a line that is not a record is skipped, and
    a garbage file is an empty rule set.
    """
    if text[:1] in ("\ufeff", "\ufffd"):
        # a UTF-8 byte-order mark, or (decoded as U+FFFD) the first one or
        # two bytes of one, as Google's parser skips them
        text = text[1:]
    lines = _LINE_END.split(text)
    if cut:
        lines.pop()
    out = RobotsTxt()
    group: Group | None = None
    in_rules = False  # has the current group's first rule line been read?
    for n, line in enumerate(lines, 1):
        kv = _key_value(line)
        if kv is None:
            continue
        kind = _kind(kv[0])
        value = kv[1]
        if kind == USER_AGENT:
            if group is None or in_rules:
                group = Group()
                out.groups.append(group)
                in_rules = False
            if value[:1] == "*" and (len(value) == 1 or value[1] in _WS):
                group.agents.append("*")
            else:
                token = product_token(value).lower()
                if token:
                    group.agents.append(token)
        elif kind in (ALLOW, DISALLOW):
            if group is None:
                continue  # a rule before any user-agent line binds no one
            in_rules = True
            if value:
                group.rules.append(Rule(kind == ALLOW, normalize_pattern(value), n))
        elif kind == SITEMAP:
            if value:
                out.sitemaps.append(value)
        elif kind == CRAWL_DELAY and group is not None:
            d = _seconds(value)
            if d is not None:
                group.crawl_delay_s = d if group.crawl_delay_s is None else max(group.crawl_delay_s, d)
        elif kind == REQUEST_RATE and group is not None:
            d = _request_interval(value)
            if d is not None:
                group.request_interval_s = d if group.request_interval_s is None else max(group.request_interval_s, d)
    return out

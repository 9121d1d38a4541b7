"""robots.txt decisions as RFC 9309 says: crawld.robots.RobotsPolicy and the
pure crawld.robotstxt module (parse, group choice, longest match, the
request target, cut bodies)."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from crawld import robotstxt
from crawld.robots import RobotsPolicy, RobotsRecord, agent_token


def policy(body: str, agent: str = "crawld", cut: bool = False) -> RobotsPolicy:
    rec = RobotsRecord(time.time(), 200, body)
    rec.cut = cut
    return RobotsPolicy(rec, agent)


# --- a UTF-8 byte-order mark ------------------------------------------------------------------

def test_byte_order_mark_does_not_hide_the_first_line():
    # what crawld's fetcher makes of the bytes EF BB BF "User-agent: *" ...
    body = b"\xef\xbb\xbfUser-agent: *\nDisallow: /\n".decode("utf-8", errors="replace")
    assert body.startswith("\ufeff")
    assert not policy(body).allowed("http://x.com/page")
    # the first one or two bytes of one (Google's parser skips them too)
    for start in (b"\xef\xbb", b"\xef"):
        cut = (start + b"User-agent: *\nDisallow: /\n").decode("utf-8", errors="replace")
        assert not policy(cut).allowed("http://x.com/page")
    # a byte-order mark elsewhere is no line break and no whitespace
    assert policy("User-agent: *\nDisallow: /a\n\ufeffDisallow: /b\n").allowed("http://x.com/b")


# --- which group binds the crawler (RFC 9309 2.2.1) -------------------------------------------

# (User-agent value of a group that disallows everything, crawler's product
# token, does the group bind the crawler?).  The file also has a "*" group
# allowing all, so an unbound crawler is allowed.
BINDING = [
    ("crawld", "crawld", True),
    ("CRAWLD", "crawld", True),
    ("crawld", "CrawlD", True),
    ("crawld/1.0", "crawld", True),        # the product token before "/"
    ("crawld bot", "crawld", True),        # ... or before a space
    ("crawld (+https://x.example)", "crawld", True),
    ("crawl", "crawld", False),            # a prefix of the token is another name
    ("c", "crawld", False),
    ("crawld-extra", "crawld", False),     # "-" belongs to the token
    ("crawld_bot", "crawld", False),
    ("mycrawld", "crawld", False),
    ("Mozilla/5.0 (compatible; crawld/0.1)", "crawld", False),  # a header value is not a group name
    ("*crawld", "crawld", False),          # no product token at all
    ("", "crawld", False),
]


@pytest.mark.parametrize("value,token,binds", BINDING)
def test_group_binds_by_exact_product_token(value, token, binds):
    body = f"User-agent: *\nAllow: /\n\nUser-agent: {value}\nDisallow: /\n"
    assert policy(body, token).allowed("http://x.com/page") is not binds


def test_all_groups_of_the_crawler_combine_and_star_is_the_fallback():
    body = ("User-agent: *\nDisallow: /star-only\n\nUser-agent: crawld\nDisallow: /a\n\n"
            "User-agent: otherbot\nDisallow: /\n\nUser-agent: CRAWLD/2\nDisallow: /b\n")
    ours = policy(body)
    assert not ours.allowed("http://x.com/a") and not ours.allowed("http://x.com/b")
    assert ours.allowed("http://x.com/star-only")  # a bound crawler ignores "*"
    other = policy(body, "nobot")
    assert not other.allowed("http://x.com/star-only") and other.allowed("http://x.com/a")
    # a group that binds with no rules (or only an empty Disallow) allows all
    assert policy("User-agent: *\nDisallow: /\n\nUser-agent: crawld\nDisallow:\n").allowed("http://x.com/p")
    assert policy("User-agent: *\nDisallow: /\n\nUser-agent: crawld\n").allowed("http://x.com/p")
    # no group for the crawler and no "*": nothing is disallowed
    assert policy("User-agent: otherbot\nDisallow: /\n").allowed("http://x.com/p")


# (User-Agent header value, product token): RFC 9110 10.1.5 product = token ["/" version]
AGENT_TOKENS = [
    ("crawld/0.1 (+https://ops.example/crawler)", "crawld"),
    ("crawld (+https://ops.example/crawler)", "crawld"),
    ("crawld", "crawld"),
    ("  crawld/0.1", "crawld"),
    ("/0.1", "*"),
    ("", "*"),
    ("\t", "*"),
]


@pytest.mark.parametrize("ua,token", AGENT_TOKENS)
def test_agent_token_from_user_agent_header(ua, token):
    assert agent_token(ua) == token


def test_agent_token_binds_the_crawlers_group():
    ua = "crawld/0.1 (+https://ops.example/crawler)"
    body = "User-agent: *\nAllow: /\n\nUser-agent: crawld/0.1\nDisallow: /private\n"
    assert not policy(body, agent_token(ua)).allowed("http://x.com/private")


# --- other records do not end a group (RFC 9309 2.2.4) ----------------------------------------

# (body, url, allowed) for the crawler "crawld"
GROUPING = [
    # an unknown line between two user-agent lines: one group of both
    ("User-agent: crawld\nFoo: bar\nUser-agent: *\nDisallow: /\n", "/", False),
    # ... between the user-agent line and its rules
    ("User-agent: crawld\nFoo: bar\nDisallow: /x\n", "/x", False),
    # Sitemap, Crawl-delay, Request-rate, comments, blank lines: the same
    ("User-agent: crawld\nSitemap: http://x.com/s.xml\nUser-agent: *\nDisallow: /\n", "/", False),
    ("User-agent: crawld\nCrawl-delay: 5\nUser-agent: *\nDisallow: /\n", "/", False),
    ("User-agent: crawld\nRequest-rate: 1/5\nUser-agent: *\nDisallow: /\n", "/", False),
    ("User-agent: crawld\n# a comment\n\nUser-agent: *\nDisallow: /\n", "/", False),
    # a rule line ends the user-agent lines: the next User-agent starts a group
    ("User-agent: crawld\nDisallow: /a\nUser-agent: *\nDisallow: /\n", "/b", True),
    ("User-agent: crawld\nDisallow:\nUser-agent: *\nDisallow: /\n", "/b", True),
    # rules before any user-agent line bind no one
    ("Disallow: /\nUser-agent: crawld\nDisallow: /a\n", "/b", True),
    # lenient line syntax: no colon (two words), key case, typos, CR line ends
    ("user-agent crawld\ndisallow /\n", "/x", False),
    ("USER-AGENT: crawld\nDISALLOW: /\n", "/x", False),
    ("User-agent: crawld\nDissallow: /\n", "/x", False),
    ("User-agent: crawld\rDisallow: /x\rAllow: /x/y\r", "/x/z", False),
    ("User-agent: crawld\r\nDisallow: /x\r\nAllow: /x/y\r\n", "/x/y", True),
    ("User-agent: crawld\nDisallow: /x # not here: /y\n", "/y", True),
    ("User-agent: * something\nDisallow: /\n", "/", False),
]


@pytest.mark.parametrize("body,path,allowed", GROUPING)
def test_groups_and_line_syntax(body, path, allowed):
    assert policy(body).allowed("http://x.com" + path) is allowed


def test_crawl_delay_of_a_group_split_by_other_records():
    pol = policy("User-agent: crawld\nCrawl-delay: 5\nUser-agent: otherbot\nDisallow: /x\n")
    assert pol.crawl_delay_s == 5.0 and not pol.allowed("http://x.com/x")
    # two values in the bound groups: the politer one
    pol = policy("User-agent: crawld\nCrawl-delay: 2\nDisallow: /a\n\nUser-agent: crawld\nRequest-rate: 1/7\n")
    assert pol.crawl_delay_s == 7.0
    assert policy("User-agent: *\nCrawl-delay: nope\nRequest-rate: 0/5\n").crawl_delay_s is None
    assert policy("User-agent: *\nRequest-rate: 3/1m 0800-1700\n").crawl_delay_s == 20.0


def test_sitemaps_anywhere_in_file_order():
    pol = policy("Sitemap: http://x.com/a.xml\nUser-agent: *\nSitemap: http://x.com/b.xml\nDisallow: /p\n"
                 "site-map: http://x.com/c.xml\n")
    assert pol.sitemaps == ["http://x.com/a.xml", "http://x.com/b.xml", "http://x.com/c.xml"]
    assert not pol.allowed("http://x.com/p")


# --- the decision is on the request target that is sent (RFC 9309 2.2.2) ---------------------

# (rule lines for "*", URL, allowed)
TARGETS = [
    # dot segments are removed (RFC 3986 5.2.4) as a client does before sending
    ("Disallow: /admin", "http://h.example/a/../admin", False),
    ("Disallow: /admin", "http://h.example/./admin/x", False),
    ("Disallow: /admin", "http://h.example/x/y/../../admin", False),
    ("Disallow: /admin", "http://h.example/../admin", False),
    ("Disallow: /admin", "http://h.example/a/%2e%2E/admin", False),   # %2E is "."
    ("Disallow: /a/b", "http://h.example/a/b/c/..", False),
    ("Disallow: /a/", "http://h.example/a/.", False),
    ("Disallow: /admin", "http://h.example/admin/../public", True),
    ("Disallow: /q", "http://h.example/p?x=/../q", True),            # the query keeps its dots
    ("Disallow: /p?x=/../q", "http://h.example/p?x=/../q", False),
    # escapes of unreserved characters are decoded, on both sides
    ("Disallow: /%7Euser", "http://h.example/~user/", False),
    ("Disallow: /~user", "http://h.example/%7euser/", False),
    ("Disallow: /%62%61%7A", "http://h.example/baz", False),
    # escapes of other octets are kept, in upper case, on both sides
    ("Disallow: /a%2fb", "http://h.example/a%2Fb", False),
    ("Disallow: /a%2Fb", "http://h.example/a/b", True),              # %2F is not "/"
    ("Disallow: /a%3Fb", "http://h.example/a?b", True),              # %3F is not "?"
    ("Disallow: /a?b", "http://h.example/a?b", False),
    # non-ASCII is percent-encoded as UTF-8, in patterns and in URLs
    ("Disallow: /café", "http://h.example/caf%C3%A9", False),
    ("Disallow: /café", "http://h.example/caf%c3%a9/menu", False),
    ("Disallow: /caf%C3%A9", "http://h.example/café", False),
    ("Disallow: /ツ", "http://h.example/%E3%83%84", False),
    ("Disallow: /a b", "http://h.example/a%20b", False),
    ("Disallow: /a%20b", "http://h.example/a b", False),
    # the query is part of what rules match; the fragment is not sent
    ("Disallow: /*?action=edit", "http://h.example/Page?action=edit", False),
    ("Disallow: /*?action=edit", "http://h.example/Page?action=view", True),
    ("Disallow: /p?q", "http://h.example/p?q#top", False),
    ("Disallow: /p$", "http://h.example/p#top", False),
    ("Disallow: /p$", "http://h.example/p?", True),
    # an empty path is "/"; a path alone is a target too
    ("Disallow: /$", "http://h.example", False),
    ("Disallow: /$", "http://h.example?x", True),
    ("Disallow: /?x", "http://h.example?x", False),
    ("Disallow: /admin", "/a/../admin", False),
    ("Disallow: /admin", "//h.example/admin", False),
    # /robots.txt itself is always allowed
    ("Disallow: /", "http://h.example/robots.txt", True),
]


@pytest.mark.parametrize("rules,url,allowed", TARGETS)
def test_decision_on_the_request_target(rules, url, allowed):
    assert policy(f"User-agent: *\n{rules}\n").allowed(url) is allowed


# (URL, request target)
REQUEST_TARGETS = [
    ("http://h/a/../admin", "/admin"),
    ("HTTPS://h:8443/x/./y?q=1#f", "/x/y?q=1"),
    ("http://h", "/"),
    ("http://h?q", "/?q"),
    ("http://user@h/p", "/p"),
    ("//h/p", "/p"),
    ("/p/../q?r=/../s", "/q?r=/../s"),
    ("", "/"),
    ("http://h/caf%c3%a9?n=%7e%41", "/caf%C3%A9?n=~A"),
    ("http://h/%zz%", "/%25zz%25"),
    ("http://h/a b", "/a%20b"),
    ("http://h/..", "/"),
    ("http://h/a/b/c/./../../g", "/a/g"),  # RFC 3986 5.4.1's example
]


@pytest.mark.parametrize("url,target", REQUEST_TARGETS)
def test_request_target(url, target):
    assert robotstxt.request_target(url) == target


# --- longest match, allow on ties, "*" and "$" (RFC 9309 2.2.2, 2.2.3) ------------------------

# (rule lines for "*", path, allowed)
MATCHING = [
    ("Disallow: /x/page.html\nAllow: /x/", "/x/page.html", False),
    ("Allow: /x/page.html\nDisallow: /x/", "/x/page.html", True),
    ("Disallow: /x\nAllow: /x/", "/x", False),
    ("Disallow: /x\nAllow: /x/", "/x/", True),
    ("Disallow: /folder\nAllow: /folder", "/folder/page", True),        # a tie: allow
    ("Disallow: /\nAllow: /", "/page", True),
    ("Allow: /page\nDisallow: /*.html", "/page.html", False),          # 7 octets beat 5
    ("Allow: /page\nDisallow: /*.html", "/page", True),
    ("Allow: /x/page.\nDisallow: /*.html", "/x/page.html", True),
    ("Disallow: /*.php$", "/a/b.php", False),
    ("Disallow: /*.php$", "/a/b.php?x", True),
    ("Disallow: /*.php$", "/a/b.php5", True),
    ("Disallow: /fish*.php", "/fishheads/catfish.php?p", False),
    ("Disallow: /fish*.php", "/Fish.PHP", True),                      # patterns are case-sensitive
    ("Disallow: /foo/bar$\nAllow: /foo/bar/qux", "/foo/bar", False),
    ("Disallow: /foo/bar$", "/foo/bar/", True),
    ("Disallow: /a$b", "/a$b", False),                                 # "$" inside is a character
    ("Disallow: /a$b", "/a", True),
    ("Disallow: /a**b", "/a/x/b", False),
    ("Disallow: *", "/anything", False),
    ("Disallow: /*", "/", False),
    ("Allow: /$\nDisallow: /", "/", True),
    ("Allow: /$\nDisallow: /", "/page", False),
    ("Disallow: /x/", "/X/y", True),
    ("Disallow: admin", "/admin", True),                               # not a path: matches nothing
    ("Disallow: /\nAllow: /*$", "/p", True),
    ("Disallow: /*a*a*a*a*a*a*a*a*b$", "/" + "a" * 2000, True),        # linear, not backtracking
]


@pytest.mark.parametrize("rules,path,allowed", MATCHING)
def test_longest_match(rules, path, allowed):
    assert policy(f"User-agent: *\n{rules}\n").allowed("http://h.example" + path) is allowed


def _reference(rules: list[robotstxt.Rule], target: str) -> bool:
    """RFC 9309 2.2.2 read literally: every rule is a regular expression,
    the longest matching pattern wins, allow on a tie."""
    best, verdict = -1, True
    for r in rules:
        p = r.pattern
        anchored = p.endswith("$")
        rx = ".*".join(re.escape(part) for part in (p[:-1] if anchored else p).split("*"))
        if p and re.match(rx + (r"\Z" if anchored else ""), target, re.DOTALL):
            if len(p) > best or (len(p) == best and r.allow):
                best, verdict = len(p), r.allow if len(p) > best else verdict or r.allow
    return verdict


def test_matcher_agrees_with_a_literal_reading_of_the_rfc():
    # seeded: the same 3,000 random rule sets and targets on every run
    rnd = random.Random(9309)
    alphabet = "ab/.?$*"
    for _ in range(3000):
        rules = []
        for _ in range(rnd.randint(1, 6)):
            pat = "/" + "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5)))
            rules.append(robotstxt.Rule(rnd.random() < 0.5, robotstxt.normalize_pattern(pat)))
        target = "/" + "".join(rnd.choice("ab/.?$") for _ in range(rnd.randint(0, 8)))
        got = robotstxt.AgentRules(rules).allowed(target)
        assert got == _reference(rules, target), (rules, target)


def test_many_plain_rules_keep_the_longest_match():
    rules = [robotstxt.Rule(False, "/")] + [robotstxt.Rule(True, f"/d{i}/x") for i in range(5000)]
    rules.append(robotstxt.Rule(False, "/d42/x/private"))
    m = robotstxt.AgentRules(rules)
    assert m.allowed("/d42/x/page") and not m.allowed("/d42/y") and not m.allowed("/d42/x/private/1")
    assert m.allowed("/d4999/x") and not m.allowed("/d5000/x")


# (pattern as written, normalised)
PATTERNS = [
    ("/foo/bar/ツ", "/foo/bar/%E3%83%84"),
    ("/foo/bar/%e3%83%84", "/foo/bar/%E3%83%84"),
    ("/foo/bar/%62%61%7A", "/foo/bar/baz"),
    ("/a%2fb", "/a%2Fb"),
    ("/*.php$", "/*.php$"),
    ("/a***b", "/a*b"),
    ("/100%", "/100%25"),
    ("/a b$", "/a%20b$"),
]


@pytest.mark.parametrize("raw,norm", PATTERNS)
def test_normalize_pattern(raw, norm):
    assert robotstxt.normalize_pattern(raw) == norm


# --- a body cut at the size cap (RFC 9309 2.5) ------------------------------------------------

def test_record_keeps_the_cut_flag_and_old_records_load():
    rec = RobotsRecord(1000.0, 200, "User-agent: *\n", cut=True)
    back = RobotsRecord.from_json(rec.to_json())
    assert back == rec and back.cut
    assert json.loads(rec.to_json())["c"] is True
    old = '{"v":1,"t":1000.0,"s":200,"b":"User-agent: *\\nDisallow: /\\n","e":null,"k":null,"n":0}'
    loaded = RobotsRecord.from_json(old)
    assert loaded.cut is False and not RobotsPolicy(loaded, "crawld").cut
    assert RobotsRecord.from_json(RobotsRecord(1.0, 200, "").to_json()).cut is False


def test_cut_body_is_parsed_up_to_its_last_complete_line():
    # the file went on "Disallow: /private-area" but was cut after "/"
    body = "User-agent: *\nDisallow: /tmp\nDisallow: /"
    cut = policy(body, cut=True)
    assert cut.cut
    assert cut.allowed("http://x.com/page") and not cut.allowed("http://x.com/tmp/1")
    whole = policy(body)
    assert not whole.cut and not whole.allowed("http://x.com/page")
    # cut right after a line end: every line is complete
    assert not policy("User-agent: *\nDisallow: /\n", cut=True).allowed("http://x.com/page")
    assert not policy("User-agent: *\r\nDisallow: /\r", cut=True).allowed("http://x.com/page")

"""Links that cannot become URLs are recorded, not dropped (pure: a real
crawld.scope.Router and crawld.links.LinkPlanner, no Redis).

An http(s) href that the WHATWG URL parser refuses, or whose host DNS
cannot resolve (crawld.urls.resolve_link), is an outlink of its page and a
push with mode ``invalid_url: <why>`` (a ``skipped`` row, never fetched),
routed as the page itself and deduplicated by the fingerprint of its
recorded form (crawld.urls.link_record).
"""

from __future__ import annotations

import json

from crawld.config import CrawlConfig
from crawld.frontier import Entry
from crawld.links import INVALID_URL, LinkPlanner
from crawld.rows import outcome_of_mode
from crawld.scope import Router
from crawld.urls import fingerprint

CFG = CrawlConfig.from_dict({"crawl_id": "c1", "num_shards": 8, "seeds": ["http://www.example.com/"],
                             "allow_domains": ["example.org"]})
PAGE = "http://www.example.com/docs/"

# (href on the page, recorded form, words of the reason)
INVALID = [
    ("http://www..example.com/a#frag", "http://www..example.com/a", "empty label"),
    ("http://" + "b" * 64 + ".example.com/", "http://" + "b" * 64 + ".example.com/", "over 63 octets"),
    ("http://www.example.com:99999/x", "http://www.example.com:99999/x", "over 65535"),
    ("//bad host.example.com/p q", "//bad%20host.example.com/p%20q", "forbidden code point"),
    ("http://me:pw@0xffffffff1/", "http://0xffffffff1/", "invalid IPv4 address"),
]


def planner() -> LinkPlanner:
    return LinkPlanner(CFG, Router(CFG), lambda origin, url: None)


def test_invalid_links_are_outlinks_and_pushes_routed_as_their_page():
    p = planner()
    hrefs = ["/ok", "mailto:x@example.com", "#top", *(h for h, _, _ in INVALID), "http://www..example.com/a#other"]
    outlinks, pushes = p.page_links(PAGE, PAGE, hrefs, set(), depth=1, nofollow_all=False)
    records = [r for _, r, _ in INVALID]
    # in order, once each (the second www..example.com/a differs only by fragment)
    assert outlinks == ["http://www.example.com/ok", *records]
    page_route = p.router.route(p.router.canonical(PAGE))
    by_record = {json.loads(item.payload)["c"]: (shard, key, item) for shard, key, item in pushes}
    assert set(by_record) == {"http://www.example.com/ok", *records}
    for _, record, words in INVALID:
        shard, key, item = by_record[record]
        assert item.mode.startswith(f"{INVALID_URL}: ") and words in item.mode, item.mode
        assert "\n" not in item.mode and item.mode.isascii()
        assert outcome_of_mode(item.mode) == "skipped"
        # the page's shard, politeness key and host; the record's fingerprint
        assert (shard, item.pkey, item.host) == (page_route.shard, "example.com", "www.example.com")
        assert item.fp == fingerprint(record) and key == item.fp + b"s"
        assert item.vkey == ""
        e = Entry.from_payload(item.payload)
        assert (e.url, e.canonical, e.depth, e.referrer) == (record, record, 2, PAGE)
        assert p.row_host(e, item.mode) == "www.example.com"
    assert not any("pw" in o for o in outlinks)


def test_the_same_invalid_href_on_many_pages_is_one_dedup_key():
    p = planner()
    href = "http://www..example.com/"
    _, first = p.page_links(PAGE, PAGE, [href], set(), 0, False)
    other_page = "http://blog.example.com/post"
    _, second = p.page_links(other_page, other_page, [href], set(), 0, False)
    assert len(first) == len(second) == 1
    assert first[0][1] == second[0][1] == fingerprint(href) + b"s"
    # routed as each page: both pages belong to example.com, so one shard
    assert first[0][0] == second[0][0]
    # once the push is committed this worker does not push it again
    p.remember([first[0][1]])
    outlinks, again = p.page_links(PAGE, PAGE, [href], set(), 0, False)
    assert outlinks == [href] and again == [] and p.local_dups == 1


def test_invalid_link_on_another_site_goes_to_that_sites_shard():
    p = planner()
    page = "https://docs.example.org/"
    _, pushes = p.page_links(page, page, ["http://exa mple.com/"], set(), 0, False)
    (shard, _, item), = pushes
    r = p.router.route(p.router.canonical(page))
    assert (shard, item.pkey, item.host) == (r.shard, "example.org", "docs.example.org")


def test_whatwg_resolution_in_page_links():
    # ///host and backslashes make an authority (WHATWG), hex IPv4 is dotted,
    # UTS #46 maps the host, a trailing dot is dropped
    p = planner()
    outlinks, _ = p.page_links(PAGE, PAGE, ["///www.example.com/a", "\\\\www.example.com\\b", "http://0x7f000001/",
                                            "http://ＷＷＷ.example.com/c", "http://www.example.com./d"],
                               set(), 0, False)
    assert outlinks == ["http://www.example.com/a", "http://www.example.com/b", "http://127.0.0.1/",
                        "http://www.example.com/c", "http://www.example.com/d"]


def test_dead_letter_row_of_an_invalid_link_that_does_not_split():
    from crawld.rows import dead_letter_row

    # an invalid link's entry dead-lettered while being recorded (its worker
    # kept dying): the row still comes out, though urlsplit refuses the form
    record = "http://[oops/"
    dead = {"payload": Entry(record, record, 2, PAGE).to_payload().decode(), "attempts": 3,
            "reason": "worker died", "mode": "invalid_url: invalid IPv6 address", "at_us": 1_700_000_000_000_000}
    row = dead_letter_row("c1", 0, dead)
    assert (row["url"], row["canonical_url"], row["host"], row["outcome"]) == (record, record, "", "dead_letter")

"""A many-site web that misbehaves the way real ones do, served by one
:class:`crawld.sitesrv.SiteServer` (the crawler's proxy), for the messy-web
test and ``bench/messy_web.py``.

Every site is a registered domain ``D`` (made-up names under real public
suffixes) whose bare host redirects every path to ``www.D`` (301), robots.txt
included, as many real sites do.  ``www.D`` serves a synthetic site whose
pages also link to ``/private/...``, which its robots.txt disallows; every
fifth site answers its robots.txt through a chain of redirects (five hops
from the bare host, the most RFC 9309 section 2.3.1.2 asks a crawler to
follow); every seventh has no robots.txt at all (404: allow all).  One more
site answers 429 (no Retry-After) above 1 request/s, as nginx ``limit_req``
does.  Seeds are the bare hosts' home pages.

Server-side facts for the checks: :meth:`MessyWeb.expected_pages` (every
page a correct crawler fetches with status 200), :meth:`MessyWeb.lower_bound`
(max over domains of the requests it needs / R: no polite crawler is done
sooner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crawld.sitesrv import SyntheticSite

#: real public suffixes (ICANN section of the PSL)
SUFFIXES = ("com", "org", "net", "co.uk", "de", "com.au", "io", "fr", "co.jp", "nl", "org.uk", "com.br")
ROBOTS = b"User-agent: *\nDisallow: /private/\n"
CHAIN = 4  # hops after the bare host's first one: 5 redirects in all


@dataclass
class MessyWeb:
    domains: list[str]
    pages: int
    limited: str                     # the registered domain that answers 429 above 1 r/s
    limited_pages: int
    synthetic: dict[str, SyntheticSite] = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    redirect_hosts: dict[str, str] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)

    @property
    def seeds(self) -> list[str]:
        return [f"http://{d}/" for d in self.domains]

    def server_kwargs(self) -> dict:
        return dict(synthetic=self.synthetic, files=self.files, redirect_hosts=self.redirect_hosts,
                    limits=self.limits)

    def site_pages(self, domain: str) -> int:
        return self.limited_pages if domain == self.limited else self.pages

    def has_robots(self, domain: str) -> bool:
        return (f"www.{domain}", "/robots.txt") in self.files

    def private(self, domain: str) -> set[str]:
        """Paths of ``domain``'s /private/ pages (page n links to n + 1)."""
        return {f"/private/{n}.html" for n in range(self.site_pages(domain) + 1)}

    def expected_pages(self) -> set[tuple[str, str]]:
        """``(host, path)`` of every page fetched with status 200 (the
        /private/ ones only where no robots.txt forbids them)."""
        out = set()
        for d in self.domains:
            www = f"www.{d}"
            out.add((www, "/"))
            out.update((www, f"/p/{n}.html") for n in range(self.site_pages(d)))
            if not self.has_robots(d):
                out.update((www, p) for p in self.private(d))
        return out

    def requests_needed(self, domain: str) -> int:
        """Requests a correct crawler sends to ``domain``: the bare home page
        and robots.txt (both redirects), the www robots.txt and its chain,
        the pages."""
        i = self.domains.index(domain)
        chain = CHAIN if i % 5 == 0 and domain != self.limited else 0
        private = 0 if self.has_robots(domain) else len(self.private(domain))
        return 2 + 1 + chain + 1 + self.site_pages(domain) + private

    def lower_bound(self, rps: float) -> float:
        """Seconds: max over domains of its requests / ``rps`` and, for the
        limited domain, of its ``www.`` host's requests / 1 r/s."""
        www_limited = self.requests_needed(self.limited) - 2  # its bare host's two redirects are not limited
        return max(max(self.requests_needed(d) / rps for d in self.domains), www_limited / 1.0)


def build(n_domains: int, pages: int, limited_pages: int = 3) -> MessyWeb:
    """A web of ``n_domains`` sites of ``pages`` pages plus the 429 site."""
    domains = [f"messy{i:03d}-web.{SUFFIXES[i % len(SUFFIXES)]}" for i in range(n_domains)]
    limited = "messy-limited.com"
    domains.append(limited)
    web = MessyWeb(domains, pages, limited, limited_pages)
    for i, d in enumerate(domains):
        www = f"www.{d}"
        peers = [f"www.{domains[(i + k) % len(domains)]}" for k in (1, 2)]
        web.synthetic[www] = SyntheticSite(web.site_pages(d), peers=peers, extra_links=2, seed=i,
                                           private_links=True)
        web.redirect_hosts[d] = www
        if d == limited:
            web.limits[www] = 1.0
            web.files[(www, "/robots.txt")] = (200, ROBOTS, "text/plain")
        elif i % 5 == 0:
            hops = ["/robots.txt", *(f"/robots-{k}.txt" for k in range(1, CHAIN))]
            for a, b in zip(hops, hops[1:] + ["/robots-final.txt"]):
                web.files[(www, a)] = (301, b"", "text/html", {"Location": f"http://{www}{b}"})
            web.files[(www, "/robots-final.txt")] = (200, ROBOTS, "text/plain")
        elif i % 7 != 0:
            web.files[(www, "/robots.txt")] = (200, ROBOTS, "text/plain")
    return web

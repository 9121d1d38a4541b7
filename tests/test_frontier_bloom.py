"""tests/test_frontier.py again, every crawl with ``dedup=redis_bloom``
(the Bloom filter over a Redis bitmap: the test server has no RedisBloom):
the frontier's semantics must not depend on the dedup backend."""

from __future__ import annotations

import pytest

import test_frontier
from test_frontier import *  # noqa: F401,F403 - the tests themselves, collected here again


@pytest.fixture(autouse=True)
def _bloom_backend(monkeypatch):
    monkeypatch.setattr(test_frontier, "DEDUP", {"dedup": "redis_bloom"})


def test_these_runs_use_the_bloom_filter(rds):
    from crawld import dedup

    f = test_frontier.make_frontier(rds)
    assert f.config.dedup == "redis_bloom"
    f.push(0, [test_frontier.item(test_frontier.A, 1)])
    assert dedup.info(rds, test_frontier.CRAWL, 0)["backend"] in ("lua", "bf")

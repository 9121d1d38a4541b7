"""``crawlctl rebalance``: change the shard count of a live crawl.

Protocol (each step can be re-run: progress is kept in
:func:`crawld.keys.crawl_rebalance`, and a second ``crawlctl rebalance``
with the same count resumes an interrupted one):

0. One rebalancer at a time: it takes the crawl's rebalance lock
   (:func:`crawld.keys.crawl_rebalance_lock`, a TTL of ``lease_ttl_s``
   renewed while it runs); a second ``crawlctl rebalance`` refuses to start
   and a killed one lets go within the TTL.  The new config keeps every
   shard's dedup sizing: ``expected_urls`` becomes (URLs per shard) x the
   new count, so the structures a new shard creates later have the size
   of those copied (Bloom filters of one size can be OR-ed again by a
   later rebalance).
1. The crawl's state (:func:`crawld.keys.crawl_state`) becomes
   ``rebalancing``.  Workers treat it like ``paused`` (claim nothing), finish
   and commit what they hold, then stop serving the crawl and give its
   shard leases up (crawld.worker ``check_crawls``/``_retire``); they do not
   serve it again (``discover``) until it is active again.
2. The rebalancer waits until every shard of the old and new count has no
   lease holder and an empty claimed set (timeout: the state is set back,
   exit 1).  An empty claimed set after a worker's last commit means every
   link its pages found is pushed (a commit pushes before it acks).  It then
   takes every such shard's lease with its own token, renewing them while
   it works: the claim script is fenced by the lease, so nothing can be
   claimed during the move, even by a misbehaving worker.  It writes the
   new rebalance generation into every shard (``stats`` field
   ``rebalance_epoch``): from now on the lease script refuses any worker
   whose config predates it (its lease call says which generation its
   config is from), so a worker that read the old config can never claim
   or push again with the old routing: it reloads the crawl first.
3. For every old shard, the politeness keys are found from its queue
   (ZSCAN), schedule and per-key hashes (HSCAN), the host-keyed hashes
   (budget, variants: the host's politeness key) and the robots cache (the
   origin's host); each key whose shard under the new count (with the
   crawl's ``shard_overrides``) differs is moved: queue entries, schedule
   score, ``gcra``/``rates``/``fails``/``parked`` fields, budget and
   variants fields of its hosts, robots cache entries of its origins, and
   the skip-list entries of its URLs (and, from a removed shard, its dead
   letters; its counters are added to shard 0's).  ``inflight`` fields of
   moved keys are dropped (nothing is claimed, so no slot is held).  Each
   structure is copied to the target first, then deleted from the source,
   so a crash leaves entries twice, never nowhere, and a re-run finishes
   the job (list entries are only appended when absent from the target).
   A moved key with queued entries but no schedule entry on its target is
   scheduled (score 0: the claim script applies GCRA).

   Visited state moves first.  ``redis_set`` structures keep each URL's
   politeness-key slot in its entry (:mod:`crawld.dedup`), and a slot alone
   decides an unpinned key's shard (:func:`crawld.sharding.shard_of_slot`),
   so the entries of exactly the domains that change shard are moved: each
   bucket is read (SMEMBERS, 256 buckets per pipeline), every entry whose
   slot maps elsewhere under the new count is added to its target (same
   bucket layout; a target laid out with other bucket bits gets
   ``bucket >> diff``, or every candidate bucket when it has more bits)
   and then removed from the source.  Entries whose slot is also the slot
   of a domain pinned to the source (``shard_overrides``; pinned keys never
   move) are copied but kept, since they may be the pinned domain's.  Bloom
   filters cannot tell their entries apart: a ``redis_bloom`` source
   shard's filter is copied to, or OR-ed into, every shard that may
   receive domains from it (jump hash is monotone: growing from n to m
   moves keys only to shards n..m-1, shrinking only moves keys of shards
   >= m).  OR-ing fills the target more (a higher false-positive rate, see
   crawld.dedup); filters of different sizes, or RedisBloom filters, are
   refused up front with a one-line error, as are plain sets (a crawl laid
   out before the dedup backends).
4. The config (``num_shards``) is stored, then the crawl's generation
   (:func:`crawld.keys.crawl_epoch`) incremented, removed shards' keys
   deleted, the leases released and the state set back to what it was,
   or to what ``crawlctl pause|resume|cancel`` asked for meanwhile (they
   record it in the progress hash while the crawl is rebalancing).
   Workers serve the crawl again with the new config: a worker whose shard
   is not below the new count no longer serves it; the reclaim process
   re-reads the config on every pass.

On a single Redis and on a Redis Cluster alike the move is copy-then-delete
(source and target shards are different hash slots).  ``crawlctl verify``
judges a rebalanced crawl's row count in total, not per shard (rows keep
the shard that wrote them).  Not covered: seeding the crawl (``crawlctl
seed``) while it is being rebalanced.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlsplit

import redis

from . import dedup, keys
from .config import CrawlConfig
from .crawls import check_shared_routing, load_crawl, load_scope
from .frontier import Frontier, register_plain_script
from .scope import Router, scope_keys
from .sharding import key_slot, politeness_key, shard_for, shard_of_slot

SEP = b"\x1f"

#: the scripts of crawld/lua/ the rebalancer runs
LUA_SCRIPTS = ("crawl_state", "rebalance_start", "fold_stats", "lock_renew", "lock_release")

#: shared hashes keyed by politeness key that move with it (``inflight`` is
#: dropped; ``want`` is not kept: nothing waits during a rebalance)
PKEY_HASHES = ("gcra", "rates", "fails", "parked", "adapt", "floor")


class RebalanceError(RuntimeError):
    """A rebalance cannot be done (or was given up); one line."""


# -- planning (pure) ---------------------------------------------------------
def target_shards(src: int, old_n: int, new_n: int) -> list[int]:
    """Shards that may receive politeness keys from ``src`` when a crawl
    goes from ``old_n`` to ``new_n`` shards (jump hash is monotone: growing
    moves keys only to the new shards; shrinking moves only the keys of
    removed shards, to any remaining one)."""
    if new_n > old_n:
        return list(range(old_n, new_n))
    if src >= new_n:
        return list(range(new_n))
    return []


def plan(pkeys: Iterable[str], old_n: int, new_n: int,
         overrides: Mapping[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """``pkey -> (old shard, new shard)`` for the keys that move."""
    out = {}
    for k in pkeys:
        a, b = shard_for(k, old_n, overrides), shard_for(k, new_n, overrides)
        if a != b:
            out[k] = (a, b)
    return out


def host_pkey(field: bytes | str, private: bool = True) -> str | None:
    """Politeness key of a host-keyed field: ``host``, ``host[:port]/path``
    (variants) or ``scheme://host:port`` (robots); None if no host.
    ``private``: the crawl's ``psl_private_domains``."""
    s = field.decode("utf-8", "replace") if isinstance(field, bytes) else field
    if "://" not in s:
        s = "//" + s
    try:
        host = urlsplit(s).hostname
        return politeness_key(host, private) if host else None
    except ValueError:
        return None


def _d(b: bytes | str) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


# -- the rebalancer ------------------------------------------------------------
class Rebalancer:
    """Moves crawl ``crawl_id`` to ``num_shards`` shards (see the module)."""

    def __init__(self, client: redis.Redis, crawl_id: str, num_shards: int, *, wait_s: float = 120.0,
                 lease_ttl_s: float = 30.0, log: Callable[[str], None] = lambda s: None):
        self.client = client
        self.cid = keys.check_crawl_id(crawl_id)
        self.to = int(num_shards)
        self.wait_s = wait_s
        self.lease_ttl_s = lease_ttl_s
        self.log = log
        self.pkey_ = keys.crawl_rebalance(self.cid)
        self.moved = 0
        self.visited_moved = 0
        self._stop = threading.Event()
        self._renew_lock = threading.Lock()
        self._renew_n = 0  # the renewer keeps the leases of shards below this
        self._lock_lost = False
        self._owner = ""
        self._lua = {name: register_plain_script(client, name) for name in LUA_SCRIPTS}

    def _progress(self) -> dict[str, str]:
        return {_d(k): _d(v) for k, v in self.client.hgetall(self.pkey_).items()}

    def run(self) -> dict[str, Any]:
        config = load_crawl(self.client, self.cid)  # NoSuchCrawl, ConfigError
        prog = self._progress()
        if prog and not {"to", "from", "token", "epoch", "prev_state"} <= set(prog):
            # a start that did not complete (a crawlctl from before the start
            # was one step): nothing was moved, begin again
            self.client.delete(self.pkey_)
            prog = {}
        if prog:
            if int(prog["to"]) != self.to:
                raise RebalanceError(f"crawl {self.cid}: a rebalance to {prog['to']} shards is under way; "
                                     f"run 'crawlctl rebalance --crawl-id {self.cid} --num-shards {prog['to']}'")
            old = int(prog["from"])
        else:
            old = config.num_shards
            if old == self.to:
                return {"crawl_id": self.cid, "from": old, "to": self.to, "moved": 0, "noop": True}
        # each shard keeps its dedup sizing (Bloom filter bits, set bucket
        # bits): expected_urls scales with the count, so the structures a
        # new shard creates match the ones copied or kept
        per = dedup.per_shard(config.expected_urls, config.num_shards)
        new_config = config.replace(num_shards=self.to, expected_urls=per * self.to)  # ConfigError: overrides
        # its domains' politeness state moves with them: no other live crawl
        # may keep them where they are (SharedDomainConflict)
        self.scope = load_scope(self.client, self.cid) | set(scope_keys(config))
        check_shared_routing(self.client, new_config, self.scope)
        self.old, self.new_config, self.config = old, new_config, config
        self.all = max(old, self.to)
        self.fr = Frontier(self.client, config.replace(num_shards=self.all))
        self._lock()
        self._stop.clear()
        renewer = threading.Thread(target=self._renew, daemon=True)
        renewer.start()
        try:
            return self._run(prog, old, new_config)
        finally:
            self._stop.set()
            renewer.join()
            self._lua["lock_release"](keys=[keys.crawl_rebalance_lock(self.cid)], args=[self._owner])

    def _run(self, prog: dict[str, str], old: int, new_config: CrawlConfig) -> dict[str, Any]:
        if not prog:
            self._check_dedup()
            state = _d(self.client.get(keys.crawl_state(self.cid)) or b"active")
            if state in ("cancelled", "rebalancing"):
                raise RebalanceError(f"crawl {self.cid} is {state}; it cannot be rebalanced")
            epoch = int(self.client.get(keys.crawl_epoch(self.cid)) or 0) + 1
            start = {"to": self.to, "from": old, "token": f"rebalance:{uuid.uuid4().hex[:12]}",
                     "prev_state": state, "epoch": epoch, "phase": "waiting"}
            if not self._lua["rebalance_start"](keys=[self.pkey_], args=[x for kv in start.items() for x in kv]):
                raise RebalanceError(f"crawl {self.cid}: another rebalance started meanwhile")
            prog = self._progress()
        self.token, self.epoch = prog["token"], int(prog["epoch"])
        before = _d(self._lua["crawl_state"](keys=[keys.crawl_state(self.cid)], args=["rebalancing"]))
        if before == "cancelled":
            self.client.delete(self.pkey_)
            raise RebalanceError(f"crawl {self.cid} is cancelled; it cannot be rebalanced")
        try:
            self._take_shards(prog.get("phase") == "waiting")
        except RebalanceError:
            if prog.get("phase") == "waiting":  # nothing moved yet: undo
                self.client.set(keys.crawl_state(self.cid), self._prev_state(prog))
                self.client.delete(self.pkey_)
            raise
        with self._renew_lock:
            self._renew_n = self.all
        self.client.hset(self.pkey_, "phase", "moving")
        for s in range(self.all):
            self.client.hset(keys.shard_keys(self.cid, s).stats, "rebalance_epoch", self.epoch)
        for src in range(old):
            if not self.client.hget(self.pkey_, f"done:{src}"):
                self._check_lock()
                self._move_shard(src)
                self.client.hset(self.pkey_, f"done:{src}", 1)
        # the new config, then the generation (workers read them in the
        # other order), then the removed shards' keys go
        self._check_lock()
        self.client.set(keys.crawl_config(self.cid), new_config.to_json())
        self.client.set(keys.crawl_epoch(self.cid), self.epoch)
        self.client.hset(self.pkey_, "phase", "finishing")
        with self._renew_lock:  # no lease of a removed shard is renewed after this
            self._renew_n = self.to
        for s in range(self.to, old):
            self._delete_shard(s)
        with self._renew_lock:  # none is renewed (taken again) after its release
            self._renew_n = 0
        for s in range(self.to):
            self.fr.release(s, self.token)
        state = self._prev_state(prog)
        self.client.set(keys.crawl_state(self.cid), state)
        self.client.delete(self.pkey_)
        return {"crawl_id": self.cid, "from": old, "to": self.to, "moved": self.moved,
                "visited_moved": self.visited_moved, "noop": False, "state": state}

    def _prev_state(self, prog: dict[str, str]) -> str:
        """The state to give the crawl back: ``prev_state`` as it is now
        (``crawlctl pause|resume|cancel`` during the rebalance set it)."""
        return self._progress().get("prev_state") or prog.get("prev_state") or "active"

    def _lock(self) -> None:
        """Take the crawl's rebalance lock, or raise RebalanceError naming
        its holder."""
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        lock = keys.crawl_rebalance_lock(self.cid)
        if not self.client.set(lock, self._owner, nx=True, px=int(self.lease_ttl_s * 1000)):
            holder = _d(self.client.get(lock) or b"?")
            raise RebalanceError(f"crawl {self.cid}: another 'crawlctl rebalance' is working on it ({holder}); "
                                 f"wait for it (a killed one lets go within {self.lease_ttl_s:g}s, then re-run "
                                 "to resume)")
        self._lock_lost = False

    def _check_lock(self) -> None:
        if self._lock_lost:
            raise RebalanceError(f"crawl {self.cid}: lost the rebalance lock (Redis unreachable for "
                                 f"{self.lease_ttl_s:g}s?); re-run to resume")

    # -- steps -----------------------------------------------------------------
    def _check_dedup(self) -> None:
        """Refuse up front what cannot be moved: RedisBloom filters, Bloom
        filters of different sizes, and plain sets (a crawl laid out before
        the dedup backends)."""
        for st in dedup.STRUCTURES:
            ls = [i for s in range(self.all) if (i := dedup.info(self.client, self.cid, s, st))]
            if any(i["backend"] == "plain" for i in ls):
                raise RebalanceError(f"crawl {self.cid}: its visited sets are laid out as before the dedup "
                                     "backends; it cannot be rebalanced")
            if self.config.dedup != "redis_bloom":
                continue
            if any(i["backend"] == "bf" for i in ls):
                raise RebalanceError(f"crawl {self.cid}: RedisBloom filters cannot be merged; a redis_bloom "
                                     "crawl on RedisBloom cannot be rebalanced")
            if len({(i["m"], i["k"]) for i in ls}) > 1:
                raise RebalanceError(f"crawl {self.cid}: its shards' Bloom filters differ in size; they "
                                     "cannot be merged")

    def _busy(self) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for s in range(self.all):
            k = keys.shard_keys(self.cid, s)
            pipe.get(k.lease).zcard(k.claimed)
        r = pipe.execute()
        return [s for s in range(self.all)
                if (r[2 * s] is not None and _d(r[2 * s]) != self.token) or r[2 * s + 1]]

    def _take_shards(self, fresh: bool) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            busy = self._busy()
            if not busy:
                taken = [s for s in range(self.all) if self.fr.lease(s, self.token, self.lease_ttl_s)]
                if len(taken) == self.all and not self._busy():
                    return
                for s in taken:
                    self.fr.release(s, self.token)
            if time.monotonic() >= deadline:
                raise RebalanceError(
                    f"crawl {self.cid}: shards still leased or claimed after {self.wait_s:g}s: "
                    f"{', '.join(map(str, busy)) or 'lease race'}; state set back, nothing moved"
                    if fresh else f"crawl {self.cid}: shards still busy after {self.wait_s:g}s: "
                                  f"{', '.join(map(str, busy))}; re-run to resume the rebalance")
            time.sleep(0.2)

    def _renew(self) -> None:
        """Keep the rebalance lock and the rebalancer's shard leases, every
        ttl/3 seconds, until stopped; leases only of shards below
        ``_renew_n`` (checked under the lock with each lease call, so that a
        removed shard's deleted lease is never renewed)."""
        lock = keys.crawl_rebalance_lock(self.cid)
        every = self.lease_ttl_s / 3.0

        def renew_lock() -> float:
            try:
                if not self._lua["lock_renew"](keys=[lock], args=[self._owner, int(self.lease_ttl_s * 1000)]):
                    self._lock_lost = True
            except redis.RedisError:
                pass
            return time.monotonic()

        while not self._stop.wait(every):
            renewed = renew_lock()
            s = 0
            while not self._stop.is_set():
                # a round over many shards' leases may outlast the lock's
                # TTL: renew it on the way too
                if time.monotonic() - renewed >= every:
                    renewed = renew_lock()
                with self._renew_lock:
                    if s >= self._renew_n:
                        break
                    try:
                        self.fr.lease(s, self.token, self.lease_ttl_s)
                    except redis.RedisError:
                        pass
                s += 1

    def _target(self, pkey: str) -> int:
        return shard_for(pkey, self.to, self.new_config.shard_override_map)

    def _move_shard(self, src: int) -> None:
        c = self.client
        sk = keys.shard_keys(self.cid, src)
        dst_keys = {d: keys.shard_keys(self.cid, d) for d in range(self.to)}
        # 0. visited state first: what the targets must know before any of
        #    the source's domains is served there
        for st in dedup.STRUCTURES:
            if self.config.dedup == "redis_set":
                flag = f"dedup:{src}:{st}"
                if not c.hget(self.pkey_, flag):
                    self._move_visited(src, getattr(sk, st), {d: getattr(k, st) for d, k in dst_keys.items()})
                    c.hset(self.pkey_, flag, 1)
                continue
            for dst in target_shards(src, self.old, self.to):
                flag = f"dedup:{src}:{dst}:{st}"
                if not c.hget(self.pkey_, flag):
                    self._copy_bloom(getattr(sk, st), getattr(dst_keys[dst], st))
                    c.hset(self.pkey_, flag, 1)
        moved: dict[str, int] = {}

        def dest(pkey: str) -> int | None:
            if pkey not in moved:
                d = self._target(pkey)
                moved[pkey] = d
            d = moved[pkey]
            return d if d != src else None

        # 1. per-key hashes and the host-keyed ones; the shared ones (every
        #    crawl's politeness state on this shard number) only for this
        #    crawl's domains, and without overwriting what the target holds
        #    (another crawl routing the domain there: the later TAT wins)
        by_host = functools.partial(host_pkey, private=self.config.psl_private_domains)
        for name, keyfn in [*((h, _d) for h in PKEY_HASHES), ("budget", by_host), ("variants", by_host),
                            ("robots", by_host)]:
            shared = name in keys.SHARED_KEY_NAMES
            by_dst: dict[int, dict[bytes, bytes]] = defaultdict(dict)
            for f, v in c.hscan_iter(getattr(sk, name), count=1000):
                pk = keyfn(f)
                if pk and shared and pk not in self.scope:
                    continue
                d = dest(pk) if pk else None
                if d is not None:
                    by_dst[d][f] = v
            for d, fields in by_dst.items():
                target = getattr(dst_keys[d], name)
                if not shared:
                    c.hset(target, mapping=fields)
                elif name == "gcra":
                    have = dict(zip(fields, c.hmget(target, list(fields))))
                    later = {f: v for f, v in fields.items() if have[f] is None or float(have[f]) < float(v)}
                    if later:
                        c.hset(target, mapping=later)
                else:
                    pipe = c.pipeline(transaction=False)
                    for f, v in fields.items():
                        pipe.hsetnx(target, f, v)
                    pipe.execute()
                c.hdel(getattr(sk, name), *fields)
        # 2. schedule
        by_dst_z: dict[int, dict[bytes, float]] = defaultdict(dict)
        for m, score in c.zscan_iter(sk.sched, count=1000):
            d = dest(_d(m))
            if d is not None:
                by_dst_z[d][m] = score
        for d, ms in by_dst_z.items():
            c.zadd(dst_keys[d].sched, ms)
            c.zrem(sk.sched, *ms)
        # 3. queue entries
        by_dst_q: dict[int, list[bytes]] = defaultdict(list)
        qkeys: dict[int, set[str]] = defaultdict(set)
        for m, _ in c.zscan_iter(sk.queue, count=1000):
            pk = _d(m.split(SEP, 1)[0])
            d = dest(pk)
            if d is not None:
                by_dst_q[d].append(m)
                qkeys[d].add(pk)
        for d, ms in by_dst_q.items():
            for i in range(0, len(ms), 1000):
                c.zadd(dst_keys[d].queue, {m: 0 for m in ms[i:i + 1000]})
            for i in range(0, len(ms), 1000):
                c.zrem(sk.queue, *ms[i:i + 1000])
            c.hincrby(dst_keys[d].stats, "moved_in", len(ms))
            c.hincrby(sk.stats, "moved_out", len(ms))
            self.moved += len(ms)
            # a moved key with entries must be on its target's schedule
            pipe = c.pipeline(transaction=False)
            for pk in sorted(qkeys[d]):
                pipe.zadd(dst_keys[d].sched, {pk: 0}, nx=True)
            pipe.execute()
        gone = [pk for pk, d in moved.items() if d != src]
        mine = sk.queue.encode()
        for i in range(0, len(gone), 1000):
            batch = gone[i:i + 1000]
            c.hdel(sk.inflight, *batch, *[pk.encode() + SEP + mine for pk in batch])
        # 4. URLs to record without a fetch; a removed shard's dead letters
        router = Router(self.new_config)

        def skip_dest(entry: bytes) -> int | None:
            try:
                payload = entry.split(SEP, 2)[2]
                return dest(router.route(json.loads(payload)["c"]).pkey)
            except (IndexError, ValueError, KeyError, TypeError):
                return 0 if src >= self.to else None

        self._move_list(sk.skips, {d: k.skips for d, k in dst_keys.items()}, skip_dest)
        if src >= self.to:
            def dead_dest(entry: bytes) -> int:
                try:
                    pk = json.loads(entry).get("pkey") or ""
                except ValueError:
                    pk = ""
                return self._target(pk) if pk else 0

            self._move_list(sk.dead, {d: k.dead for d, k in dst_keys.items()}, dead_dest)
            # a removed shard's counters go to shard 0's, once per
            # generation even if re-run (the mark is set in the same script)
            args: list[Any] = [f"folded:{src}:{self.epoch}"]
            for k, v in c.hgetall(sk.stats).items():
                if k != b"rebalance_epoch" and not k.startswith(b"folded:"):
                    try:
                        args += [k, int(v)]
                    except ValueError:
                        pass
            self._lua["fold_stats"](keys=[dst_keys[0].stats], args=args)
        if gone:
            self.log(f"shard {src}: moved {sum(len(v) for v in by_dst_q.values())} queued URL(s) of "
                     f"{len(gone)} domain(s)")

    def _move_list(self, src_key: str, dst_keys: dict[int, str], dest_of) -> None:
        c = self.client
        entries = c.lrange(src_key, 0, -1)
        by_dst: dict[int, list[bytes]] = defaultdict(list)
        for e in entries:
            d = dest_of(e)
            if d is not None:
                by_dst[d].append(e)
        for d, es in by_dst.items():
            present = set(c.lrange(dst_keys[d], 0, -1))
            new = [e for e in es if e not in present]
            if new:
                c.rpush(dst_keys[d], *new)
            for e in es:
                c.lrem(src_key, 1, e)

    def _move_visited(self, src: int, src_key: str, dst_keys: dict[int, str]) -> None:
        """Move the entries of a slot-keeping ``redis_set`` structure whose
        slot maps to another shard under the new count (see the module)."""
        c = self.client
        meta = {_d(k): _d(v) for k, v in c.hgetall(src_key).items()}
        if not meta:
            return
        bs = int(meta["bits"])
        pinned_here = {key_slot(k) for k, v in self.new_config.shard_override_map.items() if v == src}
        dbits: dict[int, int] = {}

        def target_bits(d: int) -> int:
            if d not in dbits:
                dm = {_d(k): _d(v) for k, v in c.hgetall(dst_keys[d]).items()}
                if not dm:
                    c.hset(dst_keys[d], mapping={"b": "set", "bits": bs, "slot": 1, "n": 0})
                    dm = {"bits": str(bs)}
                dbits[d] = int(dm["bits"])
            return dbits[d]

        added: dict[int, int] = defaultdict(int)
        removed = 0
        step = 256
        for first in range(0, 1 << bs, step):
            buckets = range(first, min(first + step, 1 << bs))
            pipe = c.pipeline(transaction=False)
            for b in buckets:
                pipe.smembers(f"{src_key}:{b}")
            contents = pipe.execute()
            out = c.pipeline(transaction=False)
            ops: list[int] = []  # per queued command: its target shard, or -1 for a removal
            for b, members in zip(buckets, contents):
                by_dst: dict[int, list[bytes]] = defaultdict(list)
                gone = []
                for m in members:
                    slot = dedup.member_slot(int(m))
                    d = shard_of_slot(slot, self.to)
                    if d == src:
                        continue
                    by_dst[d].append(m)
                    if slot not in pinned_here:
                        gone.append(m)
                for d, ms in by_dst.items():
                    bd = target_bits(d)
                    targets = ([b >> (bs - bd)] if bd <= bs
                               else [(b << (bd - bs)) | j for j in range(1 << (bd - bs))])
                    for t in targets:
                        out.sadd(f"{dst_keys[d]}:{t}", *ms)
                        ops.append(d)
                if gone:  # after the copies: a crash leaves entries twice, never nowhere
                    out.srem(f"{src_key}:{b}", *gone)
                    ops.append(-1)
            for d, r in zip(ops, out.execute() if ops else []):
                if d < 0:
                    removed += int(r)
                else:
                    added[d] += int(r)
        for d, n in added.items():
            if n:
                c.hincrby(dst_keys[d], "n", n)
        if removed:
            c.hincrby(src_key, "n", -removed)
        self.visited_moved += removed
        if removed:
            self.log(f"shard {src}: moved {removed} visited entr{'y' if removed == 1 else 'ies'} of "
                     f"{src_key.rsplit(':', 1)[-1]} to {len(added)} shard(s)")

    def _copy_bloom(self, src: str, dst: str) -> None:
        """Copy the Lua Bloom filter ``src`` to ``dst``, or OR it into the
        filter of the same size there (see the module)."""
        c = self.client
        meta = {_d(k): _d(v) for k, v in c.hgetall(src).items()}
        if not meta:
            return
        dmeta = {_d(k): _d(v) for k, v in c.hgetall(dst).items()}
        if meta.get("b") != "lua":  # _check_dedup refused the others up front
            raise RebalanceError(f"dedup structure {src} ({meta.get('b')}) cannot be copied")
        m = int(meta["m"])
        nbytes = (m + 7) // 8
        if not dmeta:
            c.hset(dst, mapping=meta)
            c.setrange(f"{dst}:bits", nbytes - 1, b"\0")
        elif (dmeta.get("m"), dmeta.get("k")) != (meta.get("m"), meta.get("k")):
            raise RebalanceError(f"Bloom filters {src} and {dst} differ in size; they cannot be merged")
        else:
            c.hincrby(dst, "n", int(meta.get("n", 0)))
        chunk = 1 << 20
        for off in range(0, nbytes, chunk):
            a = c.getrange(f"{src}:bits", off, off + chunk - 1)
            if not a.strip(b"\0"):
                continue
            old = c.getrange(f"{dst}:bits", off, off + len(a) - 1)
            merged = (int.from_bytes(a, "big") | int.from_bytes(old.ljust(len(a), b"\0"), "big"))
            c.setrange(f"{dst}:bits", off, merged.to_bytes(len(a), "big"))

    def _delete_shard(self, s: int) -> None:
        # this crawl's keys of the shard only: the shared ones serve other crawls
        # (braces are literal in a SCAN pattern)
        found = [k for k in self.client.scan_iter(match=keys.crawl_shard_prefix(self.cid, s) + "*", count=1000)]
        for i in range(0, len(found), 500):
            self.client.unlink(*found[i:i + 500])


def rebalance(client: redis.Redis, crawl_id: str, num_shards: int, **kw: Any) -> dict[str, Any]:
    """Run :class:`Rebalancer`; returns ``{crawl_id, from, to, moved, noop}``
    plus, when something was done, ``visited_moved`` (visited entries
    moved) and ``state`` (the crawl's state, given back as it was).

    Raises:
        RebalanceError, ConfigError, redis.RedisError.
    """
    return Rebalancer(client, crawl_id, num_shards, **kw).run()

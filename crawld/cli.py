"""``crawlctl``: the operator's command line.

Every failure an operator can cause (bad URL, unreachable Redis, bad
setting, unwritable output) ends in one line on stderr,
``crawlctl: error: ...``, and a non-zero exit code from
:mod:`crawld.exitcodes`, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import __version__, exitcodes, settings
from .cliargs import Parser, crawl_id_arg, int_range, nonempty_path, percent, positive_float, proxy_url
from .config import ConfigError, CrawlConfig, settings_table
from .config import default_family
from .crawls import (CrawlExists, NoSuchCrawl, check_seeds, create_crawl, export_dead_letters, load_crawl,
                     read_seeds_file, seed)
from .frontier import Frontier, register_plain_script
from .localredis import RedisServerError
from .merge import merge_crawl
from .output import check_writable, list_parts
from .storage import StorageError, check_output, is_remote, list_remote_parts, merged, with_location
from .redisconn import RedisUnfit, check, connect
from .scope import Router
from .urls import BadURL


#: ``crawlctl run`` starts one worker process per shard on this machine.
MAX_LOCAL_SHARDS = 128
#: most seeds stored in a crawl's config (more: only their domains, in its scope set)
MAX_CONFIG_SEEDS = 100


class CliError(Exception):
    """A one-line error with an exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


_MACHINE: settings.MachineSettings | None = None


def machine() -> settings.MachineSettings:
    """This machine's settings (/etc/crawl-workers, environment), read once.

    Raises:
        ConfigError: naming the bad setting.
    """
    global _MACHINE
    if _MACHINE is None:
        _MACHINE = settings.load()
    return _MACHINE


def _redis_url(args) -> str | None:
    return getattr(args, "redis_url", None) or machine()["REDIS_URL"]


def _client(args):
    url = _redis_url(args)
    if not url:
        raise CliError("REDIS_URL is not set (in /etc/crawl-workers/env, the environment, or --redis-url)",
                       exitcodes.CONFIG)
    client = connect(url)
    check(client, url)
    return client


def _crawl_settings(args) -> dict:
    """Crawl settings given on the command line (None = not given)."""
    d = {
        "num_shards": args.shards,
        "max_rps_per_host": args.max_rps_per_host,
        "max_depth": args.max_depth,
        "burst": args.burst,
        "max_inflight_per_host": args.max_inflight_per_host,
        "allow_domains": args.allow_domain,
        "user_agent": args.user_agent,
        "visibility_timeout_s": args.visibility_timeout,
        "max_attempts": args.max_attempts,
        "max_pages_per_host": args.max_pages_per_host,
        "sitemaps": args.sitemaps or None,
        "allow_loopback": args.allow_loopback or None,
        "allow_private_networks": args.allow_private_networks or None,
    }
    d = {k: v for k, v in d.items() if v is not None}
    for item in args.set or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CliError(f"--set {item!r}: expected NAME=VALUE (see 'crawlctl settings')", exitcodes.USAGE)
        if name.strip() in ("crawl_id", "seeds"):
            how = "--crawl-id" if name.strip() == "crawl_id" else "SEED_URL arguments"
            raise CliError(f"--set {name.strip()}: give it as {how}", exitcodes.USAGE)
        d[name.strip()] = value
    return d


def _add_crawl_options(p: argparse.ArgumentParser, crawl_id_help: str, required: bool = False) -> None:
    g = p.add_argument_group("crawl settings (stored with the crawl; see 'crawlctl settings')")
    g.add_argument("--crawl-id", type=crawl_id_arg, help=crawl_id_help, required=required)
    g.add_argument("--shards", type=int, help="number of shards (default 4)")
    g.add_argument("--max-rps-per-host", type=float, metavar="R",
                   help="requests/s per registered domain (default 2)")
    g.add_argument("--burst", type=float, help="GCRA capacity in requests, 1-2 (default 1)")
    g.add_argument("--max-inflight-per-host", type=int, metavar="N", help="default 2")
    g.add_argument("--max-depth", type=int, metavar="D", help="link depth limit (default 20)")
    g.add_argument("--allow-domain", action="append", metavar="DOMAIN",
                   help="extra registered domain in scope (repeatable)")
    g.add_argument("--user-agent")
    g.add_argument("--visibility-timeout", type=float, metavar="S", help="claim timeout in s (default 120)")
    g.add_argument("--max-attempts", type=int, metavar="N", help="claims before dead-lettering (default 3)")
    g.add_argument("--max-pages-per-host", type=int, metavar="N",
                   help="URLs queued per host name at most (default 50000; 0 = no limit)")
    g.add_argument("--sitemaps", action="store_true", help="also seed URLs from robots.txt Sitemap: lines "
                   "and /sitemap.xml")
    g.add_argument("--allow-loopback", action="store_true",
                   help="allow fetching 127.0.0.0/8, ::1 and localhost (off by default)")
    g.add_argument("--allow-private-networks", action="store_true",
                   help="allow fetching RFC 1918 / RFC 4193 / CGNAT addresses (off by default)")
    g.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="any crawl setting, e.g. --set robots_ttl_s=3600 (repeatable; see 'crawlctl settings')")


def _add_seeds_file_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds-file", metavar="FILE", action="append",
                   help="more seed URLs, one a line ('#' starts a comment line; '-' reads stdin); any "
                        "number, only their registered domains are stored with the crawl (repeatable)")


def _seeds(args) -> list[str]:
    """The seeds of the command line and of ``--seeds-file`` files, checked.

    Raises:
        CliError: a file cannot be read, or no seed at all (usage).
        BadURL: naming the first seed that is not a URL (and its file and line).
    """
    seeds = check_seeds(args.seeds) if args.seeds else []
    for name in args.seeds_file or ():
        try:
            seeds += read_seeds_file(name)  # checked, each bad line named
        except OSError as exc:
            raise CliError(f"--seeds-file {name}: {exc.strerror or exc}", exitcodes.NOINPUT)
    if not seeds:
        raise CliError("no seed URL given (SEED_URL arguments or --seeds-file)", exitcodes.USAGE)
    return seeds


def _config_seeds(seeds: list[str]) -> list[str]:
    """The seeds stored in the crawl's config: all of a short list; none of
    a long one (its registered domains are the crawl's scope set, and every
    worker and reclaim pass reads the config)."""
    return seeds if len(seeds) <= MAX_CONFIG_SEEDS else []


def _with_family(config: CrawlConfig, seeds: list[str] | None = None) -> CrawlConfig:
    """``config`` with its ``family`` stored explicitly (empty = the
    registered domains of ``seeds``, default the config's), so that later
    crawls of the same sites compare."""
    if config.family:
        return config
    return config.replace(family=default_family(seeds if seeds is not None else config.seeds))


def _new_crawl_id() -> str:
    return "run-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid() % 10000:04d}"


def _run_here(config: CrawlConfig, opts, **kw) -> dict:
    """:func:`crawld.runner.run_crawl` (``kw``: its ``seeds``, ``resume``),
    with a temporary spool for an object-storage output and its errors as
    :class:`CliError` exit codes; returns the summary."""
    from .runner import RunFailed, RunInterrupted, run_crawl

    if is_remote(config.output):
        # workers spool their parts here until each closed part is uploaded
        import tempfile

        opts.env["CRAWLD_SPOOL_DIR"] = tempfile.mkdtemp(prefix=f"crawld-spool-{config.crawl_id}-")
    try:
        return run_crawl(config, opts, **kw)
    except RunInterrupted as exc:
        raise CliError(str(exc), exitcodes.INTERRUPTED)
    except RunFailed as exc:
        raise CliError(str(exc), exitcodes.FAILED)
    finally:
        spool = opts.env.get("CRAWLD_SPOOL_DIR")
        if spool and not any(p.is_file() for p in Path(spool).rglob("*")):
            import shutil

            shutil.rmtree(spool, ignore_errors=True)  # every part shipped


def cmd_run(args) -> int:
    from .runner import RunOptions, print_summary

    seeds = _seeds(args)
    # workers, reclaimer and supervisor log warnings and errors only, unless
    # asked: the live progress line and the summary are the run's output
    os.environ.setdefault("CRAWLD_LOG_LEVEL", "info" if args.verbose else "warning")
    if args.shards is not None and args.shards > MAX_LOCAL_SHARDS:
        raise CliError(f"num_shards: crawlctl run starts one process per shard; use at most {MAX_LOCAL_SHARDS} "
                       "here (serve more shards with crawld on a fleet)", exitcodes.CONFIG)
    defaults = machine().crawl_defaults
    out_text = args.out or defaults.get("output") or "crawl-output"
    storage = None
    if is_remote(out_text):
        try:
            storage = check_output(out_text)  # reachable and writable, or one line naming the bucket
        except StorageError as exc:
            raise CliError(str(exc), exitcodes.CANTCREAT)
        out = storage.url
    else:
        out = Path(out_text).resolve()
        try:
            check_writable(out)
        except OSError as exc:
            raise CliError(f"--out {out_text}: not writable ({exc.strerror or exc})", exitcodes.CANTCREAT)
    data = {**defaults, "crawl_id": args.crawl_id or _new_crawl_id(), "seeds": _config_seeds(seeds),
            "output": str(out), **_crawl_settings(args)}
    config = _with_family(CrawlConfig.from_dict(data), seeds)
    if list_remote_parts(storage, config.crawl_id) if storage is not None else list_parts(out, config.crawl_id):
        where = storage.location_of(f"parts/{config.crawl_id}") if storage is not None else out / "parts" / config.crawl_id
        raise CliError(f"crawl_id: {where} already holds parts of a crawl "
                       f"{config.crawl_id!r}; pick another --crawl-id or another --out", exitcodes.CONFIG)
    proxy = args.proxy or machine()["CRAWLD_PROXY"]
    workers = args.workers or machine()["NUM_WORKERS"]
    opts = RunOptions(redis_url=_redis_url(args), concurrency=workers, proxy=proxy,
                      drain_timeout_s=args.drain_timeout,
                      progress=sys.stderr.isatty() and not args.quiet)
    summary = _run_here(config, opts, seeds=seeds)
    print_summary(summary, args.json)
    if not summary["statuses"] and summary["rows"]:
        loopback = _loopback_seeds(config, seeds) if summary["not_fetched"].get("address_blocked") else []
        if loopback:
            raise CliError(f"no URL could be fetched: none of the {summary['rows']} rows has a response; seed "
                           f"{loopback[0]} is a loopback address, refused by the network policy "
                           f"({LOOPBACK_HINT})", exitcodes.FAILED)
        raise CliError(f"no URL could be fetched: none of the {summary['rows']} rows has a response "
                       "(see the outcome and error columns of the artifact)", exitcodes.FAILED)
    return exitcodes.OK


#: how to crawl a seed that the network policy refuses as loopback
LOOPBACK_HINT = "pass --allow-loopback to crawl a site on this machine"


def _loopback_seeds(config: CrawlConfig, seeds: list[str], router=None) -> list[str]:
    """The seeds that ``config``'s network policy refuses only because they
    are on a loopback address (127.0.0.0/8, ::1, localhost), in order.
    ``seeds`` are valid URLs (:func:`crawld.crawls.check_seeds`); ``router``
    a :class:`crawld.scope.Router` of the crawl that may know them already."""
    from .netpolicy import AddressPolicy
    from .scope import Router

    if config.allow_loopback:
        return []
    router = router or Router(config)
    policy = AddressPolicy(config.allow_loopback, config.allow_private_networks)
    with_loopback = AddressPolicy(True, config.allow_private_networks)
    out = []
    for s in seeds:
        canon = router.canonical(s)
        if canon is None:
            continue
        host = router.route(canon).host
        if policy.check_host(host) and not with_loopback.check_host(host):
            out.append(s)
    return out


def cmd_seed(args) -> int:
    seeds = _seeds(args)
    defaults = machine().crawl_defaults
    out_text = args.out or defaults.get("output") or "crawl-output"
    output = out_text if "://" in out_text else str(Path(out_text).resolve())
    data = {**defaults, "crawl_id": args.crawl_id, "seeds": _config_seeds(seeds), "output": output,
            **_crawl_settings(args)}
    config = _with_family(CrawlConfig.from_dict(data), seeds)
    client = _client(args)
    router = Router(config, max_cache=max(200_000, 2 * len(seeds)))  # one canonical form and route per seed
    create_crawl(client, config, seeds, router)
    n = seed(client, config, seeds, router)
    print(f"crawl {config.crawl_id}: {n} new seed(s) queued across {config.num_shards} shard(s)")
    loopback = _loopback_seeds(config, seeds, router)
    if loopback:
        more = f" (and {len(loopback) - 1} more)" if len(loopback) > 1 else ""
        print(f"crawlctl: warning: seed {loopback[0]}{more} is a loopback address: workers record it as "
              f"address_blocked and never fetch it ({LOOPBACK_HINT})", file=sys.stderr)
    return exitcodes.OK


def cmd_queue_depth(args) -> int:
    client = _client(args)
    config = load_crawl(client, args.crawl_id)
    snaps = Frontier(client, config).snapshots()
    total = sum(s.queued for s in snaps)
    claimed = sum(s.claimed for s in snaps)
    dead = sum(s.dead for s in snaps)
    if args.json:
        print(json.dumps({"crawl_id": config.crawl_id, "total": total, "claimed": claimed, "dead": dead,
                          "shards": [{"shard": s.shard, "queued": s.queued, "hosts_waiting": s.scheduled,
                                      "claimed": s.claimed, "dead": s.dead, **s.stats} for s in snaps]}))
        return exitcodes.OK
    print(f"total={total} claimed={claimed} dead={dead}")
    if args.per_shard:
        for s in snaps:
            print(f"shard={s.shard} queued={s.queued} hosts_waiting={s.scheduled} claimed={s.claimed} "
                  f"dead={s.dead} pushed={s.stats.get('pushed', 0)} acked={s.stats.get('acked', 0)}")
    return exitcodes.OK


def cmd_list(args) -> int:
    """crawlctl list [--json]: one line (or JSON object) per crawl in the
    registry (``keys.CRAWLS``), sorted by crawl id; a crawl whose config is
    missing or invalid is listed as ``broken`` with the reason."""
    from . import keys, status

    client = _client(args)
    crawls = []
    for cid in sorted(x.decode(errors="replace") for x in client.smembers(keys.CRAWLS)):
        row = {"crawl_id": cid, "state": "broken", "num_shards": None, "dedup": None, "queued": None,
               "claimed": None, "fetched": None, "finished": None, "error": None}
        try:
            config = load_crawl(client, cid)  # ConfigError, or ValueError for an id unfit for key names
        except NoSuchCrawl:
            row["error"] = "registered, but no config is stored in Redis"
            crawls.append(row)
            continue
        except ValueError as exc:
            row["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            crawls.append(row)
            continue
        st = status.crawl_status(Frontier(client, config))
        t = st["totals"]
        row.update(state=st["state"], num_shards=config.num_shards, dedup=config.dedup, queued=t["queued"],
                   claimed=t["claimed"], fetched=t["fetched"], finished=st["finished"])
        crawls.append(row)
    print(json.dumps(crawls) if args.json else status.render_crawls(crawls))
    return exitcodes.OK


def cmd_status(args) -> int:
    from . import keys, status

    client = _client(args)
    frontier = Frontier(client, load_crawl(client, args.crawl_id))
    while True:
        st = status.crawl_status(frontier)
        drains = {k.decode(): float(v) for k, v in client.hgetall(keys.DRAIN).items()}
        st["drain_requested"] = sorted(drains)
        st["supervisors"] = {}
        for name, raw in client.hgetall(keys.SUPERVISORS).items():
            try:
                st["supervisors"][name.decode()] = json.loads(raw)
            except ValueError:
                continue
        if args.json:
            print(json.dumps(st), flush=True)
        else:
            text = status.render(st)
            if drains:
                text += f"\ndrain requested: shards {', '.join(sorted(drains))} (crawlctl drain --cancel)"
            for name, sup in sorted(st["supervisors"].items()):
                up = sum(1 for c in sup.get("children", {}).values() if c.get("pid"))
                restarts = sum(c.get("restarts", 0) for c in sup.get("children", {}).values())
                text += (f"\ncrawld {name}: shards {sup.get('shards')}, {up}/{len(sup.get('children', {}))} "
                         f"children up, {restarts} restart(s)"
                         + (f", given up: {', '.join(sup['gave_up'])}" if sup.get("gave_up") else ""))
            if args.watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(text, flush=True)
        if not args.watch:
            return exitcodes.OK
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return exitcodes.OK
        if not args.json:
            print(flush=True)


def cmd_drain(args) -> int:
    from . import keys

    client = _client(args)
    fields = [str(s) for s in args.shard] if args.shard else ["all"]
    if args.cancel:
        client.hdel(keys.DRAIN, *fields)
        if not args.shard:
            client.delete(keys.DRAIN)
        print(f"drain cancelled for {_shards_text(fields)}: workers claim again within ~2 s")
        return exitcodes.OK
    client.hset(keys.DRAIN, mapping={f: time.time() for f in fields})
    print(f"drain requested for {_shards_text(fields)}: workers stop claiming, finish and ack what they "
          f"hold, give their leases up and wait ('crawlctl drain --cancel' resumes)")
    if not args.wait:
        return exitcodes.OK
    crawls = sorted(x.decode() for x in client.smembers(keys.CRAWLS))
    deadline = time.monotonic() + args.wait
    while True:
        busy = []
        for cid in crawls:
            try:
                config = load_crawl(client, cid)
            except ConfigError:
                continue
            shards = range(config.num_shards) if not args.shard else [s for s in args.shard if s < config.num_shards]
            for shard in shards:
                k = keys.shard_keys(cid, shard)
                if client.exists(k.lease) or client.zcard(k.claimed):
                    busy.append(f"{cid}:{shard}")
        if not busy:
            print("drained: no lease held and nothing claimed on those shards")
            return exitcodes.OK
        if time.monotonic() >= deadline:
            raise CliError(f"not drained within {args.wait:g}s: still leased or claimed: {', '.join(busy[:10])}",
                           exitcodes.FAILED)
        time.sleep(0.5)




def cmd_crawl_state(args) -> int:
    """crawlctl pause|resume|cancel --crawl-id ID"""
    from . import keys

    client = _client(args)
    config = load_crawl(client, args.crawl_id)
    cid = config.crawl_id
    want = {"pause": "paused", "resume": "active", "cancel": "cancelled"}[args.cmd]
    before = register_plain_script(client, "crawl_state")(keys=[keys.crawl_state(cid), keys.crawl_rebalance(cid)],
                                                         args=[want])
    before = before.decode() if isinstance(before, bytes) else str(before)
    if before == "rebalancing":
        print(f"crawl {cid}: being rebalanced; it will be {want} when the rebalance ends"
              + ("" if want != "cancelled" else " (workers stop serving it then)"))
        return exitcodes.OK
    if before == "cancelled" and want != "cancelled":
        raise CliError(f"crawl {cid} is cancelled; it cannot be paused or resumed ('crawlctl purge --crawl-id "
                       f"{cid}' deletes its keys)", exitcodes.FAILED)
    if before == want:
        print(f"crawl {cid}: already {want}")
    elif want == "paused":
        print(f"crawl {cid}: paused: workers claim nothing for it within ~1 s and finish what they hold; "
              f"other crawls go on ('crawlctl resume --crawl-id {cid}')")
    elif want == "active":
        print(f"crawl {cid}: resumed: workers claim for it again within ~1 s")
    else:
        print(f"crawl {cid}: cancelled: workers stop claiming for it for good, finish and ack what they hold "
              f"and stop serving it; 'crawlctl merge' still works, 'crawlctl purge' deletes its keys")
    return exitcodes.OK


def cmd_rebalance(args) -> int:
    """crawlctl rebalance --crawl-id ID --num-shards N"""
    from .rebalance import RebalanceError, rebalance

    client = _client(args)
    load_crawl(client, args.crawl_id)
    try:
        r = rebalance(client, args.crawl_id, args.num_shards, wait_s=args.wait,
                      log=lambda line: print(f"crawl {args.crawl_id}: {line}", flush=True))
    except RebalanceError as exc:
        raise CliError(str(exc), exitcodes.FAILED) from None
    if r["noop"]:
        print(f"crawl {r['crawl_id']}: already on {r['to']} shard(s)")
    else:
        print(f"crawl {r['crawl_id']}: rebalanced from {r['from']} to {r['to']} shards: moved {r['moved']} "
              f"queued URL(s) and {r['visited_moved']} visited entr{'y' if r['visited_moved'] == 1 else 'ies'}; "
              + ("workers serve it again within a few seconds" if r["state"] == "active"
                 else f"it stays {r['state']}"))
    warning = _unserved_warning(client, r["crawl_id"], r["to"])
    if warning:
        print(f"crawlctl: warning: {warning}", file=sys.stderr)
    return exitcodes.OK


def _unserved_warning(client, crawl_id: str, num_shards: int) -> str | None:
    """None when the crawld daemons registered in Redis (``keys.SUPERVISORS``)
    serve every shard below ``num_shards`` of ``crawl_id``, else one line
    naming the unserved shards and how to start them.  Entries that are
    not JSON objects, or that serve another crawl only, are ignored.

    Raises ``redis.RedisError``."""
    from . import keys, status
    from .daemon import shard_label

    specs, registered = [], 0
    for raw in client.hvals(keys.SUPERVISORS):
        try:
            sup = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(sup, dict):
            continue
        registered += 1
        if sup.get("crawl_id") in (None, "", crawl_id):
            specs.append(str(sup.get("shards", "")))
    missing = status.unserved_shards(specs, num_shards)
    if not missing:
        return None
    label = shard_label(missing)
    units = " ".join(f"crawld@{run}" for run in label.split(","))  # no ',' in a systemd instance name
    start = f"start them (systemctl start {units}, or crawld --shards {label})"
    if not registered:
        return f"no crawld is registered in this Redis, so no shard of crawl {crawl_id} is served: {start}"
    return f"no crawld serves shard{'s' if len(missing) > 1 else ''} {label} of crawl {crawl_id}: {start}"


def cmd_purge(args) -> int:
    """crawlctl purge --crawl-id ID [--force]"""
    from . import keys, status

    client = _client(args)
    cid = keys.check_crawl_id(args.crawl_id)
    try:
        config = load_crawl(client, cid)
    except ConfigError:
        if not args.force:
            raise
        config = None  # leftovers of a crawl without a config: --force deletes them
    state = (client.get(keys.crawl_state(cid)) or b"active").decode()
    if config is not None and state != "cancelled" and not args.force:
        st = status.crawl_status(Frontier(client, config))
        if not st["finished"]:
            t = st["totals"]
            raise CliError(f"crawl {cid} is {state} and not finished ({t['queued']} queued, {t['claimed']} "
                           f"claimed, {t['skips']} to record); 'crawlctl cancel --crawl-id {cid}' first, or "
                           f"--force", exitcodes.FAILED)
    # workers stop serving it (and give its leases up) before its keys go
    client.srem(keys.CRAWLS, cid)
    client.set(keys.crawl_state(cid), "cancelled")
    held = []
    if config is not None:
        leases = [keys.shard_keys(cid, s).lease for s in range(config.num_shards)]
        deadline = time.monotonic() + args.wait
        while True:
            held = [k for k in leases if client.exists(k)]
            if not held or time.monotonic() >= deadline:
                break
            time.sleep(0.25)
    if config is not None:
        # in-flight slots are shared with the other crawls of a domain: a
        # claim left behind would lower their cap for good
        fr = Frontier(client, config)
        for s in range(config.num_shards):
            while fr.abandon(s) >= 1000:
                pass
    deleted = 0
    for _ in range(3):  # again if a late writer recreated a key meanwhile
        n = _unlink_matching(client, keys.crawl_patterns(cid))
        deleted += n
        if not n:
            break
    note = f" ({len(held)} lease(s) were still held after {args.wait:g}s: deleted anyway)" if held else ""
    print(f"purged crawl {cid}: deleted {deleted} key(s){note}")
    return exitcodes.OK


def _unlink_matching(client, patterns, batch: int = 500) -> int:
    """UNLINK every key matching ``patterns`` (SCAN, never KEYS), in
    batches of one hash tag each (one Cluster slot per UNLINK)."""
    deleted = 0
    for pattern in patterns:
        found: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            found.append(key)
            if len(found) >= batch:
                deleted += _unlink(client, found)
                found = []
        if found:
            deleted += _unlink(client, found)
    return deleted


def _unlink(client, names: list[bytes]) -> int:
    by_tag: dict[bytes, list[bytes]] = {}
    for k in names:
        start = k.find(b"{")
        end = k.find(b"}", start + 1)
        by_tag.setdefault(k[start:end + 1] if start >= 0 and end > start else k, []).append(k)
    pipe = client.pipeline(transaction=False)
    for group in by_tag.values():
        # execute_command: a Redis Cluster pipeline refuses unlink() of several
        # keys, even of one slot; the command itself is routed by that slot
        pipe.execute_command("UNLINK", *group)
    return sum(int(n) for n in pipe.execute())


def _shards_text(fields: list[str]) -> str:
    return "every shard" if fields == ["all"] else f"shard(s) {', '.join(fields)}"


def cmd_reclaim(args) -> int:
    from . import keys
    from .reclaim import reclaim_pass

    client = _client(args)
    ids = [args.crawl_id] if args.crawl_id else sorted(x.decode() for x in client.smembers(keys.CRAWLS))
    for cid in ids:
        requeued, dead = reclaim_pass(Frontier(client, load_crawl(client, cid)))
        print(f"crawl {cid}: requeued={requeued} dead_lettered={dead}")
    return exitcodes.OK


def cmd_merge(args) -> int:
    if args.created_at or not _redis_url(args):
        created = CrawlConfig(crawl_id=args.crawl_id).replace(
            **({"created_at": args.created_at} if args.created_at else {})).created_at
        output, client = args.out, None
    else:
        client = _client(args)
        config = load_crawl(client, args.crawl_id)
        created, output = config.created_at, args.out or config.output
        if output == config.output:
            export_dead_letters(client, config)
    if not output:
        raise CliError("--out is required without Redis", exitcodes.USAGE)
    if is_remote(output):
        # parts downloaded to a temporary directory, artifact uploaded
        try:
            with merged(output, args.crawl_id, created) as (res, artifact):
                res = with_location(res, artifact)
        except FileNotFoundError:
            raise CliError(f"no parts of crawl {args.crawl_id!r} under {output}", exitcodes.FAILED)
    else:
        if not list_parts(output, args.crawl_id):
            raise CliError(f"no parts of crawl {args.crawl_id!r} under {output}", exitcodes.FAILED)
        res = merge_crawl(output, args.crawl_id, created)
    if client is not None:
        from .verify import record_merge

        record_merge(client, config, res)  # for 'crawlctl verify' (row count vs the previous crawl)
    print(f"artifact={res.path} rows={res.rows} duplicates_dropped={res.duplicates} "
          f"torn_lines_skipped={res.bad_lines} parts={res.parts} "
          f"cross_shard_duplicates={res.cross_shard_duplicates} retried={res.retried}")
    return exitcodes.OK


def cmd_retry(args) -> int:
    """crawlctl retry --crawl-id ID [--outcome O] [--status S] [--host H] [--dry-run] [--run]"""
    from . import keys, retry

    client = _client(args)
    config = load_crawl(client, args.crawl_id)
    state = (client.get(keys.crawl_state(config.crawl_id)) or b"active").decode()
    if state == "cancelled":
        raise CliError(f"crawl {config.crawl_id} is cancelled; nothing of it is fetched again", exitcodes.FAILED)
    try:
        flt = retry.RetryFilter(tuple(args.outcome or retry.DEFAULT_OUTCOMES),
                                tuple(retry.check_status(x) for x in args.status or ()),
                                tuple(h.strip().lower().rstrip(".") for h in args.host or ()))
    except ValueError as exc:
        raise CliError(f"--status: {exc}", exitcodes.USAGE)
    # the artifact, merged now: the newest row of every URL
    export_dead_letters(client, config)
    if is_remote(config.output):
        try:
            with merged(config.output, config.crawl_id, config.created_at) as (res, artifact):
                rows = retry.select(res.path, flt)
        except FileNotFoundError:
            raise CliError(f"no parts of crawl {config.crawl_id!r} under {config.output}", exitcodes.FAILED)
    else:
        if not list_parts(config.output, config.crawl_id):
            raise CliError(f"no parts of crawl {config.crawl_id!r} under {config.output}", exitcodes.FAILED)
        rows = retry.select(merge_crawl(config.output, config.crawl_id, config.created_at).path, flt)
    what = retry.describe(rows, flt)
    if args.dry_run or not rows:
        print(f"crawl {config.crawl_id}: {len(rows)} URL(s) to retry ({what})" + (" [dry run]" if rows else ""))
        return exitcodes.OK
    gen, queued = retry.requeue(client, config, rows)
    print(f"crawl {config.crawl_id}: retry {gen} queued {sum(queued.values())} URL(s) on {len(queued)} "
          f"shard(s) ({what})")
    if not args.run:
        print(f"workers serving the crawl fetch them; 'crawlctl merge --crawl-id {config.crawl_id}' then keeps "
              "the newest row of each URL (or 'crawlctl retry --run' serves it here)")
        return exitcodes.OK
    from .runner import RunOptions, print_summary

    os.environ.setdefault("CRAWLD_LOG_LEVEL", "warning")
    opts = RunOptions(redis_url=_redis_url(args), concurrency=args.workers or machine()["NUM_WORKERS"],
                      proxy=args.proxy or machine()["CRAWLD_PROXY"], progress=sys.stderr.isatty())
    print_summary(_run_here(config, opts, resume=True), args.json)
    return exitcodes.OK


def cmd_verify(args) -> int:
    from . import verify

    import contextlib

    from .storage import local_copy, open_storage

    client = _client(args)
    config = load_crawl(client, args.crawl_id)
    artifact = args.artifact
    if artifact is None:
        record = verify.merge_records(client, config.family_name).get(config.crawl_id) or {}
        if is_remote(str(record.get("artifact", ""))):
            artifact = record["artifact"]
        elif not record.get("artifact") and is_remote(config.output):
            from .merge import artifact_path

            key = artifact_path(".", config.crawl_id, config.created_at).as_posix()
            artifact = open_storage(config.output).location_of(key)
    try:
        with local_copy(artifact) if artifact else contextlib.nullcontext() as local:  # s3:// downloaded to a temp file
            path, checks = verify.run_checks(client, config, local, args.tolerance / 100.0, args.band / 100.0)
        if artifact and is_remote(artifact):
            path = artifact
    except FileNotFoundError as exc:
        raise CliError(f"no artifact of crawl {config.crawl_id!r} at {exc.filename} (run 'crawlctl merge "
                       f"--crawl-id {config.crawl_id}' first, or give --artifact)", exitcodes.NOINPUT)
    except Exception as exc:  # noqa: BLE001 - a file that is not a readable artifact
        import pyarrow as pa

        if not isinstance(exc, pa.ArrowException):
            raise
        where = args.artifact or "the artifact"
        raise CliError(f"{where}: not a readable Parquet artifact ({str(exc).splitlines()[0][:200]})",
                       exitcodes.NOINPUT)
    if args.json:
        print(verify.report_json(config.crawl_id, path, checks))
    else:
        for c in checks:
            print(c.line())
        print(verify.summary_line(config.crawl_id, checks))
    return exitcodes.OK if all(c.ok for c in checks) else exitcodes.FAILED


def cmd_settings(args) -> int:
    m = machine()
    print(f"Machine settings (environment over {m.source or settings.DEFAULT_CONFIG_PATH}; "
          "as JSON keys in lower case):\n")
    print(settings.settings_table())
    print("\nCrawl settings (stored with each crawl in Redis; set with crawlctl flags, --set NAME=VALUE, "
          "or as defaults under \"crawl\" in the JSON file):\n")
    print(settings_table())
    return exitcodes.OK


def cmd_shard_balance(args) -> int:
    from . import balance

    if args.crawl_id:
        client = _client(args)
        config = load_crawl(client, args.crawl_id)
        base = {"num_shards": config.num_shards, "shard_overrides": config.shard_override_map}
    else:
        defaults = machine().crawl_defaults
        base = {"num_shards": defaults.get("num_shards", 4), "shard_overrides": defaults.get("shard_overrides", {})}
    for item in args.set or ():
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in ("shard_overrides", "num_shards"):
            raise CliError(f"--set {item!r}: shard-balance takes --set shard_overrides=JSON or num_shards=N",
                           exitcodes.USAGE)
        base[name.strip()] = value
    if args.num_shards is not None:
        base["num_shards"] = args.num_shards
    what_if = CrawlConfig.from_dict({"crawl_id": "shard-balance", **base})  # validates both, one-line errors
    n, overrides = what_if.num_shards, what_if.shard_override_map
    found_in = None
    if args.crawl_id:
        weights, found_in = balance.read_crawl_weights(client, config.crawl_id, config.num_shards,
                                                       private=config.psl_private_domains)
    else:
        source = "<stdin>" if args.hosts == "-" else args.hosts
        try:
            if args.hosts == "-":
                weights = balance.parse_hosts(sys.stdin, source)
            else:
                with open(args.hosts, encoding="utf-8", errors="replace") as f:
                    weights = balance.parse_hosts(f, source)
        except balance.HostsError as exc:
            raise CliError(str(exc), exitcodes.DATAERR)
        except OSError as exc:
            raise CliError(f"--hosts {args.hosts}: cannot be read ({exc.strerror or exc})", exitcodes.DATAERR)
        if not weights:
            raise CliError(f"--hosts {source}: no host in it", exitcodes.DATAERR)
    report = balance.balance_report(weights, n, overrides, top=args.top, found_in=found_in)
    if args.crawl_id:
        report["crawl_id"] = config.crawl_id
    print(json.dumps(report) if args.json else balance.format_report(report))
    if args.max_imbalance is not None and report["imbalance"] > args.max_imbalance:
        raise CliError(f"imbalance {report['imbalance']:.2f} exceeds --max-imbalance {args.max_imbalance:g}",
                       exitcodes.FAILED)
    return exitcodes.OK


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="crawlctl",
        description="Operate crawld crawls: run one locally, seed one for the fleet, watch and merge it.",
        epilog="Redis is taken from --redis-url or $REDIS_URL. Exit codes: 0 ok, 1 failed, "
               "64 usage, 65 bad URL, 69 Redis unavailable, 73 output not writable, 78 bad setting.")
    p.add_argument("--version", action="version", version=f"crawlctl {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)

    r = sub.add_parser("run", help="crawl locally from seeds to a Parquet artifact",
                       description="All-in-one local crawl: private redis-server unless $REDIS_URL or "
                                   "--redis-url is given, one worker process per shard plus the reclaimer, "
                                   "until every shard is empty and nothing is claimed; then merge and "
                                   "print a summary.")
    r.add_argument("seeds", nargs="*", metavar="SEED_URL")
    _add_seeds_file_option(r)
    _add_crawl_options(r, "crawl name (default: run-<UTC time>-<pid>)")
    r.add_argument("--workers", type=int_range(1, 1000), metavar="N",
                   help="concurrent fetches per shard worker, 1-1000 (default $NUM_WORKERS or 32)")
    r.add_argument("--out", type=nonempty_path, metavar="DIR",
                   help="output directory: parts and crawls/YYYY/MM/DD/<id>.parquet (default ./crawl-output)")
    r.add_argument("--proxy", type=proxy_url, metavar="URL", help="HTTP proxy for every request (default: $CRAWLD_PROXY, "
                   "else the standard HTTP_PROXY/HTTPS_PROXY/NO_PROXY variables)")
    r.add_argument("--redis-url", help="use this Redis instead of a private one")
    r.add_argument("--drain-timeout", type=positive_float, default=30.0, metavar="S",
                   help="seconds workers get to finish in-flight fetches at the end (default 30)")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.add_argument("--quiet", action="store_true", help="no live progress line")
    r.add_argument("-v", "--verbose", action="store_true",
                   help="log process starts and stops too (default: warnings and errors; $CRAWLD_LOG_LEVEL)")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("seed", help="create a crawl in Redis and queue its seeds (workers pick it up)")
    s.add_argument("seeds", nargs="*", metavar="SEED_URL")
    _add_seeds_file_option(s)
    _add_crawl_options(s, "crawl name", required=True)
    s.add_argument("--out", type=nonempty_path, metavar="DIR",
                   help="output location (default $OUTPUT_BUCKET or ./crawl-output)")
    s.add_argument("--redis-url")
    s.set_defaults(func=cmd_seed)

    rt = sub.add_parser("retry", help="fetch again the URLs whose row is an error (same crawl)",
                        description="Merge the crawl's parts, select the URLs whose newest row is an error "
                                    "(by default outcome error or dead_letter) and queue them again past the "
                                    "visited set, with no attempt spent. Workers serving the crawl fetch "
                                    "them; the next merge keeps the newest row of each URL and counts the "
                                    "older ones it replaced ('retried'). Never retries what the crawl's "
                                    "rules or the site refused (out of scope, robots.txt disallowed, ...).")
    rt.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    rt.add_argument("--outcome", action="append", choices=("error", "dead_letter", "host_parked", "robots_unreachable"),
                    help="rows to retry (repeatable; default error and dead_letter): host_parked = URLs of a "
                         "host that was given up, robots_unreachable = URLs blocked because robots.txt "
                         "could not be read")
    rt.add_argument("--status", action="append", metavar="S",
                    help="only rows with this status: 5xx, 4xx, a code (503), or none (no response); repeatable")
    rt.add_argument("--host", action="append", metavar="H",
                    help="only rows of this host (or its sub-domains); repeatable")
    rt.add_argument("--dry-run", action="store_true", help="count what would be retried, queue nothing")
    rt.add_argument("--run", action="store_true",
                    help="serve the crawl here (workers and reclaimer, as 'crawlctl run') until it is finished "
                         "again, then merge and print the summary")
    rt.add_argument("--workers", type=int_range(1, 1000), metavar="N", help="with --run: as for 'crawlctl run'")
    rt.add_argument("--proxy", type=proxy_url, metavar="URL", help="with --run: as for 'crawlctl run'")
    rt.add_argument("--json", action="store_true", help="with --run: print the summary as JSON")
    rt.add_argument("--redis-url")
    rt.set_defaults(func=cmd_retry)

    q = sub.add_parser("queue-depth", help="URLs queued and claimed (total=N)")
    q.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    q.add_argument("--per-shard", action="store_true")
    q.add_argument("--json", action="store_true")
    q.add_argument("--redis-url")
    q.set_defaults(func=cmd_queue_depth)

    m = sub.add_parser("merge", help="merge a crawl's parts into its Parquet artifact")
    m.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    m.add_argument("--out", type=nonempty_path, metavar="DIR", help="output location (default: the crawl's, from Redis)")
    m.add_argument("--created-at", help="UTC date for the artifact path when Redis is not used")
    m.add_argument("--redis-url")
    m.set_defaults(func=cmd_merge)

    ls = sub.add_parser("list", help="every crawl in Redis: state, shards, dedup, queued, claimed, fetched, "
                        "finished",
                        description="One line per crawl registered in Redis, sorted by crawl id: its state "
                                    "(active, paused, cancelled, rebalancing), num_shards, dedup backend, "
                                    "URLs queued and claimed, rows fetched, and whether it is finished. A "
                                    "crawl whose stored config is missing or invalid is listed as 'broken' "
                                    "with the reason. 'crawlctl status --crawl-id ID' shows one crawl per "
                                    "shard.")
    ls.add_argument("--json", action="store_true",
                    help="one JSON array of objects (crawl_id, state, num_shards, dedup, queued, claimed, "
                         "fetched, finished, error)")
    ls.add_argument("--redis-url")
    ls.set_defaults(func=cmd_list)

    ss = sub.add_parser("status", help="per shard: queued, hosts waiting, claimed, oldest claim, leaseholder, "
                        "fetched, errors; totals",
                        description="The state of a crawl in Redis, per shard and in total, and the crawld "
                                    "supervisors that serve it.")
    ss.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    ss.add_argument("--json", action="store_true", help="one JSON object (per refresh with --watch)")
    ss.add_argument("--watch", type=positive_float, nargs="?", const=2.0, default=None, metavar="S",
                    help="refresh every S seconds (default 2) until interrupted")
    ss.add_argument("--redis-url")
    ss.set_defaults(func=cmd_status)

    dr = sub.add_parser("drain", help="ask running workers to drain (stop claiming, finish, give leases up)",
                        description="Through Redis, ask the workers of some shards (default: all) to stop "
                                    "claiming, finish and ack what they hold, release their leases and wait. "
                                    "Applies to every crawl. --cancel resumes.")
    dr.add_argument("--shard", type=int_range(0, 4095), action="append", metavar="N",
                    help="shard to drain (repeatable; default: every shard)")
    dr.add_argument("--cancel", action="store_true", help="resume claiming on those shards")
    dr.add_argument("--wait", type=positive_float, nargs="?", const=120.0, default=None, metavar="S",
                    help="wait up to S seconds (default 120) until no lease is held and nothing claimed; "
                         "exit 1 if not")
    dr.add_argument("--redis-url")
    dr.set_defaults(func=cmd_drain)

    for name, helptext in (
            ("pause", "stop claiming for one crawl (in-flight fetches finish and are acked; other crawls go on)"),
            ("resume", "claim for a paused crawl again"),
            ("cancel", "stop a crawl for good: in-flight fetches finish, workers stop serving it; it can "
                       "still be merged")):
        cp = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] +
                            ". Workers follow it through Redis within about a second.")
        cp.add_argument("--crawl-id", type=crawl_id_arg, required=True)
        cp.add_argument("--redis-url")
        cp.set_defaults(func=cmd_crawl_state)

    rb = sub.add_parser("rebalance", help="change the shard count of a live crawl",
                        description="Change a crawl's num_shards while its workers run: the crawl is held "
                                    "(state 'rebalancing') until its workers hold nothing and give its "
                                    "leases up, then the queued URLs, host state and visited fingerprints "
                                    "of the domains whose shard changed are moved (a redis_bloom crawl's "
                                    "filters are copied whole to the shards that receive domains), the new "
                                    "count stored and the crawl resumed. An interrupted rebalance resumes when run again. "
                                    "Exit 1 when the workers do not let go within --wait.")
    rb.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    rb.add_argument("--num-shards", type=int_range(1, 4096), required=True, metavar="N")
    rb.add_argument("--wait", type=positive_float, default=120.0, metavar="S",
                    help="seconds to wait for the workers to let the crawl go (default 120)")
    rb.add_argument("--redis-url")
    rb.set_defaults(func=cmd_rebalance)

    pg = sub.add_parser("purge", help="delete every Redis key of a finished or cancelled crawl",
                        description="Delete every Redis key of a crawl (SCAN by its prefix and UNLINK in "
                                    "batches, never KEYS) and its entry in the crawl registry, after its "
                                    "workers stop serving it. Refuses (exit 1) unless the crawl is finished "
                                    "or cancelled, or --force. Parts, artifacts and the family's merge "
                                    "records (for 'crawlctl verify' of later crawls) are kept.")
    pg.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    pg.add_argument("--force", action="store_true", help="purge even an active, unfinished crawl")
    pg.add_argument("--wait", type=positive_float, default=30.0, metavar="S",
                    help="seconds to wait for workers to give the crawl's leases up first (default 30)")
    pg.add_argument("--redis-url")
    pg.set_defaults(func=cmd_purge)

    rc = sub.add_parser("reclaim", help="run one reclaim pass: return expired claims to their queues",
                        description="Return claims past their visibility timeout to their queues "
                                    "(or dead-letter them after max_attempts), once.")
    rc.add_argument("--crawl-id", type=crawl_id_arg, help="only this crawl (default: every crawl)")
    rc.add_argument("--redis-url")
    rc.set_defaults(func=cmd_reclaim)

    v = sub.add_parser("verify", help="audit a finished crawl: PASS/FAIL per check, exit 1 if any fails",
                       description="Run the audit checklist of a finished crawl: shards_drained, "
                                   "claimed_empty, visited_vs_rows, row_count_vs_previous, politeness, "
                                   "no_duplicates. One line per check (PASS or FAIL, name, figures), then "
                                   "a final line. Exit 0 when all pass, 1 when any fails, 66 no artifact.")
    v.add_argument("--crawl-id", type=crawl_id_arg, required=True)
    v.add_argument("--artifact", type=nonempty_path, metavar="PATH",
                   help="Parquet artifact to check (default: the one recorded by the last merge, else "
                        "<output>/crawls/YYYY/MM/DD/<crawl_id>.parquet)")
    v.add_argument("--tolerance", type=percent, default=2.0, metavar="PCT",
                   help="visited_vs_rows: allowed difference per shard and in total, in %% (default 2)")
    v.add_argument("--band", type=percent, default=25.0, metavar="PCT",
                   help="row_count_vs_previous: allowed change from the previous crawl of the family, "
                        "in %% (default 25)")
    v.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    v.add_argument("--redis-url")
    v.set_defaults(func=cmd_verify)

    st = sub.add_parser("settings", help="list every crawl setting with unit and default")
    st.set_defaults(func=cmd_settings)

    sb = sub.add_parser(
        "shard-balance", help="how politeness keys and their URLs spread over shards (imbalance ratio)",
        description="Show how registered domains (politeness keys) and their expected URL counts spread "
                    "over the shards: one line per shard (keys, weight, share), the imbalance ratio "
                    "(heaviest shard / mean shard) and the heaviest keys with their shard. Use it before "
                    "a crawl on a list of hosts, or on a running crawl, to choose num_shards and "
                    "shard_overrides (which pin known-large domains to chosen shards).",
        epilog="Hosts file: one host name or URL per line, optionally followed by whitespace and a weight "
               "(expected URL count, default 1); '#' starts a comment; hosts of one registered domain add up. "
               "Example CI check: crawlctl shard-balance --hosts hosts.txt --num-shards 8 "
               "--set shard_overrides='{\"example.com\": 3}' --max-imbalance 1.5")
    src = sb.add_mutually_exclusive_group(required=True)
    src.add_argument("--hosts", metavar="FILE", type=nonempty_path,
                     help="hosts file ('-' for stdin); shard count and overrides default to this "
                          "machine's crawl defaults (4 shards)")
    src.add_argument("--crawl-id", type=crawl_id_arg,
                     help="a crawl in Redis: weights are the URLs queued so far per registered domain; shard "
                          "count and overrides default to the crawl's")
    sb.add_argument("--num-shards", type=int_range(1, 4096), metavar="N",
                    help="what N shards would give (re-hashes the keys; default: the crawl's or 4)")
    sb.add_argument("--set", action="append", metavar="NAME=VALUE",
                    help="shard_overrides=JSON (or num_shards=N) to try instead of the crawl's (repeatable)")
    sb.add_argument("--top", type=int_range(0, 1000), default=5, metavar="K",
                    help="heaviest keys listed (default 5)")
    sb.add_argument("--max-imbalance", type=positive_float, metavar="X",
                    help="exit 1 when the imbalance ratio is above X (e.g. 1.5, for CI)")
    sb.add_argument("--json", action="store_true", help="print the report as one JSON object")
    sb.add_argument("--redis-url")
    sb.set_defaults(func=cmd_shard_balance)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return exitcodes.USAGE
    try:
        return args.func(args)
    except CliError as exc:
        err, code = str(exc), exc.code
    except BadURL as exc:
        err, code = str(exc), exitcodes.DATAERR
    except NoSuchCrawl as exc:
        err, code = str(exc), exitcodes.NOINPUT
    except (ConfigError, CrawlExists) as exc:
        err, code = str(exc), exitcodes.CONFIG
    except (RedisUnfit, RedisServerError) as exc:
        err, code = str(exc), exitcodes.UNAVAILABLE
    except KeyboardInterrupt:
        err, code = "interrupted", exitcodes.INTERRUPTED
    except OSError as exc:
        err, code = f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}", exitcodes.CANTCREAT
    except Exception as exc:  # noqa: BLE001 - redis errors and the unforeseen: one line, not a trace
        import redis

        from redis.exceptions import RedisClusterException  # not a RedisError (slots not covered, ...)

        if isinstance(exc, (redis.RedisError, RedisClusterException)):
            err, code = f"Redis: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", exitcodes.UNAVAILABLE
        else:
            raise
    print(f"crawlctl: error: {err}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""`dlog ui`: one status page for a cluster: its health, bookies, auto-recovery, streams as segment
timelines, subscriptions.

    GET /?q=TEXT      the page, rendered here with the data in it (dlog_tools/ui_templates/page.html,
                      escaped by jinja2), its streams filtered by name when `q` is given; it
                      needs no JavaScript. dlog_tools/ui_static/app.js only refreshes it every 2 s by
                      fetching the same URL and swapping the new HTML in (nothing from elsewhere)
    GET /api/cluster  the same data as JSON

Health. The header says "healthy" (green), or counts and names the problems (red): what could not
be read, each bookie that is down (it has a cookie, so it joined the cluster, but no registration),
each stream that lost records (a live segment's ledger is gone) or whose in-progress segment cannot
be read, each subscription that will skip records it never read (truncation or retention removed
them, by `dlog.core.snapshot.resolve`, the rule readers follow), and the under-replicated ledgers
(auto-recovery's marks). It is `health_summary` of the collected data, so the JSON says the same
(`health`).

Theory of operation. A `Collector` owns one ZooKeeper session and one BookKeeper client, made on
the first poll and made again on a later poll if ZooKeeper was unreachable. Each poll reads the
bookie registrations and cookies, scrapes every bookie's `/metrics`, lists the namespaces (children
of the namespace root), their streams, segment lists and subscriptions. It writes nothing. Every
ZooKeeper, bookie and HTTP call is bounded by a timeout; what fails shows up in the answer (an
`errors` list, a bookie marked unreachable, a segment whose records are unknown), never as an
error page. Polls are serialized and a snapshot younger than `SNAPSHOT_REUSE_S` is served again,
so ten open tabs cost one scrape; adds/s is the change of each bookie's
`dlog_bookie_add_entries_total` between two scrapes, over the time between them.

Record counts. A completed segment's metadata holds its record count. An in-progress one's does
not, so the collector reads its LAC and takes `first_record_index + record_count` from the
record-set header of that entry (`dlog.core.snapshot.tail_count`, through the one bounded cache of
handles and headers, `dlog.snapshot.SegmentReads`: an idle stream costs a LAC read, no entry read).

Subscription lag (`dlog.describe.subscription_lag`, shared with `dlog subscription describe`) is
estimated here from counts alone, as if each segment's records were spread evenly over its
entries: exact when every entry of the segment holds the same number of records, and otherwise off
by at most the records of the entries whose sizes differ. `dlog subscription describe` reads one
entry header per subscription and is exact; a status page that polls should not cost that.
A subscription whose segment was truncated lags by every live record. `lag_known` is false when
some segment's records could not be read.

Auto-recovery. Whether it is enabled, the auditor, how many ledgers are under-replicated, and the
first UNDERREPLICATED_SHOWN_MAX of them with their missing bookies, worker and copy progress (from
the marks in ZooKeeper); each bookie's re-replication bytes/s comes from its metrics like adds/s.

Damage. A live segment whose ledger metadata is gone (deleted with `dlog ledger delete --force`)
shows as damaged: its records are lost. Only the shown (newest) segments are checked, one
ZooKeeper read each per poll. A segment with a copy on the tier is never damaged for a missing
ledger (its bookie copy was deleted after the offload, or is being deleted).

Tier. Each stream with a tier (its own or its namespace's default) shows where its live segments
are (`dlog.core.tiering.placement`: on the bookies only, on both, on the tier only), each segment's
box says "on tier" or "tier + bookies", and the offloader's last run (the stream's tier status,
one ZooKeeper read): a run that failed is a warning on the stream and a problem in the header,
until a run succeeds.

Writers. An in-progress segment is "writing" only while the stream's writer lock has a holder (one
ZooKeeper read per stream with an in-progress segment); otherwise its writer crashed or was cut
off, and the page says so (NO_WRITER_NOTE): the next writer to open the stream (or the Spark
sink's commit) recovers its ledger and seals it (`dlog.seal`).

Bookie disk. Each bookie's own directories (journal, entry logs, index: where, and the bytes each
takes on disk) come from its `/api/v1/bookie/info`; the file system's used percent from its
metrics is shown beside them (it is shared with whatever else lives on that file system).

Filter. `q` keeps the streams whose name or `namespace/name` contains it (case ignored), among the
streams read (STREAMS_MAX per namespace); the health summary always covers everything read.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jinja2
from aiohttp import web

from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import DlogError, MetadataNotFoundError, invariant
from bookkeeper.meta import layout
from bookkeeper.security.settings import NO_SECURITY, SecuritySettings, unseal_password
from bookkeeper.security.tls import host_of
from dlog.core import backlog, tiering
from dlog.core.snapshot import SegmentView, StreamView, first_readable, resolve
from dlog.describe import entry_count, subscription_lag
from dlog.offsets import Offset
from dlog.snapshot import SegmentReads
from dlog_tools.units import format_duration_ms, format_size, format_time_ms, plural

STATIC_DIR = Path(__file__).resolve().parent / "ui_static"
TEMPLATE_DIR = Path(__file__).resolve().parent / "ui_templates"
QUERY_CHARS_MAX = 200  # of the stream filter
ZK_TIMEOUT_S = 3.0
HTTP_TIMEOUT_S = 2.0
LEDGER_TIMEOUT_S = 3.0
SNAPSHOT_TIMEOUT_S = 20.0
SNAPSHOT_REUSE_S = 1.0
NAMESPACES_MAX = 50
STREAMS_MAX = 200  # per namespace
SEGMENTS_SHOWN_MAX = 60  # the newest; lag and truncation still use them all
HANDLES_MAX = 256
METRICS_BYTES_MAX = 1 << 20
METRIC_NAMES = ("dlog_bookie_add_entries_total", "dlog_bookie_disk_used_ratio", "dlog_bookie_read_only",
                "dlog_autorecovery_bytes_copied_total")
UNDERREPLICATED_SHOWN_MAX = 50
SCRAPE_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ValueError)  # a bookie's admin endpoint failing


@dataclass(frozen=True, slots=True)
class UiOptions:
    zk: str
    bookkeeper_root: str = layout.DEFAULT_ROOT
    namespace_root: str = "/dlog"
    security: SecuritySettings = NO_SECURITY  # an admin's: reads every namespace, TLS to bookies
    namespaces: tuple[str, ...] = ()  # only these (those that exist); empty: every one, up to NAMESPACES_MAX


def verified_admin_url(info: dict[str, Any], tls: bool) -> str | None:
    """A bookie's admin URL, if the page may fetch it: its host must be the host of the bookie's
    registered address (a registration cannot send the page elsewhere) and, with TLS, https
    (verified with the cluster CA). Anything else is not fetched."""
    url, address = info.get("http"), info.get("address")
    if not isinstance(url, str) or not isinstance(address, str):
        return None
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError:
        return None
    if parsed.scheme != ("https" if tls else "http") or port is None or parsed.username or parsed.password:
        return None
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        return None
    if parsed.hostname != host_of(address).lower():
        return None
    return f"{parsed.scheme}://{address.rpartition(':')[0]}:{port}"


# ------------------------------------------------------------------------------ pure parts


def parse_metrics(text: str) -> dict[str, float]:
    """The unlabelled samples of METRIC_NAMES in Prometheus text format."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRIC_NAMES:
            try:
                found[name] = float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return found


class RateTracker:
    """Per-key rate of a counter from the previous scrape; a counter that went down restarted."""

    def __init__(self, keys_max: int = 1000) -> None:
        self.keys_max = keys_max
        self._previous: dict[str, tuple[float, float]] = {}

    def rate(self, key: str, value: float, now_s: float) -> float | None:
        previous = self._previous.get(key)
        if previous is None and len(self._previous) >= self.keys_max:
            self._previous.pop(next(iter(self._previous)))
        self._previous[key] = (now_s, value)
        if previous is None or now_s <= previous[0]:
            return None
        delta = value - previous[1] if value >= previous[1] else value
        return delta / (now_s - previous[0])


def truncation_point(segments: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the stream's readable records start, if anything was ever truncated."""
    live = [s for s in segments if s["state"] != "truncated"]
    if not live:
        return {"offset": None, "sequence": None, "position": None} if segments else None
    first = live[0]
    entry, slot = first_readable(first["first_entry"], first["min_active_entry"], first["min_active_slot"])
    if (entry, slot) == (first["first_entry"], 0) and first is segments[0]:
        return None  # nothing was ever truncated
    entries = entry_count(first)
    position = min(1.0, (entry - first["first_entry"]) / entries) if entries else 0.0
    return {"offset": f"{first['ledger']}:{entry}:{slot}", "sequence": first["sequence"],
            "position": position}


NO_WRITER_NOTE = "in progress, no writer (will be sealed by the next writer or recovery)"
DIRECTORY_NAMES = ("journal", "entry_logs", "index")


def describe_writer(holder: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a writer-lock holder (its node's data is the writer's to say)."""
    kinds = {"host": str, "pid": int, "started_ms": int}
    return {key: holder[key] for key, kind in kinds.items()
            if isinstance(holder.get(key), kind) and not isinstance(holder.get(key), bool)}


def bookie_directories(about_text: str) -> dict[str, dict[str, Any]] | None:
    """A bookie's own directories (path and bytes on disk) from its `/api/v1/bookie/info`; None
    when it does not say (an older bookie, or not JSON)."""
    try:
        about = json.loads(about_text)
    except ValueError:
        return None
    found = about.get("directories") if isinstance(about, dict) else None
    if not isinstance(found, dict):
        return None
    directories = {}
    for name in DIRECTORY_NAMES:
        item = found.get(name)
        if isinstance(item, dict) and isinstance(item.get("path"), str) and isinstance(item.get("bytes"), int):
            directories[name] = {"path": item["path"], "bytes": item["bytes"]}
    return directories or None


def subscription_losses(view: StreamView, committed: dict[str, Any]) -> list[str]:
    """What a subscription will skip that it never read (truncation or retention removed it), by
    the snapshot rules readers follow (`dlog.core.snapshot.resolve`)."""
    try:
        offset = Offset(committed["ledger"], committed["entry"], committed.get("slot", 0))
    except (KeyError, DlogError, ValueError, TypeError):
        return [f"its committed offset {committed!r} is not an offset"]
    return list(resolve(view, offset).losses)


def backlog_json(found: backlog.Backlog, config: Any) -> dict[str, Any]:
    """A subscription's backlog for the page: its level (ok, warning at 80% of a limit, over,
    evicted), its fraction of the nearest limit, and the note its badge shows."""
    percent_of = f"{round(found.fraction * 100)}% of its backlog limit ({backlog.describe(found, config)})"
    notes = {"ok": "", "warning": f"is at {percent_of}",
             "over": f"is over its backlog limit: {round(found.fraction * 100)}% ({backlog.describe(found, config)})"
                     + ("; writes are refused (policy hold)" if config.backlog_policy == "hold" else ""),
             "evicted": "was evicted (its backlog passed the limit, policy evict): its next read fails unless it "
                        "skips"}
    labels = {"ok": "", "warning": f"backlog {round(found.fraction * 100)}%", "over": "over backlog limit",
              "evicted": "evicted"}
    return {"bytes": found.bytes, "age_ms": found.age_ms, "fraction": found.fraction, "level": found.level,
            "note": notes[found.level], "label": labels[found.level]}


def health_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The cluster in one line: each problem named, none means healthy. Problems: what the page
    could not read, a bookie down (it has a cookie, so it joined this cluster, but is not
    registered), a stream that lost records (a live segment's ledger is gone) or whose segments
    cannot be read, under-replicated ledgers."""
    problems = [f"cannot read the cluster: {error}" for error in result.get("errors", [])]
    for bookie in result.get("bookies", []):
        if bookie.get("state") == "down":
            problems.append(f"bookie {bookie['id']} is down (it joined this cluster but is not registered)")
    for namespace in result.get("namespaces", []):
        if namespace.get("error"):
            problems.append(f"namespace {namespace['name']} cannot be read: {namespace['error']}")
        for stream in namespace.get("streams", []):
            where = f"stream {namespace['name']}/{stream['name']}"
            if stream.get("error"):
                problems.append(f"{where} cannot be read: {stream['error']}")
            lost = [str(s["ledger"]) for s in stream.get("segments", []) if s.get("damaged")]
            if lost:
                problems.append(f"{where} lost records: ledger{'s' if len(lost) > 1 else ''} "
                                f"{', '.join(lost)} missing")
            unreadable = [f"#{s['sequence']}" for s in stream.get("segments", []) if s.get("unreadable")]
            if unreadable:
                problems.append(f"{where}: segment{'s' if len(unreadable) > 1 else ''} "
                                f"{', '.join(unreadable)} cannot be read")
            last_run = (stream.get("tier") or {}).get("last_run") or {}
            if last_run.get("error"):
                problems.append(f"{where}: the last offload failed ({plural(last_run.get('failures', 1), 'failure')} "
                                f"in a row): {last_run['error']}")
            for sub in stream.get("subscriptions", []):
                if sub.get("losses"):
                    problems.append(f"{where}: subscription {sub['name']} will skip records it never read "
                                    f"({sub['losses'][0]})")
                if (sub.get("backlog") or {}).get("level") in ("over", "evicted"):
                    problems.append(f"{where}: subscription {sub['name']} {sub['backlog']['note']}")
    recovery = result.get("autorecovery") or {}
    count = recovery.get("underreplicated") or 0
    if count:
        problems.append(f"{plural(count, 'ledger')} under-replicated")
    return {"ok": not problems, "problems": problems}


def filter_namespaces(namespaces: list[dict[str, Any]], query: str) -> tuple[list[dict[str, Any]], int]:
    """The namespaces with only the streams whose name or `namespace/name` contains `query` (case
    ignored; blank: all), and how many streams matched. Namespaces without a match are left out."""
    needle = query.strip().lower()
    if not needle:
        return namespaces, sum(len(ns["streams"]) + ns.get("streams_omitted", 0) for ns in namespaces)
    shown = []
    for namespace in namespaces:
        streams = [s for s in namespace["streams"]
                   if needle in s["name"].lower() or needle in f"{namespace['name']}/{s['name']}".lower()]
        if streams:
            shown.append({**namespace, "streams": streams, "streams_omitted": 0})
    return shown, sum(len(ns["streams"]) for ns in shown)


# ------------------------------------------------------------------------------ the collector


class Collector:
    def __init__(self, options: UiOptions, clock: Clock = SYSTEM_CLOCK) -> None:
        self.options = options
        self.clock = clock
        self.rates = RateTracker()
        self._zk: Any = None
        self._client: Any = None
        self._http: aiohttp.ClientSession | None = None
        self._reads: Any = None  # dlog.snapshot.SegmentReads over the client
        self._lock = asyncio.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None

    async def snapshot(self) -> dict[str, Any]:
        async with self._lock:
            now_s = self.clock.monotonic_s()
            if self._last is not None and now_s - self._last[0] < SNAPSHOT_REUSE_S:
                return self._last[1]
            result = await self._collect()
            self._last = (now_s, result)
            return result

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._client is not None:
            await self._client.close()
        if self._zk is not None:
            await self._zk.close()
        self._zk = self._client = self._http = self._reads = None

    async def _connect(self) -> None:
        from bookkeeper.client import BookKeeper
        from bookkeeper.meta.acl import zk_options
        from bookkeeper.meta.zk import AsyncZooKeeper
        from bookkeeper.meta.zkstore import ZooKeeperMetadataStore

        security = self.options.security
        if self._http is None:
            headers = {"Authorization": f"Bearer {security.token}"} if security.token else None
            connector = aiohttp.TCPConnector(ssl=security.tls.context()) if security.tls else None
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S),
                                               headers=headers, connector=connector)
        if self._zk is None:
            zk = AsyncZooKeeper(self.options.zk, timeout_s=ZK_TIMEOUT_S,
                                **zk_options(security, self.options.bookkeeper_root))
            await zk.start()  # closes itself when it fails
            self._zk = zk
        if self._client is None:
            store = ZooKeeperMetadataStore(self._zk, self.options.bookkeeper_root)
            self._client = await BookKeeper(store=store, read_timeout_s=LEDGER_TIMEOUT_S,
                                            security=security).start()
            self._reads = SegmentReads(self._client, handles_max=HANDLES_MAX, headers_max=HANDLES_MAX,
                                       step_timeout_s=LEDGER_TIMEOUT_S)

    async def _collect(self) -> dict[str, Any]:
        result: dict[str, Any] = {"zk": self.options.zk, "bookkeeper_root": self.options.bookkeeper_root,
                                  "namespace_root": self.options.namespace_root,
                                  "generated_ms": self.clock.wall_ms(), "errors": [],
                                  "bookies": [], "namespaces": [], "namespaces_omitted": 0, "autorecovery": None}
        try:
            await self._connect()
        except DlogError as exc:
            result["errors"].append(str(exc))
            result["health"] = health_summary(result)
            return result
        bookies, namespaces, recovery = await asyncio.gather(self._bookies(), self._namespaces(),
                                                             self._autorecovery(), return_exceptions=True)
        for key, found in (("bookies", bookies), ("namespaces", namespaces), ("autorecovery", recovery)):
            if isinstance(found, (DlogError, ValueError)):  # ValueError: a node that is not JSON
                result["errors"].append(f"reading {key}: {found}")
            elif isinstance(found, BaseException):
                raise found
            elif key == "namespaces":
                result["namespaces"], result["namespaces_omitted"] = found
            else:
                result[key] = found
        result["health"] = health_summary(result)
        return result

    # ------------------------------------------------------------------ bookies

    async def _bookies(self) -> list[dict[str, Any]]:
        from bookkeeper.bookie.registration import list_bookies_and_down

        bookies = await list_bookies_and_down(self._zk, self.options.bookkeeper_root)
        if self.options.security.zk_user:
            from bookkeeper.meta.zkstore import ZooKeeperMetadataStore

            store = ZooKeeperMetadataStore(self._zk, self.options.bookkeeper_root, trusted_registrations_only=True)
            registered = [item for item in bookies if item.get("state") != "down"]
            trusted = set(await store.trusted([str(item.get("id")) for item in registered]))
            for item in registered:
                if item.get("id") not in trusted:
                    item["http"] = None
                    item["state"] = "untrusted"
        return await asyncio.gather(*(self._bookie(item) for item in bookies))

    async def _bookie(self, info: dict[str, Any]) -> dict[str, Any]:
        bookie_id = str(info.get("id"))
        row = {"id": bookie_id, "address": info.get("address"), "state": info.get("state"),
               "rack": info.get("rack"), "http": info.get("http"), "admin": "none",
               "disk_used_percent": None, "directories": None, "adds_per_second": None,
               "copied_bytes_per_second": None}
        url = verified_admin_url(info, self.options.security.tls is not None)
        if info.get("state") in ("down", "untrusted") or url is None:
            if info.get("http") and info.get("state") not in ("down", "untrusted"):
                row["admin"] = "unverified"
            return row
        text, about = await asyncio.gather(self._fetch(url + "/metrics"), self._fetch(url + "/api/v1/bookie/info"),
                                           return_exceptions=True)
        for found in (text, about):
            if isinstance(found, BaseException) and not isinstance(found, SCRAPE_ERRORS):
                raise found
        if isinstance(about, str):  # it needs a token where /metrics may not: without one, no directories
            row["directories"] = bookie_directories(about)
        if not isinstance(text, str):
            row["admin"] = "unreachable"
            return row
        samples = parse_metrics(text)
        row["admin"] = "ok"
        if "dlog_bookie_read_only" in samples:  # fresher than the registration
            row["state"] = "read_only" if samples["dlog_bookie_read_only"] else "writable"
        if "dlog_bookie_disk_used_ratio" in samples:
            row["disk_used_percent"] = round(samples["dlog_bookie_disk_used_ratio"] * 100, 1)
        if "dlog_bookie_add_entries_total" in samples:
            rate = self.rates.rate(bookie_id, samples["dlog_bookie_add_entries_total"], self.clock.monotonic_s())
            row["adds_per_second"] = None if rate is None else round(rate, 1)
        if "dlog_autorecovery_bytes_copied_total" in samples:
            rate = self.rates.rate(f"{bookie_id} copied", samples["dlog_autorecovery_bytes_copied_total"],
                                   self.clock.monotonic_s())
            row["copied_bytes_per_second"] = None if rate is None else round(rate)
        return row

    async def _fetch(self, url: str) -> str:
        """The body of a GET to a bookie's admin endpoint, at most METRICS_BYTES_MAX of it."""
        invariant(self._http is not None, "bookies are scraped only after _connect()")
        async with self._http.get(url) as response:  # type: ignore[union-attr]
            response.raise_for_status()
            return (await response.content.read(METRICS_BYTES_MAX)).decode(errors="replace")

    # ------------------------------------------------------------------ auto-recovery

    async def _autorecovery(self) -> dict[str, Any]:
        from bookkeeper.autorecovery.status import cluster_status, underreplicated
        from bookkeeper.autorecovery.store import RecoveryStore

        store = RecoveryStore(self._zk, self.options.bookkeeper_root)
        status = await cluster_status(store)
        audit = status.pop("audit")
        status["last_ensemble_scan_ms"] = audit.get("ensembles", {}).get("finished_ms")
        status["last_replica_check_ms"] = audit.get("replicas", {}).get("finished_ms")
        status["ledgers"] = await underreplicated(store, UNDERREPLICATED_SHOWN_MAX)
        return status

    # ------------------------------------------------------------------ streams

    async def _namespaces(self) -> tuple[list[dict[str, Any]], int]:
        """The namespaces shown (the chosen ones, else the first NAMESPACES_MAX by name) and how many
        more there are."""
        try:
            names = sorted(await self._zk.children(self.options.namespace_root))
        except MetadataNotFoundError:
            return [], 0
        if self.options.namespaces:
            names = [name for name in names if name in self.options.namespaces]
        shown = await asyncio.gather(*(self._namespace(name) for name in names[:NAMESPACES_MAX]))
        return list(shown), max(0, len(names) - NAMESPACES_MAX)

    async def _namespace(self, name: str) -> dict[str, Any]:
        from dlog.segments.store import StreamStore

        store = StreamStore(self._zk, f"{self.options.namespace_root}/{name}")
        try:
            streams = await store.list_streams()
            default_tier = await store.namespace_tier()
        except DlogError as exc:
            return {"name": name, "streams": [], "streams_omitted": 0, "error": str(exc)}
        shown = await asyncio.gather(*(self._stream(store, stream, default_tier) for stream in streams[:STREAMS_MAX]))
        return {"name": name, "streams": list(shown),
                "streams_omitted": max(0, len(streams) - STREAMS_MAX), "error": None}

    async def _stream(self, store: Any, name: str, default_tier: Any = None) -> dict[str, Any]:
        try:
            config = await store.config(name)
            listing = await store.segments(name)
            offsets = await store.subscriptions(name)
            policy = tiering.effective_policy(config, default_tier)
            tier = None
            if policy.enabled or any(s.tier is not None for s in listing.segments):
                tier = {"uri": policy.uri or "", "placement": tiering.placement(listing),
                        "last_run": await store.tier_status(name)}
        except DlogError as exc:
            return {"name": name, "error": str(exc), "segments": [], "segments_omitted": 0,
                    "records": None, "truncation_point": None, "subscriptions": [], "settings": None, "tier": None}
        namespace = store.root.rsplit("/", 1)[1]
        try:
            password = unseal_password(config.password, self.options.security.seal_key(namespace)).encode()
        except DlogError:
            password = b""  # sealed and no key: in-progress record counts show as unknown
        segments = [await self._segment(config, segment, password) for segment in listing.segments]
        await self._mark_damaged(segments[-SEGMENTS_SHOWN_MAX:])
        await self._mark_writer(store, name, segments)
        view = StreamView(name, tuple(SegmentView.of(segment, item["last_entry"] if segment.is_in_progress else None)
                                      for segment, item in zip(listing.segments, segments, strict=True)))
        backlogs = {b.subscription: b for b in backlog.backlogs(listing, config, offsets, self.clock.wall_ms())}
        subscriptions = [{"name": sub, "offset": f"{o['ledger']}:{o['entry']}:{o.get('slot', 0)}",
                          **subscription_lag(segments, o), "losses": subscription_losses(view, o),
                          "backlog": backlog_json(backlogs[sub], config)}
                         for sub, o in sorted(offsets.items())]
        live = [s for s in segments if s["state"] != "truncated"]
        return {"name": name, "error": None, "segments": segments[-SEGMENTS_SHOWN_MAX:],
                "segments_omitted": max(0, len(segments) - SEGMENTS_SHOWN_MAX),
                "records": sum(s["records"] or 0 for s in live),
                "truncation_point": truncation_point(segments), "subscriptions": subscriptions,
                "settings": _settings(config), "tier": tier}

    async def _mark_damaged(self, segments: list[dict[str, Any]]) -> None:
        """A live segment whose ledger is gone has lost its records: say so."""
        alive = [s for s in segments if s["state"] != "truncated" and s["tier"] is None]
        found = await asyncio.gather(*(self._zk.exists(layout.ledger_path(self.options.bookkeeper_root,
                                                                           s["ledger"])) for s in alive))
        for segment, exists in zip(alive, found, strict=True):
            if not exists:
                segment["damaged"] = True
                segment["note"] = f"DAMAGED: ledger {segment['ledger']} is missing, its records are lost"

    async def _mark_writer(self, store: Any, name: str, segments: list[dict[str, Any]]) -> None:
        """Who writes each in-progress segment: the writer-lock holder writes the newest one (when it
        is in progress); any other in-progress segment, or the newest with the lock free, has no
        writer: its writer crashed or was cut off, and it stays in progress until the next writer
        or a recovery seals it."""
        in_progress = [s for s in segments if s["state"] == "in_progress"]
        if not in_progress:
            return
        holder = await store.lock_holder(name) if in_progress[-1] is segments[-1] else None
        for segment in in_progress:
            if segment is segments[-1] and holder is not None:
                segment["writer"] = describe_writer(holder)
            else:
                segment["writer"] = None
                segment["note"] = segment["note"] or NO_WRITER_NOTE

    async def _segment(self, config: Any, segment: Any, password: bytes) -> dict[str, Any]:
        item = {"sequence": segment.sequence, "ledger": segment.ledger_id, "state": segment.state.value,
                "first_entry": segment.first_entry, "last_entry": segment.last_entry,
                "records": segment.records, "bytes": segment.bytes,
                "min_active_entry": segment.min_active_entry, "min_active_slot": segment.min_active_slot,
                "min_active": f"{segment.ledger_id}:{segment.min_active_entry}:{segment.min_active_slot}",
                "note": None, "damaged": False, "unreadable": False, "writer": None,
                "tier": None if segment.tier is None else "both" if segment.tier.on_bookies else "tier"}
        if segment.is_in_progress:
            item["bytes"] = None  # a ledger's length is known once it is closed
            try:
                item["last_entry"], item["records"] = await self._tail(segment, password)
            except (TimeoutError, DlogError) as exc:
                self._reads.forget(segment.ledger_id)
                item["last_entry"] = item["records"] = None
                item["note"] = f"records unknown: {exc or type(exc).__name__}"
                item["unreadable"] = bool(password) or not config.password  # not merely a sealed password
        return item

    async def _tail(self, segment: Any, password: bytes) -> tuple[int, int]:
        """The in-progress segment's last confirmed entry and record count."""
        lac = await self._reads.lac(segment, password)
        return lac, (await self._reads.tail(segment, lac, password)).records


def _settings(config: Any) -> dict[str, Any]:
    """What the page shows of a stream's config (never its password)."""
    return {key: getattr(config, key) for key in (
        "ensemble", "write_quorum", "ack_quorum", "roll_bytes", "roll_age_ms", "roll_records",
        "retention_age_ms", "retention_bytes", "retention_keeps_unconsumed")}


# ------------------------------------------------------------------------------ the page


FLAG_ROWS_MAX = 8  # subscription flags close together stack in at most this many rows


def scale_css() -> str:
    """Sizes and positions as classes (the CSP allows no inline style): width, left and flex-grow
    in whole percent, and the rows of subscription flags."""
    rules = [f".w-{n}{{width:{n}%}}.l-{n}{{left:{n}%}}.g-{n}{{flex-grow:{n}}}" for n in range(101)]
    rules += [f".fr-{n}{{top:calc(100% + {2 + n * 15}px)}}.pb-{n + 1}{{padding-bottom:{6 + (n + 1) * 15}px}}"
              for n in range(FLAG_ROWS_MAX)]
    return "\n".join(rules) + "\n"


SCALE_CSS = scale_css()


def percent(value: float) -> int:
    return max(0, min(100, round(value)))


def segment_boxes(stream: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """What the timeline shows of each segment (its class, width, label, truncation shade and
    subscription flags), and how many rows the flags take."""
    live_records = sum(s["records"] or 0 for s in stream["segments"] if s["state"] != "truncated")
    point = stream["truncation_point"]
    boxes: list[dict[str, Any]] = []
    flag_rows = 1
    for segment in stream["segments"]:
        state = segment["state"] if segment["state"] in ("in_progress", "completed", "truncated") else "unknown"
        css = "damaged" if segment["damaged"] else state
        label = "damaged" if segment["damaged"] else state.replace("_", " ")
        if state == "in_progress" and segment.get("writer") is None and not segment["damaged"]:
            css, label, activity = "in_progress no-writer", "no writer", "no writer"
        elif state == "in_progress":
            activity = "writing"
        else:
            activity = format_size(segment["bytes"]) if segment["bytes"] is not None else ""
        if segment.get("tier") and not segment["damaged"]:
            css += " tiered"
            activity = TIER_LABELS[segment["tier"]]
        grow = 0
        if state != "truncated":
            grow = percent((segment["records"] or 0) / live_records * 100) if live_records else 1
        shade = None
        if point and point["sequence"] == segment["sequence"] and (point["position"] or 0) > 0:
            shade = percent(point["position"] * 100)
        flags: list[dict[str, Any]] = []
        placed: list[float] = []
        for sub in stream["subscriptions"]:
            if sub["segment"] != segment["sequence"] or sub["position"] is None:
                continue
            row = min(FLAG_ROWS_MAX - 1, len([p for p in placed if abs(p - sub["position"]) < 0.35]))
            placed.append(sub["position"])
            flags.append({"name": sub["name"], "offset": sub["offset"], "left": percent(sub["position"] * 100),
                          "right": sub["position"] > 0.6, "row": row})
            flag_rows = max(flag_rows, row + 1)
        title = (f"segment {segment['sequence']}, ledger {segment['ledger']}, {label}, min active "
                 f"{segment['min_active']}" + (f"\n{segment['note']}" if segment["note"] else ""))
        writer = segment.get("writer")
        if state == "in_progress" and writer is not None:
            title += (f"\nwriter: pid {writer.get('pid', '?')} on {writer.get('host', '?')} since "
                      f"{format_time_ms(writer.get('started_ms'), 'seconds')}")
        boxes.append({"segment": segment, "css": css, "label": label, "activity": activity, "grow": grow,
                      "shade": shade, "flags": flags, "title": title})
    return boxes, flag_rows


TIER_LABELS = {"both": "tier + bookies", "tier": "on tier"}


def tier_line(tier: dict[str, Any] | None) -> str:
    """Where a tiered stream's live segments are: on the bookies only, on both, on the tier only."""
    if not tier:
        return ""
    parts = []
    for where, label in (("bookies", "bookies only"), ("both", "both"), ("tier", "tier only")):
        counts = tier["placement"][where]
        size = counts["tier_bytes"] if where == "tier" else counts["bytes"]
        parts.append(f"{label}: {plural(counts['segments'], 'segment')}, {plural(counts['records'], 'record')}, "
                     f"{format_size(size)}")
    return f"tier {tier['uri'] or 'none'} · " + " · ".join(parts)


def tier_warning(tier: dict[str, Any] | None) -> str:
    """The stream's warning when the offloader's last run failed ("" otherwise)."""
    last_run = (tier or {}).get("last_run") or {}
    if not last_run.get("error"):
        return ""
    return (f"the last offload failed at {format_time_ms(last_run.get('at_ms'), 'seconds')} "
            f"({plural(last_run.get('failures', 1), 'failure')} in a row; retried with back-off): {last_run['error']}")


def settings_line(settings: dict[str, Any] | None) -> str:
    if not settings:
        return ""
    limits = [f"older than {format_duration_ms(settings['retention_age_ms'])}" if settings["retention_age_ms"]
              else None, f"over {format_size(settings['retention_bytes'])}" if settings["retention_bytes"] else None]
    retention = " or ".join(item for item in limits if item) or "off"
    if retention != "off" and settings["retention_keeps_unconsumed"]:
        retention += ", keeps unread"
    roll = " / ".join(item for item in (
        format_size(settings["roll_bytes"]) if settings["roll_bytes"] else None,
        format_duration_ms(settings["roll_age_ms"]) if settings["roll_age_ms"] else None,
        plural(settings["roll_records"], "record") if settings["roll_records"] else None) if item)
    return (f"E{settings['ensemble']} Qw{settings['write_quorum']} Qa{settings['ack_quorum']} · roll at "
            f"{roll or 'never'} · retention {retention}")


def stream_view(stream: dict[str, Any]) -> dict[str, Any]:
    if stream["error"]:
        return stream
    boxes, flag_rows = segment_boxes(stream)
    notes = [f"segment #{s['sequence']}: {s['note']}" for s in stream["segments"] if s["note"]]
    return {**stream, "boxes": boxes, "flag_rows": flag_rows, "notes": notes,
            "settings_line": settings_line(stream["settings"]), "tier_line": tier_line(stream.get("tier")),
            "tier_warning": tier_warning(stream.get("tier"))}


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:,}"


def _page_time(time_ms: int | None) -> str:
    return format_time_ms(time_ms, "seconds")


_TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=True,
                                undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_TEMPLATES.globals.update(number=_number, size=format_size, time=_page_time, percent=percent, plural=plural)


def render_page(result: dict[str, Any], query: str = "") -> str:
    """The whole page with the data in it: it shows without JavaScript (which only refreshes it)."""
    result = {"bookies": [], "namespaces": [], "namespaces_omitted": 0, "autorecovery": None, "zk": "?",
              "bookkeeper_root": "?", "namespace_root": "?", **result}
    namespaces, shown = filter_namespaces(result["namespaces"], query)
    namespaces = [{**ns, "streams": [stream_view(stream) for stream in ns["streams"]]} for ns in namespaces]
    total = sum(len(ns["streams"]) + ns.get("streams_omitted", 0) for ns in result["namespaces"])
    return _TEMPLATES.get_template("page.html").render(
        data=result, health=result.get("health") or health_summary(result), namespaces=namespaces,
        query=query, streams_shown=shown, streams_total=total, generated=_page_time(result.get("generated_ms")),
        namespaces_max=NAMESPACES_MAX)


# ------------------------------------------------------------------------------ the web app

COLLECTOR_KEY: web.AppKey[Collector] = web.AppKey("collector", Collector)
# Everything is served from here: scripts, styles and fetches may not go anywhere else.
SECURITY_HEADERS = {"Content-Security-Policy": "default-src 'self'; base-uri 'none'; frame-ancestors 'none'",
                    "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


async def _snapshot(request: web.Request) -> dict[str, Any] | None:
    try:
        async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
            return await request.app[COLLECTOR_KEY].snapshot()
    except TimeoutError:
        return None


def _too_slow() -> dict[str, Any]:
    return {"errors": [f"collecting took over {SNAPSHOT_TIMEOUT_S:.0f} s"]}


async def _page(request: web.Request) -> web.Response:
    """GET /?q=TEXT: the page, its streams filtered by name on the server."""
    query = request.query.get("q", "")[:QUERY_CHARS_MAX]
    result = await _snapshot(request)
    body = render_page(result if result is not None else _too_slow(), query)
    return web.Response(text=body, content_type="text/html", status=200 if result is not None else 504)


async def _scale(request: web.Request) -> web.Response:
    return web.Response(text=SCALE_CSS, content_type="text/css")


async def _cluster(request: web.Request) -> web.Response:
    result = await _snapshot(request)
    if result is None:
        return web.json_response(_too_slow(), status=504)
    return web.json_response(result, dumps=lambda value: json.dumps(value, sort_keys=True))


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


def make_app(collector: Collector) -> web.Application:
    app = web.Application()
    app[COLLECTOR_KEY] = collector
    app.router.add_get("/", _page)
    app.router.add_get("/api/cluster", _cluster)
    app.router.add_get("/static/scale.css", _scale)
    app.router.add_static("/static/", STATIC_DIR)
    app.on_response_prepare.append(_security_headers)

    async def close_collector(app: web.Application) -> None:
        await app[COLLECTOR_KEY].close()

    app.on_cleanup.append(close_collector)
    return app


async def serve_until(options: UiOptions, host: str, port: int, stop: asyncio.Event,
                      on_ready: Callable[[str], None]) -> None:
    """Serve the page until `stop` is set; `on_ready(url)` once listening."""
    runner = web.AppRunner(make_app(Collector(options)), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise DlogError(f"the UI cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        bound_port = runner.addresses[0][1]
        shown_host = f"[{host}]" if ":" in host else host
        on_ready(f"http://{shown_host}:{bound_port}/")
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(options: UiOptions, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """`dlog ui`: serve in the foreground until SIGINT or SIGTERM."""
    import signal

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve_until(options, host, port, stop, on_ready)

    asyncio.run(run())


class UiThread:
    """The page served from a background thread with its own event loop (`dlog standalone`)."""

    def __init__(self, options: UiOptions, host: str = "127.0.0.1", port: int = 0) -> None:
        self.options, self.host, self.port = options, host, port
        self.url: str | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="dlog-ui", daemon=True)

    def start(self, timeout_s: float = 10.0) -> str:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise DlogError(f"the UI did not start within {timeout_s} s")
        if self._error is not None:
            raise self._error
        assert self.url is not None
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await serve_until(self.options, self.host, self.port, self._stop, self._on_ready)

        try:
            asyncio.run(main())
        except Exception as exc:  # handed to start() in the caller's thread, which raises it
            self._error = exc
        finally:
            self._ready.set()

    def _on_ready(self, url: str) -> None:
        self.url = url
        self._ready.set()

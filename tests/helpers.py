"""Small helpers shared by tests: wait for conditions by polling with a deadline, never by sleeping."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from bookkeeper.meta.zkserver import EmbeddedZooKeeper
from dlog_tools.cluster import LocalCluster

T = TypeVar("T")

POLL_INTERVAL_S = 0.02


async def eventually(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = 10.0,
                     interval_s: float = POLL_INTERVAL_S, message: str = "") -> T:
    """Poll ``predicate`` (plain or async) until it returns something truthy; return that.

    Fails the test with AssertionError if ``timeout_s`` passes first. Exceptions from the
    predicate propagate: a condition that errors is a failure, not "not yet".
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout_s}s: {what} (last value {result!r})")
        await asyncio.sleep(interval_s)


def eventually_blocking(predicate: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.2,
                        message: str = "") -> T:
    """`eventually` for blocking code (the Spark tests): poll, sleeping between tries, until truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout_s}s: {what} (last value {result!r})")
        time.sleep(interval_s)


@contextmanager
def local_clusters(zk_server: EmbeddedZooKeeper, directory: Path, root_prefix: str,
                   default_bookies: int) -> Iterator[Callable[..., LocalCluster]]:
    """A factory of LocalClusters (bookie processes) under unique roots of the session's ZooKeeper,
    or, with own_zk=True, on a ZooKeeper of their own (for tests that pause or restart it); all of
    them are stopped afterwards, even when a test left ZooKeeper or a bookie SIGSTOPped."""
    clusters: list[LocalCluster] = []

    def make(bookies: int = default_bookies, bookie_args: list[str] | None = None, start: bool = True,
             own_zk: bool = False) -> LocalCluster:
        root = f"/{root_prefix}-{uuid.uuid4().hex[:8]}"
        cluster = LocalCluster(directory / f"cluster-{len(clusters)}", bookies=bookies, zk_root=root,
                               bookie_args=bookie_args, zk_server=None if own_zk else zk_server)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            if cluster.zk.running and cluster.zk.paused:
                cluster.zk.resume()
            for bookie in cluster.bookies:  # a SIGSTOPped bookie would ignore the SIGTERM of stop()
                if bookie.running:
                    cluster.kill_bookie(bookie.index, signal.SIGCONT)
            cluster.stop()


def dlog_runner(zk: str, zk_root: str, namespace: str | None = None,
                env: dict[str, str] | None = None) -> Callable[..., subprocess.CompletedProcess]:
    """Run the real `dlog` command against a cluster: `run("stream", "list")` adds --zk, --zk-root
    and (unless `namespaced=False`, for ledger and bookie commands) --namespace. `stdin` may be text
    or bytes (then stdout is bytes too); `ok=True` asserts the exit status is 0."""

    def run(*arguments: str, stdin: str | bytes = "", ok: bool = True, namespaced: bool = True,
            timeout_s: float = 120) -> subprocess.CompletedProcess:
        scope = ["--zk", zk, "--zk-root", zk_root]
        if namespaced and namespace is not None:
            scope += ["--namespace", namespace]
        result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments, *scope], input=stdin,
                                capture_output=True, text=isinstance(stdin, str), timeout=timeout_s,
                                env={**os.environ, **(env or {})})
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    return run


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The single line a refused command printed (asserting it failed, without a traceback)."""
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def readme_blocks(language: str) -> list[str]:
    """The README's fenced code blocks of `language` ("" for plain ones), in order: tests run them
    as printed, so the README cannot drift from what works."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
            if lang == language]


@contextmanager
def secure_local_cluster(directory: Path, bookies: int, bookie_args: list[str]) -> Iterator[LocalCluster]:
    """A secure cluster of its own (as `dlog standalone --secure` makes one) under `directory`, with
    the admin's client.toml written; `cluster.secure_dir` holds the CA, keys and tokens."""
    from dlog_tools.secure import create, write_admin_config

    secure = create(directory / "secure")
    cluster = LocalCluster(directory / "cluster", bookies=bookies, secure=secure, bookie_args=bookie_args)
    cluster.start()
    try:
        write_admin_config(secure, cluster.zk_address)
        cluster.secure_dir = secure  # type: ignore[attr-defined]
        yield cluster
    finally:
        cluster.stop()

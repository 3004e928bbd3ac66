"""Fixtures shared by every test directory. Keep each section small; add new ones below."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.meta.zkserver import EmbeddedZooKeeper

# A non-interactive shell starts a background job (`make test &`, nohup) with SIGINT ignored, and
# every child inherits an ignored signal: the tests that press Ctrl-C on a `dlog` child would wait
# for it forever. A handled signal is reset to the default in a child, so handle it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Property tests judge behaviour, not speed: hypothesis's per-example deadline (200 ms) and its
# too-slow health check failed a name round trip on a machine loaded by the rest of the suite.
settings.register_profile("dlog", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dlog")

# ------------------------------------------------------------------------------ ZooKeeper


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedZooKeeper]:
    """One real ZooKeeper for the whole session; tests keep apart by using ``zk_root``."""
    server = EmbeddedZooKeeper(Path(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_hosts(zk_server: EmbeddedZooKeeper) -> str:
    """The connect string of the session's ZooKeeper, e.g. "127.0.0.1:PORT"."""
    return zk_server.address


@pytest.fixture
def zk_root() -> str:
    """A root path no other test uses, e.g. "/t-1a2b3c4d" (not created: tests create what they need)."""
    return f"/t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def zk(zk_server: EmbeddedZooKeeper) -> AsyncIterator[AsyncZooKeeper]:
    """A started client of the session's ZooKeeper, closed after the test."""
    client = AsyncZooKeeper(zk_server.address, timeout_s=10.0)
    await client.start()
    yield client
    await client.close()


# ------------------------------------------------------------------------------ a secure cluster


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory):
    """A secure cluster for the whole session (started by the first test that asks): its own
    ZooKeeper with dlog's admin as super user, two TLS bookies requiring tokens and registering
    under ACLs, and the namespaces `orders` and `billing` provisioned."""
    import asyncio

    from dlog_tools.cluster import LocalCluster
    from dlog_tools.secure import create, provision_namespace

    directory = tmp_path_factory.mktemp("secure")
    secure = create(directory / "secure")
    cluster = LocalCluster(directory / "cluster", bookies=2, secure=secure,
                           bookie_args=["--gc-interval", "0"])
    cluster.start()
    admin = secure.admin_settings()
    for namespace in ("orders", "billing"):
        asyncio.run(provision_namespace(cluster.zk_address, admin, namespace))
    cluster.secure_dir = secure
    yield cluster
    cluster.stop()


# ------------------------------------------------------------------------------ running side by side


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs two pytest-xdist workers (`-n 2 --dist loadgroup`): most of the suite waits
    on real processes, so two files at once use the machine's two cores. A file's tests stay
    together on one worker, in order (its module fixtures start once); the Spark files share one
    worker (one Spark JVM at a time), and the tests of the session's secure cluster share one
    (it starts once)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.nodeid.split("::")[0]
        if path.startswith("tests/spark/"):
            group = "spark"
        elif "secure_cluster" in getattr(item, "fixturenames", ()):
            group = "secure-cluster"
        else:
            group = path
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under `--dist loadgroup`, stop unless every test id a worker collected carries its group: a
    pytest and pytest-xdist pair that drops the groups (pytest 9.2 with xdist 3.8) would still
    pass, only slower, with module fixtures and the fixed-seed sweeps run once on each worker."""
    if node.config.getoption("dist", default="no") != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if "@" not in nodeid.rpartition("]")[2]]
    if lost:
        pytest.exit(f"--dist loadgroup lost the test groups (e.g. {lost[0]}): this pytest-xdist does "
                    "not group with this pytest; see pyproject.toml", returncode=pytest.ExitCode.USAGE_ERROR)

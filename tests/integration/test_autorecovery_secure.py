"""Auto-recovery on a secure cluster (TLS, tokens, ZooKeeper ACLs): a bookie lost for good is
replaced although every bookie refuses unauthenticated peers. The bookies' workers reach each
other with their own certificate and a `bookie` token they sign, fence nothing they may not, and
the stream's records read back whole by the namespace's consumer."""

from __future__ import annotations

import pytest

from bookkeeper.autorecovery.policy import bookies_named
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.client import BookKeeper
from dlog.namespace import Namespace
from tests.helpers import eventually, secure_local_cluster
from tests.integration.test_streams import read_all, values
from dlog_tools.secure import provision_namespace

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def secure_four(tmp_path):
    with secure_local_cluster(tmp_path, 4, ["--zk-session-timeout", "4", "--lost-bookie-recovery-delay", "0s",
                                            "--checkpoint-interval", "1", "--gc-interval", "0"]) as cluster:
        yield cluster


async def test_a_lost_bookie_of_a_secure_cluster_is_replaced(secure_four):
    cluster, secure = secure_four, secure_four.secure_dir
    admin = secure.admin_settings()
    await provision_namespace(cluster.zk_address, admin, "orders")
    settings = secure.client_settings("orders", ["produce:orders", "consume:orders"])
    async with Namespace(cluster.zk_address, "orders", security=settings) as ns:
        await ns.create_stream("s", ensemble=3, write_quorum=2, ack_quorum=2)
        async with ns.open_writer("s") as writer:
            for value in values(300):
                writer.write_nowait(value)
            await writer.flush()
        ledgers = [segment.ledger_id for segment in (await ns.store.segments("s")).segments]

    async with BookKeeper(cluster.zk_address, root=cluster.zk_root, security=admin) as bk:
        metadata, _ = await bk.ledger_metadata(ledgers[0])
        victim = metadata.ensembles[0][1][0]
        index = next(b.index for b in cluster.bookies if (b.bookie_id or b.address) == victim)
        cluster.kill_bookie(index)  # gone for good: never restarted
        store = RecoveryStore(bk.store.zk, cluster.zk_root)

        async def replaced() -> bool:
            if await store.count_marks():
                return False
            for ledger_id in ledgers:
                if victim in bookies_named((await bk.ledger_metadata(ledger_id))[0]):
                    return False
            return True

        await eventually(replaced, 90, interval_s=0.5, message=f"every ledger replicated away from {victim}")

    async with Namespace(cluster.zk_address, "orders", security=settings) as ns:
        assert [record.value for record in await read_all(ns, "s")] == values(300)

"""A secure cluster's data is readable by its own user only: the bookies' journals, entry logs, index,
cookie and log, and the embedded ZooKeeper's snapshots and transaction logs, are created 0600 in
0700 directories."""

from __future__ import annotations

import stat
from pathlib import Path

from bookkeeper.client import BookKeeper
from tests.helpers import eventually, secure_local_cluster


def shared(root: Path) -> list[str]:
    """Files and directories under `root` (and itself) that its group or others may use."""
    paths = [root, *root.rglob("*")]
    return [f"{path} {stat.filemode(path.stat().st_mode)}" for path in paths
            if stat.S_IMODE(path.stat().st_mode) & 0o077]


async def test_bookie_and_zookeeper_data_are_private(tmp_path):
    with secure_local_cluster(tmp_path, 1, ["--checkpoint-interval", "0.2"]) as cluster:
        bookie = cluster.bookies[0]
        async with BookKeeper(cluster.zk_address, root=cluster.zk_root,
                              security=cluster.secure_dir.admin_settings()) as client:
            handle = await client.create_ledger(1, 1, 1, password=b"pw")
            await handle.append(b"secret")
            await handle.close()
        entry_logs = bookie.data_dir / "ledgers" / "entrylogs"
        await eventually(lambda: any(entry_logs.glob("*.log")), 10)  # checkpointed
        kinds = {path.parent.name for path in bookie.data_dir.rglob("*") if path.is_file()}
        assert {"journal", "entrylogs", "index", "ledgers"} <= kinds  # lastmark is in ledgers/
        assert shared(bookie.data_dir) == []
        zookeeper = cluster.directory / "zookeeper"
        assert any((zookeeper / "data").rglob("snapshot.*")) and any((zookeeper / "data").rglob("log.*"))
        assert stat.S_IMODE(zookeeper.stat().st_mode) == 0o700
        assert shared(zookeeper / "data") == []

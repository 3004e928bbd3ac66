"""The README's Spark example runs as printed (only the ZooKeeper address and the checkpoint folder
are this test's): it reads `clicks` and creates and fills `clicks_upper`; without `createStream`
the query stops as it starts with one line naming the missing stream."""

from __future__ import annotations

import pytest

import dlog
from tests.helpers import eventually_blocking, readme_blocks
from dlog_tools.cluster import LocalCluster

README_ZK = "127.0.0.1:2181"
README_CHECKPOINT = "/tmp/checkpoints/upper"


@pytest.fixture(scope="module")
def readme_cluster(tmp_path_factory):
    """Its own ZooKeeper, so the README's default roots (/bookkeeper, namespace default) are ours."""
    cluster = LocalCluster(tmp_path_factory.mktemp("readme-spark"), bookies=3)
    cluster.start()
    yield cluster
    from dlog_spark.connection import close_all

    close_all()
    cluster.stop()


def example(cluster: LocalCluster, checkpoint: str) -> str:
    (code,) = [body for body in readme_blocks("python") if "readStream" in body]
    assert README_ZK in code and README_CHECKPOINT in code
    return code.replace(README_ZK, cluster.zk_address).replace(README_CHECKPOINT, checkpoint)


def values(ns, stream: str) -> list[bytes]:
    with ns.open_reader(stream, follow=False) as reader:
        return [record.value for record in reader]


def test_the_spark_example_runs_as_printed(spark, readme_cluster, tmp_path):
    with dlog.connect(readme_cluster.zk_address) as ns:
        ns.create_stream("clicks")
        with ns.open_writer("clicks") as writer:
            writer.write_many([b"hello", b"world"])
        scope: dict = {"spark": spark}
        exec(compile(example(readme_cluster, str(tmp_path / "upper")), "README.md", "exec"), scope)
        query = scope["query"]
        try:
            eventually_blocking(lambda: "clicks_upper" in ns.list_streams() and
                                values(ns, "clicks_upper") == [b"HELLO", b"WORLD"], timeout_s=120,
                                message="the query created clicks_upper and wrote the upper-cased clicks")
            assert query.exception() is None
        finally:
            query.stop()

        without = example(readme_cluster, str(tmp_path / "plain")).replace(
            'option("stream", "clicks_upper")', 'option("stream", "clicks_plain")').replace(
            '.option("createStream", "true")', "")
        exec(compile(without, "README.md", "exec"), scope)
        failed = scope["query"]
        try:
            eventually_blocking(lambda: not failed.isActive, timeout_s=120, message="the query stopped at once")
            error = str(failed.exception())
        finally:
            failed.stop()
        assert ("the dlog sink's stream 'clicks_plain' does not exist in namespace 'default': create it with "
                '`dlog stream create clicks_plain`, or set .option("createStream", "true")') in error
        assert "clicks_plain" not in ns.list_streams()

"""Spark against a secure cluster: the source and sink take client.toml (`config`) and `token` as
options, write and read back end to end, and a token of another namespace is refused by name."""

from __future__ import annotations

import pytest

from dlog_tools.secure import write_client_toml

pytestmark = pytest.mark.spark


def test_the_sink_and_source_work_with_security_options(spark, secure_cluster, tmp_path):
    secure = secure_cluster.secure_dir
    settings = secure.client_settings("orders", ["produce:orders", "consume:orders"])
    config = tmp_path / "client.toml"
    write_client_toml(config, zk=secure_cluster.zk_address, ca_file=secure.ca_file, token=settings.token,
                      zk_user=settings.zk_user, zk_password=settings.zk_password,
                      zk_identities=settings.zk_identities, namespace_key=settings.namespace_key)
    options = {"namespace": "orders", "config": str(config)}
    rows = spark.createDataFrame([(b"k", f"v{i}".encode()) for i in range(20)], "key binary, value binary")
    import asyncio

    from dlog import Namespace

    async def create() -> None:
        async with Namespace(secure_cluster.zk_address, "orders", security=settings) as ns:
            await ns.create_stream("spark-secure", ensemble=2, write_quorum=2, ack_quorum=2, exist_ok=True)

    asyncio.run(create())
    rows.write.format("dlog").options(**options).option("stream", "spark-secure").mode("append").save()
    read = spark.read.format("dlog").options(**options).option("stream", "spark-secure").load()
    assert sorted(row.value for row in read.select("value").collect()) == sorted(
        f"v{i}".encode() for i in range(20))
    intruder = secure.token("intruder", ["consume:billing"])
    with pytest.raises(Exception, match="may not read"):
        (spark.read.format("dlog").options(**options).option("token", intruder)
         .option("stream", "spark-secure").load().collect())

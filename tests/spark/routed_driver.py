"""A Spark driver the routed-sink test kills: reads stream `source` and routes each record to
`out-0`, `out-1` or `out-2` (by its number modulo 3), exactly once, until it is killed.

    python -m tests.spark.routed_driver MASTER CHECKPOINT OPTIONS_JSON [CONF_JSON]

Not a test module: tests/spark/test_spark_standalone.py runs it as a process of its own.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    master, checkpoint, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    conf = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("dlog-routed-driver")
               .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    query = (routed_records(spark.readStream.format("dlog").options(**options).option("stream", "source")
                            .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "300").load())
             .writeStream.format("dlog").options(**options).option("sinkId", "routed-job")
             .option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds").start())
    print("query started", flush=True)
    query.awaitTermination()


def routed_records(frame):
    """Records "event-0000123" go to stream out-(123 % 3)."""
    return frame.selectExpr("concat('out-', cast(cast(substring(cast(value as string), 7) as int) % 3 as string)) "
                            "as stream", "key", "value", "timestamp")


if __name__ == "__main__":
    main()

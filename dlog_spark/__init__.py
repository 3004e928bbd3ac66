"""The "dlog" Spark data source (batch and streaming read and write); see docs/spark.md.

    source.py      DlogDataSource: the entry point Spark calls (found through pyspark_dlog)
    options.py     the options, checked by name
    offsets.py     Spark's offset JSON (per stream the next entry to read, an Offset)
    plan.py        pure planning: admission control, partitions
    catalog.py     the driver's views of streams (dlog.snapshot) and entry headers
    reader.py      stream and batch readers
    partition.py   a partition and its read in a worker
    schema.py      the read schema and the Arrow conversions of both directions
    sink.py        write tasks (one ledger each) and the sink's commit and abort
    segments.py    appending ledgers as segments with the sink's batch id, in one multi
    connection.py  one namespace connection per Python process
"""

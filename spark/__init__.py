"""The "dlog" Spark data source (batch and streaming read and write); see docs/spark.md.

    source.py      DlogDataSource: the entry point Spark calls (found through pyspark_dlog)
    options.py     the options, checked by name
    plan.py        pure planning: offsets, data loss, admission control, partitions
    catalog.py     the driver's snapshots of segment lists, LACs and entry headers
    reader.py      stream and batch readers, and the partition read in workers
    schema.py      the read schema and the Arrow conversions of both directions
    sink.py        write tasks (one ledger each) and the sink's commit and abort
    segments.py    appending ledgers as segments with the sink's batch id, in one multi
    connection.py  one namespace connection per Python process
"""

"""The "dlog" Spark data source: `spark.read`, `spark.readStream`, `df.write`, `df.writeStream`.

    spark.readStream.format("dlog").option("zk", "127.0.0.1:2181").option("stream", "orders").load()

Spark finds it with no registration call through the top-level module `pyspark_dlog`;
`spark.dataSource.register(DlogDataSource)` works too. The options are in `dlog_spark.options` and in
docs/spark.md. Spark creates this object in several processes (planning, each read task, each
commit) from pickled options, so it holds nothing but them.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from bookkeeper.errors import ConfigError
from dlog.segments.codec import default_schema
from dlog_spark.catalog import Catalog
from dlog_spark.connection import connection
from dlog_spark.options import ROUTE_COLUMN, SinkOptions, parse_sink_options, parse_source_options
from dlog_spark.reader import DlogBatchReader, DlogStreamReader
from dlog_spark.schema import read_schema
from dlog_spark.sink import DlogBatchWriter, DlogStreamWriter


class DlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dlog"

    def schema(self) -> StructType:
        """The read schema: metadata columns, then key/value or the typed streams' own columns."""
        options = parse_source_options(self.options, batch=True)  # the wider set; readers check again
        catalog = Catalog(connection(options.connection), options)
        names = catalog.stream_names()
        schemas = {name: catalog.schema(name) for name in names}
        first = next(iter(schemas.values()), default_schema())
        for name, schema in schemas.items():
            if not schema.equals(first):
                raise ConfigError(f"streams {names[0]!r} and {name!r} have different schemas; one query "
                                  "reads streams of one schema")
        return read_schema(first, options.include_headers)

    def reader(self, schema: StructType) -> DlogBatchReader:
        return DlogBatchReader(parse_source_options(self.options, batch=True), schema)

    def streamReader(self, schema: StructType) -> DlogStreamReader:
        return DlogStreamReader(parse_source_options(self.options, batch=False), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DlogBatchWriter:
        if overwrite:
            raise ConfigError("dlog streams are append-only: use save mode 'append' (an overwrite "
                              "would have to truncate the stream; use `dlog truncate` for that)")
        return DlogBatchWriter(_routable(parse_sink_options(self.options, streaming=False), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DlogStreamWriter:
        # Complete and update output modes (overwrite=True for complete) append each micro-batch's
        # rows like any other, as Kafka's sink does: a stream of aggregate updates whose latest
        # record per key is the current value. Exactly-once per batch id still holds.
        return DlogStreamWriter(_routable(parse_sink_options(self.options, streaming=True), schema))


def _routable(options: SinkOptions, schema: StructType) -> SinkOptions:
    """Without option `stream`, rows name their stream in a string `stream` column (routing)."""
    if options.stream is None and ROUTE_COLUMN not in schema.fieldNames():
        raise ConfigError(f"the dlog sink needs option 'stream' (the stream to append to) or a {ROUTE_COLUMN!r} "
                          "column naming each row's stream")
    return options

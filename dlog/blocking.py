"""A blocking facade for scripts and Spark workers: the same method names, no `await`.

    import dlog
    with dlog.connect("127.0.0.1:2181") as ns:
        ns.create_stream("orders")
        with ns.open_writer("orders") as writer:
            offset = writer.write(b"value")
        with ns.open_reader("orders", follow=False) as reader:
            for record in reader: ...

One event loop runs in a daemon thread per connection (dlog.bridge.LoopThread, the one bridge);
every call hands a coroutine to it and waits for the result, with a timeout, so a hung cluster
cannot block a caller forever.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator
from typing import Any, TypeVar

import pyarrow as pa

from dlog.bridge import LoopThread
from dlog.namespace import Namespace
from dlog.offsets import Offset
from dlog.reader import Record, StreamReader
from dlog.writer import DuplicateWrite, StreamWriter, WrittenBatch

T = TypeVar("T")


class BlockingNamespace:
    def __init__(self, zk: str | None = None, name: str = "default", **options: Any) -> None:
        self._loop = LoopThread()
        self.namespace = Namespace(zk, name, **options)
        self._loop.call(self.namespace.start())

    def __getattr__(self, attribute: str) -> Any:
        """Every coroutine method of Namespace, made blocking (create_stream, truncate, ...)."""
        method = getattr(self.namespace, attribute)
        if not callable(method):
            return method

        def blocking(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            return self._loop.call(result) if asyncio.iscoroutine(result) else result

        return blocking

    def open_writer(self, name: str, **options: Any) -> BlockingWriter:
        return BlockingWriter(self._loop, self._loop.call(self.namespace.open_writer(name, **options)))

    def open_reader(self, name: str, start: str | Offset | int | datetime.datetime = "earliest",
                    **options: Any) -> BlockingReader:
        return BlockingReader(self._loop, self._loop.call(self.namespace.open_reader(name, start, **options)))

    def close(self) -> None:
        self._loop.call(self.namespace.close())
        self._loop.stop()

    def __enter__(self) -> BlockingNamespace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BlockingWriter:
    def __init__(self, loop: LoopThread, writer: StreamWriter) -> None:
        self._loop = loop
        self.writer = writer

    @property
    def last_sequence(self) -> int | None:
        """A named producer's last durable sequence (`StreamWriter.last_sequence`)."""
        return self.writer.last_sequence

    def write(self, value: bytes, key: bytes | None = None, timestamp_ms: int | None = None,
              headers: list[tuple[str, bytes | None]] | None = None, *,
              sequence: int | None = None) -> Offset | DuplicateWrite:
        return self._loop.call(self.writer.write(value, key, timestamp_ms, headers, sequence=sequence))

    def write_many(self, values: list[bytes], keys: list[bytes | None] | None = None) -> list[Offset | DuplicateWrite]:
        """Pipelined per-record writes; returns every offset once all are durable."""
        async def run() -> list[Offset | DuplicateWrite]:
            futures = []
            for index, value in enumerate(values):
                await self.writer.wait_writable()
                futures.append(self.writer.write_nowait(value, keys[index] if keys else None))
            return list(await asyncio.gather(*futures))

        return self._loop.call(run())

    def write_batch(self, batch: pa.RecordBatch | list[bytes], *,
                    sequence: int | list[int] | None = None) -> WrittenBatch | DuplicateWrite:
        return self._loop.call(self.writer.write_batch(batch, sequence=sequence))

    def flush(self) -> None:
        self._loop.call(self.writer.flush())

    def close(self) -> None:
        self._loop.call(self.writer.close())

    def __enter__(self) -> BlockingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BlockingReader:
    def __init__(self, loop: LoopThread, reader: StreamReader) -> None:
        self._loop = loop
        self.reader = reader

    def __iter__(self) -> Iterator[Record]:
        while True:
            try:
                yield self._loop.call(self.reader.__anext__())
            except StopAsyncIteration:
                return

    def read_batch(self, max_records: int = 65536, timeout_ms: int = 1000) -> pa.RecordBatch | None:
        return self._loop.call(self.reader.read_batch(max_records, timeout_ms))

    @property
    def position(self) -> Offset | None:
        return self.reader.position

    def close(self) -> None:
        self._loop.call(self.reader.close())

    def __enter__(self) -> BlockingReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect(zk: str | None = None, name: str = "default", **options: Any) -> BlockingNamespace:
    """A blocking Namespace, taking Namespace's own arguments (`name=` the namespace, `root=`,
    `bookkeeper_root=`, `config=`...); `zk` and security default to client.toml ($DLOG_CONFIG or
    config=)."""
    return BlockingNamespace(zk, name, **options)

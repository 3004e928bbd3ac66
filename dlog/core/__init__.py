"""The sans-IO stream core: the rules of writers, readers, truncation and retention as pure code.

`writer.WriterMachine` and `reader.ReaderMachine` are state machines: events in (records, entry
acknowledgements and failures, segment-store results including a lost compare-and-set and the list
as it now is, list-change notifications, the time), effects out (`effects`: create a ledger,
append an entry, commit a segment-list change, close or delete a ledger, complete or fail records,
wake waiters, read entries, long-poll). The writer machine batches records into entries with a
part of its own (`batching.EntryBatcher`) and commits the segments around them; its settings are
in `settings`. `changes` holds the pure planners the machines and the namespace share: sealing a
segment, merging a change with concurrent ones, truncation, retention.
`dedup` is the one producer-deduplication table (idempotent Kafka producers and named native
writers alike): batches in, verdicts out, snapshot and replay to rebuild it on a new owner.

Nothing here does I/O, reads a clock or touches asyncio or ZooKeeper: time comes in with events
(`now_ms`), and encoding or decoding entries is a pure function handed in. `dlog.writer` and
`dlog.reader` are the asyncio drivers that carry the effects out; the stream simulator
(tests/harness/streamsim) drives the very same machines on simulated time.
"""

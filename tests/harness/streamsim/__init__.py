"""The seeded stream simulator: the real stream layer (namespace, writer and reader drivers and
their sans-IO machines, truncation, retention, the Spark sink's commits) on simulated time, over
the in-memory segment store and modelled ledgers, under faults; checked by the one checker
(tests/harness/history). Replay a seed with `python -m tests.harness.streamsim --seed S`."""

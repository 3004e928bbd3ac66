"""The test harness, not shipped in the wheel: seeded simulators of the ledger layer
(`tests.harness.sim`) and the stream layer (`tests.harness.streamsim`), the history recorder and its checker (`tests.harness.history`), fault
injection on real processes (`tests.harness.faults`) and the chaos soak (`tests.harness.chaos`).

It may import every shipped package; nothing shipped (bookkeeper, dlog, dlog_spark, dlog_tools) imports it.
Run its commands from the project root: `python -m tests.harness.sim --seed 42`,
`python -m tests.harness.chaos --seed 1 --minutes 30`.
"""

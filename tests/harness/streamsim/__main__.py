"""Run the seeded stream simulator: replay one seed, or explore many.

    python -m tests.harness.streamsim --seed 42                 # replay one run (add --trace for its events)
    python -m tests.harness.streamsim --seeds 200 --start 0     # explore seeds 0..199 and print a summary
    python -m tests.harness.streamsim --seeds 100 --plant reader-misses-roll   # see the checker catch a bug

Exit status 1 when any run broke a promise; every failing seed is printed with the command that
replays it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

from tests.harness.seeds import seed_parser
from tests.harness.streamsim import plants
from tests.harness.streamsim.simulation import StreamRunResult, StreamSimulation

FAILING_SEEDS_SHOWN_MAX = 20
TRACE_EVENTS = 200



def _parser() -> argparse.ArgumentParser:
    parser = seed_parser("python -m tests.harness.streamsim", __doc__.split("\n")[0])
    parser.add_argument("--trace", action="store_true", help=f"with --seed: print the last {TRACE_EVENTS} events")
    parser.add_argument("--plant", choices=plants.NAMES, help="run with a planted bug, to see the checker catch it")
    return parser


def replay(seed: int, trace: bool) -> int:
    simulation = StreamSimulation(seed)
    result = simulation.run()
    stats = result.report.stats
    print(f"seed {seed}: {result.scenario.describe()}")
    print(f"  {stats.get('writes', 0)} writes ({stats.get('ok', 0)} ok), {stats.get('reads', 0)} records read by "
          f"{stats.get('readers', 0)} reader sessions, {stats.get('writers', 0)} writer sessions, "
          f"{stats.get('segments', 0)} segments; {result.simulated_s:.1f} simulated s; fingerprint {result.fingerprint}")
    print(f"  faults: {dict(sorted(result.faults.items())) or 'none'}")
    if trace:
        for event in simulation.history.events[-TRACE_EVENTS:]:
            detail = {key: value for key, value in event.items() if key not in ("t", "process", "f", "type")}
            print(f"  t={event['t']:9.4f} {event['process']} {event['f']} {event['type']} {str(detail)[:160]}")
    if result.anomalies:
        print(result.text)
        return 1
    print("  anomalies: 0")
    return 0


def explore(start: int, count: int) -> int:
    began = time.monotonic()
    faults: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failing: list[StreamRunResult] = []
    writes = 0
    for seed in range(start, start + count):
        result = StreamSimulation(seed).run()
        faults.update(result.faults)
        writes += result.writes_ok
        if result.anomalies:
            failing.append(result)
            kinds.update(anomaly.kind for anomaly in result.report.anomalies)
    print(f"runs: {count} (seeds {start}..{start + count - 1}) in {time.monotonic() - began:.1f} s")
    print(f"writes acknowledged: {writes}; faults injected: {sum(faults.values())} {dict(sorted(faults.items()))}")
    print(f"runs with anomalies: {len(failing)} {dict(sorted(kinds.items()))}")
    for result in failing[:FAILING_SEEDS_SHOWN_MAX]:
        print(f"  seed {result.seed}: {result.anomalies[0][:200]}")
        print(f"    replay: python -m tests.harness.streamsim --seed {result.seed}")
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("dlog", "bookkeeper", "dlog_spark", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    arguments = _parser().parse_args(argv)
    with plants.planted(arguments.plant):
        if arguments.plant:
            print(f"planted bug: {arguments.plant}: {plants.describe(arguments.plant)}")
        if arguments.seed is not None:
            return replay(arguments.seed, arguments.trace)
        return explore(arguments.start, arguments.seeds)


if __name__ == "__main__":
    sys.exit(main())

"""Run the seeded protocol simulator: replay one seed, or explore many.

    python -m tests.harness.sim --seed 42                    # replay one run (add --trace for its events)
    python -m tests.harness.sim --seeds 1000 --start 0       # explore seeds 0..999 and print a summary
    python -m tests.harness.sim --seeds 300 --plant ack-before-fsync   # show the checker catching a bug

Exit status 1 when any run broke a promise; every failing seed is printed with the command that
replays it. The simulator runs the shipped client and bookie code (see tests/harness/sim/simulation.py);
its fixed seeds and plants are tests/sim/test_simulation.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from tests.harness.seeds import seed_parser, whole_number
from tests.harness.sim import plants
from tests.harness.sim.simulation import DEFAULT_STEPS, RunResult, Simulation

FAILING_SEEDS_SHOWN_MAX = 20



def _parser() -> argparse.ArgumentParser:
    parser = seed_parser("python -m tests.harness.sim", __doc__.split("\n")[0])
    parser.add_argument("--steps", type=whole_number, default=DEFAULT_STEPS,
                        help=f"event-loop turns before every fault heals (default {DEFAULT_STEPS})")
    parser.add_argument("--trace", action="store_true", help="with --seed: print the last 200 events")
    parser.add_argument("--plant", choices=plants.NAMES,
                        help="run with a planted bug, to see the checker catch it")
    return parser


def _simulate(seed: int, steps: int, options: dict[str, bool]) -> tuple[Simulation, RunResult]:
    simulation = Simulation(seed, steps, **options)
    return simulation, simulation.run()


def replay(seed: int, steps: int, options: dict[str, bool], trace: bool) -> int:
    simulation, result = _simulate(seed, steps, options)
    print(f"seed {seed}, steps {steps}: {result.scenario.describe()}")
    print(f"  {result.entries_appended} entries appended, {result.entries_acked} acknowledged, ledger "
          f"closed at entry {result.last_entry_id}; {result.events} loop turns over "
          f"{result.simulated_ms:.0f} simulated ms; fingerprint {result.fingerprint}")
    print(f"  faults: {dict(sorted(result.faults.items())) or 'none'}")
    print(f"  exercised: {dict(sorted(simulation.world.stats.items()))}")
    if trace:
        print(simulation.world.format_trace(200))
    if result.violations:
        print(result.report)
        return 1
    print("  violations: 0")
    return 0


def explore(start: int, count: int, steps: int, options: dict[str, bool]) -> int:
    began = time.monotonic()
    faults: Counter[str] = Counter()
    exercised: Counter[str] = Counter()
    acked = appended = 0
    failing: list[RunResult] = []
    for seed in range(start, start + count):
        simulation, result = _simulate(seed, steps, options)
        faults.update(result.faults)
        exercised.update(simulation.world.stats)
        acked += result.entries_acked
        appended += result.entries_appended
        if result.violations:
            failing.append(result)
    elapsed_s = time.monotonic() - began
    print(f"runs: {count} (seeds {start}..{start + count - 1}, steps {steps}) in {elapsed_s:.1f} s")
    print(f"entries appended: {appended}, acknowledged: {acked}")
    print(f"faults injected: {sum(faults.values())} {dict(sorted(faults.items()))}")
    print(f"exercised: {dict(sorted(exercised.items()))}")
    print(f"violations: {len(failing)}")
    for result in failing[:FAILING_SEEDS_SHOWN_MAX]:
        print(f"  seed {result.seed}: {result.violations[0]}")
        print(f"    replay: python -m tests.harness.sim --seed {result.seed} --steps {result.steps}")
    if len(failing) > FAILING_SEEDS_SHOWN_MAX:
        print(f"  ... and {len(failing) - FAILING_SEEDS_SHOWN_MAX} more")
    if failing:
        print(f"\nfirst failure in full:\n{failing[0].report}")
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    with plants.planted(arguments.plant) as options:
        if arguments.plant:
            print(f"planted bug: {arguments.plant}: {plants.describe(arguments.plant)}")
        if arguments.seed is not None:
            return replay(arguments.seed, arguments.steps, options, arguments.trace)
        return explore(arguments.start, arguments.seeds, arguments.steps, options)


if __name__ == "__main__":
    sys.exit(main())

"""The command line both seeded simulators share: replay one seed, or explore a range of them."""

from __future__ import annotations

import argparse
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

S = TypeVar("S")
T = TypeVar("T")
SEED_PROCESSES_MAX = 4  # processes that run a range of seeds side by side (at most one per core)


def whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def seed_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """--seed N (replay) or --seeds N (explore), and --start for the first seed explored."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--seed", type=whole_number, help="replay this one seed")
    mode.add_argument("--seeds", type=whole_number, help="explore this many seeds")
    parser.add_argument("--start", type=whole_number, default=0, help="first seed to explore (default 0)")
    return parser


def map_seeds(function: Callable[[S], T], seeds: Iterable[S]) -> list[T]:
    """`function(seed)` for every seed (or (plant, seed) pair...), in seed order, the seeds spread over this machine's cores
    (each run is deterministic and independent: only the wall time changes). `function` must be a
    module-level function, its result picklable. The processes are spawned, not forked: a fork of
    a test process copies whatever threads (ZooKeeper clients, Spark's gateway) hold locks."""
    seeds = list(seeds)
    processes = min(os.cpu_count() or 1, SEED_PROCESSES_MAX, len(seeds))
    if processes < 2:
        return [function(seed) for seed in seeds]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(function, seeds, chunksize=max(1, len(seeds) // (processes * 8))))

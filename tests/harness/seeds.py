"""The command line both seeded simulators share: replay one seed, or explore a range of them."""

from __future__ import annotations

import argparse


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

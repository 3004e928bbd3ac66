"""Tests of the seeded simulators (the simulators themselves live in tests/harness)."""

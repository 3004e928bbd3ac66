"""Fault scenarios on real processes, checked by histories (see docs/faults.md)."""

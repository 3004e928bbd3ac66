"""One error contract: every error class of every shipped package has its own code in the one
registry, a duplicate or missing code is refused at import time, wire statuses map back to their
classes, and a broken invariant is never a DlogError (so `except DlogError` cannot swallow it)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from bookkeeper import errors
from bookkeeper.errors import (
    ERRORS,
    BookieError,
    DlogError,
    InvariantError,
    LedgerFencedError,
    MetadataError,
    NoSuchLedgerError,
    error_for_status,
    invariant,
)
from bookkeeper.protocol.wire import Status

SHIPPED = ("bookkeeper", "dlog", "dlog_spark", "dlog_tools")


def import_everything() -> None:
    for top in SHIPPED:
        package = importlib.import_module(top)
        for module in pkgutil.walk_packages(package.__path__, f"{top}."):
            if module.name.endswith("__main__"):
                continue
            importlib.import_module(module.name)


def every_subclass(root: type) -> list[type]:
    found, todo = [], [root]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_of_every_package_has_its_own_registered_code():
    import_everything()
    classes = [cls for cls in every_subclass(DlogError) if cls.__module__.split(".")[0] in SHIPPED]
    assert len(classes) > 40
    for cls in [*classes, InvariantError]:
        assert "code" in cls.__dict__, f"{cls.__qualname__} inherits its code"
        assert ERRORS[cls.code] is cls, f"{cls.__qualname__}: code {cls.code} is registered to {ERRORS[cls.code]}"
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))


def test_a_duplicate_or_missing_code_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match="already taken by .*ConfigError"):
        type("Clash", (DlogError,), {"code": errors.ConfigError.code})
    with pytest.raises(TypeError, match="must declare its own integer `code`"):
        type("NoCode", (MetadataError,), {})
    assert "Clash" not in {cls.__name__ for cls in ERRORS.values()}


def test_wire_statuses_map_back_to_their_classes_and_codes_stay_apart_from_statuses():
    for status in Status:
        if status is Status.OK:
            continue
        cls = type(error_for_status(status))
        assert cls.status == status, status  # type: ignore[attr-defined]
    assert isinstance(error_for_status(Status.NO_LEDGER), NoSuchLedgerError)
    assert isinstance(error_for_status(Status.FENCED), LedgerFencedError)
    assert type(error_for_status(999)) is BookieError  # an unknown status is the generic class


def test_a_broken_invariant_is_never_caught_as_a_dlog_error():
    assert not issubclass(InvariantError, DlogError)
    with pytest.raises(InvariantError):
        try:
            invariant(False, "a bug")
        except DlogError:  # what handlers of expected failures write
            pytest.fail("an InvariantError was caught by `except DlogError`")

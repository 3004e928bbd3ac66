"""How a setting of the command line is described once: its kind (how it is written on the command
line, in a config file and in the docs, and carried into the config record) and its row in a table
of settings (`Setting`). dlog_tools/bookie_settings.py holds the bookie's table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from bookkeeper.autorecovery.settings import RecoverySettings
from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.errors import ConfigError
from dlog_tools.units import DURATION, SIZE, format_in_unit

FROM_RECORD = object()  # the default is the record's field default
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


# ------------------------------------------------------------------------------ kinds


@dataclass(frozen=True)
class Kind:
    """How a setting is written (on the command line, in a config file, in the docs) and carried
    into the record; this base is a plain string, None when not set."""

    unit = ""  # as the docs show it

    def click_type(self) -> Any:
        return click.STRING

    def to_record(self, value: Any, field: str) -> Any:
        """The record's value (for its field named `field`) of what the command line gave."""
        return value

    def from_record(self, value: Any, field: str) -> Any:
        """The command line's way of writing the record's value."""
        return value

    def text(self, value: Any) -> str:
        return "none" if value is None else str(value)

    def toml(self, value: Any) -> str:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Text(Kind):
    blank_is_none: bool = False  # an empty value means "not set"

    def to_record(self, value: Any, field: str) -> Any:
        return (value or None) if self.blank_is_none else value


@dataclass(frozen=True)
class Directory(Kind):
    def click_type(self) -> Any:
        return click.Path(file_okay=False, path_type=Path)


@dataclass(frozen=True)
class CommaList(Kind):
    """Names separated by commas on the command line; a tuple in the record."""

    def to_record(self, value: Any, field: str) -> Any:
        return tuple(item.strip() for item in value.split(",") if item.strip())

    def from_record(self, value: Any, field: str) -> Any:
        return ",".join(value)


@dataclass(frozen=True)
class Whole(Kind):
    """A whole number within [low, high]."""

    low: int | None = None
    high: int | None = None
    unit: str = ""
    minus_one_is_none: bool = False  # -1 on the command line is None in the record (a port: off)

    def click_type(self) -> Any:
        return click.IntRange(self.low, self.high)

    def to_record(self, value: Any, field: str) -> Any:
        return None if self.minus_one_is_none and value < 0 else value

    def from_record(self, value: Any, field: str) -> Any:
        return -1 if value is None else int(value)

    def text(self, value: Any) -> str:
        return f"{value} {self.unit}".strip()

    def toml(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class Number(Kind):
    """A number within [low, high]; `unit` "s" for seconds."""

    low: float | None = None
    high: float | None = None
    unit: str = ""

    def click_type(self) -> Any:
        return click.FloatRange(self.low, self.high)

    def text(self, value: Any) -> str:
        return f"{value:g} {self.unit}".strip()

    def toml(self, value: Any) -> str:
        return repr(float(value))


@dataclass(frozen=True)
class Size(Kind):
    """Bytes, written with a unit (`64KiB`, `256MiB`, plain bytes); defaults are shown in `unit`."""

    unit: str = "MiB"

    def click_type(self) -> Any:
        return SIZE

    def to_record(self, value: Any, field: str) -> Any:
        return SIZE.convert(value, None, None)

    def from_record(self, value: Any, field: str) -> Any:
        return format_in_unit(int(value), self.unit)


@dataclass(frozen=True)
class Duration(Kind):
    """A duration written with a unit (`500ms`, `30s`, `7d`); in the record, seconds or
    milliseconds as the field's name says (`_s`, `_ms`); defaults are shown in `unit`."""

    unit: str = "s"
    least_ms: int = 0  # shorter durations count as this (0 would be refused by the record)

    def click_type(self) -> Any:
        return DURATION

    def to_record(self, value: Any, field: str) -> Any:
        duration_ms = max(self.least_ms, DURATION.convert(value, None, None))
        return duration_ms if field.endswith("_ms") else duration_ms / 1000

    def from_record(self, value: Any, field: str) -> Any:
        return format_in_unit(round(value if field.endswith("_ms") else value * 1000), self.unit)


@dataclass(frozen=True)
class Flag(Kind):
    """On when given; `inverted`: the record holds the opposite (--no-fsync is journal_sync)."""

    inverted: bool = False

    def click_type(self) -> Any:
        return click.BOOL

    def to_record(self, value: Any, field: str) -> Any:
        return bool(value) != self.inverted

    def from_record(self, value: Any, field: str) -> Any:
        return bool(value) != self.inverted

    def text(self, value: Any) -> str:
        return "on" if value else "off"

    def toml(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class Switch(Flag):
    """--name/--no-name; the record holds a sub-record when on, None when off."""

    def from_record(self, value: Any, field: str) -> Any:
        return value is not None


# ------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Setting:
    name: str  # the parameter, the config-file key, the DLOG_BOOKIE_<NAME> variable
    kind: Kind
    lands: str  # where in BookieConfig (dotted); "*" when the record builder works it out (it says how)
    help: str = ""
    details: str = ""  # more for docs/operations.md
    flag: str = ""  # default: --name with dashes
    default: Any = FROM_RECORD
    shown: str | bool = True  # the default as --help and the docs show it (False: not in --help)
    documented: str = ""  # the default as the docs say it, when --help does not show it
    example: str = ""  # a TOML value for the example file when there is no default
    section: str = ""  # the group it is listed under in the example file

    @property
    def recovery(self) -> bool:
        """An auto-recovery setting (`dlog autorecovery` takes it too)."""
        return self.lands.startswith("autorecovery.")

    @property
    def flags(self) -> str:
        dashed = self.name.replace("_", "-")
        if self.flag:
            return self.flag
        return f"--{dashed}/--no-{dashed}" if isinstance(self.kind, Switch) else f"--{dashed}"

    @property
    def default_value(self) -> Any:
        """The option's default, in the setting's own unit."""
        if self.default is not FROM_RECORD:
            return self.default() if callable(self.default) else self.default
        return self.kind.from_record(record_default(self.lands), self.lands)

    @property
    def default_text(self) -> str:
        if self.documented:
            return self.documented
        if isinstance(self.shown, str):
            return self.shown
        return self.kind.text(self.default_value)

    def option(self) -> Decorator:
        options: dict[str, Any] = {"help": self.help or None}
        if isinstance(self.kind, Flag) and not isinstance(self.kind, Switch):
            return click.option(self.flags, self.name, is_flag=True, **options)
        options["default"] = self.default if callable(self.default) else self.default_value
        options["type"] = self.kind.click_type() if not isinstance(self.kind, Switch) else None
        if isinstance(self.shown, str) or (self.shown and self.default_value is not None):
            options["show_default"] = self.shown
        return click.option(self.flags, self.name, **options)


def record_default(path: str) -> Any:
    """The default of a field of BookieConfig, `limits.` ServerLimits or `autorecovery.`
    RecoverySettings."""
    record: type = BookieConfig
    parts = path.split(".")
    for part in parts[:-1]:
        record = {"limits": ServerLimits, "autorecovery": RecoverySettings}[part]
    field = {field.name: field for field in dataclasses.fields(record)}[parts[-1]]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ConfigError(f"{path} has no default in the record: the setting must name its own")

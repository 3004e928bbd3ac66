"""Settings from a TOML file and the environment, layered under command-line flags.

Precedence, highest first: a flag given on the command line; an environment variable
`<PREFIX><SETTING>` (e.g. `DLOG_BOOKIE_GROUP_WAIT_US=200`); the `[section]` table of the TOML file
named by `--config` (or `$DLOG_CONFIG`); the flag's default. Setting names are the flags' names with
underscores (`group_wait_us`, `entry_log_size = "256MiB"`); each value is converted and checked by
the flag's own type, so a bad value in the file gets the same message as a bad flag.
`docs/dlog.example.toml` documents every setting.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from bookkeeper.errors import ConfigError

CONFIG_ENV = "DLOG_CONFIG"
NOT_SETTINGS = frozenset({"config", "as_json", "help"})


def load_section(path: str | Path | None, section: str) -> dict[str, Any]:
    """The `[section]` table of a TOML file ({} without a file)."""
    if path is None:
        return {}
    try:
        document = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    table = document.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] in {path} must be a table of settings")
    return table


def layered_params(ctx: click.Context, section: str, env_prefix: str) -> dict[str, Any]:
    """The command's parameters with file and environment values filled in under the flags."""
    path = ctx.params.get("config") or os.environ.get(CONFIG_ENV)
    from_file = load_section(path, section)
    settings = {param.name: param for param in ctx.command.params
                if param.name and param.name not in NOT_SETTINGS}
    unknown = sorted(set(from_file) - set(settings))
    if unknown:
        raise ConfigError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} in "
                          f"[{section}] of {path}; known: {', '.join(sorted(settings))}")
    params = dict(ctx.params)
    for name, param in settings.items():
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            continue
        variable = f"{env_prefix}{name.upper()}"
        if variable in os.environ:
            raw, origin = os.environ[variable], f"environment variable {variable}"
        elif name in from_file:
            raw, origin = from_file[name], f"{name} in [{section}] of {path}"
        else:
            continue
        try:
            params[name] = param.type_cast_value(ctx, raw)
        except click.BadParameter as exc:
            raise ConfigError(f"bad value {raw!r} for {origin}: {exc.message}") from exc
    return params


def zk_timeout_s() -> float:
    """How long commands wait to reach ZooKeeper: $DLOG_ZK_TIMEOUT_S, default 10 s."""
    raw = os.environ.get("DLOG_ZK_TIMEOUT_S", "10")
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"bad DLOG_ZK_TIMEOUT_S {raw!r}: write seconds, e.g. 10") from exc
    if value <= 0:
        raise ConfigError(f"DLOG_ZK_TIMEOUT_S must be > 0, got {value}")
    return value


def known_section(section: str, known: list[str]) -> tuple[str | None, dict[str, Any]]:
    """The `[section]` table of `$DLOG_CONFIG` (and the file's path), refused with one line when it
    holds a setting not in `known`."""
    path = os.environ.get(CONFIG_ENV)
    values = load_section(path, section)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown setting {', '.join(unknown)} in [{section}] of {path}; known: "
                          f"{', '.join(known)}")
    return path, values


def client_options(section: str = "client", env_prefix: str = "DLOG_CLIENT_") -> dict[str, Any]:
    """Ledger-client settings for commands that talk to a cluster, from `$DLOG_CONFIG` and the
    environment: add_timeout_s, read_timeout_s, speculative_read_ms, explicit_lac_interval_ms."""
    known = {"add_timeout_s": float, "read_timeout_s": float, "speculative_read_ms": int,
             "explicit_lac_interval_ms": int}
    path, values = known_section(section, sorted(known))
    options: dict[str, Any] = {}
    for name, kind in known.items():
        raw = os.environ.get(f"{env_prefix}{name.upper()}", values.get(name))
        if raw is None:
            continue
        try:
            value = kind(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad value {raw!r} for client setting {name}: expected a "
                              f"{'number' if kind is float else 'whole number'}") from exc
        if value <= 0:
            raise ConfigError(f"client setting {name} must be > 0, got {value}")
        options[name] = value
    return options


TIER_KEYS = ("s3_endpoint", "s3_region", "s3_access_key", "s3_secret_key")


def tier_options(section: str = "tier", env_prefix: str = "DLOG_TIER_") -> Any:
    """How to reach an S3 tier (`dlog.segments.tier.TierOptions`), from the `[tier]` table of
    `$DLOG_CONFIG` (client.toml) and the environment (`DLOG_TIER_S3_ENDPOINT`...): s3_endpoint,
    s3_region, s3_access_key, s3_secret_key. None when nothing is set: pyarrow then reads the
    environment's AWS_* variables and ~/.aws as boto3 does."""
    from dlog.segments.tier import TierOptions

    path, values = known_section(section, list(TIER_KEYS))
    for name, value in values.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} in [{section}] of {path} must be a non-empty string, got {value!r}")
    found = {name: os.environ.get(f"{env_prefix}{name.upper()}") or values.get(name) for name in TIER_KEYS}
    found = {name: value for name, value in found.items() if value}
    return TierOptions.from_mapping(found) if found else None

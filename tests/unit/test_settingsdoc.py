"""Each bookie setting is defined once (dlog_tools/bookie_settings.py): its flag lands on the record field
the table names, its default is that field's, and the docs hold what the table makes."""

from __future__ import annotations

import dataclasses

import pytest

from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.protocol.wire import ENTRY_BYTES_MAX_DEFAULT, HEADER_BYTES
from dlog_tools.bookie_settings import RECOVERY_SETTINGS, SETTINGS, bookie_config
from dlog_tools.settings import (
    FROM_RECORD,
    CommaList,
    Directory,
    Duration,
    Flag,
    Number,
    Setting,
    Size,
    Switch,
    Text,
    Whole,
    record_default,
)
from dlog_tools.settingsdoc import BLOCKS, ROOT, rewritten

LANDING = [setting for setting in SETTINGS if setting.lands != "*" and not isinstance(setting.kind, Switch)]


@pytest.mark.parametrize("path", sorted(BLOCKS))
def test_the_docs_hold_what_the_table_makes(path):
    assert (ROOT / path).read_text() == rewritten(path), f"{path} is stale: run `python -m dlog_tools.settingsdoc`"


@pytest.mark.parametrize("setting", [setting for setting in LANDING if setting.default is FROM_RECORD],
                         ids=lambda setting: setting.name)
def test_a_default_shown_is_the_records_default(setting):
    """What --help, the docs and the example file show, read back as the flag reads it, is the
    record field's own default: no second definition to drift."""
    field = setting.lands.rpartition(".")[2]
    assert setting.kind.to_record(setting.default_value, field) == record_default(setting.lands)


def _other_value(setting: Setting) -> object:
    """A value of the setting that is not its default, as a flag or a config file would give it."""
    kind, default = setting.kind, setting.default_value
    if isinstance(kind, Flag):
        return not default
    if isinstance(kind, CommaList):
        return "/a,/b"
    if isinstance(kind, (Text, Directory)):
        return {"host": "10.0.0.7", "zk_root": "/other"}.get(setting.name, "other")
    if isinstance(kind, Size):
        return 2 * kind.to_record(default, "")
    if isinstance(kind, Duration):
        return "3s"
    assert isinstance(kind, (Whole, Number))
    if kind.high is not None and default >= kind.high:
        return kind.high - 1
    return max(default, kind.low or 0) + 1 if isinstance(kind, Whole) else default / 2 if default else 0.5


def _field(config: BookieConfig, path: str) -> object:
    value: object = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("setting", LANDING, ids=lambda setting: setting.name)
def test_a_setting_lands_on_the_field_the_table_names(setting, tmp_path, monkeypatch):
    monkeypatch.delenv("DLOG_ZK", raising=False)
    value = _other_value(setting)
    values = {"data_dir": tmp_path, setting.name: value}
    if setting.name == "host":
        values["insecure_plaintext"] = values["allow_anonymous"] = True  # off loopback, asked for
    if setting.name == "disk_threshold":
        values["disk_lwm"] = 0.1
    if setting.name == "zk_user":
        (tmp_path / "password").write_text("secret\n")
        values["zk_password_file"] = str(tmp_path / "password")
    config, default = bookie_config(values), bookie_config({"data_dir": tmp_path})
    field = setting.lands.rpartition(".")[2]
    landed = _field(config, setting.lands)
    assert landed == setting.kind.to_record(value, field) and landed != _field(default, setting.lands)


def test_the_default_flags_make_the_records_defaults(tmp_path, monkeypatch):
    """Only what is worked out from other settings differs: the frame size from the entry size and
    the low-water mark from the threshold (0.95 - 0.05 in floating point)."""
    monkeypatch.delenv("DLOG_ZK", raising=False)
    limits = dataclasses.replace(ServerLimits(), frame_bytes_max=ENTRY_BYTES_MAX_DEFAULT + 1024 + HEADER_BYTES)
    assert bookie_config({"data_dir": tmp_path}) == BookieConfig(data_dir=tmp_path, limits=limits,
                                                                 disk_usage_lwm=0.95 - 0.05)


def test_every_option_of_the_bookie_and_autorecovery_commands_is_in_the_table():
    from dlog_tools.cli.autorecovery import autorecovery
    from dlog_tools.cli.bookie import bookie_start
    from dlog_tools.cli.standalone import standalone

    assert [param.name for param in bookie_start.params] == [setting.name for setting in SETTINGS] + ["config"]
    own = {param.name for param in autorecovery.params} - {setting.name for setting in RECOVERY_SETTINGS}
    assert own == {"zk", "zk_root", "client_config", "token", "identity", "zk_session_timeout", "host",
                   "http_port"}
    assert "lost_bookie_recovery_delay" in {param.name for param in standalone.params}

"""Settings layer as documented: flag > environment > TOML file > default, every value checked by
the flag's own type, and unknown or malformed settings refused with one line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bookkeeper.errors import ConfigError
from dlog_tools.bookie_settings import SETTINGS, bookie_config
from dlog_tools.cli.bookie import bookie_start
from dlog_tools.config import client_options, layered_params
from dlog_tools.units import SIZE


@click.command()
@click.option("--size", default="1KiB", type=SIZE)
@click.option("--count", default=1, type=click.IntRange(1, 10))
@click.option("--config", default=None)
@click.pass_context
def probe(ctx: click.Context, **_: object) -> None:
    click.echo(json.dumps(layered_params(ctx, "probe", "PROBE_")))


def run(tmp_path: Path, toml: str, *arguments: str, env: dict[str, str] | None = None):
    path = tmp_path / "settings.toml"
    path.write_text(toml)
    return CliRunner().invoke(probe, ["--config", str(path), *arguments], env=env or {})


def test_flag_beats_environment_beats_file_beats_default(tmp_path):
    toml = '[probe]\nsize = "2KiB"\ncount = 3\n'
    assert json.loads(run(tmp_path, "").output) == {"size": 1024, "count": 1, "config": str(tmp_path / "settings.toml")}
    assert json.loads(run(tmp_path, toml).output)["size"] == 2048
    assert json.loads(run(tmp_path, toml, env={"PROBE_SIZE": "4KiB"}).output)["size"] == 4096
    assert json.loads(run(tmp_path, toml, "--size", "8KiB", env={"PROBE_SIZE": "4KiB"}).output)["size"] == 8192


@pytest.mark.parametrize("toml, words", [
    ("[probe]\ncolour = 1\n", "unknown setting colour"),
    ('[probe]\nsize = "lots"\n', "bad value 'lots' for size in [probe]"),
    ("[probe]\ncount = 99\n", "bad value 99 for count"),
    ("[probe\n", "not valid TOML"),
])
def test_bad_settings_are_refused(tmp_path, toml, words):
    result = run(tmp_path, toml)
    assert isinstance(result.exception, ConfigError) and words in str(result.exception)


def test_the_example_file_documents_every_bookie_setting_and_is_valid(tmp_path):
    example = tomllib.loads(Path("docs/dlog.example.toml").read_text())
    settings = {param.name for param in bookie_start.params} - {"config"}
    commented = {setting.name for setting in SETTINGS if setting.example}
    assert set(example["bookie"]) | commented == settings  # commented-out ones are listed in the file too
    text = Path("docs/dlog.example.toml").read_text()
    assert all(f"{name} =" in text for name in settings)
    config = bookie_config({**example["bookie"], "data_dir": tmp_path})
    assert config == bookie_config({"data_dir": tmp_path})  # the file holds the defaults
    assert config.journal_group_bytes_max == 524288 and config.limits.entry_bytes_max == 2**22


def test_client_options_come_from_the_file_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "dlog.toml"
    path.write_text("[client]\nadd_timeout_s = 2.5\n")
    monkeypatch.setenv("DLOG_CONFIG", str(path))
    monkeypatch.setenv("DLOG_CLIENT_READ_TIMEOUT_S", "7")
    assert client_options() == {"add_timeout_s": 2.5, "read_timeout_s": 7.0}
    monkeypatch.setenv("DLOG_CLIENT_SPECULATIVE_READ_MS", "soon")
    with pytest.raises(ConfigError, match="speculative_read_ms"):
        client_options()


def test_the_example_autorecovery_table_holds_only_settings_of_dlog_autorecovery():
    from dlog_tools.cli.autorecovery import autorecovery

    example = tomllib.loads(Path("docs/dlog.example.toml").read_text())["autorecovery"]
    settings = {param.name for param in autorecovery.params} - {"config"}
    assert set(example) <= settings and "lost_bookie_recovery_delay" in example
    text = Path("docs/dlog.example.toml").read_text().split("[autorecovery]")[1].split("[client]")[0]
    assert "identity =" in text and "zk =" in text

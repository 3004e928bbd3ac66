"""Write the bookie settings into the docs from their one table (dlog_tools/bookie_settings.py): the two
settings tables of docs/operations.md and the [bookie] table of docs/dlog.example.toml, each between
its markers, so the docs cannot drift from the flags and the record.

    python -m dlog_tools.settingsdoc        (tests/unit/test_settingsdoc.py checks the docs are current)
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from dlog_tools.bookie_settings import RECOVERY_SETTINGS, SETTINGS
from dlog_tools.settings import Setting

ROOT = Path(__file__).resolve().parents[1]
GENERATED = "made by `python -m dlog_tools.settingsdoc` from dlog_tools/bookie_settings.py"
TOML_WIDTH = 100


def _meaning(setting: Setting) -> str:
    details = setting.details
    return f"{setting.help}. {details[0].upper()}{details[1:]}" if details else setting.help


def _row(setting: Setting) -> str:
    return f"| `{setting.flags}` | `{setting.name}` | {setting.default_text} | {_meaning(setting)} |"


def bookie_table() -> str:
    """docs/operations.md: every flag of `dlog bookie start`, the auto-recovery ones last and short."""
    rows = [_row(setting) for setting in SETTINGS if not setting.recovery]
    recovery = ", ".join(f"`{setting.flags}`" for setting in RECOVERY_SETTINGS)
    rows.append(f"| {recovery} | | | the auto-recovery settings: see [Auto-recovery](#auto-recovery) |")
    return "\n".join(["| flag | `[bookie]` key | default | meaning |", "|---|---|---|---|", *rows])


def recovery_table() -> str:
    """docs/operations.md, "Auto-recovery": the settings `dlog bookie start` and `dlog autorecovery` share."""
    return "\n".join(["| setting (`dlog bookie start`, `dlog autorecovery`) | key | default | meaning |",
                      "|---|---|---|---|", *(_row(setting) for setting in RECOVERY_SETTINGS)])


def bookie_toml() -> str:
    """docs/dlog.example.toml: the [bookie] table, every setting with its help and default (one
    without a default commented out, with an example), by section."""
    lines = ["[bookie]"]
    for section in dict.fromkeys(setting.section for setting in SETTINGS):
        lines += ["", *_comment(f"---- {section}")]
        for setting in (setting for setting in SETTINGS if setting.section == section):
            lines += _comment(setting.help)
            value = setting.default_value
            if value is None or setting.example:
                lines.append(f"# {setting.name} = {setting.example}")
            else:
                lines.append(f"{setting.name} = {setting.kind.toml(value)}")
    return "\n".join(lines)


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, TOML_WIDTH, initial_indent="# ", subsequent_indent="# ")


# path -> (begin marker, end marker, what goes between them)
BLOCKS: dict[str, list[tuple[str, str, Callable[[], str]]]] = {
    "docs/operations.md": [
        (f"<!-- bookie settings, {GENERATED} -->", "<!-- end of the bookie settings -->", bookie_table),
        (f"<!-- auto-recovery settings, {GENERATED} -->", "<!-- end of the auto-recovery settings -->",
         recovery_table),
    ],
    "docs/dlog.example.toml": [
        (f"# ---- [bookie]: {GENERATED}", "# ---- end of [bookie]", bookie_toml),
    ],
}


def rewritten(path: str) -> str:
    """The file at `path` with every generated block made from the table as it is now."""
    text = (ROOT / path).read_text()
    for begin, end, render in BLOCKS[path]:
        head, found, rest = text.partition(begin + "\n")
        if not found or end not in rest:
            raise SystemExit(f"{path} lacks the markers {begin!r} ... {end!r}")
        text = head + begin + "\n" + render() + "\n" + end + rest.split(end, 1)[1]
    return text


def main() -> None:
    for path in BLOCKS:
        text = rewritten(path)
        if text != (ROOT / path).read_text():
            (ROOT / path).write_text(text)
            sys.stdout.write(f"rewrote {path}\n")


if __name__ == "__main__":
    main()

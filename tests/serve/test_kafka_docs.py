"""docs/serving.md's wire protocol section lists every supported API with its versions and every
error code dlog answers with, so the page cannot drift from the codec's table."""

from __future__ import annotations

from pathlib import Path

from dlog.serve.kafka import SUPPORTED_APIS
from dlog.serve.kafka.errors import MEANING, ErrorCode

PAGE = (Path(__file__).resolve().parents[2] / "docs/serving.md").read_text()


def test_every_supported_api_is_listed_with_its_versions():
    for api in SUPPORTED_APIS.values():
        versions = f"{api.min_version}-{api.max_version}" if api.min_version != api.max_version else f"{api.min_version}"
        assert f"| {api.name} ({api.key}) | {versions} |" in PAGE, api.name


def test_every_error_code_has_a_meaning_and_a_row():
    assert set(MEANING) == set(ErrorCode)
    for code in ErrorCode:
        assert f"| {int(code)} | {code.name}" in PAGE, code.name

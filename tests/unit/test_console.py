"""The pure parts of the console tools: stdin chunks to records by format (lines split anywhere
across chunks, binary kept, JSON kept as JSON, bad lines named), a run's account of what is durable
and what is not, `--from` texts, ZooKeeper addresses, exact and estimated lag in records and bytes,
and the CLI's wording of library errors."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from bookkeeper.errors import ConfigError
from bookkeeper.meta.zk import parse_hosts
from dlog import LedgerDeletedError, Offset, WriterAbortedError
from dlog.describe import subscription_lag
from dlog_tools.cli.common import cli_wording
from dlog_tools.console import RECORD_BYTES_MAX, BadInputError, Produced, RecordParser
from dlog_tools.positions import parse_start
from dlog_tools.units import format_duration_ms, parse_duration_ms, plural


def parse(input_format: str, *chunks: bytes, separator: str | None = None, **options) -> list[tuple]:
    """(value, key, timestamp), with the headers fourth when a record has any."""
    parser = RecordParser(input_format, separator, **options)
    records = [record for chunk in chunks for record in parser.feed(chunk)]
    return [tuple(record) if record.headers is not None else tuple(record[:3])
            for record in records + list(parser.finish())]


def account(outcomes: list) -> Produced:
    """A Produced fed futures that end as `outcomes` say (an Offset, or an exception), in order."""

    async def run() -> Produced:
        produced = Produced()
        futures = [asyncio.get_running_loop().create_future() for _ in outcomes]
        for future in futures:
            produced.track(future)
        for future, outcome in zip(futures, outcomes):
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        await asyncio.sleep(0)  # the done callbacks
        return produced

    return asyncio.run(run())


def test_a_run_accounts_for_what_is_durable_lost_unknown_and_not_written():
    clean = account([Offset(3, 0, 0), Offset(3, 0, 1), Offset(4, 0, 0)])
    assert clean.summary("s") == "wrote 3 records to s (3:0:0 .. 4:0:0)" and clean.clean
    aborted = account([Offset(3, 0, 0), Offset(3, 0, 1), WriterAbortedError("stopped"), WriterAbortedError("stopped")])
    assert aborted.summary("s") == "2 records durable in s up to 3:0:1; 2 in flight with an unknown outcome"
    deleted = LedgerDeletedError("ledger 4 was deleted", 4, pending_lost=True)
    lost = account([Offset(3, 0, 0, 10), Offset(4, 0, 0, 11), Offset(4, 1, 0, 12), deleted, deleted])
    assert lost.summary("s") == ("1 record durable in s up to 3:0:0; 2 acknowledged into ledger 4, deleted under "
                                 "the writer, lost; 2 not written")
    assert lost.to_json() == {"count": 1, "first": "3:0:0", "last": "3:0:0", "first_position": 10,
                              "last_position": 10, "unknown": 0, "lost": 2, "not_written": 2, "deleted_ledgers": [4],
                              "duplicates": 0}
    idle = account([Offset(4, 0, 0)])
    idle.writer_failed(LedgerDeletedError("ledger 4 was deleted", 4, pending_lost=True))  # nothing was pending
    assert idle.summary("s") == "0 records durable in s; 1 acknowledged into ledger 4, deleted under the writer, lost"


def test_lines_split_across_chunks_keep_their_bytes():
    assert parse("lines", b"al", b"pha\nbe", b"ta\r\n\n\xff\xfe\n", b"tail") == [
        (b"alpha", None, None), (b"beta", None, None), (b"\xff\xfe", None, None), (b"tail", None, None)]


def test_a_line_is_written_as_soon_as_its_newline_arrives():
    parser = RecordParser("lines")
    assert list(parser.feed(b"first\nsec")) == [(b"first", None, None, None)]
    assert list(parser.feed(b"ond\n")) == [(b"second", None, None, None)]
    assert list(parser.finish()) == []


def test_key_separator_splits_at_the_first_one_and_a_line_without_it_has_no_key():
    assert parse("lines", b"k::v::w\nplain\n", separator="::") == [(b"v::w", b"k", None), (b"plain", None, None)]
    assert parse("base64", b"a2V5:dmFsdWU=\n", separator=":") == [(b"value", b"key", None)]


def test_raw_is_all_of_stdin_as_one_record():
    assert parse("raw", b"a\nb", b"\x00c\n") == [(b"a\nb\x00c\n", None, None)]
    assert parse("raw") == []


def test_jsonl_keeps_json_values_as_json_text():
    assert parse("jsonl", b'{"value": {"a": 1}, "key": "k", "timestamp": 5}\n{"value": [true, null]}\n'
                          b'{"value": "t\xc3\xa9xt"}\n{"value": 1.5, "key": 7}\n') == [
        (b'{"a":1}', b"k", 5), (b"[true,null]", None, None), ("téxt".encode(), None, None), (b"1.5", b"7", None)]


@pytest.mark.parametrize("chunk, words", [
    (b'{"value": 0}\n{"value": null}\n', 'line 2: "value" is null'),
    (b'{"key": "k"}\n', 'line 1 needs a "value" \\(or "value_b64"\\) field'),
    (b'{"value": 1, "ts": 2}\n', "line 1 has unknown field 'ts'"),
    (b'{"value": 1, "timestamp": "noon"}\n', "line 1: timestamp must be whole milliseconds"),
    (b'{"value": 0}\n\n{"value": "\xff"}\n', "line 3 is not UTF-8 text"),  # an empty line counts
    (b"{'value': 0}\n", "line 1 is not JSON"),
])
def test_bad_jsonl_names_its_line(chunk, words):
    with pytest.raises(BadInputError, match=words):
        parse("jsonl", chunk)


def test_a_line_over_the_record_limit_is_refused_before_it_is_buffered_whole():
    parser = RecordParser("lines")
    with pytest.raises(BadInputError, match="line 1 is over 2 MiB"):
        list(parser.feed(b"x" * (RECORD_BYTES_MAX + 1)))


def test_skip_drops_each_oversized_line_unbuffered_and_says_so_once_per_line():
    said: list[str] = []
    big = b"x" * (RECORD_BYTES_MAX + 1)
    chunks = [b"a\n" + big[:1000], big[1000:], b"\nb\n", big + b"\n", b"c"]  # split, then whole
    assert parse("lines", *chunks, on_oversize="skip", on_skip=said.append) == [
        (b"a", None, None), (b"b", None, None), (b"c", None, None)]
    assert len(said) == 2 and said[0].startswith("skipped line 2: over 2 MiB") and "line 4" in said[1]
    assert parse("raw", big, b"more", on_oversize="skip", on_skip=said.append) == []


def test_jsonl_takes_back_what_read_json_prints():
    line = (b'{"offset": "3:0:1", "position": 7, "key_b64": "AP8=", "value_b64": "//4=", "timestamp": 5, '
            b'"headers_b64": [["h", "wyg="], ["n", null]]}\n{"value": "v", "headers": [["t", "x"]]}\n')
    assert parse("jsonl", line) == [(b"\xff\xfe", b"\x00\xff", 5, [("h", b"\xc3\x28"), ("n", None)]),
                                    (b"v", None, None, [("t", b"x")])]
    with pytest.raises(BadInputError, match='line 1 has both "value" and "value_b64"'):
        parse("jsonl", b'{"value": "a", "value_b64": "YQ=="}\n')
    with pytest.raises(BadInputError, match='line 1: "value_b64" is not base64'):
        parse("jsonl", b'{"value_b64": "not base64!"}\n')


def test_options_that_do_not_fit_the_format_are_refused():
    with pytest.raises(ConfigError, match="--key-separator works with --format lines or base64"):
        RecordParser("jsonl", ":")
    with pytest.raises(ConfigError, match="--key-separator is empty"):
        RecordParser("lines", "")


def test_from_texts():
    now_ms = 1_800_000_000_000
    assert parse_start("earliest") == "earliest" and parse_start("12:3") == "12:3"
    assert parse_start("1234") == 1234  # a stream position
    assert parse_start("-15m", now_ms=now_ms).timestamp() * 1000 == now_ms - 15 * 60_000
    local = datetime.datetime(2026, 11, 20, 10, 0).astimezone()
    assert parse_start("2026-11-20T10:00") == local
    assert parse_start("2026-11-20T10:00+00:00") == datetime.datetime(2026, 11, 20, 10, tzinfo=datetime.UTC)
    with pytest.raises(ConfigError, match="bad --from position 9999999999999999999: use an integer in 0.."):
        parse_start("9999999999999999999")  # over 2**63 - 1
    with pytest.raises(ConfigError, match="bad --to 'soon'"):
        parse_start("soon", flag="--to")


@pytest.mark.parametrize("address, words", [
    ("127.0.0.1:abc", "port 'abc' is not a number"), ("h:99999", "port '99999'"), ("", "empty"),
    (":2181", "has no host"), ("a:1,:2", "has no host"),
])
def test_zookeeper_addresses_are_checked(address, words):
    with pytest.raises(ConfigError, match=words):
        parse_hosts(address)
    assert parse_hosts("a:1,b/chroot") == [("a", 1), ("b", 2181)] and parse_hosts("[::1]:5") == [("::1", 5)]


SEGMENTS = [
    {"sequence": 1, "ledger": 10, "state": "truncated", "first_entry": 0, "last_entry": 3, "records": 40, "bytes": 400},
    {"sequence": 2, "ledger": 11, "state": "completed", "first_entry": 0, "last_entry": 3, "records": 40, "bytes": 800},
    {"sequence": 3, "ledger": 12, "state": "in_progress", "first_entry": 0, "last_entry": 1, "records": 10, "bytes": 100},
]


def test_lag_in_records_and_bytes_exact_when_the_position_is_known():
    exact = subscription_lag(SEGMENTS, {"ledger": 11, "entry": 2, "slot": 3}, consumed_in_segment=30)
    assert (exact["lag_records"], exact["lag_bytes"], exact["position"]) == (10 + 10, 200 + 100, 0.75)
    estimated = subscription_lag(SEGMENTS, {"ledger": 11, "entry": 2, "slot": 3})
    assert estimated["lag_records"] == 40 - 20 - 3 + 10
    behind = subscription_lag(SEGMENTS, {"ledger": 10, "entry": 0, "slot": 0})
    assert (behind["lag_records"], behind["lag_bytes"], behind["note"]) == (50, 900, "behind the truncation point")


def test_units_and_wording():
    assert parse_duration_ms("0") == 0 and format_duration_ms(7_200_000) == "2h" and format_duration_ms(1500) == "1500ms"
    assert plural(1, "record") == "1 record" and plural(1000, "entry", "entries") == "1,000 entries"
    assert cli_wording("x; open with takeover=True to fence it and take over") == "x; pass --takeover to fence it and take over"
    assert cli_wording("reopen with skip_truncated=True to skip them") == "pass --skip-truncated to skip them"

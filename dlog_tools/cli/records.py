"""`dlog write`, `dlog truncate` and `dlog export`: records in and out of a stream (`dlog read` is
in dlog_tools/cli/read.py).

Bad input (names, offsets, sizes, durations) is refused before anything changes, with one line
saying what was wrong and what would be right.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from bookkeeper.errors import ConfigError, DlogError
from dlog_tools.cli.common import cli_wording, cluster_options, fails_cleanly, json_option, run_namespace
from dlog_tools.positions import end_of_stream
from dlog_tools.units import format_size, format_time_ms, plural


@click.command("write")
@click.argument("name")
@click.option("--format", "input_format", type=click.Choice(["lines", "raw", "base64", "jsonl"]),
              default="lines", show_default=True,
              help="lines: a value per line (any bytes); raw: all of stdin is one value; base64: a "
                   "base64 value per line; jsonl: {\"key\", \"value\", \"timestamp\"} objects, or what "
                   "`dlog read --json --headers` prints")
@click.option("--on-oversize", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="a line over 2 MiB (a record's limit): fail the run, or skip it with a warning on stderr")
@click.option("--key-separator", default=None, metavar="SEP",
              help="with lines or base64: split each line at the first SEP into key and value")
@click.option("--takeover", is_flag=True, help="fence the stream's current writer and take over")
@click.option("--header", "-H", "header_texts", multiple=True, metavar="K=V",
              help="a record header on every record written (repeatable; the value may be empty)")
@click.option("--producer-id", default=None, metavar="ID",
              help="write as the named idempotent producer ID: each record's sequence is its place in the "
                   "input (0, 1, 2...), so running again over the same input writes only what is missing")
@cluster_options
@json_option
@fails_cleanly
def write_command(name: str, input_format: str, on_oversize: str, key_separator: str | None, takeover: bool,
                  header_texts: tuple[str, ...], producer_id: str | None, cluster: tuple[str, str, str],
                  as_json: bool) -> None:
    """Write records from standard input as they arrive, through one writer for the whole run.

    Each line is written when it arrives (`tail -f app.log | dlog write logs` works); records that
    arrive together go in one entry, and whatever is written is durable before the next wait for
    input. Ctrl-C ends the run after flushing; a second Ctrl-C stops at once, without waiting for
    the records in flight. The last line says how many records are durable and up to which offset
    (the input's first N records: resume after them), and, when the run did not end cleanly, how
    many have an unknown outcome, were lost with a ledger deleted under the writer or were not
    written; then the exit status is 1. In jsonl, a string value is stored as its text and any
    other JSON value as JSON text; a null value is refused. Empty lines are skipped.

    `dlog read a --json --headers | dlog write b --format jsonl` copies records losslessly (keys,
    values, headers and timestamps; `value_b64`/`key_b64` for bytes that are not UTF-8).

    With `--producer-id ID` the run writes as a named idempotent producer: the Nth record of the
    input has sequence N-1, and records the stream already holds from an earlier run with the same
    ID and input are counted as duplicates instead of written again (after a crash, run again)."""
    from dlog.core.dedup import native_producer
    from dlog.names import check_stream_name
    from dlog_tools.console import BadInputError, Produced, RecordParser, produce, stdin_chunks
    from dlog_tools.interrupts import Interrupts

    check_stream_name(name)
    if producer_id is not None:
        native_producer(producer_id)  # a bad id is refused before anything is read
    headers = [_parse_header(text) for text in header_texts] or None
    parser = RecordParser(input_format, key_separator, on_oversize,
                          on_skip=lambda message: click.echo(f"dlog: {message}", err=True))
    produced = Produced()
    interrupts = Interrupts()

    def on_lock_wait(holder: dict[str, Any] | None) -> None:
        if takeover:
            click.echo(f"dlog: the writer lock of stream {name!r} is held by {_holder_text(holder)}: fencing that "
                       "writer and taking over (--takeover)", err=True)
            return
        click.echo(f"dlog: waiting for the writer lock of stream {name!r}, held by {_holder_text(holder)}; "
                   "pass --takeover to fence that writer and take over", err=True)

    error: BaseException | None = None
    try:
        run_namespace(cluster, lambda ns: produce(ns, name, stdin_chunks(sys.stdin.fileno()), parser,
                                                  takeover=takeover, on_lock_wait=on_lock_wait,
                                                  produced=produced, headers=headers, interrupts=interrupts,
                                                  producer_id=producer_id),
                      interrupts=interrupts)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a console producer; the writer was closed (flushed) on the way out
    except BadInputError:
        raise  # one line, which says how many records before it were written
    except DlogError as exc:
        if not produced.started:
            raise  # nothing was written: the reason alone
        error = exc
    result = {**produced.to_json(), "skipped": parser.skipped}
    skipped = f"; skipped {plural(parser.skipped, 'line')} over 2 MiB" if parser.skipped else ""
    click.echo(json.dumps(result) if as_json else produced.summary(name) + skipped)
    error = error or produced.error
    if error is not None or not produced.clean:
        click.echo(f"dlog: {cli_wording(str(error or 'some records are not durable'))}", err=True)
        sys.exit(1)


def _parse_header(text: str) -> tuple[str, bytes]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise ConfigError(f"bad --header {text!r}: write KEY=VALUE, e.g. --header trace=abc (the value may be empty)")
    return key, value.encode()


def _holder_text(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a writer that does not say who it is"
    since = format_time_ms(holder.get("started_ms"), "seconds")
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {since}"


@click.command("truncate")
@click.argument("name")
@click.option("--before", required=True,
              help="remove every record strictly below this offset L:E[:S], or every record so far: latest")
@cluster_options
@json_option
@fails_cleanly
def truncate_command(name: str, before: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Remove records below an offset (whole segments are deleted)."""
    from dlog import Offset

    offset = None if before == "latest" else Offset.parse(before)

    async def action(ns: Any) -> tuple[Any, list[Any], bool]:
        target = offset if offset is not None else await end_of_stream(ns, name)
        if target is None:
            return None, [], False
        before = (await ns.store.segments(name)).segments
        removed = await ns.truncate(name, target)
        return target, removed, (await ns.store.segments(name)).segments != before

    target, removed, changed = run_namespace(cluster, action)
    if target is None:
        click.echo(json.dumps({"stream": name, "before": None, "segments_removed": [], "changed": False})
                   if as_json else f"{name} holds no records: nothing to truncate")
        return
    result = {"stream": name, "before": str(target), "segments_removed": [s.sequence for s in removed],
              "changed": changed}
    if as_json:
        click.echo(json.dumps(result))
    elif not changed:
        click.echo(f"nothing to truncate: {name} holds no records before {target} (it was truncated there "
                   "already, or that is its first record)")
    else:
        click.echo(f"truncated {name} before {target}: removed {plural(len(removed), 'segment')}")


@click.command("export")
@click.argument("name")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["parquet", "arrow"]), default="parquet",
              show_default=True)
@click.option("--from", "start", default="earliest", show_default=True, help="earliest or L:E[:S]")
@click.option("--to", "end", default=None, help="last offset to export L:E[:S]")
@click.option("--force", is_flag=True, help="overwrite an existing file, create missing folders")
@click.option("--prefer", type=click.Choice(["bookies", "tier"]), default="bookies", show_default=True,
              help="where to read segments offloaded to the tier whose bookie copy still exists")
@click.option("--schema-version", type=click.IntRange(1), default=None,
              help="a typed stream: export every record in this schema version (default: the latest)")
@cluster_options
@json_option
@fails_cleanly
def export_command(name: str, out_path: Path, output_format: str, start: str, end: str | None, force: bool,
                   prefer: str, schema_version: int | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Export a stream's records to a Parquet or Arrow IPC file, with a progress bar.

    Refuses to overwrite an existing file or to create missing folders unless --force. The
    columns are ledger, entry, slot, then the stream's; timestamps are UTC (timestamp[ms,
    tz=UTC]), and the file's metadata holds the stream's name and schema (dlog.stream,
    dlog.schema). A typed stream's records are all in one schema version (the latest, or
    --schema-version), with its field ids (PARQUET:field_id)."""
    from dlog_tools.export import check_out_path, export_stream

    check_out_path(out_path, force)
    result = run_namespace(cluster, lambda ns: export_stream(ns, name, out_path, output_format, start, end,
                                                             progress=not as_json, force=force, prefer=prefer,
                                                             schema_version=schema_version))
    click.echo(json.dumps(result) if as_json else
               f"exported {plural(result['records'], 'record')} to {out_path} ({format_size(result['bytes'])})")

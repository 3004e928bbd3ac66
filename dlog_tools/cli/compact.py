"""`dlog compact`: key compaction of a stream now (the policy runner does it by itself on a stream
with `--compaction on`)."""

from __future__ import annotations

import json
from typing import Any

import click

from dlog_tools.cli.common import cluster_options, fails_cleanly, json_option, run_namespace
from dlog_tools.units import plural


@click.command("compact")
@click.argument("name")
@click.option("--until", default=None,
              help="compact only the completed segments that end before this offset L:E[:S] (default: every "
                   "completed segment past the min compaction lag)")
@cluster_options
@json_option
@fails_cleanly
def compact_command(name: str, until: str | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Keep only the latest record of each key in the stream's completed segments.

    Offsets never change: a kept record keeps its offset and position. A record with a null value
    (an empty one in an untyped stream) deletes its key, and goes itself once its segment was
    first compacted the stream's delete retention ago. The in-progress segment is never touched;
    writers and readers carry on meanwhile."""
    from dlog import Offset
    from dlog.compaction import Compactor
    from dlog.names import check_stream_name

    check_stream_name(name)
    offset = Offset.parse(until) if until is not None else None

    async def action(ns: Any) -> Any:
        return await Compactor(ns).run(name, until=offset)

    report = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps(report.to_json(), sort_keys=True))
    elif report.skipped:
        click.echo(f"{name}: {report.skipped}")
    else:
        click.echo(f"{name}: compacted {plural(len(report.segments), 'segment')} "
                   f"({report.segments[0]}..{report.segments[-1]}): kept {report.records_kept:,} of "
                   f"{report.records_read:,} records ({plural(report.keys, 'key')}, "
                   f"{plural(report.tombstones_kept, 'deletion marker')}) in ledger {report.ledger_id}, "
                   f"in {report.seconds:.2f} s")


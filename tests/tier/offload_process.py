"""An offloader as its own process, for the faults that kill it (`python -m tests.tier.offload_process`).

It runs one `Offloader.run(stream, now=True)` and prints `step NAME` (flushed) after each step the
offloader reports. `--kill-at STEP` makes it SIGKILL itself right after that step (the first time
it comes), as a crash there would. `--hold-upload-after BYTES` holds the upload once that many
bytes of the file are written (the real upload code and filesystem; only its output stream is
watched): it prints `uploading N` and waits there for the parent to kill it mid-upload. At the end
it prints `report <json>`; `--quietly` runs it as the policy runners do (`offload_quietly`: a
tier error is the report's, not raised).

S3 credentials come from the environment (AWS_ACCESS_KEY_ID...), the endpoint from the tier URI's
query or `--s3-endpoint`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import threading
from typing import Any

import dlog.segments.tier as tier_module
from dlog import Namespace
from dlog.offload import Offloader, offload_quietly
from dlog.segments.tier import TierOptions, TierStore

HOLD_LIMIT_S = 120.0  # a held upload ends by itself if nobody kills it (never an orphan for long)


class _WatchedStream:
    """An output stream that holds (sleeps) once `limit` bytes went through it."""

    def __init__(self, stream: Any, limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.written = 0

    def write(self, data: Any) -> int:
        written = self.stream.write(data)
        self.written += len(data)
        if self.written >= self.limit:
            print(f"uploading {self.written}", flush=True)
            threading.Event().wait(HOLD_LIMIT_S)
            os.kill(os.getpid(), signal.SIGKILL)
        return int(written)

    def __enter__(self) -> _WatchedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()


class _WatchedFilesystem:
    def __init__(self, filesystem: Any, limit: int) -> None:
        self.filesystem = filesystem
        self.limit = limit

    def open_output_stream(self, path: str) -> _WatchedStream:
        return _WatchedStream(self.filesystem.open_output_stream(path), self.limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.filesystem, name)


class HoldingTierStore(TierStore):
    """A TierStore whose uploads hold after `limit` bytes."""

    def __init__(self, options: TierOptions, limit: int) -> None:
        super().__init__(options)
        self.limit = limit

    def locate(self, uri: str) -> tuple[Any, str]:
        filesystem, path = super().locate(uri)
        return _WatchedFilesystem(filesystem, self.limit), path


def on_step(kill_at: str):
    def step(name: str) -> None:
        print(f"step {name}", flush=True)
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return step


async def main(arguments: argparse.Namespace) -> None:
    options = TierOptions(s3_endpoint=arguments.s3_endpoint or None)
    async with Namespace(arguments.zk, arguments.namespace, bookkeeper_root=arguments.root,
                         zk_session_timeout_s=arguments.session_timeout, tier_options=options) as ns:
        if arguments.hold_upload_after:
            tier_module.UPLOAD_CHUNK_BYTES = arguments.upload_chunk_bytes  # read at each upload
            ns.reads.tier = HoldingTierStore(options, arguments.hold_upload_after)
        offloader = Offloader(ns, on_step=on_step(arguments.kill_at), temp_dir=arguments.temp_dir or None)
        if arguments.quietly:
            report = await offload_quietly(offloader, arguments.stream, now=True)
        else:
            report = await offloader.run(arguments.stream, now=True)
        print(f"report {json.dumps(report.to_json(), sort_keys=True)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--root", required=True, help="the BookKeeper root")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--kill-at", default="", help="the step after which to SIGKILL itself")
    parser.add_argument("--hold-upload-after", type=int, default=0, help="hold the upload after BYTES")
    parser.add_argument("--upload-chunk-bytes", type=int, default=2**20)
    parser.add_argument("--s3-endpoint", default="")
    parser.add_argument("--temp-dir", default="", help="where the offloader builds its files")
    parser.add_argument("--quietly", action="store_true", help="offload_quietly: tier errors in the report")
    parser.add_argument("--session-timeout", type=float, default=2.0,
                        help="the ZooKeeper session (its offloader claim ends this long after a kill)")
    asyncio.run(main(parser.parse_args()))

"""An S3 store on loopback for `dlog bench tier --moto` and the tier tests (tests/harness/s3.py):
moto's server mode as a subprocess (moto is in the `test` extra: pip install 'dlog[test]').

`MotoS3.start()` runs `python -m moto.server` on 127.0.0.1 at a free port, polls it (with a
deadline) until it answers, creates the bucket through pyarrow, and `stop()` ends exactly the
process it started (by its pid). moto keeps its objects in memory: a stopped server forgets them,
so `restart()` (the same port: an "S3 that was away comes back") creates the bucket again.

Every request moto serves is one line of its log (werkzeug's access log): `requests()` reads them,
so a test can show that an upload really went as a multipart upload (`POST ...?uploads`, then one
`PUT ...?partNumber=N` per part: pyarrow's S3 output stream uploads parts of 10 MiB).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError
from dlog.segments.tier import TierOptions
from dlog_tools.cluster import free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
PART_BYTES = 10 * 2**20  # pyarrow's S3 upload part size (measured from moto's log: 12 MiB -> 2 parts)
_REQUEST = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" (?P<status>\d{3})')


@dataclass
class MotoS3:
    directory: Path
    bucket: str = "dlog-tier"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"moto-{self.port}.log"

    def options(self) -> TierOptions:
        """How dlog reaches this store (credentials and endpoint beside the URI)."""
        return TierOptions(s3_endpoint=f"http://{self.endpoint}", s3_region=REGION, s3_access_key=ACCESS_KEY,
                           s3_secret_key=SECRET_KEY)

    def uri(self, prefix: str = "tier", *, in_uri: bool = False) -> str:
        """A tier URI under the bucket; `in_uri` names the endpoint in the URI's query too."""
        base = f"s3://{self.bucket}/{prefix}".rstrip("/")
        return f"{base}?endpoint_override={self.endpoint}&scheme=http" if in_uri else base

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION, scheme="http",
                                 endpoint_override=self.endpoint, allow_bucket_creation=True)

    # ------------------------------------------------------------------ the process

    def start(self) -> MotoS3:
        if importlib.util.find_spec("moto") is None:
            raise ConfigError("moto is not installed: pip install 'moto[server]' (or 'dlog[test]') for an S3 "
                              "store on loopback, or name a real one with --s3-endpoint")
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = monotonic_s() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"moto exited with {self.process.returncode}; its log: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            if monotonic_s() >= deadline:
                self.stop()
                raise RuntimeError(f"moto did not answer on {self.endpoint} within {START_TIMEOUT_S}s")
            time.sleep(0.05)
        self.filesystem().create_dir(self.bucket)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/moto-api/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False

    def stop(self) -> None:
        """End the process this started (by pid), and wait for it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)

    def restart(self) -> MotoS3:
        """The store back on the same port, empty but for the bucket (moto keeps objects in memory)."""
        self.stop()
        return self.start()

    # ------------------------------------------------------------------ what it saw

    def requests(self) -> list[tuple[str, str, int]]:
        """(method, path with query, status) of every request served so far, in order."""
        if not self.log_path.exists():
            return []
        return [(m["method"], m["path"], int(m["status"]))
                for m in _REQUEST.finditer(self.log_path.read_text(errors="replace"))]

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under `prefix`."""
        selector = pafs.FileSelector(f"{self.bucket}/{prefix}".rstrip("/"), recursive=True, allow_not_found=True)
        return sorted(info.path.split("/", 1)[1] for info in self.filesystem().get_file_info(selector)
                      if info.type == pafs.FileType.File)

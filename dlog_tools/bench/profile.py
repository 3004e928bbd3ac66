"""`dlog bench ... --profile DIR`: a flame graph of the bench's client process and of each bookie
process for the run, written into DIR by role (client.svg, bookie-0.svg, ...).

py-spy samples each process from outside (one `py-spy record --nonblocking --pid` per process:
it reads the stacks without pausing the process, which perturbs the run less; started once the
cluster is up and stopped with SIGINT before it stops, when py-spy writes its SVG). Where py-spy
is not installed or cannot attach (it needs ptrace rights over the process: root, CAP_SYS_PTRACE or
kernel.yama.ptrace_scope 0), the client falls back to the stdlib profiler (client.pstats and the
top functions in client-top.txt) and the bookies go unprofiled; the result says which in one line.
Nothing here runs unless --profile is given.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import DlogError
from dlog_tools.cluster import LineReader, LocalCluster, signal_and_wait

SAMPLES_PER_S = 100  # py-spy's default rate: ~1% of a core per process sampled
ATTACH_TIMEOUT_S = 10.0  # py-spy says "Sampling process" once attached, or exits with the reason
WRITE_TIMEOUT_S = 60.0  # after SIGINT, py-spy writes its SVG (seconds for a long run)
TOP_FUNCTIONS = 40  # lines of client-top.txt in the cProfile fallback


def py_spy_path() -> str | None:
    """The py-spy executable beside this Python (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def profile_dir_checked(directory: Path | None) -> Path | None:
    """Create DIR before anything runs, so a path that cannot be written fails in one line first."""
    if directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DlogError(f"--profile {directory}: cannot create it ({exc.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise DlogError(f"--profile {directory}: not writable")
    return directory


class _Recording:
    """One `py-spy record` of one process, until stopped."""

    def __init__(self, executable: str, pid: int, output: Path) -> None:
        self.output = output
        # its complaints into a file, so a talkative run never blocks it on a full pipe
        self._errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by close()
        self.process = subprocess.Popen(
            [executable, "record", "--pid", str(pid), "--rate", str(SAMPLES_PER_S), "--format", "flamegraph",
             "--nonblocking", "-o", str(output)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._errors,
            text=True)

    def attached(self) -> str | None:
        """None once py-spy samples; else why it could not attach (it has exited then)."""
        line = LineReader(self.process).line_starting("py-spy> Sampling", ATTACH_TIMEOUT_S)
        if line is not None:
            return None
        self.stop()
        self._errors.seek(0)
        error = self._errors.read()
        self.close()
        return next((text.strip() for text in error.splitlines() if text.strip()), "no output")

    def stop(self) -> bool:
        """SIGINT (py-spy then writes its file); True when the file was written."""
        signal_and_wait(self.process, signal.SIGINT, WRITE_TIMEOUT_S)
        return self.output.is_file() and self.output.stat().st_size > 0

    def close(self) -> None:
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._errors.close()


class Profiler:
    """Profiles the client (this process) and a cluster's bookies between `attach` and `detach`
    (`dlog_tools.bench.common.local_cluster` calls both); `summary()` is what the result shows."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.notes: list[str] = []
        self.files: dict[str, str] = {}
        self._recordings: dict[str, _Recording] = {}
        self._cprofile: cProfile.Profile | None = None
        self._started = 0.0
        self._seconds = 0.0

    def attach(self, cluster: LocalCluster) -> None:
        executable = py_spy_path()
        targets = {"client": os.getpid(), **{f"bookie-{bookie.index}": bookie.pid for bookie in cluster.bookies
                                              if bookie.pid is not None}}
        if executable is None:
            self.notes.append("py-spy is not installed (pip install 'dlog[bench]'): client profiled with "
                              "cProfile, bookies not profiled")
        else:
            started = {role: _Recording(executable, pid, self.directory / f"{role}.svg")
                       for role, pid in targets.items()}
            for role, recording in started.items():
                reason = recording.attached()
                if reason is None:
                    self._recordings[role] = recording
                else:
                    fallback = "cProfile instead" if role == "client" else "not profiled"
                    self.notes.append(f"py-spy could not attach to the {role} ({reason}): {fallback}")
        if "client" not in self._recordings:
            self._cprofile = cProfile.Profile()
            self._cprofile.enable()
        self._started = monotonic_s()

    def detach(self) -> None:
        self._seconds += monotonic_s() - self._started
        for role, recording in self._recordings.items():
            if recording.stop():
                self.files[role] = str(recording.output)
            else:
                self.notes.append(f"py-spy wrote no flame graph of the {role}")
            recording.close()
        self._recordings = {}
        if self._cprofile is not None:
            self._cprofile.disable()
            self.files["client"] = self._write_pstats(self._cprofile)
            self._cprofile = None

    def _write_pstats(self, profile: cProfile.Profile) -> str:
        path = self.directory / "client.pstats"
        profile.dump_stats(path)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(TOP_FUNCTIONS)
        (self.directory / "client-top.txt").write_text(text.getvalue())
        return str(path)

    def summary(self) -> dict[str, Any]:
        tool = "py-spy" if any(path.endswith(".svg") for path in self.files.values()) else "cProfile"
        return {"profiler": f"{tool}, {SAMPLES_PER_S} samples/s, on-CPU" if tool == "py-spy" else tool,
                "profiled_s": round(self._seconds, 1), "profiles": dict(sorted(self.files.items())),
                **({"profile_notes": "; ".join(self.notes)} if self.notes else {})}

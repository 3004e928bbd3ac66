"""Real Spark engines from the pyspark wheel: a standalone cluster and a Spark Connect server.

    with SparkStandalone(directory) as cluster:          # a master and one worker
        spark = SparkSession.builder.master(cluster.master_url)...
    with SparkConnectServer(directory) as server:        # its own driver, local[2] by default
        spark = SparkSession.builder.remote(server.url).getOrCreate()

Used by tests/spark (the source and sink on executors in their own processes, and through Spark
Connect) and by `dlog bench spark --standalone`. Everything comes from the installed pyspark
wheel: `bin/spark-class` runs the master, the worker and the Connect server (SparkSubmit with
`SparkConnectServer`, what `sbin/start-connect-server.sh` runs, without its daemon wrapper so
that the process is ours to stop), and the wheel's `jars/` already holds spark-connect.

Every process binds 127.0.0.1 only (SPARK_LOCAL_IP, --host, the Connect binding address), on
ports picked free below the ephemeral range, keeps its heap small, dies with its parent
(PR_SET_PDEATHSIG survives spark-class's exec into java), runs in a session of its own, and is
stopped by its pid. A worker's executors are its child processes: stopping the worker (SIGTERM)
kills them; SIGKILL of the worker's process group catches any that linger.

Python workers of executors and of the Connect server run `python` = `PYSPARK_PYTHON`, by default
this interpreter: it must have dlog installed (its `pyspark_dlog` module is how Spark finds the
"dlog" source).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError, DlogError
from bookkeeper.meta.zkserver import find_java, pick_free_port
from dlog_tools.cluster import die_with_parent

HOST = "127.0.0.1"
DAEMON_MEMORY = "256m"  # the master's and the worker's own heap (Spark's default is 1g)
# A small JVM that starts fast: C1 only, serial GC (the tests' engines are short-lived and tiny).
JVM_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2
LOG_TAIL_LINES = 30
CONNECT_DRIVER_MEMORY = "1g"  # Spark refuses a driver heap under 450 MiB
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SparkStartError(DlogError):
    """A Spark process did not come up; the message ends with its log's last lines."""

    code = 600


def spark_home() -> Path:
    """The installed pyspark package: the wheel is a SPARK_HOME (bin/, jars/)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("pyspark is not installed: pip install 'dlog[spark]'")
    home = Path(next(iter(spec.submodule_search_locations)))
    if not (home / "bin" / "spark-class").is_file():
        raise ConfigError(f"{home} has no bin/spark-class: install pyspark from its wheel (pip install pyspark)")
    return home


def spark_environment(python: str | None = None) -> dict[str, str]:
    """The environment of every Spark process started here."""
    env = dict(os.environ)
    home = spark_home()
    java = Path(find_java()).resolve()
    env.update({
        "SPARK_HOME": str(home),
        "JAVA_HOME": str(java.parent.parent),
        "SPARK_LOCAL_IP": HOST,  # every server socket and web UI of Spark binds loopback only
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": JVM_FLAGS,
        # The master's REST submission server would listen on the fixed port 6066: two clusters on
        # one machine would fight over it, and nothing here submits through it.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": python or sys.executable,
        "PYSPARK_DRIVER_PYTHON": python or sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
    })
    env.pop("SPARK_CONF_DIR", None)  # never a configuration from elsewhere on the machine
    return env


class _SparkProcess:
    """One java process run through spark-class, logging to a file."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def spawn(self, arguments: list[str], env: dict[str, str], cwd: Path) -> None:
        command = [str(spark_home() / "bin" / "spark-class"), *arguments]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                            stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                            preexec_fn=die_with_parent, start_new_session=True)

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise SparkStartError(f"the Spark {self.name} exited with status {self.process.returncode}; "
                                  f"last lines of {self.log_path}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (the JVM's shutdown hooks stop what it started), then SIGKILL of its process
        group (its own session: children it left behind, and nothing else)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process.poll() is None:
            process.wait(timeout_s)


def _wait(condition: Callable[[], bool], what: str, processes: list[_SparkProcess], timeout_s: float) -> None:
    deadline = monotonic_s() + timeout_s
    while True:
        for process in processes:
            process.check_alive()
        if condition():
            return
        if monotonic_s() >= deadline:
            tails = "\n".join(f"--- {p.log_path}:\n{p.log_tail()}" for p in processes)
            raise SparkStartError(f"{what} not within {timeout_s:.0f} s\n{tails}")
        time.sleep(POLL_INTERVAL_S)


def _json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((HOST, port)) == 0


class SparkStandalone:
    """A Spark standalone cluster on this machine: one master and one worker, loopback only.

    The worker offers `worker_cores` cores and `worker_memory` to applications; each application
    gets executors (their own JVM processes, children of the worker) in `directory/work`."""

    def __init__(self, directory: Path | str, *, worker_cores: int = 1, worker_memory: str = "1g",
                 python: str | None = None) -> None:
        self.directory = Path(directory).absolute()
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.env = spark_environment(python)
        self.master = _SparkProcess("master", self.directory / "master.log")
        self.worker = _SparkProcess("worker", self.directory / "worker.log")
        self.master_port = self.master_ui_port = 0

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> SparkStandalone:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.master_port, self.master_ui_port = pick_free_port(HOST), pick_free_port(HOST)
        try:
            self.master.spawn(["org.apache.spark.deploy.master.Master", "--host", HOST,
                               "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)],
                              self.env, self.directory)
            _wait(lambda: self._state() is not None, "the Spark master answering", [self.master], timeout_s)
            work = self.directory / "work"
            work.mkdir(exist_ok=True)
            self.worker.spawn(["org.apache.spark.deploy.worker.Worker", "--host", HOST,
                               "--port", str(pick_free_port(HOST)), "--webui-port", str(pick_free_port(HOST)),
                               "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                               "--work-dir", str(work), self.master_url], self.env, self.directory)
            _wait(lambda: (self._state() or {}).get("aliveworkers", 0) >= 1, "the Spark worker registering",
                  [self.master, self.worker], timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def application_conf(self, executor_memory: str = "512m", *, cores: int | None = None,
                         small_jvm: bool = True) -> dict[str, str]:
        """Settings of an application (a SparkSession's builder.config) that runs on this cluster:
        one executor of `cores` cores (all the worker's by default; fewer leave room for another
        application), its Python workers on this interpreter."""
        cores = cores or self.worker_cores
        conf = {
            "spark.executor.memory": executor_memory,
            "spark.executor.cores": str(cores),
            "spark.cores.max": str(cores),
            "spark.executorEnv.PYSPARK_PYTHON": self.env["PYSPARK_PYTHON"],
            "spark.executorEnv.SPARK_LOCAL_IP": HOST,
        }
        if small_jvm:
            conf["spark.executor.extraJavaOptions"] = JVM_FLAGS
        return conf

    def _state(self) -> dict | None:
        """The master's JSON status (its web UI's /json)."""
        return _json(f"http://{HOST}:{self.master_ui_port}/json/")

    def executor_pids(self) -> list[int]:
        """Executor JVMs the worker runs now (its children running CoarseGrainedExecutorBackend)."""
        worker = self.worker.pid
        if worker is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == worker and b"CoarseGrainedExecutorBackend" in command:
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        self.worker.stop()
        self.master.stop()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


class SparkConnectServer:
    """A Spark Connect server (gRPC on 127.0.0.1) with its own driver; `master` is where its
    queries run (`local[2]`, or a standalone cluster's `spark://...`)."""

    def __init__(self, directory: Path | str, *, master: str = "local[2]", python: str | None = None,
                 conf: dict[str, str] | None = None) -> None:
        self.directory = Path(directory).absolute()
        self.master = master
        self.env = spark_environment(python)
        # The launcher would size the server's heap by SPARK_DAEMON_MEMORY (the Connect server is
        # one of its daemon classes), which is below what a Spark driver accepts.
        self.env.pop("SPARK_DAEMON_MEMORY", None)
        self.conf = dict(conf or {})
        self.server = _SparkProcess("Connect server", self.directory / "connect-server.log")
        self.port = 0

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.server.pid

    def start(self, timeout_s: float = START_TIMEOUT_S) -> SparkConnectServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = pick_free_port(HOST)
        conf = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.bindAddress": HOST, "spark.driver.host": HOST,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            **self.conf,
        }
        arguments = ["org.apache.spark.deploy.SparkSubmit", "--class", CONNECT_SERVER_CLASS,
                     "--name", "dlog Spark Connect server", "--master", self.master,
                     "--driver-memory", CONNECT_DRIVER_MEMORY, "--driver-java-options", JVM_FLAGS]
        for key, value in conf.items():
            arguments += ["--conf", f"{key}={value}"]
        arguments.append("spark-internal")
        try:
            self.server.spawn(arguments, self.env, self.directory)
            _wait(lambda: _listening(self.port), f"the Spark Connect server listening on {HOST}:{self.port}",
                  [self.server], timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

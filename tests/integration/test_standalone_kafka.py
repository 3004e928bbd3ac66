"""`dlog standalone` runs one `dlog serve` server: its ready line names the Kafka port, a Kafka
producer's topic is created on first use and reads back with `dlog read`, `dlog serve list` shows
the server and the stream it owns, and stopping the standalone stops the server too; `--kafka-port
-1` runs none."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from tests.integration.test_serve_kafka import expected_records, librdkafka_produce
from tests.integration.test_standalone import start_standalone, stop_standalone
from dlog_tools.cluster import LineReader, free_port


def dlog(zk: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments, "--zk", zk], capture_output=True,
                          text=True, timeout=60, check=True)


def test_standalone_serves_kafka_clients_and_stops_its_server(tmp_path):
    process, zk, _ = start_standalone(tmp_path / "sa", free_port(), bookies=1)
    try:
        listed = json.loads(dlog(zk, "serve", "list", "--json").stdout)["servers"]
        assert len(listed) == 1, listed
        kafka = listed[0]["kafka"]
        records = expected_records("standalone", 20)
        offsets = librdkafka_produce(kafka, "events", records)
        assert offsets == list(range(20))
        read = [json.loads(line) for line in dlog(zk, "read", "events", "--json", "--to", "19").stdout.splitlines()]
        assert [line["position"] for line in read] == list(range(20))
        assert json.loads(dlog(zk, "serve", "list", "--json").stdout)["servers"][0]["streams"] == ["events"]
    finally:
        assert stop_standalone(process) == 0
    assert asyncio.run(_port_closed(kafka))


async def _port_closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return True
    writer.close()
    return False


def standalone_ready(directory: Path, kafka_port: int, bookies: int = 1) -> tuple[subprocess.Popen, str]:
    """A standalone with this --kafka-port, and its ready line."""
    process = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory),
                                "--bookies", str(bookies), "--zk-port", str(free_port()), "--ui-port", "-1",
                                "--kafka-port", str(kafka_port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    line = LineReader(process).line_starting("dlog standalone ready", 90)
    if line is None:
        process.kill()
        raise AssertionError(f"standalone not ready (status {process.wait()}): {process.stderr.read()}")
    return process, line


def test_standalone_ready_line_names_the_kafka_port_and_minus_one_runs_no_server(tmp_path):
    port = free_port()
    process, line = standalone_ready(tmp_path / "a", port)
    try:
        assert line.endswith(f" kafka=127.0.0.1:{port}"), line
    finally:
        assert stop_standalone(process) == 0
    process, line = standalone_ready(tmp_path / "b", -1)
    try:
        assert "kafka=" not in line, line
    finally:
        assert stop_standalone(process) == 0


def test_the_readme_kafka_quick_start_works_as_printed(tmp_path):
    from tests.helpers import readme_blocks
    (code,) = [body for body in readme_blocks("python") if "from confluent_kafka" in body]
    (commands,) = [body for body in readme_blocks("") if "dlog serve list" in body]
    port = free_port()
    process, line = standalone_ready(tmp_path / "sa", port, bookies=3)
    try:
        zk = line.split("zk=", 1)[1].split()[0]
        script = tmp_path / "kafka_example.py"
        script.write_text(code.replace("127.0.0.1:9092", f"127.0.0.1:{port}"))
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "0 b'o-1' b'{\"total\": 9.5}'"
        outputs = []
        for command in [line.split("  #")[0].strip() for line in commands.splitlines() if line.strip()]:
            command = command.replace(".venv/bin/dlog", f"{sys.executable} -m dlog_tools.cli") + f" --zk {zk}"
            outputs.append(subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60))
        assert all(output.returncode == 0 for output in outputs), outputs
        record = json.loads(outputs[0].stdout.splitlines()[0])
        assert (record["position"], record["key"], record["value"], record["headers"]) == \
            (0, "o-1", '{"total": 9.5}', [["source", "web"]]), record
        assert "billing" in outputs[1].stdout and "orders" in outputs[2].stdout
    finally:
        assert stop_standalone(process) == 0


def test_a_secure_standalone_serves_kafka_clients_over_sasl_ssl_only(tmp_path):
    """`dlog standalone --secure` runs its server with the bookies' certificate and token key: a
    client with the admin token over SASL_SSL produces; one without SASL gets nothing acknowledged."""
    from tests.integration.test_serve_secure import librdkafka_consume
    from tests.integration.test_serve_secure import librdkafka_produce as sasl_produce
    directory = tmp_path / "secure-sa"
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory),
                                "--bookies", "1", "--zk-port", str(free_port()), "--ui-port", "-1", "--secure",
                                "--kafka-port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = LineReader(process)
    line = lines.line_starting("dlog standalone ready", 120)
    if line is None:
        process.kill()
        raise AssertionError(f"standalone not ready (status {process.wait()}): {process.stderr.read()}")
    try:
        assert line.endswith(f" kafka=127.0.0.1:{port}"), line
        secure = directory / "secure"
        config = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL",
                  "ssl.ca.location": str(secure / "ca.pem"), "sasl.mechanisms": "PLAIN", "sasl.username": "admin",
                  "sasl.password": (secure / "admin.token").read_text().strip()}
        assert sasl_produce(config, "secured", [b"one", b"two"]) == ([0, 1], [])
        assert librdkafka_consume(config, "secured", 2) == [b"one", b"two"]
        plain = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
                 "ssl.ca.location": str(secure / "ca.pem")}
        offsets, errors = sasl_produce(plain, "secured", [b"anonymous"], timeout_ms=5_000)
        assert offsets == [] and len(errors) == 1, errors
    finally:
        assert stop_standalone(process) == 0

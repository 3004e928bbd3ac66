"""`dlog write` is a console producer: each line is written as it arrives through one writer for the
whole run, input is binary-safe in every format, JSON values stay JSON, a waiting writer says who
holds the lock, --takeover fences it, and Ctrl-C ends a run with everything flushed."""

from __future__ import annotations

import base64
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

import dlog
from tests.helpers import dlog_runner, eventually_blocking, one_error_line
from dlog_tools.cluster import LocalCluster


@pytest.fixture(scope="module")
def producer(zk_server, tmp_path_factory):
    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"ns{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("producer"), bookies=1, zk_root=root, zk_server=zk_server)
    cluster.start()
    run = dlog_runner(zk_server.address, root, namespace)
    with dlog.connect(zk_server.address, namespace, bookkeeper_root=root) as ns:
        yield run, ns, ["--zk", zk_server.address, "--zk-root", root, "--namespace", namespace]
    cluster.stop()


def create(run, name: str) -> None:
    run("stream", "create", name, "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")


def values(ns, name: str) -> list[bytes]:
    with ns.open_reader(name, follow=False) as reader:
        return [record.value for record in reader]


def records(ns, name: str) -> list[tuple[bytes | None, bytes]]:
    with ns.open_reader(name, follow=False) as reader:
        return [(record.key, record.value) for record in reader]


def stderr_line(process: subprocess.Popen, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        if select.select([process.stderr], [], [], 0.1)[0]:
            line += os.read(process.stderr.fileno(), 1)
    return line.decode()


def test_each_line_is_written_as_it_arrives_through_one_writer(producer):
    run, ns, scope = producer
    create(run, "tail")
    writing = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "write", "tail", *scope],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        writing.stdin.write(b"first\n")
        writing.stdin.flush()  # like `tail -f`: the input stays open
        eventually_blocking(lambda: values(ns, "tail") == [b"first"], timeout_s=30,
                            message="the first line is readable while the producer still runs")
        writing.stdin.write(b"second\nthird\n")
        writing.stdin.flush()
        eventually_blocking(lambda: values(ns, "tail") == [b"first", b"second", b"third"], timeout_s=30)
        writing.send_signal(signal.SIGINT)  # Ctrl-C ends the run, flushed, without a complaint
        out, err = writing.communicate(timeout=60)
    finally:
        writing.kill()
    assert writing.returncode == 0 and err == b"", err
    assert out.decode().startswith("wrote 3 records to tail (")
    assert len(ns.stream_info("tail")["segments"]) == 1  # one writer, one segment, for the whole run


def test_every_format_is_binary_safe_and_json_stays_json(producer):
    run, ns, _ = producer
    create(run, "formats")
    binary = b"caf\xe9 \xff\xfe latin-1, not UTF-8"
    written = run("write", "formats", stdin=b"plain\n" + binary + b"\r\n\nk1:v:1\n").stdout
    assert written.startswith(b"wrote 3 records to formats (")  # the empty line is skipped
    raw = bytes(range(256)) * 3 + b"\n\x00 no line ends here"
    run("write", "formats", "--format", "raw", stdin=raw)
    encoded = b"\n".join(base64.b64encode(v) for v in (b"\x00\x01", b"\xff")) + b"\n"
    run("write", "formats", "--format", "base64", stdin=encoded)
    run("write", "formats", "--format", "base64", "--key-separator", ":",
        stdin=base64.b64encode(b"key\xff") + b":" + base64.b64encode(b"value\xfe") + b"\n")
    run("write", "formats", "--key-separator", "::", stdin=b"user-7::clicked::twice\nno separator\n")
    jsonl = (b'{"key": "k", "value": {"a": 1, "b": [true, null]}, "timestamp": 1700000000000}\n'
             b'{"value": "text \xc3\xa9"}\n{"value": 42}\n{"key": 7, "value": "numeric key"}\n')
    run("write", "formats", "--format", "jsonl", stdin=jsonl)
    assert records(ns, "formats") == [
        (None, b"plain"), (None, binary), (None, b"k1:v:1"), (None, raw), (None, b"\x00\x01"), (None, b"\xff"),
        (b"key\xff", b"value\xfe"), (b"user-7", b"clicked::twice"), (None, b"no separator"),
        (b"k", b'{"a":1,"b":[true,null]}'), (None, "text é".encode()), (None, b"42"), (b"7", b"numeric key")]


@pytest.mark.parametrize("arguments, stdin, words", [
    (("--format", "jsonl"), b'{"value": 1}\n{"value": null}\n',
     'line 2: "value" is null, and a record always has a value (write "null" as a string to store the '
     "text null) (1 record before it was written to bad-input)"),
    (("--format", "jsonl"), b'{"value": "\xff"}\n', "line 1 is not UTF-8 text"),
    (("--format", "jsonl"), b"{'a': 1}\n", "line 1 is not JSON"),
    (("--format", "base64"), b"not base64!\n", "line 1: the value is not base64"),
    (("--format", "raw", "--key-separator", ":"), b"x", "--key-separator works with --format lines or base64"),
])
def test_bad_input_is_one_line_naming_the_line(producer, arguments, stdin, words):
    run, ns, _ = producer
    if "bad-input" not in ns.list_streams():
        create(run, "bad-input")
    error = one_error_line(run("write", "bad-input", *arguments, stdin=stdin, ok=False))
    assert words in error


def test_a_waiting_writer_says_who_holds_the_lock_and_takeover_fences_it(producer):
    run, ns, scope = producer
    create(run, "locked")
    holder = ns.open_writer("locked")
    holder.write(b"from the holder")
    waiting = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "write", "locked", *scope],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        waiting.stdin.write(b"from the console\n")
        waiting.stdin.close()
        line = stderr_line(waiting)
        assert line.startswith(f"dlog: waiting for the writer lock of stream 'locked', held by pid {os.getpid()} "
                               f"on {socket.gethostname()} since "), line
        assert line.rstrip().endswith("; pass --takeover to fence that writer and take over")
        holder.close()  # the lock is free: the console producer goes on
        waiting.wait(timeout=60)
        err = waiting.stderr.read()
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert values(ns, "locked") == [b"from the holder", b"from the console"]

    fenced = ns.open_writer("locked")
    fenced.write(b"before the takeover")
    run("write", "locked", "--takeover", stdin="taken over\n")
    with pytest.raises(dlog.WriterFencedError):
        fenced.write(b"after the takeover")
    fenced.close()
    assert values(ns, "locked")[-2:] == [b"before the takeover", b"taken over"]

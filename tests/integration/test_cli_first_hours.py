"""Issue 23, through the real commands on a real one-bookie cluster: the CLI round trip is lossless
(`dlog read --json | dlog write --format jsonl`), bytes that are not UTF-8 are never replaced
silently, an oversized line can be skipped, streams fit a cluster smaller than the defaults,
messages lead somewhere, `dlog.connect` takes Namespace's keywords, and the small truths (plurals,
a truncate that changes nothing, counts without truncated records, UTC in Parquet, tokens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

import dlog
from tests.helpers import dlog_runner, one_error_line
from dlog_tools.cluster import LocalCluster
from dlog_tools.console import RECORD_BYTES_MAX


@pytest.fixture(scope="module")
def first(zk_server, tmp_path_factory):
    """(run, ns, scope): `dlog` in a fresh namespace of a one-bookie cluster, a blocking Namespace
    of it, and the scope options for commands run by hand."""
    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"ns{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("first"), bookies=1, zk_root=root, zk_server=zk_server)
    cluster.start()
    with dlog.connect(zk_server.address, name=namespace, bookkeeper_root=root) as ns:
        yield dlog_runner(zk_server.address, root, namespace), ns, [
            "--zk", zk_server.address, "--zk-root", root, "--namespace", namespace]
    cluster.stop()


def create(ns, name: str) -> None:
    ns.create_stream(name, ensemble=1, write_quorum=1, ack_quorum=1)


def records_of(ns, name: str) -> list[tuple]:
    with ns.open_reader(name, follow=False, headers=True) as reader:
        return [(r.key, r.value, r.timestamp_ms, r.headers) for r in reader]


# ------------------------------------------------------------------------------ 2. a lossless CLI


def test_read_json_piped_to_write_jsonl_copies_records_losslessly(first):
    run, ns, scope = first
    create(ns, "copied-from")
    create(ns, "copied-to")
    with ns.open_writer("copied-from") as writer:
        writer.write(b'{"a":1}', b"k1", 1_700_000_000_000, [("trace", b"abc"), ("none", None)])
        writer.write(b"\xff\xfe binary", b"\x00\xffkey", 1_700_000_000_001, [("bin", b"\xc3\x28")])
        writer.write("téxt".encode(), None, 1_700_000_000_002)
    read = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "read", "copied-from", "--json", "--headers", *scope],
                          capture_output=True, check=True)
    run("write", "copied-to", "--format", "jsonl", stdin=read.stdout)
    assert records_of(ns, "copied-to") == records_of(ns, "copied-from")
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert "value_b64" in lines[1] and "key_b64" in lines[1] and "headers_b64" in lines[1]


def test_plain_read_says_when_bytes_are_not_utf8_and_raw_keeps_them(first):
    run, ns, scope = first
    create(ns, "binary")
    run("write", "binary", stdin=b"ok\n\xff\xfe\nalso \xc3\x28\n")
    plain = run("read", "binary", stdin=b"")
    warnings = [line for line in plain.stderr.decode().splitlines() if line.strip()]
    assert len(warnings) == 1 and "not UTF-8" in warnings[0] and "--format raw" in warnings[0], warnings
    assert run("read", "binary", "--format", "raw", stdin=b"").stdout == b"ok\n\xff\xfe\nalso \xc3\x28\n"
    assert run("read", "binary", "--max", "1", stdin=b"").stderr == b""  # UTF-8 only: nothing to say


def test_on_oversize_skip_skips_a_line_with_one_warning_and_goes_on(first):
    run, ns, _ = first
    create(ns, "oversized")
    big = b"x" * (RECORD_BYTES_MAX + 10)
    stdin = b"before\n" + big + b"\nafter\n" + big + b"\nlast\n"
    failed = run("write", "oversized", stdin=stdin, ok=False)
    error = one_error_line(failed)
    assert "line 2 is over 2 MiB" in error and "--on-oversize skip" in error
    skipped = run("write", "oversized", "--on-oversize", "skip", stdin=stdin)
    warnings = skipped.stderr.decode().splitlines()
    assert len(warnings) == 2 and "line 2" in warnings[0] and "line 4" in warnings[1], warnings
    assert b"skipped 2 lines over 2 MiB" in skipped.stdout
    values = [value for _, value, _, _ in records_of(ns, "oversized")]
    assert values == [b"before", b"before", b"after", b"last"]  # the failed run wrote what came before


# ------------------------------------------------------------------------------ 3. a cluster smaller than the defaults


def test_create_fits_a_cluster_smaller_than_the_default_ensemble(first):
    run, ns, _ = first
    created = run("stream", "create", "fitted")
    assert created.stderr.strip() == ("dlog: 1 bookie registered, fewer than the default ensemble of 3: the stream has "
                                      "ensemble 1, write quorum 1, ack quorum 1 (`dlog stream alter` changes it for "
                                      "new segments)")
    assert run("write", "fitted", stdin="works\n").stdout.startswith("wrote 1 record to fitted")


def test_alter_changes_replication_for_new_segments_checking_the_quorums(first):
    run, ns, _ = first
    asked = run("stream", "create", "too-wide", "--ensemble", "2", "--write-quorum", "2", "--ack-quorum", "2")
    assert "only 1 bookie registered" in asked.stderr and "stream alter too-wide --ensemble 1" in asked.stderr
    refused = run("stream", "alter", "too-wide", "--ensemble", "1", ok=False)  # the quorums of 2 stay
    assert "ensemble >= write quorum >= ack quorum" in one_error_line(refused)
    run("stream", "alter", "too-wide", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")
    assert "  replication   ensemble 1, write quorum 1, ack quorum 1" in run("stream", "info", "too-wide").stdout
    run("write", "too-wide", stdin="now it fits\n")
    ledger = json.loads(run("stream", "info", "too-wide", "--json").stdout)["segments"][0]["ledger"]
    shown = json.loads(run("ledger", "show", str(ledger), "--json", namespaced=False).stdout)
    assert shown["ensemble_size"] == 1


# ------------------------------------------------------------------------------ 5. one API, two forms


def test_connect_takes_the_keywords_of_namespace(first, zk_server):
    run, ns, _ = first
    root = ns.namespace.bookkeeper_root
    other = f"kw{uuid.uuid4().hex[:6]}"
    with dlog.connect(zk=zk_server.address, name=other, bookkeeper_root=root) as keyworded:
        assert keyworded.namespace.name == other
        keyworded.create_stream("named", ensemble=1, write_quorum=1, ack_quorum=1)
    listed = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "stream", "list", "--zk", zk_server.address,
                             "--zk-root", root, "--namespace", other], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == ["named"]


# ------------------------------------------------------------------------------ 8. small truths


def test_counts_are_worded_and_a_truncate_that_changes_nothing_says_so(first):
    run, ns, _ = first
    create(ns, "worded")
    written = json.loads(run("write", "worded", "--json", stdin="a\nb\nc\n").stdout)
    first_offset = written["first"]
    nothing = run("truncate", "worded", "--before", first_offset)
    assert nothing.stdout.startswith("nothing to truncate: worded holds no records before")
    assert json.loads(run("truncate", "worded", "--before", first_offset, "--json").stdout)["changed"] is False
    assert run("stream", "delete", "worded").stdout == "deleted stream worded (1 ledger)\n"


def test_stream_info_does_not_count_records_truncated_inside_a_segment(first):
    run, ns, _ = first
    create(ns, "cut")
    with ns.open_writer("cut") as writer:
        offsets = [writer.write(b"%d" % n) for n in range(5)]  # one entry each
        writer.write_many([b"x", b"y", b"z"])  # pipelined: may share entries
    run("truncate", "cut", "--before", str(offsets[3]))
    info = json.loads(run("stream", "info", "cut", "--json").stdout)
    assert info["records"] == 5 and info["segments"][0]["records_truncated"] == 3
    assert info["first_offset"] == str(offsets[3])
    assert "  records       5 records in 1 live segment" in run("stream", "info", "cut").stdout
    run("read", "cut", "--subscription", "s", "--max", "2")
    lag = json.loads(run("subscription", "describe", "cut", "s", "--json").stdout)
    assert lag["lag_records"] == 3, lag


def test_offsets_shown_are_records_that_exist(first):
    run, ns, _ = first
    create(ns, "emptied")
    run("write", "emptied", stdin="a\nb\n")
    run("truncate", "emptied", "--before", "latest")  # inside the in-progress segment: past its last record
    info = json.loads(run("stream", "info", "emptied", "--json").stdout)
    assert (info["records"], info["first_offset"], info["last_offset"]) == (0, None, None), info
    written = json.loads(run("write", "emptied", "--json", stdin="c\n").stdout)
    info = json.loads(run("stream", "info", "emptied", "--json").stdout)
    assert info["first_offset"] == info["last_offset"] == written["first"] and info["records"] == 1


def test_export_timestamps_are_utc_with_the_stream_schema_in_the_metadata(first, tmp_path):
    import pyarrow.parquet as pq

    from dlog.segments.codec import schema_from_text

    run, ns, _ = first
    create(ns, "exported")
    with ns.open_writer("exported") as writer:
        writer.write(b"v", None, 1_700_000_000_000)
    out = tmp_path / "out.parquet"
    run("export", "exported", "--out", str(out))
    table = pq.read_table(out)
    assert str(table.schema.field("timestamp").type) == "timestamp[ms, tz=UTC]"
    assert table.column("timestamp")[0].as_py().isoformat() == "2023-11-14T22:13:20+00:00"
    metadata = table.schema.metadata
    assert metadata[b"dlog.stream"] == b"exported"
    assert schema_from_text(metadata[b"dlog.schema"].decode()) == ns.namespace.schema_of(ns.config("exported"))


def test_tokens_expire_by_default_and_a_written_config_keeps_the_secret_off_the_terminal(tmp_path):
    import tomllib

    from bookkeeper.security.tokens import TokenKey, TokenVerifier
    from dlog_tools.secure import create as create_secure
    from dlog_tools.secure import write_admin_config

    secure = create_secure(tmp_path / "secure")
    admin = write_admin_config(secure, "127.0.0.1:1")  # no ZooKeeper needed for a cluster-wide token
    key = TokenKey.from_file(str(secure.token_key))

    def token_create(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dlog_tools.cli", "token", "create", "--role", "admin", *arguments,
                               "--config", str(admin)], capture_output=True, text=True, timeout=60)

    printed = token_create()
    assert printed.returncode == 0, printed.stderr
    expires_s = TokenVerifier(key).verify(printed.stdout.strip()).expires_s
    assert expires_s is not None and 29 * 86400 < expires_s - time.time() <= 30 * 86400
    assert TokenVerifier(key).verify(token_create("--ttl", "never").stdout.strip()).expires_s is None
    assert "--ttl never" in one_error_line(token_create("--ttl", "0"))
    out = tmp_path / "app.toml"
    written = token_create("--client-config", str(out))
    token = tomllib.loads(out.read_text())["security"]["token"]
    assert written.returncode == 0 and token not in written.stdout + written.stderr
    assert written.stdout.startswith(f"wrote {out}: a token for admin (admin) that expires ")


# ------------------------------------------------------------------------------ 4. messages that lead somewhere


def dlog_cli(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("DLOG_")}
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments], capture_output=True, text=True,
                          timeout=120, env={**clean, **(env or {})})


def zk_exists(zk_address: str, path: str) -> bool:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_address)
    client.start(timeout=30)
    try:
        return client.exists(path) is not None
    finally:
        client.stop()
        client.close()


def test_takeover_says_whom_it_fences_and_never_to_pass_takeover(first):
    run, ns, _ = first
    create(ns, "taken")
    holder = ns.open_writer("taken")
    holder.write(b"held")
    try:
        taken = run("write", "taken", "--takeover", stdin="mine now\n")
    finally:
        with pytest.raises(dlog.WriterFencedError):
            holder.close()
    assert "--takeover" not in taken.stderr.replace("(--takeover)", "") and "pass --takeover" not in taken.stderr
    assert f"is held by pid {os.getpid()}" in taken.stderr and "fencing that writer" in taken.stderr


def test_ledger_read_of_a_streams_segment_says_how_to_read_the_stream(first):
    run, ns, scope = first
    create(ns, "segmented")
    run("write", "segmented", stdin="r\n")
    ledger = json.loads(run("stream", "info", "segmented", "--json").stdout)["segments"][0]["ledger"]
    line = one_error_line(run("ledger", "read", str(ledger), namespaced=False, ok=False))
    namespace = scope[scope.index("--namespace") + 1]
    assert f"read its records with `dlog read segmented --namespace {namespace}`" in line


@pytest.mark.parametrize("arguments, words", [
    (("read",), "dlog read: missing argument 'NAME' (dlog read -h for help)"),
    (("stream", "create", "s", "--ensemble", "many"), "dlog stream create: invalid value for '--ensemble'"),
    (("strem", "list"), "dlog: no such command 'strem'"),
])
def test_usage_errors_are_one_line(arguments, words):
    result = subprocess.run([sys.executable, "-c", "from dlog_tools.cli import main; main(prog_name='dlog')", *arguments],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and words in one_error_line(result)


def test_read_only_commands_create_no_namespace_and_a_missing_stream_names_it(first, zk_server):
    run, ns, scope = first
    zk, root = scope[1], scope[3]
    ghost = f"ghost{uuid.uuid4().hex[:6]}"
    common = ["--zk", zk, "--zk-root", root, "--namespace", ghost]
    assert dlog_cli("stream", "list", *common).stdout == "\n"
    for arguments in (("stream", "info", "s"), ("read", "s"), ("subscription", "describe", "s", "sub"),
                      ("truncate", "s", "--before", "1:0")):
        line = one_error_line(dlog_cli(*arguments, *common))
        assert f"stream 's' does not exist in namespace '{ghost}'" in line, (arguments, line)
    assert not zk_exists(zk_server.address, f"/dlog/{ghost}")


def test_a_wrong_zk_root_says_no_bookies_are_registered_there(first, zk_server):
    run, ns, scope = first
    create(ns, "rooted")
    namespace = scope[scope.index("--namespace") + 1]
    wrong = f"/wrong-{uuid.uuid4().hex[:6]}"
    for arguments in (("stream", "info", "rooted", "--namespace", namespace), ("ledger", "list"),
                      ("stream", "create", "elsewhere")):
        line = one_error_line(dlog_cli(*arguments, "--zk", zk_server.address, "--zk-root", wrong))
        assert f"no bookies are registered under --zk-root {wrong}" in line, line
    assert not zk_exists(zk_server.address, wrong)


def test_a_secure_cluster_used_without_client_settings_names_the_file_to_export(secure_cluster, tmp_path,
                                                                                  monkeypatch):
    from dlog_tools.secure import write_admin_config

    monkeypatch.setenv("DLOG_HOME", str(tmp_path / "home"))
    admin_toml = write_admin_config(secure_cluster.secure_dir, secure_cluster.zk_address)
    result = dlog_cli("stream", "list", "--namespace", "orders", "--zk", secure_cluster.zk_address,
                      env={"DLOG_HOME": str(tmp_path / "home")})
    assert f"export DLOG_CONFIG={admin_toml.resolve()}" in one_error_line(result)
    unknown = dlog_cli("stream", "list", "--namespace", "orders", "--zk", secure_cluster.zk_address,
                       env={"DLOG_HOME": str(tmp_path / "elsewhere")})
    assert "export DLOG_CONFIG=FILE" in one_error_line(unknown)


def test_a_spark_worker_python_without_dlog_says_to_set_pyspark_python():
    """Spark imports pyspark_dlog in its Python worker ($PYSPARK_PYTHON, else python3): an
    interpreter without dlog's environment (here: this one without site-packages) says what to set."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    load = f"import sys; sys.path.insert(0, {repo!r}); import pyspark_dlog"
    worker = subprocess.run([sys.executable, "-S", "-c", load], capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ.get("PATH", "")})
    assert worker.returncode != 0
    last = worker.stderr.strip().splitlines()[-1]
    assert "export PYSPARK_PYTHON to the interpreter dlog is installed in" in last and sys.executable in last

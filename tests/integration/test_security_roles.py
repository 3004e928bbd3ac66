"""Roles inside a namespace hold where they cannot be bypassed (issue 20, item 3): a consume-only
token (and a produce-only one) cannot delete, alter, truncate, retain, reset or delete subscriptions,
delete or recover ledgers, whether through `dlog` (one line, nothing changed) or by writing
ZooKeeper directly with its own identity; a consumer still commits its subscription, and the
namespace's admin does all of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from bookkeeper.meta import layout
from bookkeeper.security.settings import load_client_settings
from tests.helpers import one_error_line
from dlog_tools.secure import write_admin_config

NAMESPACE = "shop"


def dlog(*arguments: str, config, stdin: str = "") -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("DLOG_")}
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments, "--namespace", NAMESPACE]
                          if arguments[0] not in ("ledger", "token") else [sys.executable, "-m", "dlog_tools.cli", *arguments],
                          input=stdin, text=True, capture_output=True, timeout=120,
                          env={**clean, "DLOG_CONFIG": str(config)})


@pytest.fixture(scope="module")
def principals(secure_cluster, tmp_path_factory):
    """client.toml files of an admin, a producer and a consumer of `shop`, made with
    `dlog token create --client-config`, and a stream `cart2` with records and a subscription."""
    directory = tmp_path_factory.mktemp("roles")
    admin_toml = write_admin_config(secure_cluster.secure_dir, secure_cluster.zk_address)
    configs = {}
    for role in ("admin", "produce", "consume"):
        configs[role] = directory / f"{role}.toml"
        made = dlog("token", "create", "--role", role, "--namespace", NAMESPACE, "--client-config",
                    str(configs[role]), config=admin_toml)
        assert made.returncode == 0, made.stderr
    assert dlog("stream", "create", "cart2", "--ensemble", "2", "--write-quorum", "2",
                config=configs["produce"]).returncode == 0
    written = dlog("write", "cart2", "--json", config=configs["produce"], stdin="one\ntwo\nthree\n")
    assert written.returncode == 0, written.stderr
    first = json.loads(written.stdout.strip().splitlines()[-1])["first"]
    read = dlog("read", "cart2", "--subscription", "billing", "--max", "1", config=configs["consume"])
    assert read.returncode == 0 and read.stdout.split() == ["one"], read.stderr  # a consumer commits
    return configs, int(first.split(":")[0])


def stream_intact(config) -> None:
    info = dlog("stream", "info", "cart2", "--json", config=config)
    assert info.returncode == 0, info.stderr
    document = json.loads(info.stdout)
    assert document["records"] == 3 and "billing" in json.dumps(document["subscriptions"]), document


@pytest.mark.parametrize("role", ["consume", "produce"])
def test_without_the_admin_role_every_destructive_command_is_refused_in_one_line(principals, role):
    configs, ledger_id = principals
    for command in (["stream", "delete", "cart2"], ["stream", "alter", "cart2", "--roll-size", "1MiB"],
                    ["truncate", "cart2", "--before", "latest"], ["retention", "set", "cart2", "--age", "1s"],
                    ["retention", "apply", "cart2"], ["subscription", "reset", "cart2", "billing", "--to", "latest"],
                    ["subscription", "delete", "cart2", "billing"], ["ledger", "delete", str(ledger_id), "--force"],
                    ["ledger", "recover", str(ledger_id), "--force"]):
        line = one_error_line(dlog(*command, config=configs[role]))
        assert f"admin:{NAMESPACE}" in line, (command, line)
    stream_intact(configs["admin"])


@pytest.mark.parametrize("role", ["consume", "produce"])
def test_zookeeper_itself_refuses_what_only_admins_may(secure_cluster, principals, role):
    """The same, bypassing `dlog`: the principal's own ZooKeeper identities write directly."""
    configs, ledger_id = principals
    settings = load_client_settings(configs[role])
    client = KazooClient(hosts=secure_cluster.zk_address, timeout=10, auth_data=settings.zk_auth())
    client.start(timeout=10)
    stream = f"/dlog/{NAMESPACE}/streams/cart2"
    try:
        attempts = [lambda: client.delete(stream, recursive=True),
                    lambda: client.set(stream, b"{}"),
                    lambda: client.delete(f"{stream}/subscribers/billing")]
        if role == "consume":  # a producer writes segment lists and its ledgers: that is writing
            segments = client.get_children(f"{stream}/segments")
            attempts += [lambda: client.delete(f"{stream}/segments/{segments[0]}"),
                         lambda: client.set(f"{stream}/segments", b"{}"),
                         lambda: client.set(layout.ledger_path(secure_cluster.zk_root, ledger_id),
                                            b'{"deleted": true}'),
                         lambda: client.create(f"{stream}/lock/writer-intruder", b"")]
        for attempt in attempts:
            with pytest.raises(NoAuthError):
                attempt()
    finally:
        client.stop()
        client.close()
    stream_intact(configs["admin"])


def test_the_namespace_admin_may(principals):
    configs, _ = principals
    assert dlog("subscription", "reset", "cart2", "billing", "--to", "earliest", config=configs["admin"]).returncode == 0
    assert dlog("stream", "alter", "cart2", "--roll-size", "1MiB", config=configs["admin"]).returncode == 0
    deleted = dlog("stream", "delete", "cart2", config=configs["admin"])
    assert deleted.returncode == 0, deleted.stderr
    assert "cart2" not in dlog("stream", "list", config=configs["admin"]).stdout

"""The secure cluster from the command line: `dlog token create` makes a namespace's client.toml,
commands read it through --config / $DLOG_CONFIG and --token / $DLOG_TOKEN, and every refusal is
one line (no token, another namespace's credentials, an expired token, an insecure bookie off
loopback)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from tests.helpers import one_error_line
from dlog_tools.secure import write_admin_config


def dlog(*arguments: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("DLOG_")}
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments], input=stdin, text=True,
                          capture_output=True, timeout=120, env={**clean, **(env or {})})


def test_a_namespace_client_config_works_and_is_confined(secure_cluster, tmp_path):
    secure = secure_cluster.secure_dir
    admin_toml = write_admin_config(secure, secure_cluster.zk_address)
    shop_toml = tmp_path / "shop.toml"
    made = dlog("token", "create", "--role", "produce", "--role", "consume", "--namespace", "shop",
                "--client-config", str(shop_toml), "--config", str(admin_toml))
    assert made.returncode == 0, made.stderr
    token = tomllib.loads(shop_toml.read_text())["security"]["token"]
    assert token not in made.stdout + made.stderr and made.stdout.startswith(f"wrote {shop_toml}: a token for")
    shop = {"DLOG_CONFIG": str(shop_toml)}
    assert dlog("stream", "create", "cart", "--namespace", "shop", "--ensemble", "2", "--write-quorum", "2",
                env=shop).returncode == 0
    assert dlog("write", "cart", "--namespace", "shop", stdin="one\ntwo\n", env=shop).returncode == 0
    read = dlog("read", "cart", "--namespace", "shop", "--max", "2", env=shop)
    assert read.stdout.split() == ["one", "two"], read.stderr
    line = one_error_line(dlog("stream", "list", "--namespace", "orders", env=shop))
    assert "not open" in line
    import time

    from bookkeeper.security.tokens import TokenKey, create_token

    expired = create_token(TokenKey.from_file(secure.token_key), "late", ["produce:shop"], ttl_s=60,
                           now_s=time.time() - 3600)
    line = one_error_line(dlog("write", "cart", "--namespace", "shop", "--token", expired, stdin="x\n",
                               env=shop))
    assert "expired" in line


def test_without_a_config_a_secure_cluster_refuses_in_one_line(secure_cluster):
    line = one_error_line(dlog("stream", "list", "--namespace", "orders", "--zk", secure_cluster.zk_address))
    assert "not open" in line and "dlog token create" in line


def test_a_bookie_off_loopback_needs_tls_and_authentication_unless_refused_by_name(tmp_path):
    line = one_error_line(dlog("bookie", "start", "--dir", str(tmp_path), "--host", "10.1.2.3"))
    assert "--tls-cert" in line and "--insecure-plaintext" in line
    line = one_error_line(dlog("bookie", "start", "--dir", str(tmp_path), "--host", "10.1.2.3",
                               "--insecure-plaintext"))
    assert "--token-key" in line and "--allow-anonymous" in line

"""`dlog token create`: signed tokens for clients, and optionally their whole client.toml."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError
from dlog_tools.cli.common import fails_cleanly, zk_option
from dlog_tools.units import format_time_ms, parse_duration_ms

TTL_DEFAULT = "30d"  # docs/security.md


@click.group()
def token() -> None:
    """Make tokens (signed with the key named by client.toml's token_key_file)."""


@token.command("create")
@click.option("--role", "roles", multiple=True, required=True,
              type=click.Choice(["produce", "consume", "admin", "bookie"]),
              help="repeatable; with --namespace, produce/consume/admin are that namespace's")
@click.option("--namespace", default=None, help="the namespace the roles are for (none: cluster-wide admin)")
@click.option("--subject", default=None, help="the principal's name (default: app-<namespace> or admin)")
@click.option("--ttl", default=TTL_DEFAULT, show_default=True,
              help="lifetime, e.g. 12h or 90d; `never` for a token that does not expire (a token cannot be "
                   "revoked before it expires, only all at once by rotating the key)")
@click.option("--key", "key_file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="signing key (default: token_key_file of client.toml)")
@click.option("--client-config", "client_config_out", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="also write a client.toml for this principal (token, CA, the namespace's ZooKeeper "
                   "credentials) and create the namespace in ZooKeeper if needed")
@zk_option
@fails_cleanly
def token_create(roles: tuple[str, ...], namespace: str | None, subject: str | None, ttl: str,
                 key_file: str | None, client_config_out: Path | None, zk: str, zk_root: str) -> None:
    """Print a token with the given roles; with --client-config, write it into that file instead
    (and print only where it went and when it expires).

    Tokens expire: after --ttl, 30 days unless given; `--ttl never` must be asked for by name."""
    from bookkeeper.security.settings import load_client_settings
    from bookkeeper.security.tokens import TokenKey, create_token
    from dlog.names import check_subscription_name

    settings = load_client_settings()
    key_path = key_file or settings.token_key_file
    if key_path is None:
        raise ConfigError("no signing key: pass --key FILE or use an admin's client.toml (token_key_file)")
    if namespace is not None:
        check_subscription_name(namespace)
        scoped = [f"{role}:{namespace}" if role in ("produce", "consume", "admin") else role for role in roles]
    else:
        if set(roles) - {"admin", "bookie"}:
            raise ConfigError("produce and consume need --namespace NAME")
        scoped = list(roles)
    name = subject or (f"app-{namespace}" if namespace else "admin")
    ttl_ms = _ttl_ms(ttl)
    text = create_token(TokenKey.from_file(key_path), name, scoped,
                        ttl_s=ttl_ms / 1000 if ttl_ms is not None else None)
    if client_config_out is None:
        click.echo(text)
        return
    _write_client_config(client_config_out, settings, namespace, roles, text, zk, zk_root)
    expiry = "never expires" if ttl_ms is None else f"expires {format_time_ms(wall_ms() + ttl_ms, 'seconds')}"
    click.echo(f"wrote {client_config_out}: a token for {name} ({', '.join(scoped)}) that {expiry}")


def _ttl_ms(text: str) -> int | None:
    """--ttl: milliseconds, or None for `never`; 0 is refused (it would expire at once)."""
    if text.strip().lower() == "never":
        return None
    ttl_ms = parse_duration_ms(text)
    if ttl_ms <= 0:
        raise ConfigError(f"bad --ttl {text!r}: a token needs a lifetime, e.g. 30d; write --ttl never for one "
                          "that does not expire")
    return ttl_ms


def _write_client_config(path: Path, settings, namespace: str | None, roles: tuple[str, ...], text: str,
                         zk: str, zk_root: str) -> None:
    from bookkeeper.security.settings import namespace_settings
    from dlog_tools.secure import provision_namespace, write_client_toml

    if settings.tls is None or settings.tls.ca_file is None:
        raise ConfigError("--client-config needs an admin's client.toml with ca_file")
    zookeeper: dict = {}
    if namespace is not None:
        if settings.cluster_secret is None:
            raise ConfigError("--client-config for a namespace needs cluster_secret_file in client.toml")
        asyncio.run(provision_namespace(zk, settings, namespace, bookkeeper_root=zk_root))
        zookeeper = namespace_settings(settings.cluster_secret, namespace, [r for r in roles if r != "bookie"])
    write_client_toml(path, zk=zk, ca_file=Path(settings.tls.ca_file), token=text, **zookeeper)

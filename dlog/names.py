"""Stream and subscription names: which are allowed, and how a stream name becomes a ZooKeeper node.

A stream name is 1..200 characters from ``A-Z a-z 0-9 . _ -`` plus ``/`` between the parts of a
hierarchical name (``sales/eu/orders``). Each part is non-empty and must not start with ``.`` or
``_`` (both reserved for internal use, like DistributedLog's ``.``-prefixed names) and must not be
``zookeeper`` in any letter case (ZooKeeper's own node). The character set alone keeps a name
away from shell metacharacters, path traversal (``.`` and ``..`` start with ``.``), control
characters and percent signs; the part rules keep it away from every internal node we create now
(``_segments``-style names, ``zookeeper``) or later (anything starting with ``_``).

A whole stream lives under ONE ZooKeeper node whose name is the stream name with ``/`` written as
``%2F``. ``%`` never occurs in a valid name, so the mapping is reversible and two names never
share a node. A subscription name follows the same rules without ``/``.
"""

from __future__ import annotations

import re

from bookkeeper.errors import ConfigError, CorruptMetadataError

NAME_CHARS_MAX = 200
RESERVED_PREFIXES = (".", "_")
RESERVED_PARTS = frozenset({"zookeeper"})  # compared in lower case
NODE_SEPARATOR = "%2F"

_PART_CHARS = r"A-Za-z0-9._\-"
_BAD_STREAM_CHAR = re.compile(f"[^{_PART_CHARS}/]")
_BAD_PART_CHAR = re.compile(f"[^{_PART_CHARS}]")
_STREAM_RULE = "use 1-200 characters from A-Z a-z 0-9 . _ - with / between parts, e.g. sales/eu/orders"
_SUBSCRIPTION_RULE = "use 1-200 characters from A-Z a-z 0-9 . _ - (no /), e.g. billing-2"


def check_stream_name(name: str) -> str:
    """``name`` if it is a valid stream name, else ConfigError saying what is wrong and the rule."""
    _check_common(name, "stream", _BAD_STREAM_CHAR, _STREAM_RULE)
    if name == "/":
        raise ConfigError(f"bad stream name '/': it has no parts; {_STREAM_RULE}")
    if name.startswith("/") or name.endswith("/"):
        raise ConfigError(f"bad stream name {_shown(name)}: it starts or ends with '/'; {_STREAM_RULE}")
    if "//" in name:
        raise ConfigError(f"bad stream name {_shown(name)}: it has an empty part ('//'); {_STREAM_RULE}")
    for part in name.split("/"):
        _check_part(name, part, "stream", _STREAM_RULE)
    return name


def check_subscription_name(name: str) -> str:
    """``name`` if it is a valid subscription name (one part, no ``/``), else ConfigError."""
    _check_common(name, "subscription", _BAD_PART_CHAR, _SUBSCRIPTION_RULE)
    _check_part(name, name, "subscription", _SUBSCRIPTION_RULE)
    return name


def stream_node_name(name: str) -> str:
    """The one ZooKeeper node name (no ``/``) that holds stream ``name``."""
    return check_stream_name(name).replace("/", NODE_SEPARATOR)


def stream_name_from_node(node: str) -> str:
    """Inverse of `stream_node_name`; a node that no valid name maps to is CorruptMetadataError."""
    if not isinstance(node, str) or "/" in node:
        raise CorruptMetadataError(f"stream node {node!r} cannot come from stream_node_name")
    name = node.replace(NODE_SEPARATOR, "/")
    if "%" in name:
        raise CorruptMetadataError(f"stream node {_shown(node)} has a '%' not part of the separator {NODE_SEPARATOR}")
    try:
        return check_stream_name(name)
    except ConfigError as error:
        raise CorruptMetadataError(f"stream node {_shown(node)} holds no valid stream name: {error}") from error


def _check_common(name: str, kind: str, bad_char: re.Pattern[str], rule: str) -> None:
    if not isinstance(name, str):
        raise ConfigError(f"bad {kind} name {name!r}: it must be text, not {type(name).__name__}; {rule}")
    if not name:
        raise ConfigError(f"bad {kind} name '': it is empty; {rule}")
    if len(name) > NAME_CHARS_MAX:
        raise ConfigError(
            f"bad {kind} name {_shown(name)}: it has {len(name)} characters, over {NAME_CHARS_MAX}; {rule}"
        )
    found = bad_char.search(name)
    if found:
        char = found.group()
        described = "a control character" if not char.isprintable() else "not allowed"
        raise ConfigError(
            f"bad {kind} name {_shown(name)}: character {char!r} at position {found.start()} is {described}; {rule}"
        )


def _check_part(name: str, part: str, kind: str, rule: str) -> None:
    if part in (".", ".."):
        raise ConfigError(f"bad {kind} name {_shown(name)}: part {part!r} is a path step, not a name; {rule}")
    if part.startswith(RESERVED_PREFIXES):
        raise ConfigError(
            f"bad {kind} name {_shown(name)}: part {part!r} starts with {part[0]!r}, "
            f"which is reserved for internal names; {rule}"
        )
    if part.lower() in RESERVED_PARTS:
        raise ConfigError(f"bad {kind} name {_shown(name)}: part {part!r} is ZooKeeper's own node name; {rule}")


def _shown(name: str) -> str:
    """The name quoted for a message, cut short so a huge name cannot flood a log line."""
    if len(name) <= 60:
        return repr(name)
    return f"{name[:40]!r}... ({len(name)} characters)"

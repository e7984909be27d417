"""Topic schemes: how a queue manager reads topic strings (``mqtt`` or ``swiftmq``).

A queue manager has one scheme, recorded in ``{qm}:manager`` by the first worker
or subscribe that runs with it (``Settings.topic_scheme``). Every process that
routes, subscribes or publishes reads topics the same way, so a process whose
setting differs from the recorded one is refused with ``ConfigError`` rather than
matching differently from the others.

* ``mqtt``: ``/``-separated levels, ``+``/``#`` wildcards (MQTT 5 §4.7,
  ``broker.core.topic_rules``).
* ``swiftmq``: ``.``-separated nodes, SQL-LIKE predicate nodes after the root,
  publish/subscribe reaching parents and sub-nodes (SwiftMQ's Topic Manager,
  seed 003, ``broker.core.hierarchy``).

The **root topic** of a topic string is its first level (``mqtt``) or node
(``swiftmq``): slow-subscriber conditions are defined per root topic.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast

import redis

from broker.core import keys, wire
from broker.core.connection import as_bytes
from broker.core.errors import ConfigError, ForeignKey, translate_errors

SchemeName = Literal["mqtt", "swiftmq"]


class ManagerSettings(Protocol):
    """The settings ``record_manager`` reads (``broker.core.config.Settings`` has them: named here, not
    imported, since the settings' validation uses this module's ``separator``)."""

    @property
    def qm(self) -> str: ...
    @property
    def topic_scheme(self) -> str: ...
    @property
    def direct_subscriber_selection(self) -> bool: ...


#: The schemes, with the separator of their levels (nodes).
SEPARATORS: dict[str, str] = {"mqtt": "/", "swiftmq": "."}

DEFAULT_SCHEME: SchemeName = "mqtt"


def separator(scheme: str) -> str:
    """The level separator of ``scheme``: ``/`` (mqtt) or ``.`` (swiftmq).

    Raises:
        ConfigError: an unknown scheme.
    """
    try:
        return SEPARATORS[scheme]
    except KeyError:
        raise ConfigError(f"unknown topic scheme {scheme!r}; known: {', '.join(SEPARATORS)}") from None


def root_topic(topic: str, scheme: str) -> str:
    """The root topic of ``topic``: its first level (``mqtt``, may be empty) or node (``swiftmq``).

    Examples: ``root_topic("feed.bloomberg", "swiftmq") == "feed"``,
    ``root_topic("sport/tennis", "mqtt") == "sport"``.
    """
    return topic.partition(separator(scheme))[0]


def scheme_of(qm: str, manager: dict[Any, Any]) -> SchemeName:
    """The scheme recorded in the ``{qm}:manager`` hash as read (``mqtt`` when none is).

    Raises:
        ConfigError: the record holds an unknown scheme.
    """
    raw = manager.get(b"topic_scheme", manager.get("topic_scheme"))
    found = wire.lenient_text(raw) if raw is not None else DEFAULT_SCHEME
    if found not in SEPARATORS:
        raise ConfigError(
            f"{keys.manager(qm)} records an unknown topic scheme {found!r}; known: {', '.join(SEPARATORS)}"
        )
    return cast(SchemeName, found)


@translate_errors
def record_manager(client: redis.Redis, settings: ManagerSettings) -> None:
    """Record the queue manager's topic scheme and subscriber selection, or check them against ``settings``.

    The first process records them; every later one must agree (a worker calls this at start).

    Raises:
        ConfigError: the recorded scheme or selection mode differs from ``settings``.
        ForeignKey: ``{qm}:manager`` holds another Redis type.
    """
    qm = settings.qm
    recorded_scheme(client, qm, settings.topic_scheme)
    key = keys.manager(qm)
    wanted = "true" if settings.direct_subscriber_selection else "false"
    raw = client.hget(key, "direct_subscriber_selection")
    if raw is None:  # read first: a worker starting on a full server writes nothing once recorded
        client.hsetnx(key, "direct_subscriber_selection", wanted)
        raw = client.hget(key, "direct_subscriber_selection")
    found = wire.lenient_text(raw or b"true")
    if found != wanted:
        raise ConfigError(
            f"queue manager {qm} uses direct_subscriber_selection = {found} (recorded in {key}); this "
            f"process is configured with {wanted}: change the setting, or `broker reset` the queue manager"
        )


@translate_errors
def recorded_scheme(client: redis.Redis, qm: str, wanted: str | None = None) -> SchemeName:
    """The queue manager's topic scheme, recording ``wanted`` when none is recorded yet.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        wanted: the scheme this process is configured with; None only reads
            (``mqtt`` when nothing is recorded).

    Returns:
        The recorded scheme.

    Raises:
        ConfigError: ``wanted`` differs from the recorded scheme, or the record
            holds an unknown scheme.
        ForeignKey: ``{qm}:manager`` holds another Redis type.
    """
    key = keys.manager(qm)
    if wanted is not None:
        separator(wanted)
    try:
        raw = client.hget(key, "topic_scheme")
        if raw is None and wanted is not None:  # written only when absent: a user that may only
            client.hsetnx(key, "topic_scheme", wanted)  # read it (a subscriber) can still attach
            raw = client.hget(key, "topic_scheme")
    except redis.ResponseError as exc:
        if "WRONGTYPE" in str(exc):
            found_type = client.type(key)
            raise ForeignKey(key, as_bytes(found_type).decode(), "hash") from exc
        raise
    found = scheme_of(qm, {} if raw is None else {b"topic_scheme": raw})
    if wanted is not None and found != wanted:
        raise ConfigError(
            f"queue manager {qm} uses the topic scheme {found!r} (recorded in {key}); this process is "
            f"configured with {wanted!r}: set topic_scheme = {found!r}, or `broker reset` the queue manager"
        )
    return found

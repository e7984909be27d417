"""The broker's settings: one pydantic model, from a TOML file then ``BROKER_*`` variables.

Precedence, highest first: keyword overrides (the command line), ``BROKER_*``
environment variables, the TOML file (``--config``, else ``$BROKER_CONFIG``,
else ``configs/broker.toml`` in the working directory when it exists), then the
defaults below. Every duration is in milliseconds and every size in bytes.
Nothing is read at import time.
"""

from __future__ import annotations

import os
import re
import tomllib
from contextvars import ContextVar
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from broker.core.connection import TLSOptions
from broker.core.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("configs") / "broker.toml"

#: Limits against abuse (``Settings``): their defaults, also those of the library functions
#: that take them (``broker.topics.subscriptions.subscribe``).
DEFAULT_MAX_PROPERTIES_BYTES = 65_536
DEFAULT_MAX_TOPIC_BYTES = 4_096
DEFAULT_MAX_TOPIC_LEVELS = 32
DEFAULT_MAX_SELECTOR_BYTES = 10_240
DEFAULT_MAX_SUBSCRIPTIONS_PER_CLIENT = 1_000
DEFAULT_MAX_CONSUMERS_PER_SUBSCRIPTION = 1_000

_file_values: ContextVar[dict[str, Any] | None] = ContextVar("_file_values", default=None)


class _TomlSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_file_values.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_file_values.get() or {})


#: How the consumers of one subscription share it: ``exclusive`` (one consumer;
#: a second is refused, Jakarta Messaging 3.1 §6.11.1 for unshared durable
#: subscriptions), ``shared`` (each message to one of many consumers) or
#: ``activestandby`` (one active consumer; others wait and take over within a
#: lease when it dies: SwiftMQ's queue controllers, seed 003).
ConsumerModeName = Literal["exclusive", "shared", "activestandby"]


class ConsumerMode(BaseModel):
    """One rule of ``Settings.consumer_modes``: subscriptions whose id is SQL-LIKE ``predicate`` get ``mode``.

    Attributes:
        predicate: a SQL LIKE pattern on the subscription id (``%`` any run, ``_`` one character).
        mode: the consumer mode of those subscriptions.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    predicate: str = Field(min_length=1)
    mode: ConsumerModeName

    @field_validator("predicate")
    @classmethod
    def _predicate_valid(cls, value: str) -> str:
        return _like_pattern(value)


def _like_pattern(value: str) -> str:
    """``value`` when it is a valid SQL LIKE pattern (``broker.core.selectors.like``).

    Raises:
        ValueError: (``InvalidSelector``) it is not; the message says why.
    """
    from broker.core.selectors import like

    like(value, "")
    return value


#: A queue controller's persistence mode (SwiftMQ's ``persistence-mode``, seed 003): ``as_message``
#: keeps each publication's own delivery mode; ``persistent`` and ``non_persistent`` give every
#: message of the matching subscriptions that Jakarta Messaging delivery mode (JMSDeliveryMode).
QueuePersistenceMode = Literal["as_message", "persistent", "non_persistent"]


class QueueController(BaseModel):
    """One of ``Settings.queue_controllers`` (SwiftMQ's queue controllers, seed 003).

    A subscription whose id (``<client id>$<name>``) the SQL LIKE ``predicate`` matches
    takes its attributes from the first controller that matches, in the list's order
    (SwiftMQ matches its controllers top-down in the lexical order of their names; a
    TOML list has an order of its own, which is the one used).

    Attributes:
        name: a name for the operator (SwiftMQ's ``01``, ``02``...); "" for none. Two
            controllers may not have the same non-empty name.
        predicate: a SQL LIKE pattern on the subscription id (``%`` any run, ``_`` one
            character; ``$`` is an ordinary character), e.g. ``tmp$%``.
        persistence_mode: ``as_message`` (the default: each publication keeps its own
            delivery mode), ``persistent`` or ``non_persistent``: the delivery mode of the
            messages of the matching subscriptions: the ``JMSDeliveryMode`` their consumers
            see, and whether a full subscriber queue is handled under PMSGDLV or NPMSGDLV
            and by the slow-subscriber conditions of that persistence mode. Applied by the
            worker when every subscriber queue of a publication agrees (docs/design.md,
            "Queue controllers").
        consumer_mode: how the consumers of a matching subscription share it
            (``exclusive``, the default; ``shared``; ``activestandby``); a subscription made
            shared (``--shared``, ``$share/``) is always shared.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    predicate: str = Field(min_length=1)
    persistence_mode: QueuePersistenceMode = "as_message"
    consumer_mode: ConsumerModeName = "exclusive"

    @field_validator("predicate")
    @classmethod
    def _predicate_valid(cls, value: str) -> str:
        return _like_pattern(value)

    @property
    def forced_persistent(self) -> bool | None:
        """The delivery mode it gives its subscriptions' messages (True: persistent), or None for ``as_message``."""
        if self.persistence_mode == "as_message":
            return None
        return self.persistence_mode == "persistent"


#: Which publications a slow-subscriber condition looks at, by their delivery mode (JMSDeliveryMode).
PersistenceMode = Literal["all", "persistent", "non_persistent"]

#: Which subscriptions a slow-subscriber condition looks at: ``local`` ones (every
#: subscription made on this queue manager), ``remote`` ones (the channels to other queue
#: managers: their transmission streams' undelivered entries) or ``all``.
SubscriptionType = Literal["all", "local", "remote"]


class SlowSubscriberCondition(BaseModel):
    """One of ``Settings.slow_subscriber_conditions`` (SwiftMQ's Topic Manager, seed 003).

    During a publication's unit of work, a subscriber queue that holds ``max_messages``
    messages or more (every priority band) gets no copy of a publication on the
    condition's root topic (or any topic below it) whose delivery mode matches
    ``persistence_mode``; the other subscribers get theirs, and the publication counts
    as delivered. The withheld copy is counted in ``{qm}:skipped`` and ``{qm}:slow``.
    Once the queue holds fewer than ``max_messages``, it gets publications again.

    A slow subscription is withheld publications before the queue's MAXDEPTH is
    looked at, so a slow subscriber never gets a publication refused under
    PMSGDLV(ALL).

    Attributes:
        name: the root topic: the first level (``mqtt``: ``sport`` for ``sport/tennis``;
            "" for the topics beginning with ``/``) or node (``swiftmq``: ``feed`` for
            ``feed.bloomberg``) of the topics it covers (``broker.core.schemes.root_topic``).
        max_messages: messages waiting in a subscriber queue (every priority band) at
            which it counts as slow, >= 1.
        persistence_mode: the publications it applies to: ``persistent``,
            ``non_persistent`` (the default) or ``all``; a publication's delivery mode
            is its own, else its topic's DEFPSIST, else persistent.
        subscription_type: the subscriptions it applies to: ``local`` matches every
            subscription of this queue manager; ``remote`` the channels to other queue
            managers (SwiftMQ: "for remote subscriptions the subscriber queue is the routing
            queue"), counted by the entries of a transmission stream the receiver has not
            filed yet (not the filed ones it keeps for ``retention_ms``), watched by the
            channel process each ``network_poll_ms`` (``broker.network.slow_routes``): a
            channel that far behind gets no further publication of the root topic until it
            is below ``max_messages`` again; ``all`` both. A ``remote`` condition costs the
            workers nothing until a channel is withheld from. On a remote route either
            ``disconnect_*`` option removes the proxy subscriptions of the root topic behind
            that channel, until their queue managers announce again.
        disconnect_non_durable_subscriber: also remove a non-durable (local) subscription it
            matches (with its queue and its consumers' in-flight messages), right after
            the unit of work, logged at WARNING.
        disconnect_delete_durable_subscriber: also delete a durable subscription it
            matches with all its messages, right after the unit of work, logged at
            WARNING. The messages are lost: use it for dead durable subscriptions.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    max_messages: int = Field(default=500, ge=1)
    persistence_mode: PersistenceMode = "non_persistent"
    subscription_type: SubscriptionType = "all"
    disconnect_non_durable_subscriber: bool = False
    disconnect_delete_durable_subscriber: bool = False

    def applies(self, persistent: bool) -> bool:
        """Whether the condition looks at a publication with this delivery mode at all.

        False for a ``remote`` condition (the channel process watches the remote routes,
        not the unit of work) and for a publication whose delivery mode ``persistence_mode``
        leaves out.
        """
        if self.subscription_type == "remote":
            return False
        if self.persistence_mode == "all":
            return True
        return persistent == (self.persistence_mode == "persistent")


class Settings(BaseSettings):
    """Everything a worker, publisher or command needs to know.

    Attributes:
        redis_url: the Redis server (``redis://host:port/db``, ``rediss://`` for
            TLS, ``unix:///path``), or a Redis Cluster (``redis+cluster://host:port``,
            any one node; ``rediss+cluster://`` for TLS; database 0 only); default
            the embedded server that ``broker server`` runs on port 6380.
        tls_ca_file: TLS (a ``rediss://`` or ``rediss+cluster://`` URL): PEM file of
            the CA(s) that signed the server's certificate; empty (the default) for
            the system's trusted CAs. Every client the broker makes (workers, the
            channel process and its peers, the scheduler and its jobs, the command
            line, Spark tasks, ``broker cli``) uses these four settings.
        tls_cert_file: TLS: PEM file of the client certificate, for a server that
            requires one (``tls-auth-clients yes``, mutual TLS); empty for none. It
            may hold the private key too.
        tls_key_file: TLS: PEM file of the client certificate's private key
            (unencrypted); empty when ``tls_cert_file`` holds it.
        tls_verify: TLS: verify the server's certificate against the CA and that it
            names the URL's host (as redis-py does); false only for tests. Any
            ``tls_*`` setting with a URL that is not ``rediss://`` or
            ``rediss+cluster://``, or a file that is missing or not PEM, is an error.
        qm: queue manager name; every key is under the hash tag ``{qm}``.
        concurrency: worker processes in the pool.
        batch_size: most publication entries one dequeue reads.
        heads: most FIFO entries handled per publisher whose turn a worker holds, per round.
        lease_ms: lease of a publisher's turn, ms; a dead worker's turn is
            taken over after at most this long.
        block_ms: how long an idle worker blocks waiting for entries, ms.
        sweep_interval_ms: how often a worker sweeps for orphaned publishers, ms.
        trim_every_entries: a worker removes the acknowledged entries from the publish stream
            (``maintenance.trim_acknowledged``) once it has committed this many since its last
            trim and has nothing to do (16 times this many while it is busy), one worker at a
            time (``{qm}:trim_lock``), so that draining the subscriptions frees memory without
            the scheduler's trim job. 0: only the trim job trims.
        dedup_window_ms: how long a delivered message id is remembered, ms. Each
            record costs about 120 bytes, so memory is ~120 B x rate x window
            (10 minutes at 20,000 publications/s: about 1.4 GB).
        reply_ttl_ms: how long a publication's result is kept for its publisher, ms.
        max_body_bytes: largest body accepted, bytes; larger ones are dead-lettered.
        max_properties_bytes: largest ``props`` field (the user properties' JSON) accepted,
            bytes; a publication with a larger one is dead-lettered with the reason (and
            "refused" is posted to a publisher that waits).
        max_topic_bytes: longest topic accepted, bytes of UTF-8 (MQTT allows 65,535): a
            publication on a longer topic is dead-lettered, a subscription to a longer
            filter is refused (``InvalidTopicFilter``), 1-65,535.
        max_topic_levels: most levels (``/``; swiftmq: ``.`` nodes) in a topic, as
            ``max_topic_bytes``; bounds the work of matching one publication.
        max_selector_bytes: longest message selector a subscription may have, bytes of UTF-8;
            a longer one is refused when the subscription is made (``SelectorTooComplex``),
            and the routing table skips a stored record over it (``broker status`` names it).
            A selector is evaluated for every publication its subscription's filter matches:
            a 768 KB one (60,000 comparisons) added 23 ms to each. The default, 10,240, is IBM
            MQ's MQ_SELECTOR_LENGTH, the most a selection string may have there, so a selector
            an MQ application uses fits; the work is bounded further, whatever the size, by
            ``broker.core.selectors`` (``MAX_TERMS`` 1,000 terms, nesting ``MAX_DEPTH``/``MAX_PARENS``).
        max_subscriptions_per_client: most subscriptions one client id may have (counted in
            the transaction that writes a new one; a ``$share/<ShareName>/`` one counts under
            its ShareName); a new one beyond it is refused (``TooManySubscriptions``).
            0: no limit.
        max_consumers_per_subscription: most live consumers (leases running) one subscription
            may have; one more is refused (``TooManyConsumers``) before anything is written.
            0: no limit.
        default_maxdepth: MAXDEPTH of every subscriber queue that no topic object bounds,
            messages: ``SYSTEM.BASE.TOPIC``'s MAXDEPTH when it says NOLIMIT (an object's
            own MAXDEPTH, NOLIMIT included, still wins below it). A full queue is then
            handled as for any MAXDEPTH (``PMSGDLV``/``NPMSGDLV``: by default, ALLAVAIL, a
            full queue is skipped and counted in ``{qm}:skipped``; under ALL or ALLDUR a
            topic object can have it refuse the publication as a whole). 0 (the default):
            unbounded.
        stop_grace_ms: how long the pool waits for workers after SIGTERM, ms.
        journal: write a delivery journal record per publication, in its unit of work.
        journal_max_len: approximate cap of the journal stream, records.
        dead_letter_max_len: approximate cap of the dead-letter stream, records;
            the oldest dead letters are dropped beyond it (a body over
            max_body_bytes is never copied there, so a record is small).
        max_deliveries: an entry taken over this many times without being
            handled (its workers keep dying on it) is dead-lettered. A death is charged to
            every head the dead worker held, except in a round that handles one entry alone (a
            suspect, delivered 3 times or more, or an entry behind one): then to that entry
            only, so a healthy entry is never dead-lettered for another's (``worker.suspects``).
            Waiting (a foreign key, a lost connection) counts nothing.
        consumer_lease_ms: a consumer that has not renewed its lease (each receive
            and heartbeat does) for this long is dead: its in-flight messages go
            back to the queue and another consumer may take over, ms.
        subscription_expiry_ms: a non-durable subscription whose consumers have
            all been dead for this long is removed with its queue (MQTT 5 session
            expiry), ms. Durable subscriptions stay.
        durable_idle_expiry_ms: a durable subscription that no consumer has used for
            this long (its last consumer closed, or its lease ran out, that long
            ago) is deleted with its messages by the scheduler's admin job, ms;
            0 (the default) keeps durable subscriptions until they are deleted.
        max_redeliveries: a message whose consumers died this many times without
            acknowledging it is dead-lettered instead of delivered again.
        expired_to_dlq: a message that expires while waiting in a subscriber
            queue is dead-lettered (it is always counted and never delivered).
        queue_controllers: SwiftMQ's queue controllers (seed 003; ``QueueController``):
            ordered ``{name, predicate, persistence_mode, consumer_mode}``; the first whose
            SQL LIKE predicate matches a subscription's id gives its consumer mode (when it
            is made) and its messages' delivery mode (``persistence_mode``, applied by the
            workers). TOML: ``[[queue_controllers]]`` tables. None matching: exclusive, and
            each publication's own delivery mode. A worker with no controller forcing a
            persistence mode does no work per publication for them.
        consumer_modes: the older, mode-only form of ``queue_controllers``: ordered rules
            ``{predicate, mode}``, looked at after every queue controller; the first whose SQL
            LIKE predicate matches a new subscription's id gives its consumer mode; none
            matching: ``exclusive``. A subscription made shared (``--shared``, ``$share/``)
            is always shared.
        topic_scheme: how topic strings are read, for the whole queue manager:
            ``mqtt`` (``/`` levels, ``+`` and ``#`` wildcards, MQTT 5 §4.7) or
            ``swiftmq`` (``.`` nodes, SQL-LIKE predicate nodes, hierarchy rules
            of SwiftMQ's Topic Manager, seed 003; ``broker.core.hierarchy``). The first
            worker or subscribe records it in ``{qm}:manager``; a process whose
            setting differs is refused (``broker reset`` to change it).
        direct_subscriber_selection: swiftmq scheme: a publication's topic is a
            plain string matched against the subscriptions' predicates (true, the
            default); false: it is itself a predicate selecting among the declared
            topics, whose subscribers receive it (SwiftMQ's indirect selection).
        topics: declared topics (SwiftMQ's ``<topics>``), added to those declared
            with ``broker topic declare``; indirect selection picks among them.
        flowcontrol_enabled: delay-based flow control (SwiftMQ's Topic Manager, seed
            003): each unit of work works out a delay from the depth of the subscriber
            queues it delivered to, and the publisher waits that long before its next
            publication (``flow_control_delay_ms`` in the result; the
            ``{qm}:pub:<publisher>:flow`` key for a publisher that does not wait for
            results). The delay is that of the slowest subscriber (the deepest queue).
            False: no delay is worked out or asked for, at no cost.
        flow_control_start_depth: depth of a subscriber queue (messages in the priority
            band a publication goes to, itself included) up to which the delay is 0.
        flow_control_full_depth: depth, messages, at which the delay reaches
            ``flow_control_max_delay_ms``; in between it grows linearly:
            ``max_delay * (depth - start) / (full - start)`` ms, rounded down. Must be
            above ``flow_control_start_depth``.
        flow_control_max_delay_ms: the largest delay asked of a publisher, ms.
        slow_subscriber_conditions: per root topic, when a subscriber is too slow to
            get more publications (``SlowSubscriberCondition``); at most one per
            root topic. TOML: ``[[slow_subscriber_conditions]]`` tables with
            ``name = "feed"``, ``max_messages = 100``, ... A publication whose root
            topic has none costs nothing more.
        network_poll_ms: how often a channel process (``broker channel``) looks at the
            network's announcements and topic objects and reconciles its queue manager's
            proxy subscriptions, ms (SwiftMQ's subscription exchange, seed 003).
        channel_batch: most transmission entries a channel mover moves per call.
        channel_max_backoff_ms: the longest pause of a channel mover whose receiver cannot be
            reached; it doubles from 100 ms up to this, ms, and is reported in ``status --network``.
        security: run with Redis ACL users (``broker.operations.acl``): the embedded server starts with
            the default user off and an ACL file in its data directory holding one user, the
            one ``redis_url`` names (``redis://user:password@host:port/0``; it is allowed
            everything: give workers and others their own users with ``broker acl add``);
            ``broker publish`` publishes through the ingress stream of the user it is
            authenticated as (``broker.core.principals``).
        server_port: TCP port of the embedded server.
        server_dir: data directory of the embedded server.
        server_config: a redis.conf for the embedded server; empty (the default)
            for the one shipped in the package, ``broker/conf/redis.conf``
            (AOF every second, noeviction). A file that does not exist is an error.
        console_host: the address the web console (``broker console``) listens on; the
            loopback address by default: put a TLS proxy in front to serve it further.
        console_port: TCP port of the web console.
        console_session_idle_ms: a console login unused for this long is logged out, ms.
        log_format: how every broker process logs (``broker.core.logs``): ``text`` (one line per
            record, control characters escaped) or ``json`` (one JSON object per line, for
            log shippers); a line about a publication carries its ``msgid``, ``publisher``
            and ``entry_id``. ``broker --log-format``, ``BROKER_LOG_FORMAT``.
        log_level: the least severe level logged: ``DEBUG``, ``INFO`` (the default),
            ``WARNING``, ``ERROR`` or ``CRITICAL`` (any case). ``broker --log-level``,
            ``BROKER_LOG_LEVEL``.
        metrics_port: TCP port on which the worker pool serves Prometheus metrics on
            ``/metrics`` (``broker.operations.metrics``: its workers' counters and histograms, and what it
            samples from Redis at scrape time); 0 (the default): no metrics, and the workers
            record nothing, at no cost. ``broker metrics`` serves the sampled ones alone.
        metrics_host: the address the metrics server binds to (default 127.0.0.1, this
            machine only; 0.0.0.0 for every interface).
        metrics_max_subscriptions: most subscriptions given their own series (depth, in
            flight, consumers, redelivered) at each scrape: the deepest ones; the totals cover
            every subscription. Bounds the label set Prometheus stores.
        metrics_max_topics: most topic strings given their own series of topic statistics
            (``broker.operations.topic_stats``) at each scrape: those with the most publications;
            the others are one series without the ``topic`` label.
        topic_stats_max_topics: most topic strings whose statistics (publications, copies, last
            publication: IBM MQ ``DISPLAY TPSTATUS``) are kept on their own, in each worker's memory
            and in Redis; publications on the others are counted together as "(other topics)".
            0: no topic statistics, and the workers do no work for them.
        topic_stats_flush_ms: how often each worker adds its topic counts to Redis, ms; a worker
            killed between two flushes loses at most this long of counts (statistics, not guarantees).
    """

    model_config = SettingsConfigDict(env_prefix="BROKER_", extra="forbid")

    redis_url: str = "redis://127.0.0.1:6380/0"
    # TLS of the clients (rediss://, rediss+cluster://): one block, checked by _tls_usable.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_verify: bool = True
    qm: str = Field(default="QM1", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    concurrency: int = Field(default=2, ge=1, le=64)
    batch_size: int = Field(default=500, ge=1, le=5_000)
    heads: int = Field(default=500, ge=1, le=5_000)
    lease_ms: int = Field(default=30_000, ge=10)
    block_ms: int = Field(default=1_000, ge=1)
    sweep_interval_ms: int = Field(default=1_000, ge=1)
    trim_every_entries: int = Field(default=256, ge=0)
    dedup_window_ms: int = Field(default=600_000, ge=1)
    reply_ttl_ms: int = Field(default=60_000, ge=1)
    max_body_bytes: int = Field(default=1_048_576, ge=0, le=512 * 1024 * 1024)
    max_properties_bytes: int = Field(default=DEFAULT_MAX_PROPERTIES_BYTES, ge=0, le=512 * 1024 * 1024)
    max_topic_bytes: int = Field(default=DEFAULT_MAX_TOPIC_BYTES, ge=1, le=65_535)
    max_topic_levels: int = Field(default=DEFAULT_MAX_TOPIC_LEVELS, ge=1, le=65_535)
    max_selector_bytes: int = Field(default=DEFAULT_MAX_SELECTOR_BYTES, ge=1, le=1_048_576)
    max_subscriptions_per_client: int = Field(default=DEFAULT_MAX_SUBSCRIPTIONS_PER_CLIENT, ge=0)
    max_consumers_per_subscription: int = Field(default=DEFAULT_MAX_CONSUMERS_PER_SUBSCRIPTION, ge=0)
    default_maxdepth: int = Field(default=0, ge=0)
    stop_grace_ms: int = Field(default=10_000, ge=0)
    journal: bool = False
    journal_max_len: int = Field(default=1_000_000, ge=1)
    dead_letter_max_len: int = Field(default=100_000, ge=1)
    max_deliveries: int = Field(default=5, ge=2)
    consumer_lease_ms: int = Field(default=10_000, ge=10)
    subscription_expiry_ms: int = Field(default=60_000, ge=0)
    durable_idle_expiry_ms: int = Field(default=0, ge=0)
    max_redeliveries: int = Field(default=10, ge=0)
    expired_to_dlq: bool = False
    queue_controllers: list[QueueController] = Field(default_factory=list)
    consumer_modes: list[ConsumerMode] = Field(default_factory=list)
    topic_scheme: Literal["mqtt", "swiftmq"] = "mqtt"
    direct_subscriber_selection: bool = True
    topics: list[str] = Field(default_factory=list)
    flowcontrol_enabled: bool = True
    flow_control_start_depth: int = Field(default=1_000, ge=0)
    flow_control_full_depth: int = Field(default=100_000, ge=1)
    flow_control_max_delay_ms: int = Field(default=1_000, ge=1, le=3_600_000)
    slow_subscriber_conditions: list[SlowSubscriberCondition] = Field(default_factory=list)
    network_poll_ms: int = Field(default=200, ge=1)
    channel_batch: int = Field(default=500, ge=1, le=10_000)
    channel_max_backoff_ms: int = Field(default=5_000, ge=100)
    security: bool = False
    server_port: int = Field(default=6380, ge=1, le=65535)
    server_dir: str = ".broker"
    server_config: str = ""
    console_host: str = "127.0.0.1"
    console_port: int = Field(default=8470, ge=1, le=65535)
    console_session_idle_ms: int = Field(default=8 * 3_600_000, ge=1_000)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    metrics_port: int = Field(default=0, ge=0, le=65_535)
    metrics_host: str = "127.0.0.1"
    metrics_max_subscriptions: int = Field(default=50, ge=0, le=10_000)
    metrics_max_topics: int = Field(default=20, ge=0, le=10_000)
    topic_stats_max_topics: int = Field(default=1_000, ge=0, le=1_000_000)
    topic_stats_flush_ms: int = Field(default=1_000, ge=10)

    @field_validator("redis_url")
    @classmethod
    def _url_scheme(cls, value: str) -> str:
        if not value.startswith(
            ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
        ):
            raise ValueError(
                "must start with redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://"
            )
        return value

    @model_validator(mode="after")
    def _tls_usable(self) -> Settings:
        self.tls.client_options(self.redis_url)  # raises ConfigError (a ValueError): names the setting
        return self

    @property
    def tls(self) -> TLSOptions:
        """The ``tls_*`` settings, as ``connect(url, tls=...)`` and ``wait_for_server`` take them."""
        return TLSOptions(self.tls_ca_file, self.tls_cert_file, self.tls_key_file, self.tls_verify)

    @field_validator("server_config")
    @classmethod
    def _server_config_exists(cls, value: str) -> str:
        try:
            found = Path(value).is_file() if value else True
        except OSError as exc:  # a name too long, a directory that cannot be searched
            raise ValueError(f"cannot look at {value[:80]!r}: {exc.strerror}") from None
        if not found:
            raise ValueError(f"no such file: {value!r} (leave it empty for the packaged redis.conf)")
        return value

    @field_validator("queue_controllers")
    @classmethod
    def _controller_names_unique(cls, value: list[QueueController]) -> list[QueueController]:
        seen: set[str] = set()
        for controller in value:
            if controller.name and controller.name in seen:
                raise ValueError(
                    f"two queue controllers are named {controller.name!r}; give each its own name"
                )
            seen.add(controller.name)
        return value

    @field_validator("topics")
    @classmethod
    def _declared_valid(cls, value: list[str]) -> list[str]:
        from broker.core.hierarchy import validate_topic

        for topic in value:
            validate_topic(topic)  # raises InvalidTopic, a ValueError
        return value

    @field_validator("flow_control_full_depth")
    @classmethod
    def _full_above_start(cls, value: int, info: ValidationInfo) -> int:
        start = info.data.get("flow_control_start_depth")
        if start is not None and start >= value:
            raise ValueError(f"must be above flow_control_start_depth ({start}), not {value}")
        return value

    @field_validator("slow_subscriber_conditions")
    @classmethod
    def _one_condition_per_root_topic(
        cls, value: list[SlowSubscriberCondition], info: ValidationInfo
    ) -> list[SlowSubscriberCondition]:
        from broker.core.schemes import separator

        scheme = info.data.get("topic_scheme", "mqtt")
        sep = separator(scheme)
        seen: set[str] = set()
        for condition in value:
            name = condition.name
            if name in seen:
                raise ValueError(
                    f"two conditions for the root topic {name!r}; give each root topic at most one"
                )
            seen.add(name)
            bad = [c for c in (sep, "+", "#", "\x00") if c in name]
            if bad:
                raise ValueError(
                    f"{name!r} is not a root topic of the {scheme} scheme (it contains {bad[0]!r}): "
                    f"give the first level of the topics, e.g. {name.split(sep)[0]!r}"
                )
        return value

    def url_credentials(self) -> tuple[str | None, str | None]:
        """The user name and password in ``redis_url`` (None when it has none), URL-decoded."""
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(self.redis_url)
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        return user, password

    def flow_control_delay_ms(self, depth: int) -> int:
        """The flow-control delay for a subscriber queue ``depth`` messages deep, ms (``commit.lua``'s twin).

        0 up to ``flow_control_start_depth``, ``flow_control_max_delay_ms`` from
        ``flow_control_full_depth`` on, linear (rounded down) in between; 0 with flow control off.
        """
        start, full, most = (
            self.flow_control_start_depth,
            self.flow_control_full_depth,
            self.flow_control_max_delay_ms,
        )
        if not self.flowcontrol_enabled or depth <= start:
            return 0
        if depth >= full:
            return most
        return most * (depth - start) // (full - start)

    @property
    def controllers(self) -> list[QueueController]:
        """Every queue controller in matching order: ``queue_controllers``, then each rule of
        ``consumer_modes`` as a controller that keeps the publications' delivery mode."""
        rules = [QueueController(predicate=r.predicate, consumer_mode=r.mode) for r in self.consumer_modes]
        return [*self.queue_controllers, *rules]

    def queue_controller(self, sub_id: str) -> QueueController | None:
        """The queue controller of subscription ``sub_id``: the first of ``controllers`` whose
        predicate matches it, or None."""
        return first_controller(self.controllers, sub_id)

    def consumer_mode(self, sub_id: str) -> ConsumerModeName:
        """The consumer mode of subscription ``sub_id``: its queue controller's, else exclusive."""
        controller = self.queue_controller(sub_id)
        return controller.consumer_mode if controller is not None else "exclusive"

    def server_config_file(self) -> str:
        """The redis.conf ``broker server`` loads: ``server_config``, or the one shipped in the package."""
        if self.server_config:
            return self.server_config
        return str(resources.files("broker").joinpath("conf", "redis.conf"))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls))


def first_controller(controllers: list[QueueController], sub_id: str) -> QueueController | None:
    """The first of ``controllers`` whose SQL LIKE predicate matches the subscription id ``sub_id``, or None."""
    from broker.core.selectors import like

    for controller in controllers:
        if like(controller.predicate, sub_id):
            return controller
    return None


def read_toml(path: str | Path, where: str) -> dict[str, Any]:
    """Read a TOML file (settings, topic objects, the network), every failure one clear error.

    Args:
        path: the file.
        where: how messages name it, e.g. ``network file configs/network.toml``.

    Raises:
        ConfigError: the file does not exist, cannot be read, is not UTF-8, not TOML, or nested
            too deeply.
    """
    try:
        with Path(path).open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"{where} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not valid TOML: not UTF-8 ({exc.reason})") from exc
    except RecursionError as exc:
        raise ConfigError(f"{where} is not valid TOML: nested too deeply") from exc


def _line_of(path: Path | None, loc: tuple[Any, ...]) -> str:
    """Where the setting an error names is in the TOML file: `` (line N)``, or "" when it is not there.

    ``loc`` is pydantic's location: ``("qm",)`` is the line ``qm = ...``; ``("queue_controllers", 1,
    "predicate")`` is the ``predicate =`` line of the second ``[[queue_controllers]]`` table (else
    that table's header, or the ``queue_controllers =`` line of an inline array). Read only when
    the settings are refused.
    """
    if path is None or not loc or not isinstance(loc[0], str):
        return ""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    name = re.escape(loc[0])
    if len(loc) > 1 and isinstance(loc[1], int):
        tables = [n for n, line in enumerate(lines, 1) if re.match(rf"\s*\[\[\s*{name}\s*\]\]", line)]
        if loc[1] < len(tables):
            start = tables[loc[1]]
            if len(loc) > 2 and isinstance(loc[2], str):  # the key's own line in that table
                key = re.escape(loc[2])
                for n in range(start, len(lines)):
                    if re.match(r"\s*\[", lines[n]):
                        break
                    if re.match(rf"\s*{key}\s*=", lines[n]):
                        return f" (line {n + 1})"
            return f" (line {start})"
    for n, line in enumerate(lines, 1):
        if re.match(rf"\s*{name}\s*=", line):
            return f" (line {n})"
    return ""


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Load and validate the settings.

    Args:
        config_file: a TOML file; None means ``$BROKER_CONFIG``, else
            ``configs/broker.toml`` if it exists, else no file.
        **overrides: values that win over the file and the environment
            (None values are ignored).

    Returns:
        The validated ``Settings``.

    Raises:
        ConfigError: the file is missing, unreadable or not TOML, names an
            unknown setting, or a value (from the file or the environment) is invalid.
    """
    path: Path | None
    if config_file is not None:
        path = Path(config_file)
    elif os.environ.get("BROKER_CONFIG"):
        path = Path(os.environ["BROKER_CONFIG"])
    else:
        path = DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None
    values: dict[str, Any] = {}
    if path is not None:
        values = read_toml(path, f"config file {str(path)!r}")
        unknown = sorted(set(values) - set(Settings.model_fields))
        if unknown:
            raise ConfigError(f"config file {str(path)!r}: unknown setting(s) {', '.join(unknown)}")
    token = _file_values.set(values)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        where = f"config file {str(path)!r} / BROKER_* environment" if path else "BROKER_* environment"
        problems = "; ".join(
            (f"{'.'.join(str(p) for p in err['loc'])}: " if err["loc"] else "")
            + err["msg"]
            + _line_of(path, err["loc"])
            for err in exc.errors()
        )
        raise ConfigError(f"invalid settings ({where}): {problems}") from exc
    finally:
        _file_values.reset(token)

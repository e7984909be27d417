"""A JMS-style publish/subscribe broker on Redis.

Publishers ``XADD`` publications to ``{qm}:publish``; a pool of workers fans
each one out, in per-publisher order and in one atomic unit of work, to every
subscriber queue whose filter matches its topic or a topic linked from it.
The wire protocol is documented in ``broker.core.keys``.
"""

from broker.clients.consumer import Delivery, Subscriber
from broker.clients.control import request_subscription, request_unsubscribe
from broker.clients.publish import Publisher, PublishResult
from broker.core.config import Settings, load_settings
from broker.core.connection import connect
from broker.core.errors import (
    BrokerError,
    ClusterUnsupported,
    ConfigError,
    ConnectionLost,
    ConsumerConflict,
    CorruptRecord,
    ForeignKey,
    InvalidLink,
    InvalidMessage,
    InvalidName,
    InvalidSelector,
    InvalidTopic,
    InvalidTopicFilter,
    LibraryMissing,
    LinkCycle,
    NoSuchLink,
    NoSuchSubscription,
    NotAuthorized,
    PublicationRefused,
    ReplyTimeout,
    RequestRefused,
    SelectorTooComplex,
    ServerError,
    ServerFull,
    ServerNotFound,
    SubscriptionConflict,
    TooManyConsumers,
    TooManySubscriptions,
)
from broker.core.keys import PROTOCOL_VERSION
from broker.core.models import Message
from broker.core.selectors import like, select
from broker.core.topic_rules import matches, validate_filter, validate_topic
from broker.operations.status import status
from broker.topics.explain import explain
from broker.topics.links import link, list_links, unlink, unlink_all
from broker.topics.subscriptions import list_subscriptions, subscribe, unsubscribe

__all__ = [
    "PROTOCOL_VERSION",
    "BrokerError",
    "ClusterUnsupported",
    "ConfigError",
    "ConnectionLost",
    "ConsumerConflict",
    "CorruptRecord",
    "Delivery",
    "ForeignKey",
    "InvalidLink",
    "InvalidMessage",
    "InvalidName",
    "InvalidSelector",
    "InvalidTopic",
    "InvalidTopicFilter",
    "LibraryMissing",
    "LinkCycle",
    "Message",
    "NoSuchLink",
    "NoSuchSubscription",
    "NotAuthorized",
    "PublicationRefused",
    "PublishResult",
    "Publisher",
    "ReplyTimeout",
    "RequestRefused",
    "SelectorTooComplex",
    "ServerError",
    "ServerFull",
    "ServerNotFound",
    "Settings",
    "Subscriber",
    "SubscriptionConflict",
    "TooManyConsumers",
    "TooManySubscriptions",
    "connect",
    "explain",
    "like",
    "link",
    "list_links",
    "list_subscriptions",
    "load_settings",
    "matches",
    "request_subscription",
    "request_unsubscribe",
    "select",
    "status",
    "subscribe",
    "unlink",
    "unlink_all",
    "unsubscribe",
    "validate_filter",
    "validate_topic",
]

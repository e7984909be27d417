"""Request/reply over topics: a requester with a temporary reply destination, and a responder helper.

A ``Requestor`` owns a temporary reply destination: a non-durable subscription
on its own topic ``$tmp/<client id>/<random>`` (a ``$`` topic, so no ``#`` or
``+`` subscription of anybody else matches it, MQTT 5 §4.7.2). It is removed
when the requester closes, or by the workers' sweep once the requester's lease
lapses (``subscription_expiry_ms`` after it died), like Jakarta Messaging's
``TemporaryTopic``. ``request`` publishes with ``reply_to`` and a fresh
``correlation_id`` and waits for the reply carrying that correlation id.

A ``Responder`` serves a subscription: for each request it calls a handler and
publishes the answer to the request's ``reply_to`` with the request's
correlation id (its message id when it has none), then acknowledges the request.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

import redis

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core.config import Settings
from broker.core.errors import BrokerError, InvalidTopic, ReplyTimeout
from broker.core.logs import publication_extra
from broker.core.models import Message, PropertyValue
from broker.core.topic_rules import validate_topic
from broker.topics.subscriptions import SubscriptionRecord, subscribe

log = logging.getLogger("broker.request_reply")


def _extra(message: Message) -> dict[str, str | None]:
    """The log keys of a line about ``message`` (``broker.core.logs``)."""
    return publication_extra(message.entry_id, msgid=message.msgid, publisher=message.publisher)


#: The first level of every temporary reply topic.
TEMPORARY_PREFIX = "$tmp"

#: The property a responder sets on the reply when its handler raised.
ERROR_PROPERTY = "error"


class Requestor:
    """Sends requests and waits for their replies on a temporary reply destination.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        client_id: the requester's client id (``A-Za-z0-9_.-``).
        settings: consumer lease and expiry settings; default ``Settings()``.
        publisher_id: the publisher id of the requests; default ``<client id>.requests``.

    Raises:
        InvalidName: the client id has other characters.
    """

    def __init__(
        self,
        client: redis.Redis,
        qm: str,
        client_id: str,
        settings: Settings | None = None,
        publisher_id: str | None = None,
    ) -> None:
        self.reply_topic = f"{TEMPORARY_PREFIX}/{client_id}/{uuid.uuid4().hex[:16]}"
        self.record = subscribe(client, qm, self.reply_topic, client_id)
        self.subscriber = Subscriber(client, qm, self.record, settings)
        self.publisher = Publisher(client, qm, publisher_id or f"{client_id}.requests", client_id=client_id)

    def request(
        self,
        topic: str,
        body: bytes | str = b"",
        *,
        timeout_ms: int = 10_000,
        properties: dict[str, PropertyValue] | None = None,
    ) -> Message:
        """Publish a request on ``topic`` and wait for its reply.

        Args:
            topic: where the responders subscribe.
            body: the request body.
            timeout_ms: how long to wait for the reply, ms.
            properties: user properties of the request.

        Returns:
            The reply (its ``correlation_id`` is the request's).

        Raises:
            ReplyTimeout: no reply within ``timeout_ms``.
            InvalidTopic: the topic is invalid.
        """
        correlation_id = uuid.uuid4().hex
        self.publisher.publish(
            topic, body, properties=properties, correlation_id=correlation_id, reply_to=self.reply_topic
        )
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            delivery = self.subscriber.receive(timeout_ms=left) if left > 0 else None
            if delivery is None:
                raise ReplyTimeout(f"no reply to the request on {topic!r} within {timeout_ms} ms")
            reply = delivery.message  # decoded before the ack: a malformed one stays in flight
            self.subscriber.ack(delivery)
            if reply.correlation_id == correlation_id:
                return reply
            log.info(
                "dropping a late reply (correlation id %s)",
                reply.correlation_id,
                extra=_extra(reply),
            )

    def close(self) -> None:
        """Remove the temporary reply destination."""
        self.subscriber.close()

    def __enter__(self) -> Requestor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Responder:
    """Answers the requests of one subscription.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        record: the subscription the requests arrive on.
        handler: request -> reply body. If it raises, the reply has an empty body
            and the user property ``error`` with the exception's text.
        settings: consumer settings; default ``Settings()``.
        publisher_id: the publisher id of the replies; default ``<client id>.replies``.
    """

    def __init__(
        self,
        client: redis.Redis,
        qm: str,
        record: SubscriptionRecord,
        handler: Callable[[Message], bytes | str],
        settings: Settings | None = None,
        publisher_id: str | None = None,
    ) -> None:
        self.handler = handler
        self.subscriber = Subscriber(client, qm, record, settings)
        self.publisher = Publisher(client, qm, publisher_id or f"{record.client_id}.replies")
        self.stopping = threading.Event()

    def serve_once(self, timeout_ms: int = 1_000, max_messages: int = 100) -> int:
        """Answer the requests waiting (waiting up to ``timeout_ms`` for one); returns how many."""
        deliveries = self.subscriber.receive_many(max_messages, timeout_ms)
        # every request decoded before any is answered: a malformed one raises InvalidMessage
        # with the batch left in flight, none answered twice
        for request in [delivery.message for delivery in deliveries]:
            if request.reply_to:
                self._answer(request)
            else:
                log.warning("request %s has no reply_to; not answered", request.msgid, extra=_extra(request))
        self.subscriber.ack_many(deliveries)
        return len(deliveries)

    def _answer(self, request: Message) -> None:
        assert request.reply_to is not None
        properties: dict[str, PropertyValue] = {}
        try:
            body = self.handler(request)
        except Exception as exc:  # one bad request never stops the responder
            log.exception("handler failed on request %s", request.msgid, extra=_extra(request))
            body, properties = b"", {ERROR_PROPERTY: f"{type(exc).__name__}: {exc}"}
        try:
            validate_topic(request.reply_to)
            self.publisher.publish(
                request.reply_to,
                body,
                correlation_id=request.correlation_id or request.msgid,
                properties=properties or None,
            )
        except (InvalidTopic, BrokerError) as exc:
            log.warning("reply to request %s not sent: %s", request.msgid, exc, extra=_extra(request))

    def serve(self, timeout_ms: int = 1_000) -> None:
        """Answer requests until ``stopping`` is set (from another thread), then close."""
        try:
            while not self.stopping.is_set():
                self.serve_once(timeout_ms)
        finally:
            self.close()

    def close(self) -> None:
        """Stop consuming (unanswered requests go back for redelivery)."""
        self.subscriber.close()

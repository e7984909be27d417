"""Queue controllers on the workers' side: the delivery mode a controller gives a subscriber queue.

SwiftMQ's queue controllers (seed 003) match subscriber queue names with a SQL LIKE predicate
and set their attributes (``broker.core.config.QueueController``). The consumer mode is given
when a subscription is made (``broker.topics.subscriptions.subscribe``); the persistence mode is
applied here, by the worker, to each publication: a ``non_persistent`` controller makes the
messages of its subscriptions Jakarta Messaging NON_PERSISTENT (``JMSDeliveryMode``, NPMSGDLV,
the slow-subscriber conditions for ``non_persistent``), a ``persistent`` one PERSISTENT.

A publication has one envelope, which its unit of work writes to every subscriber queue
(``commit.lua``), so a controller's mode is applied when every queue the publication goes to
agrees: all under controllers giving the same mode. When they do not (a ``tmp$%`` subscription
and an ordinary one matching the same topic, or a channel to another queue manager), the
publication keeps its own delivery mode everywhere. Storage is the same for both modes (the
queues live in Redis, written to its append-only file): the delivery mode changes what
consumers see and how a full queue is handled, not where the message is kept.
"""

from __future__ import annotations

from typing import Any

from broker.core import keys
from broker.core.config import QueueController, Settings, first_controller
from broker.core.models import set_header

#: Most subscriber queues whose delivery mode a worker remembers; the memory is cleared beyond it.
_REMEMBERED = 65_536


class PersistenceModes:
    """The delivery modes the queue controllers give subscriber queues, for one worker.

    False (``bool``) when no controller gives one: the worker then does nothing more per
    publication. A queue's controller is resolved from its subscription id the first time a
    publication goes to it, and remembered (it depends on the id and the settings only).

    Args:
        settings: the broker settings (``qm``, ``queue_controllers``, ``consumer_modes``).
    """

    def __init__(self, settings: Settings) -> None:
        self._controllers: list[QueueController] = settings.controllers
        self._prefix = keys.sub_prefix(settings.qm)
        self._qm = settings.qm
        self._any = any(c.forced_persistent is not None for c in self._controllers)
        #: queue key -> its forced delivery mode (True persistent), None for as_message
        self._known: dict[str, bool | None] = {}

    def __bool__(self) -> bool:
        return self._any

    def forced(self, queue: str) -> bool | None:
        """The delivery mode the queue controller of subscriber queue ``queue`` (any priority
        band) gives its messages (True: persistent), or None: the publication's own (``as_message``,
        no controller, or not a subscriber queue: a channel's transmission stream)."""
        known = self._known
        if queue in known:
            return known[queue]
        mode = None
        if queue.startswith(self._prefix):
            controller = first_controller(self._controllers, keys.band_sub_id(self._qm, queue))
            mode = controller.forced_persistent if controller is not None else None
        if len(known) >= _REMEMBERED:
            known.clear()
        known[queue] = mode
        return mode

    def apply(self, header: dict[str, Any], queues: tuple[str, ...]) -> bool | None:
        """Give a publication the delivery mode its subscriber queues' controllers agree on.

        Args:
            header: the publication's envelope header; its ``persistent`` field is set when
                every queue's controller gives the same mode.
            queues: the subscriber queues (and transmission streams) it goes to, at least one.

        Returns:
            The mode set (True: persistent), or None when the queues do not all agree (the
            header is left alone).
        """
        modes = {self.forced(queue) for queue in queues}
        if len(modes) != 1:
            return None
        mode = modes.pop()
        if mode is not None:
            set_header(header, "persistent", mode)
        return mode

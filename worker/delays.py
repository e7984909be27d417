"""What a worker knows of the delayed publications (``{qm}:delayed``), and when it asks for them.

Delivery delay (Jakarta Messaging 2.0 section 7.9: a message's delivery time, ``JMSDeliveryTime``, is
the earliest time it may be delivered; ActiveMQ Artemis's scheduled delivery): ``dequeue.lua``
moves each entry with a ``delivery_time`` field into ``{qm}:delayed`` and, when the worker asks
(``release``), moves the due ones back into the publish stream. Nothing here costs a command: the
worker learns the earliest delivery time still waiting from the dequeue replies that touched the
set (``Dequeued.delay_seen``) and from its heartbeat's pipeline (``heard``), asks for a release
only once that time has come, and caps its idle waits at it (``wait_ms``).

One worker wakes on time for a due time: the one whose dequeue moved a publication in or out knows
the time exactly; the others take it one ``STANDBY_MS`` later (they stand by, should that worker
have died), and then find it released (one dequeue each, at most about once per ``STANDBY_MS``).
With no delayed publication nothing changes: no wait is cut, no release asked.
"""

from __future__ import annotations

from broker.core.scripts import Dequeued

#: How long after a delivery time a worker that did not delay or release the publications itself
#: asks for their release (another worker knows the time exactly, should it be alive), ms.
STANDBY_MS = 1_000


class Delays:
    """One worker's knowledge of the earliest delivery time waiting (module text)."""

    def __init__(self) -> None:
        #: when this worker asks for a release, ms since the epoch; None: none it knows of
        self.next_due_ms: int | None = None
        #: publications its last dequeue moved into or out of ``{qm}:delayed`` (work done, none committed)
        self.moved = 0

    def release(self, now_ms: int) -> bool:
        """Whether the dequeue at ``now_ms`` (ms since the epoch) should release the due publications."""
        return self.next_due_ms is not None and now_ms >= self.next_due_ms

    def learned(self, dequeued: Dequeued) -> None:
        """Note what a dequeue saw of ``{qm}:delayed`` (only when it looked at it)."""
        self.moved = dequeued.delayed_moves
        if not dequeued.delay_seen:
            return
        due = dequeued.next_due_ms
        if due is not None and not dequeued.delayed_moves:
            due += STANDBY_MS  # another worker moved them: it asks on time
        self.next_due_ms = due

    def heard(self, due_ms: int | None) -> None:
        """Note the earliest delivery time waiting, read with the heartbeat (None: none waits)."""
        if due_ms is None:
            self.next_due_ms = None
            return
        standby = due_ms + STANDBY_MS
        self.next_due_ms = standby if self.next_due_ms is None else min(self.next_due_ms, standby)

    def wait_ms(self, now_ms: int, wait_ms: int) -> int:
        """``wait_ms`` (an idle wait, ms) cut to end when a release is due (at least 1 ms)."""
        if self.next_due_ms is None:
            return wait_ms
        return max(1, min(wait_ms, self.next_due_ms - now_ms))

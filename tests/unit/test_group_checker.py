"""The chaos harness's message-group checker (``scripts.rig.groups.GroupLog.check``) finds each
kind of violation, and passes a history that keeps the rules (a move after a death included)."""

from __future__ import annotations

from dataclasses import dataclass

from scripts.rig.groups import GroupLog


@dataclass
class Pub:
    acked: bool = True


def published(log: GroupLog, group: str, n: int, start: int = 1) -> list[str]:
    msgids = [f"{group}.{seq}" for seq in range(start, start + n)]
    for seq, msgid in enumerate(msgids, start):
        log.publish(msgid, group, seq, Pub())
    return msgids


def test_a_group_that_moves_after_its_owner_died_with_its_unacked_messages_first_passes():
    log = GroupLog()
    a = published(log, "A", 4)
    b = published(log, "B", 1)
    log.receive("c1", a[0], False)
    log.receive("c1", a[1], False)
    log.receive("c2", b[0], False)
    log.ack("c1", [a[0]])
    log.ack("c2", [b[0]])
    log.end("c1")  # dies holding A.2
    log.receive("c2", a[1], True)
    log.receive("c2", a[2], False)
    log.receive("c2", a[3], False)
    log.ack("c2", a[1:])
    verdict = log.check()
    assert verdict.ok, verdict.examples
    assert (verdict.publications, verdict.receipts) == (5, 6)


def test_two_consumers_holding_one_group_is_found():
    log = GroupLog()
    a = published(log, "A", 2)
    log.receive("c1", a[0], False)
    log.ack("c1", [a[0]])
    log.receive("c2", a[1], False)  # c1 has not ended: it still owns A
    log.ack("c2", [a[1]])
    assert log.check().shared == 1


def test_a_new_owner_taking_a_later_message_before_the_unacked_ones_is_found():
    log = GroupLog()
    a = published(log, "A", 3)
    log.receive("c1", a[0], False)
    log.end("c1")
    log.receive("c2", a[1], False)  # A.1 was neither acknowledged nor given to c2 first
    log.receive("c2", a[0], True)
    log.receive("c2", a[2], False)
    log.ack("c2", a)
    verdict = log.check()
    assert verdict.reordered == 1 and verdict.shared == 0


def test_lost_and_duplicated_messages_are_found_and_an_unknown_outcome_is_not_owed():
    log = GroupLog()
    a = published(log, "A", 3)
    log.publish("A.4", "A", 4, Pub(acked=False))
    log.receive("c1", a[0], False)
    log.ack("c1", [a[0]])
    log.receive("c1", a[0], False)  # again after its ack
    log.receive("c1", a[2], False)  # A.2 never came: lost, and A.3 out of order
    log.ack("c1", [a[2]])
    verdict = log.check()
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (1, 1, 1)


def test_an_ack_of_unknown_outcome_counts_as_maybe_acknowledged():
    log = GroupLog()
    a = published(log, "A", 2)
    log.receive("c1", a[0], False)
    log.ack_unknown("c1", [a[0]])  # the connection failed during the ack: it may have been applied
    log.end("c1")
    log.receive("c2", a[1], False)
    log.ack("c2", [a[1]])
    assert log.check().ok

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


def test_a_holder_whose_lease_may_have_lapsed_is_counted_as_lapsed_not_as_sharing():
    # Given consumers with a 1 s lease whose renewals are recorded, c1 renewing last at t=1.0
    log = GroupLog(lease_ms=1000)
    a = published(log, "A", 3)
    log.renew("c1", 0.0, at=0.1)
    log.receive("c1", a[0], False, started=1.0, at=1.1)
    log.renew("c1", 1.0, at=1.1)
    log.ack("c1", [a[0]], at=1.2)
    # When c2 takes A.2 at t=2.5, more than a lease after c1's last renewal began (its heartbeat stalled)
    log.renew("c2", 2.0, at=2.1)
    log.receive("c2", a[1], False, started=2.4, at=2.5)
    log.ack("c2", [a[1]], at=2.6)
    # Then the move is a lapse, not two holders at once, and c1 holds nothing from then on:
    verdict = log.check()
    assert (verdict.lapsed, verdict.shared) == (1, 0), verdict.examples
    # the zombie taking A.3 while c2 holds A is still two holders at once
    log.receive("c1", a[2], False, started=2.7, at=2.8)
    assert log.check().shared == 1


def _c2_takes_a2_after_c1_renewed(started: float, ended: float) -> GroupLog:
    """c1 (1 s lease) took A.1 at 0.1 and renewed again from ``started`` to ``ended``; c2 takes A.2
    by a receive from 1.9 to 2.0."""
    log = GroupLog(lease_ms=1000)
    a = published(log, "A", 2)
    log.renew("c1", 0.0, at=0.1)
    log.receive("c1", a[0], False, started=0.0, at=0.1)
    log.renew("c1", started, at=ended)
    log.receive("c2", a[1], False, started=1.9, at=2.0)
    return log


def test_a_holder_that_renewed_within_a_lease_still_shares_when_another_takes_its_group():
    verdict = _c2_takes_a2_after_c1_renewed(1.5, 1.6).check()  # its lease runs to 2.5 at least
    assert (verdict.lapsed, verdict.shared) == (0, 1)


def test_a_renewal_still_under_way_when_the_other_receive_began_does_not_count():
    # c1's renewal that began at 1.5 ended at 2.2, after c2's receive began: it may have reached
    # the server after c2's take, so c1's lease (from its renewal at 0.0) may have lapsed
    verdict = _c2_takes_a2_after_c1_renewed(1.5, 2.2).check()
    assert (verdict.lapsed, verdict.shared) == (1, 0)


def test_an_ack_made_after_the_lease_may_have_lapsed_counts_as_maybe_acknowledged():
    log = GroupLog(lease_ms=1000)
    a = published(log, "A", 1)
    log.renew("c1", 0.0, at=0.1)
    log.receive("c1", a[0], False, started=0.0, at=0.1)
    log.ack("c1", [a[0]], at=1.5)  # a zombie's ack: A.1 was given back before it, the ack ignored
    log.renew("c2", 1.6, at=1.7)
    log.receive("c2", a[0], True, started=1.8, at=1.9)
    verdict = log.check()
    assert verdict.duplicated == 0 and verdict.lapsed == 1, verdict.examples

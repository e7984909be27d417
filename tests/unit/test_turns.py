"""``worker.turns.ready_heads``: which heads a worker handles now, which it takes over, and (while
a backlog is drained) which it leaves to the worker that read them."""

from __future__ import annotations

from worker.turns import ready_heads, turns_to_ask

HEADS = {"p1": ["1-0", "2-0", "3-0"], "p2": ["4-0", "5-0"], "p3": ["6-0"]}
#: the worker read 1-0 (p1's first head) and 6-0 (all of p3); 2-0, 3-0 and p2's were read elsewhere
ENTRIES = {"1-0": ("p1", {}), "6-0": ("p3", {})}


def test_heads_read_elsewhere_after_its_own_are_taken_over_without_a_backlog():
    ready, (counted, uncounted), waiting = ready_heads(HEADS, ENTRIES)
    assert ready == {"p1": ["1-0"], "p3": ["6-0"]}
    assert (counted, uncounted) == (["2-0", "4-0"], ["3-0", "5-0"])
    assert waiting == {"p1", "p2"}


def test_while_a_backlog_is_drained_the_heads_after_its_own_are_left_to_their_reader():
    ready, (counted, uncounted), waiting = ready_heads(HEADS, ENTRIES, leave=True)
    # p1's heads after 1-0 are left (its dequeue gives the turn to their reader); p2, whose first
    # head it did not read, was kept by the dequeue (nobody live has it in mind): taken over
    assert ready == {"p1": ["1-0"], "p3": ["6-0"]}
    assert (counted, uncounted) == (["4-0"], ["5-0"])
    assert waiting == {"p2"}


def test_the_next_dequeue_asks_for_the_turns_of_what_it_read_only_while_a_backlog_is_drained():
    entries = {**ENTRIES, "7-0": ("p4", {})}  # p4: read here, its turn another worker's
    assert turns_to_ask(HEADS, ("p2",), entries, plenty=False) == ["p1", "p3"]
    assert turns_to_ask(HEADS, ("p2",), entries, plenty=True) == ["p1", "p3", "p4"]

"""Which turns a round keeps, which it gives up, what its next dequeue reads, and which heads another
worker read (pure: no Redis; ``worker.loop`` applies them).

- **Fair share** (``turns_to_give_up``): the waiting entries split over the live workers give each
  its share; a worker keeps its heaviest publishers up to it and gives up the others.
- **A saturated publisher** (``next_read``): a worker keeping one while another is spare reads
  nothing more; its next heads, read by the others, come back taken over in its next dequeue.
- **Hand-over** (``ready_heads``, ``missing_heads``): a head another worker read is taken over
  (``take_over.lua``, XCLAIM) before it is handled; only the publisher's FIFO head counts as a new
  delivery (``worker.suspects``). With other heads to commit, that take-over rides with the commit
  (``ready_heads``: those publishers wait a round); with none, it is a round trip of its own.
  While a backlog is drained a turn follows its entries instead: its holder commits the heads it
  read and its next dequeue gives the turn to the live reader of the next ones (``ready_heads``'
  ``leave``, ``dequeue.lua``'s ``left_to_reader``).

May import: ``broker.core`` (types) only.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.core.scripts import Dequeued

#: The smallest fair share worth handing over, entries: with less waiting per live worker (a low
#: rate: a few entries each), a worker keeps every turn it holds and takes every free one it reads
#: (``dequeue.lua`` gets it as an argument), since its next commit handles them all in one call,
#: while a hand-over costs the other worker a take-over round trip and the publication a round:
#: at 2,000/s, 7% of the publications waited 1-3 ms for a sweep to take a turn declined or given
#: up this way. Above it, the fair share applies (one busy worker cannot keep the others idle).
MIN_SHARE = 16

#: ``{entry id: (publisher, fields)}``: the entries a worker holds in memory.
Entries = Mapping[str, object]


def stream_id(entry_id: str) -> tuple[int, int]:
    """``"ms-seq"`` as a sortable pair (stream order)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def turns_to_give_up(dequeued: Dequeued, entries: Entries, heads: int) -> tuple[str, ...]:
    """Publishers beyond this worker's fair share of the work, to give up after this round.

    The waiting entries split over the live workers give each its fair share
    (``dequeued.fair``). The worker keeps its publishers, heaviest FIFO first
    (then those whose entries it already holds), until their backlogs reach
    that share, and gives up the others to the sweep: a worker serving one
    busy publisher hands everyone else to the other workers, and a worker
    that dequeued everything cannot keep the others idle.

    Under ``MIN_SHARE`` entries of fair share (a low rate), nothing is given up, unless the worker
    holds a saturated publisher.

    A saturated publisher (a backlog of at least ``heads``: a whole round of
    work on its own) counts as a full share while another live worker is spare
    (``Dequeued.spare``: not holding a saturated publisher itself): its
    order makes it the pool's bottleneck, so its worker keeps it alone and
    never delays it with others' work (``dequeue.lua`` gives it no free turn
    either).
    """
    held = dequeued.turns
    if len(held) <= 1:
        return ()
    backlog = dequeued.backlog
    fair = dequeued.fair
    saturated = heads if dequeued.spare > 0 else None
    if fair < MIN_SHARE and (saturated is None or max(backlog.values(), default=0) < saturated):
        return ()  # too little work to be worth a hand-over (``MIN_SHARE``)

    def weight(publisher: str) -> tuple[int, int]:
        return backlog.get(publisher, 0), sum(1 for e in held[publisher] if e in entries)

    kept_load = 0
    given_up = []
    for publisher in sorted(held, key=weight, reverse=True):
        if kept_load >= fair:
            given_up.append(publisher)
        else:
            load = backlog.get(publisher, 0)
            kept_load += max(load, fair) if saturated is not None and load >= saturated else load
    return tuple(given_up)


def next_read(
    dequeued: Dequeued, give_up: tuple[str, ...], heads: int, batch_size: int, last_read_id: str
) -> tuple[int, tuple[str, str] | None]:
    """What the next dequeue (sent with this round's commits) reads: ``(count, ahead)``.

    A worker keeping a saturated publisher (a backlog of at least ``heads``) while
    another live worker is spare reads nothing: the other workers read the stream (and so
    see, and take, every other publisher's turn), and its next heads, which they read,
    come back taken over in the same call (``ahead``: the publisher, and the last entry
    id this worker may have read itself, after ``last_read_id``). Once its backlog is
    under ``heads`` it reads ``batch_size`` entries again, as every other worker.
    """
    if dequeued.spare > 0:
        for publisher, ids in dequeued.turns.items():
            if publisher in give_up or not ids:
                continue
            if dequeued.backlog.get(publisher, 0) >= heads:
                return 0, (publisher, max(ids[-1], last_read_id or "0-0", key=stream_id))
    return batch_size, None


def ready_heads(
    heads: Mapping[str, list[str]], entries: Entries, leave: bool = False
) -> tuple[dict[str, list[str]], tuple[list[str], list[str]], set[str]]:
    """Split the heads into those the worker can handle now and those another worker read.

    Args:
        leave: plenty is left to read (``Dequeued.plenty``: a backlog, another worker live): the
            heads after those this worker read are not taken over; the dequeue that rides with
            the commit gives the turn to their reader when it is live (``dequeue.lua``,
            ``left_to_reader``), which handles them from memory, where a take-over would read
            them from the stream again and parse them a second time (40% of the entries of the
            2-worker bench row were taken over so before). A turn whose first head this worker
            did not read is still taken over: its dequeue kept it, so nobody live has it in mind.

    Returns:
        ``(ready, (counted, uncounted), waiting)``: ``ready`` is each publisher's heads up to the
        first one not in ``entries`` (publishers whose first head is not there are left out);
        ``counted`` is that first missing head of each publisher (its FIFO head once ``ready`` is
        committed: its take-over counts as a new delivery); ``uncounted`` the other missing heads;
        ``waiting`` the publishers with a missing head to take over (``leave``: none after heads
        this worker read).
    """
    ready: dict[str, list[str]] = {}
    counted: list[str] = []
    uncounted: list[str] = []
    waiting: set[str] = set()
    for publisher, ids in heads.items():
        first = next((i for i, entry_id in enumerate(ids) if entry_id not in entries), -1)
        if first < 0:
            ready[publisher] = ids
            continue
        if first:
            ready[publisher] = ids[:first]
            if leave:
                continue
        counted.append(ids[first])
        uncounted.extend(e for e in ids[first + 1 :] if e not in entries)
        waiting.add(publisher)
    return ready, (counted, uncounted), waiting


def turns_to_ask(
    heads: Mapping[str, list[str]],
    give_up: tuple[str, ...],
    entries: Mapping[str, tuple[str, object]],
    plenty: bool,
) -> list[str]:
    """The publishers whose turn the next dequeue asks for: those held and not given up, and, while
    a backlog is drained (``plenty``), those of the entries in memory whose turn another worker
    holds (the turn follows its entries: it takes them when their holder gives them up)."""
    keep = set(heads).difference(give_up)
    if plenty:
        keep.update(publisher for publisher, _ in entries.values() if publisher not in heads)
    return sorted(keep)


def missing_heads(heads: Mapping[str, list[str]], entries: Entries) -> tuple[list[str], list[str]]:
    """The heads not in ``entries``, to take over before this round's decide: ``(counted, uncounted)``,
    where only each publisher's first head counts as a new delivery."""
    counted: list[str] = []
    uncounted: list[str] = []
    for ids in heads.values():
        for i, entry_id in enumerate(ids):
            if entry_id not in entries:
                (uncounted if i else counted).append(entry_id)
    return counted, uncounted

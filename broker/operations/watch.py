"""``broker status --watch``: a live view of a queue manager's rates and depths (rich ``Live``).

Every refresh takes a ``Sample``: the operator's snapshot (``broker.operations.status.status``:
stream, subscriptions, dead letters, workers, problems) plus two counters that
only grow, read without touching the hot path:

- ``entries_added``: publications ever added to the publish stream (``XINFO STREAM``'s
  ``entries-added``, Redis >= 7.0);
- ``acknowledged``: publications the workers have committed (their unit of work
  applied: delivered, refused, expired or duplicate), from the workers' group
  (``entries-read`` - pending).

Rates are the difference of two samples over the time measured between them
(a monotonic clock, injectable): publications/s from ``entries_added``,
deliveries/s (publications whose unit of work was committed) from
``acknowledged``, and per subscription the change of its depth per second (a
positive one: its consumers fall behind). A counter that went back (a reset queue
manager) gives no rate for that refresh.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from broker.core import keys, wire
from broker.core.errors import BrokerError
from broker.core.stream import group_state
from broker.operations.status import Snapshot, status

#: Problems lines shown at most; the rest are counted on one more line.
MAX_PROBLEM_LINES = 5

#: Lines the subscription table takes besides its rows (borders and header, 4), and the line
#: saying how many rows were left out (the lines above the table are measured at the width).
_TABLE_LINES = 4 + 1


def monotonic_ms() -> float:
    """The clock samples are taken with: monotonic, ms."""
    return time.monotonic() * 1000


def sleep_ms(ms: float) -> None:
    """How the view waits between refreshes, ms."""
    time.sleep(ms / 1000)


@dataclass(frozen=True)
class Sample:
    """One look at a queue manager.

    Attributes:
        at_ms: when it was taken, ms on the monotonic clock (``monotonic_ms``).
        snapshot: ``broker.operations.status.status(client, qm, keyspace=False)`` (no ``SCAN`` per refresh).
        entries_added: publications ever added to the publish stream, or None when unknown
            (no stream yet, a foreign key, a server before Redis 7.0).
        acknowledged: publications the workers committed, or None when unknown.
    """

    at_ms: float
    snapshot: Snapshot
    entries_added: int | None = None
    acknowledged: int | None = None


@dataclass(frozen=True)
class Rates:
    """What changed between two samples, per second.

    Attributes:
        interval_ms: the time between the samples, ms.
        publications_per_s: publications added to the publish stream, or None when unknown.
        deliveries_per_s: publications whose unit of work was committed, or None when unknown.
        depth_per_s: subscription id -> change of its depth (messages waiting), for the
            subscriptions whose depth both samples know.
    """

    interval_ms: float
    publications_per_s: float | None
    deliveries_per_s: float | None
    depth_per_s: dict[str, float] = field(default_factory=dict)


def _entries_added(client: redis.Redis, qm: str) -> int | None:
    try:
        info: Any = client.xinfo_stream(keys.publish_stream(qm))
    except redis.ResponseError:  # no stream yet, or a foreign key (the snapshot names it)
        return None
    for name, value in info.items():
        if wire.text(name) == "entries-added":
            return int(value)
    return None  # a server before Redis 7.0


def take_sample(client: redis.Redis, qm: str, clock_ms: Callable[[], float] | None = None) -> Sample:
    """Take one ``Sample`` of queue manager ``qm``.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        clock_ms: the clock, ms; default ``monotonic_ms``.

    Raises:
        ConnectionLost, redis.ConnectionError: the server cannot be reached. What the sample
            finds (foreign keys, corrupt records) is in ``snapshot.problems``, never raised.
    """
    at_ms = (clock_ms or monotonic_ms)()
    snapshot = status(client, qm, keyspace=False)  # a SCAN of the whole database per refresh is too dear
    added = _entries_added(client, qm)
    try:
        group = group_state(client, qm)
        acknowledged: int | None = group.acknowledged if group.exists else 0
    except (BrokerError, redis.ResponseError):  # the snapshot's problems name it
        acknowledged = None
    return Sample(at_ms, snapshot, added, acknowledged)


def _per_s(before: int | None, after: int | None, seconds: float) -> float | None:
    if before is None or after is None or after < before:
        return None
    return (after - before) / seconds


def rates(before: Sample, after: Sample) -> Rates | None:
    """The rates between two samples, or None when no time passed between them."""
    interval = after.at_ms - before.at_ms
    if interval <= 0:
        return None
    seconds = interval / 1000
    depths = {s.id: s.depth for s in before.snapshot.subscriptions if s.depth is not None}
    depth_per_s = {
        s.id: (s.depth - depths[s.id]) / seconds
        for s in after.snapshot.subscriptions
        if s.depth is not None and s.id in depths
    }
    return Rates(
        interval,
        _per_s(before.entries_added, after.entries_added, seconds),
        _per_s(before.acknowledged, after.acknowledged, seconds),
        depth_per_s,
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def render(sample: Sample, found: Rates | None, title: str, height: int, width: int = 80) -> RenderableType:
    """One frame of the view: title, rates, stream and workers, problems, then the subscriptions
    deepest first, as many as fit in ``height`` lines (the rest counted on one line).

    The lines above the table are measured as they wrap at ``width``, and each subscription
    takes one line (a long id or filter is cut with "…"), so the frame never holds more than
    ``height`` lines and the line counting the rest is always shown (rich ``Live`` would crop
    the bottom of a taller frame).

    Args:
        sample: the latest sample.
        found: the rates since the sample before, or None (the first frame: "-").
        title: the first line (which queue manager, on which server).
        height: the lines available (the terminal's height).
        width: the columns available (the terminal's width).
    """
    snap = sample.snapshot
    shown_at = datetime.now(UTC).strftime("%H:%M:%S UTC")
    parts: list[RenderableType] = [Text.assemble((title, "bold"), f"  {shown_at}")]
    every = f" (over {found.interval_ms / 1000:.1f} s)" if found else " (from the next refresh)"
    parts.append(
        Text.assemble(
            "publications/s ",
            (_rate(found.publications_per_s if found else None), "bold"),
            "   deliveries/s ",
            (_rate(found.deliveries_per_s if found else None), "bold"),
            every,
        )
    )
    workers = snap.workers
    alive = sum(1 for w in workers if w.state == "alive")
    dead = snap.dead_lettered
    parts.append(
        Text.assemble(
            f"stream length {snap.stream_length}   lag {snap.lag}   pending {snap.pending}   ",
            ("dead letters ", "bold red" if dead else ""),
            (str(dead), "bold red" if dead else ""),
            "   workers alive ",
            (f"{alive}/{len(workers)}", "bold red" if alive < len(workers) or not workers else ""),
        )
    )
    problems = snap.problems
    parts.extend(Text(f"problem: {problem}", style="red") for problem in problems[:MAX_PROBLEM_LINES])
    if len(problems) > MAX_PROBLEM_LINES:
        parts.append(Text(f"... and {len(problems) - MAX_PROBLEM_LINES} more problem(s)", style="red"))
    subs = sorted(snap.subscriptions, key=lambda s: (-(s.depth if s.depth is not None else -1), s.id))
    if not subs:
        parts.append(Text("no subscriptions"))
        return Group(*parts)
    above = len(Console(width=width, file=io.StringIO()).render_lines(Group(*parts), pad=False))
    room = max(1, height - above - _TABLE_LINES)
    table = Table()
    for n, column in enumerate(("subscription", "filter", "depth", "depth/s", "in flight", "consumers")):
        table.add_column(
            column,
            justify="left" if n < 2 else "right",
            overflow="ellipsis",
            no_wrap=True,
            max_width=max(8, width // (5 if n == 0 else 4)) if n < 2 else None,
        )
    growth = found.depth_per_s if found else {}
    for sub in subs[:room]:
        change = growth.get(sub.id)
        table.add_row(
            sub.id,
            sub.filter,
            _count(sub.depth),
            Text(_rate(change), style="yellow" if change and change > 0 else ""),
            _count(sub.inflight),
            _count(sub.consumers),
        )
    parts.append(table)
    if len(subs) > room:
        parts.append(Text(f"... and {len(subs) - room} more subscription(s), less deep"))
    return Group(*parts)


def watch(
    sample: Callable[[], Sample],
    console: Console,
    interval_ms: int,
    title: str,
    iterations: int | None = None,
    wait_ms: Callable[[float], None] | None = None,
) -> int:
    """Show the live view until Ctrl-C (or ``iterations`` refreshes): one frame per ``interval_ms``.

    On a terminal the frame is redrawn in place (rich ``Live``); elsewhere (a pipe, a
    file) each frame is printed after the last.

    Args:
        sample: takes one ``Sample`` (``take_sample`` bound to a client and a queue manager).
        console: where to draw.
        interval_ms: the time between refreshes, ms.
        title: the frame's first line.
        iterations: stop after this many refreshes; None: until Ctrl-C.
        wait_ms: waits between refreshes, ms (``interval_ms`` less the time the last
            refresh took); default ``sleep_ms``.

    Returns:
        How many frames were shown. Ctrl-C ends it as a normal return.

    Raises:
        ConnectionLost, redis.ConnectionError: the server cannot be reached.
    """
    wait = wait_ms or sleep_ms
    shown = 0
    before: Sample | None = None
    started = 0.0

    def pause() -> None:
        wait(max(0.0, interval_ms - (monotonic_ms() - started)))

    def frame() -> RenderableType:
        nonlocal before, started
        started = monotonic_ms()
        now = sample()
        found = rates(before, now) if before is not None else None
        before = now
        return render(now, found, title, console.size.height, console.size.width)

    try:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False, transient=False) as live:
                while iterations is None or shown < iterations:
                    if shown:
                        pause()
                    live.update(frame(), refresh=True)
                    shown += 1
        else:
            while iterations is None or shown < iterations:
                if shown:
                    pause()
                console.print(frame())
                console.print()
                shown += 1
    except KeyboardInterrupt:
        pass
    return shown

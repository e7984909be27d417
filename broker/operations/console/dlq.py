"""The console's dead-letter pages: listing, one entry, and planning and running replay and purge.

All reading and writing goes through ``broker.operations.dead_letters``; this module turns form
fields into a ``Selection`` and results into what the templates show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import redis

from broker.operations import dead_letters, reasons
from broker.operations.console.auth import Pending
from broker.operations.dead_letters import DeadLetter, Selection

#: The filters the dead-letter page offers (form and query fields).
FILTERS = ("reason", "kind", "publisher", "topic", "subscription")

#: Most bytes of a body shown on an entry's page.
BODY_PREVIEW_BYTES = 4_096


def filters_of(fields: Mapping[str, Any]) -> dict[str, str]:
    """The non-empty filters among form or query ``fields``: ``{"reason": ..., "publisher": ...}``."""
    found = {}
    for name in FILTERS:
        value = fields.get(name)
        if isinstance(value, str) and value.strip():
            found[name] = value.strip()
    return found


def query_of(filters: Mapping[str, str]) -> str:
    """``filters`` as a query string (for links back to the filtered list)."""
    return urlencode(dict(filters))


def selection_of(filters: Mapping[str, str], topic_valid: Any = None) -> Selection:
    """The ``Selection`` of every dead letter matching ``filters`` (all of them when there are none).

    Args:
        topic_valid: ``reasons.topic_check`` of the queue manager, for the ``kind`` filter.
    """
    if not filters:
        return Selection(everything=True)
    return Selection(
        reason=filters.get("reason"),
        kind=filters.get("kind"),
        topic_valid=topic_valid,
        publisher=filters.get("publisher"),
        topic=filters.get("topic"),
        subscription=filters.get("subscription"),
    )


def _topic_valid(client: redis.Redis, qm: str, filters: Mapping[str, str]) -> Any:
    """The queue manager's topic check when ``filters`` has a ``kind`` (else None: not read)."""
    return reasons.topic_check(client, qm) if "kind" in filters else None


def _row(entry: DeadLetter) -> dict[str, Any]:
    return {
        "id": entry.id,
        "time_ms": entry.time_ms,
        "reason": entry.reason,
        "publisher": entry.publisher,
        "topic": entry.topic,
        "msgid": entry.msgid,
        "subscription": entry.subscription,
        "entry_id": entry.entry_id,
        "body_size": entry.body_size,
    }


def counts(client: redis.Redis, qm: str) -> dict[str, Any]:
    """``{"total": n, "by_reason": [(reason code, n)]}``, most frequent first: grouped by kind
    (``broker.operations.reasons``, the metrics' ``reason`` label), not by the exact text."""
    by_reason = dead_letters.count_by_reason(client, qm, by_kind=True)
    ranked = sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))
    return {"total": sum(by_reason.values()), "by_reason": ranked}


def listing(client: redis.Redis, qm: str, filters: Mapping[str, str], count: int) -> dict[str, Any]:
    """The page's list: ``{"rows": [...] (at most ``count``, oldest first), "problems", "counts", "more"}``."""
    selection = selection_of(filters, _topic_valid(client, qm, filters))
    entries, problems = dead_letters.list_dead_letters(client, qm, selection, count=count + 1)
    return {
        "rows": [_row(e) for e in entries[:count]],
        "more": len(entries) > count,
        "problems": problems,
        "counts": counts(client, qm),
    }


def entry(client: redis.Redis, qm: str, dlq_id: str) -> dict[str, Any]:
    """One dead letter with every field (text, or a preview of bytes that are not).

    Raises:
        LookupError: no such dead letter.
    """
    found = dead_letters.show(client, qm, dlq_id)
    shown = []
    for name, value in sorted(found.fields.items()):
        raw = value if isinstance(value, bytes) else str(value).encode()
        cut = raw[:BODY_PREVIEW_BYTES]
        try:
            text = cut.decode("utf-8")
            binary = False
        except UnicodeDecodeError:
            text, binary = cut.hex(" "), True
        shown.append(
            {"name": name, "text": text, "binary": binary, "size": len(raw), "cut": len(raw) > len(cut)}
        )
    return {**_row(found), "fields": shown}


def plan(
    client: redis.Redis,
    qm: str,
    action: str,
    filters: Mapping[str, str],
    ids: list[str] | None,
    keep: bool,
    limit: int,
) -> dict[str, Any]:
    """What a replay or purge would do, for its confirmation page.

    Args:
        action: ``replay`` or ``purge``.
        filters: the filters of "all matching" (used when ``ids`` is None).
        ids: the entries ticked, or None for every entry matching ``filters``.
        keep: replay: keep the dead letters after replaying them.
        limit: most entries one action covers (the oldest first).

    Returns:
        ``{"ids": [the existing entries it covers], "rows": [the first 50 of them], "truncated":
        more matched than ``limit``, "skipped": [(id, why)] (replay: entries it would skip),
        "replayable": n, "live_workers": workers running (replay), else None}``.
    """
    if ids is not None:  # ids not of the form <ms>-<n> (or <sub id>/<ms>-<n>) name no dead letter
        ids = [i for i in dict.fromkeys(ids) if dead_letters.is_dead_letter_id(i)]
        if not ids:
            return {
                "ids": [],
                "rows": [],
                "truncated": False,
                "skipped": [],
                "replayable": 0,
                "live_workers": None,
            }
    if ids is None:
        selection = selection_of(filters, _topic_valid(client, qm, filters))
    else:
        selection = Selection(ids=tuple(ids))
    entries, _ = dead_letters.list_dead_letters(client, qm, selection, count=limit + 1)
    truncated = len(entries) > limit
    entries = entries[:limit]
    found = [e.id for e in entries]
    skipped: list[tuple[str, str]] = []
    replayable = len(found)
    live_workers = None
    if action == "replay" and found:
        report = dead_letters.replay(client, qm, Selection(ids=tuple(found)), keep=keep, dry_run=True)
        skipped = list(report.skipped)
        replayable = len(report.replayed)
        live_workers = report.live_workers
    return {
        "ids": found,
        "rows": [_row(e) for e in entries[:50]],
        "truncated": truncated,
        "skipped": skipped,
        "replayable": replayable,
        "live_workers": live_workers,
    }


def execute(client: redis.Redis, qm: str, pending: Pending) -> str:
    """Run a confirmed replay or purge on exactly the entries its confirmation page listed.

    Returns:
        One line saying what was done (shown on the next page).
    """
    selection = Selection(ids=pending.ids)
    if pending.action == "purge":
        removed = dead_letters.purge(client, qm, selection)
        return f"Purged {removed} dead letter(s)."
    report = dead_letters.replay(client, qm, selection, keep=pending.keep)
    text = f"Replayed {len(report.replayed)} dead letter(s)"
    if report.requeued:
        text += f" ({len(report.requeued)} re-queued to their subscription)"
    text += "; the dead letters were kept." if report.kept else "; their dead letters were removed."
    if report.skipped:
        reasons = "; ".join(f"{dlq_id}: {why}" for dlq_id, why in report.skipped[:5])
        text += f" Skipped {len(report.skipped)}: {reasons}"
    return text

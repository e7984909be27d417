"""The crash-point hook of a chaos worker or channel process, and the processes' entry points.

The harness arms a worker by writing a plan to ``<control dir>/<pid>.plan``
and sending the process SIGUSR1; the hook reads the plan in the signal handler,
so the hot path only compares a string. A plan is JSON::

    {"point": "before_commit", "action": "kill" | "stop", "after": 2}

At the ``after``-th time the worker passes ``point`` (one of
``worker.loop.CRASH_POINTS``, or a channel mover's ``before_channel_in`` /
``after_channel_in``) the hook writes ``<pid>.<action>`` (the point's
name) and then SIGKILLs the process (a crash) or SIGSTOPs it (a stall: the
harness SIGCONTs it once its lease is over, and the zombie's writes must be
fenced). An empty or missing plan disarms the hook. The process writes
``<pid>.ready`` once its SIGUSR1 handler is installed (before that, SIGUSR1
would end it).

A chaos worker also dies (SIGKILL, after writing ``<pid>.kill`` holding
``KILLER_FIELD``) as it handles an entry with the field ``KILLER_FIELD``: a
*killer entry*, as an entry that crashes a C extension or exhausts memory
would. Dead-lettering it (``max_deliveries``) does not handle it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

#: An entry with this field kills the chaos worker that handles it (``install_killer``).
KILLER_FIELD = "chaos.kill"


class CrashHook:
    """Callable passed as ``hook`` to ``worker.loop.Worker``/``main``.

    Args:
        control_dir: the directory the harness writes plans to.
    """

    def __init__(self, control_dir: str | Path) -> None:
        self.control_dir = Path(control_dir)
        self.plan: dict[str, Any] | None = None
        self.point: str | None = None

    def reload(self, signum: int | None = None, frame: object = None) -> None:
        """Read this process's plan (the SIGUSR1 handler)."""
        path = self.control_dir / f"{os.getpid()}.plan"
        try:
            plan = json.loads(path.read_text())
        except (OSError, ValueError):
            plan = None
        self.plan = plan or None
        self.point = plan["point"] if plan else None

    def __call__(self, point: str) -> None:
        if point != self.point or self.plan is None:
            return
        self.plan["after"] = int(self.plan.get("after", 1)) - 1
        if self.plan["after"] > 0:
            return
        action = self.plan.get("action", "kill")
        self.plan = self.point = None
        marker = self.control_dir / f"{os.getpid()}.{action}"
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(point)
        tmp.rename(marker)  # the harness never reads half a marker
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            os.kill(os.getpid(), signal.SIGKILL)


def install_killer(control_dir: str) -> None:
    """Make this worker process die (SIGKILL) as it handles an entry with ``KILLER_FIELD``."""
    import worker.decide

    real_parse = worker.decide.parse_entry
    field = KILLER_FIELD.encode()

    def parse(entry_id: str, fields: dict[bytes, bytes], *limits: int) -> Any:
        if field in fields:
            marker = Path(control_dir) / f"{os.getpid()}.kill"
            marker.with_suffix(".tmp").write_text(KILLER_FIELD)
            marker.with_suffix(".tmp").rename(marker)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_parse(entry_id, fields, *limits)

    worker.decide.parse_entry = parse  # type: ignore[assignment]


def _armed(control_dir: str, log_file: str, plan: dict[str, Any] | None) -> CrashHook:
    """Log to ``log_file``, install the SIGUSR1 handler of a ``CrashHook`` and say the process is ready."""
    logging.basicConfig(
        filename=log_file,
        level=logging.WARNING,
        format=f"%(asctime)s pid={os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    hook = CrashHook(control_dir)
    signal.signal(signal.SIGUSR1, hook.reload)
    hook.reload()
    if plan:
        hook.plan, hook.point = dict(plan), plan["point"]
    (Path(control_dir) / f"{os.getpid()}.ready").write_text("")  # SIGUSR1 may be sent from now on
    return hook


def run_worker(
    settings_json: str, control_dir: str, log_file: str, plan: dict[str, Any] | None = None
) -> None:
    """Entry point of a chaos worker process: ``worker.loop.main`` with a ``CrashHook``; it dies on
    killer entries (``install_killer``).

    Args:
        settings_json: ``Settings.model_dump_json()``.
        control_dir: where plans and markers live.
        log_file: the worker's log (warnings and errors), appended to.
        plan: a plan to start with (tests), instead of waiting for SIGUSR1.
    """
    from broker.core.config import Settings
    from worker.loop import main

    hook = _armed(control_dir, log_file, plan)
    install_killer(control_dir)
    main(Settings.model_validate_json(settings_json), hook=hook)


def run_channel(
    settings_json: str,
    control_dir: str,
    log_file: str,
    name: str | None = None,
    plan: dict[str, Any] | None = None,
) -> None:
    """Entry point of a chaos channel process: ``broker.network.channel.main`` with a ``CrashHook`` (crash
    points ``before_channel_in``, ``after_channel_in`` of its movers).

    Args:
        settings_json: ``Settings.model_dump_json()`` (its ``qm`` is the queue manager).
        control_dir: where plans and markers live.
        log_file: the process's log (warnings and errors), appended to.
        name: the process's name (its mover leases): a restarted process of the same slot
            takes its channels over at once instead of after the dead one's lease.
        plan: a plan to start with (tests), instead of waiting for SIGUSR1.
    """
    from broker.core.config import Settings
    from broker.network.channel import main

    hook = _armed(control_dir, log_file, plan)
    main(Settings.model_validate_json(settings_json), name=name, hook=hook)

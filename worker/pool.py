"""The worker pool: N worker processes, supervised.

- A child that dies (crash, SIGKILL) is restarted; its publishers' turns are
  taken over by the orphan sweep once its lease runs out, so nothing is lost.
- SIGTERM or SIGINT to the pool: each child finishes its current unit of work,
  gives up its turns and exits; children still running after the grace period
  are killed (their work is reclaimed later, as after a crash).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from multiprocessing.process import BaseProcess

from broker.config import Settings
from broker.errors import WorkerPoolFailed

log = logging.getLogger("broker.pool")

#: A child restarted more often than this many times a minute is given up on.
MAX_RESTARTS_PER_MINUTE = 30


def _child(settings_json: str) -> None:
    from worker.loop import main

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main(Settings.model_validate_json(settings_json))


class Pool:
    """Run and supervise ``settings.concurrency`` worker processes.

    Args:
        settings: the broker settings.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._ctx = multiprocessing.get_context("spawn")
        self._children: list[BaseProcess | None] = [None] * settings.concurrency
        self._restarts: list[float] = []
        self.stopping = False

    def _spawn(self, slot: int) -> None:
        proc = self._ctx.Process(
            target=_child, args=(self.settings.model_dump_json(),), name=f"broker-worker-{slot}", daemon=False
        )
        proc.start()
        self._children[slot] = proc

    def start(self) -> None:
        """Start every child."""
        for slot in range(len(self._children)):
            self._spawn(slot)

    def alive(self) -> int:
        """How many children are running."""
        return sum(1 for p in self._children if p is not None and p.is_alive())

    def supervise_once(self) -> int:
        """Restart children that died; returns how many were restarted."""
        restarted = 0
        for slot, proc in enumerate(self._children):
            if proc is not None and not proc.is_alive() and not self.stopping:
                now = time.monotonic()
                self._restarts = [t for t in self._restarts if now - t < 60] + [now]
                if len(self._restarts) > MAX_RESTARTS_PER_MINUTE:
                    raise WorkerPoolFailed(
                        f"workers died {len(self._restarts)} times in a minute; giving up (see the log above)"
                    )
                log.warning("worker %s exited with %s; restarting", proc.name, proc.exitcode)
                self._spawn(slot)
                restarted += 1
        return restarted

    def stop(self) -> None:
        """SIGTERM every child, wait up to ``stop_grace_ms``, then SIGKILL the rest."""
        self.stopping = True
        for proc in self._children:
            if proc is not None and proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + self.settings.stop_grace_ms / 1000
        for proc in self._children:
            if proc is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    log.warning("worker %s did not stop in time; killing it", proc.name)
                    proc.kill()
                    proc.join()

    def run(self) -> None:
        """Start, supervise until SIGTERM/SIGINT, then stop."""

        def _on_signal(signum: int, frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        self.start()
        try:
            while not self.stopping:
                self.supervise_once()
                time.sleep(0.2)
        finally:
            self.stop()

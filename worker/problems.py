"""Why a worker's rounds fail, told to the operator once per distinct problem: a full server
(``maxmemory`` reached: nothing written, the same units sent again), a foreign key (a key of the wrong
type where the broker keeps a queue-manager-wide key: nothing written, waiting for it to be removed),
or a Redis error (retried); then at debug level until the problem changes or goes away.

May import: ``broker.core`` (errors) only.
"""

from __future__ import annotations

import logging

import redis

from broker.core.errors import ForeignKey, ServerFull

log = logging.getLogger("broker.worker")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is full (``maxmemory`` reached), before anything was written."""
    return isinstance(exc, (redis.exceptions.OutOfMemoryError, ServerFull))


def script_error(exc: Exception) -> str:
    """A script's error reply as the operator reads it: ``foreign key: <key> holds a <type>, not a <type>``,
    without the ``BROKER`` tag and the script's sha and line that redis-py appends."""
    text = str(exc).removeprefix("BROKER ")
    return text.split(" script: ", 1)[0]


class Problems:
    """One worker's failed rounds (module text).

    Args:
        name: the worker's name, in every line logged.
        pause_ms: the pause between retries the worker makes, ms (told in the full server's line).
    """

    def __init__(self, name: str, pause_ms: int) -> None:
        self.name = name
        self.pause_ms = pause_ms
        #: the server was full (``maxmemory`` reached) in a round since the last one that committed
        self.server_full = False
        self._this_round = False  # the server was full in the round running
        self._last = ""  # the last problem logged at error or warning level

    def round_starts(self) -> None:
        """A round starts: whether the server is full is told by this round."""
        self._this_round = False

    def round_done(self, done: int) -> None:
        """A round committed ``done`` publications: after a full server, say it accepts writes again."""
        if self.server_full and done and not self._this_round:
            self.server_full = False
            self._last = ""
            log.info("worker %s: the server accepts writes again; going on", self.name)

    def report(self, exc: Exception) -> None:
        """Log why a round failed: once per distinct problem at error level, then at debug."""
        text = f"{type(exc).__name__}: {script_error(exc)}"  # the same problem from two scripts: one text
        full = out_of_memory(exc)
        if full:
            self._this_round = True
        if text == self._last or (full and self.server_full):
            log.debug("worker %s: %s; retrying", self.name, text)
            return
        self._last = text
        if full:
            self.server_full = True
            what = f"{exc.what} refused" if isinstance(exc, ServerFull) else str(exc).rstrip(".")
            log.warning(
                "worker %s: the Redis server is full (maxmemory reached; %s): nothing was written; "
                "pausing %d ms between retries until memory is freed",
                self.name,
                what,
                self.pause_ms,
            )
        elif isinstance(exc, ForeignKey):
            log.error(
                "worker %s: %s; nothing was written, waiting for it to be removed",
                self.name,
                script_error(exc),
            )
        else:
            log.warning("worker %s: %s; retrying", self.name, text)

"""Fault-injection pieces shared by ``scripts/chaos.py`` and the fault tests.

- ``broker.chaos.proxy``: a loopback TCP proxy in front of Redis that can drop
  the reply to a command the server has applied, or cut every connection.
- ``broker.chaos.hook``: the crash-point hook run inside worker processes
  (SIGKILL or SIGSTOP itself at a named point of ``worker.loop.CRASH_POINTS``).
- ``broker.chaos.history``: what was published and received, and the checker
  (lost, duplicated, reordered).

Nothing here is used by the broker itself.
"""

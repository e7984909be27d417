"""The test rig: fault injection and checking tooling, not shipped with the broker.

Imported by ``python -m scripts.chaos`` / ``python -m scripts.fuzz`` (run from the
repository's root) and by the tests; it imports ``broker`` and ``worker``, never ``tests``:

- ``proxy``: a loopback proxy that loses replies or cuts requests on a named command;
- ``hook``: the crash-point hook the chaos harness arms in worker processes;
- ``history``: what the chaos harness published and received, and the check of the guarantees;
- ``consumers``: consumer processes with a crash hook armed (the chaos harness, the tests);
- ``fuzzing``: bad input of every kind, for the property tests and ``scripts/fuzz.py``;
- ``cluster``: a local Redis Cluster and queue manager names on distinct masters;
- ``tls``: a server with trustme certificates.

The in-process workers, the throwaway server and the collecting subscriber are shipped:
``broker.testing``.
"""

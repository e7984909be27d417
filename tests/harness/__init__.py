"""Test, fault-injection and benchmark tooling: not shipped with the broker.

Importable by the tests and by ``python -m scripts.chaos`` / ``python -m
scripts.bench`` / ``python -m scripts.fuzz`` run from the repository's root:

- ``testing``: a throwaway server, in-process workers driven round by round, queue contents;
- ``proxy``: a loopback proxy that loses replies or cuts requests on a named command;
- ``hook``: the crash-point hook the chaos harness arms in worker processes;
- ``history``: what the chaos harness published and received, and the check of the guarantees;
- ``bench_lib``: the measurements of ``scripts/bench.py``;
- ``fuzzing``: bad input of every kind, for the property tests and ``scripts/fuzz.py``.
"""

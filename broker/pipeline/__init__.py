"""Spark jobs around the broker: bulk publishing from a data set, exporting and auditing the delivery journal.

Everything that needs PySpark (a JVM) or pyarrow lives in this package and is
imported lazily: ``broker.cli.pipeline`` defines the click groups ``pipeline``
and ``journal`` without importing either, so the broker and its workers start
without them (they come with the ``spark`` extra).

- ``session``: the one SparkSession builder (local master, quiet, UTC).
- ``source``: reading a data set and turning each row into a publication with a
  deterministic message id and per-publisher sequence number.
- ``publish``: the bulk publish job (one partition owns whole publishers).
- ``journal``: exporting (and draining) the ``{qm}:journal`` stream to Parquet.
- ``routes``: MQTT 5 §4.7 matching and link closure, written independently of
  ``broker.core.topic_rules``, for the audit's expectations.
- ``audit``: the audit job over the exported journal, its JSON report and figure.
"""

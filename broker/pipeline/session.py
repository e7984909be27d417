"""The one SparkSession builder of the pipeline jobs: local, quiet, UTC, no UI.

Spark runs in local mode by default (``local[*]``: one executor thread per
core, inside the driver's JVM); its Python workers are this interpreter
(``PYSPARK_PYTHON=sys.executable``) so they import the same ``broker`` package.
Task retries in local mode need the ``local[N,F]`` master syntax (F attempts
per task); ``spark.task.maxFailures`` only applies to cluster masters.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The default master: local mode, one task slot per core.
DEFAULT_MASTER = "local[*]"
#: Default driver memory (the whole of local mode lives in the driver JVM).
DEFAULT_DRIVER_MEMORY = "2g"
#: Shuffle partitions: the data sets here are small, 200 (Spark's default) only adds overhead.
SHUFFLE_PARTITIONS = 4

_LOCAL = re.compile(r"^local\[\s*(\d+|\*)\s*(?:,\s*(\d+)\s*)?\]$")

#: Log4j 2 configuration: warnings from Spark's own loggers are noise for a CLI job. A failed
#: task's Python traceback is not logged by the executor: it reaches the driver, which raises
#: it when the task has no attempt left.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
"""


def _log_config() -> str:
    path = Path(tempfile.gettempdir()) / "broker-pipeline-log4j2.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return str(path)


def task_attempts(master: str) -> int | None:
    """How many attempts a task gets under a local master.

    Args:
        master: a Spark master URL.

    Returns:
        F of ``local[N,F]``, 1 for ``local``/``local[N]``, None for a non-local master.
    """
    if master == "local":
        return 1
    found = _LOCAL.match(master)
    if found is None:
        return None
    return int(found.group(2)) if found.group(2) else 1


def with_retries(master: str, attempts: int = 3) -> str:
    """The local master with ``attempts`` attempts per task (``local[2]`` -> ``local[2,3]``).

    Non-local masters are returned unchanged (set ``spark.task.maxFailures`` there).
    """
    if master == "local":
        return f"local[1,{attempts}]"
    found = _LOCAL.match(master)
    if found is None:
        return master
    return f"local[{found.group(1)},{attempts}]"


def build_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "broker-pipeline",
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    shuffle_partitions: int = SHUFFLE_PARTITIONS,
    log_level: str = "ERROR",
) -> SparkSession:
    """Start (or return the running) SparkSession for the pipeline jobs.

    If a session is already running in this process it is returned as it is
    (its master and memory cannot change any more).

    Args:
        master: Spark master URL, e.g. ``local[*]``, ``local[2,3]`` (2 slots,
            3 attempts per task) or ``spark://host:7077``.
        app_name: the application name.
        driver_memory: ``spark.driver.memory``, e.g. ``2g``.
        shuffle_partitions: ``spark.sql.shuffle.partitions``.
        log_level: Spark's log level once started (``ERROR``, ``WARN``, ``INFO``).

    Returns:
        The SparkSession.

    Raises:
        ImportError: pyspark is not installed (``pip install 'redis-pubsub-broker[spark]'``).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_log_config()}")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark

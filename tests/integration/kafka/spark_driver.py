"""A Spark driver in a process of its own, for ``test_kafka_spark.py``: one SparkSession with
Spark's Kafka connector on its class path (``spark.jars``), driven over stdin and stdout.

Why a process of its own: ``spark.jars`` reaches the driver's class path only when the JVM
is launched, and the test session may already have one (the jobs' tests share a session
without the connector; a JVM launched by pyspark serves every session of its process).

Run as a script, ``spark_driver.py JARS_DIR``. Each stdin line is a JSON command; each answer
is one stdout line ``RESULT_PREFIX + json`` (the JVM writes to the same stdout, so other
lines are skipped). Keys and values travel as hex. Commands:

- ``{"op": "read", "bootstrap", "topic"}``: ``spark.read.format("kafka")`` of the whole
  topic -> ``{"rows": [[partition, offset, key, value], ...]}``
- ``{"op": "write", "bootstrap", "topic", "rows": [[key, value], ...]}``:
  ``df.write.format("kafka")`` of those rows -> ``{"written": n}``
- ``{"op": "stream", "bootstrap", "topic", "checkpoint", "out"}``: one ``readStream`` run
  with ``trigger(availableNow=True)`` into a parquet sink at ``out`` ->
  ``{"input_rows": rows this run read, "rows": every row in ``out``}``
- ``{"op": "stop"}``: stop Spark and exit.

A command that raises answers ``{"error": traceback}`` and the driver goes on.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

RESULT_PREFIX = "@@spark-driver "

_ROW_COLUMNS = ("partition", "offset", "hex(key) AS key", "hex(value) AS value")


def _session(jars_dir: Path) -> Any:
    from pyspark.sql import SparkSession

    jars = ",".join(str(p) for p in sorted(jars_dir.glob("*.jar")))
    spark = (
        SparkSession.builder.appName("headrace-kafka-tests")
        .master("local[2]")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # a short-lived driver on two shared cores: one GC thread, and the quick JIT alone
        # (C2's compiles cost more CPU than a few small jobs win back)
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _rows(df: Any) -> list[list[Any]]:
    return [list(r) for r in df.selectExpr(*_ROW_COLUMNS).collect()]


def _read(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", cmd["bootstrap"])
        .option("subscribe", cmd["topic"])
        .load()
    )
    return {"rows": _rows(df)}


def _write(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    # an inline table of binary literals: no Python worker to start for local data
    values = ", ".join(f"(X'{key}', X'{value}')" for key, value in cmd["rows"])
    df = spark.sql(f"SELECT * FROM VALUES {values} AS t(key, value)")
    (
        df.write.format("kafka")
        .option("kafka.bootstrap.servers", cmd["bootstrap"])
        .option("topic", cmd["topic"])
        .save()
    )
    return {"written": len(cmd["rows"])}


def _stream(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", cmd["bootstrap"])
        .option("subscribe", cmd["topic"])
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("partition", "offset", "key", "value")
    )
    query = (
        source.writeStream.format("parquet")
        .option("path", cmd["out"])
        .option("checkpointLocation", cmd["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    input_rows = sum(p["numInputRows"] for p in query.recentProgress)
    return {"input_rows": input_rows, "rows": _rows(spark.read.parquet(cmd["out"]))}


OPS = {"read": _read, "write": _write, "stream": _stream}


def main() -> None:
    spark = _session(Path(sys.argv[1]))
    print(RESULT_PREFIX + json.dumps({"ready": spark.version}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "stop":
            break
        try:
            answer = OPS[cmd["op"]](spark, cmd)
        except Exception:
            answer = {"error": traceback.format_exc()}
        print(RESULT_PREFIX + json.dumps(answer), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()

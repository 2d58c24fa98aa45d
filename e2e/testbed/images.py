"""Known images: what a container without ``command`` runs on this host (pure, but for
``host_images``, which looks the host's programs up once at start-up).

The runner has no images, so a container must name a host program. Some pods are
made by programs we do not control, and name only an image and its arguments: Spark's
driver creates executor pods with ``image: <spark.kubernetes.container.image>``,
``args: ["executor"]`` and the contract in environment variables. For those images
this module stands in for the image's entrypoint, as a small explicit table from image
repository (any tag) to an adapter that turns the container's resolved ``args`` and
environment into a host argv. An image not in the table stays an error
(``CreateContainerConfigError``), as before.

**Spark** (``apache/spark``, ``spark``, and headrace's own Spark image,
``headrace-spark``, whose entrypoint does the same): the image's ``/opt/entrypoint.sh executor``
runs ``java $SPARK_JAVA_OPT_* -Xms$SPARK_EXECUTOR_MEMORY -Xmx$SPARK_EXECUTOR_MEMORY
-cp $SPARK_CONF_DIR:$SPARK_HOME/jars/* KubernetesExecutorBackend --driver-url
$SPARK_DRIVER_URL --executor-id $SPARK_EXECUTOR_ID --cores $SPARK_EXECUTOR_CORES
--app-id $SPARK_APPLICATION_ID --hostname $SPARK_EXECUTOR_POD_IP --resourceProfileId
$SPARK_RESOURCE_PROFILE_ID --podName $SPARK_EXECUTOR_POD_NAME`` (Spark's
``resource-managers/kubernetes/docker/.../entrypoint.sh``). Here the same command runs
with the host's ``java`` and pyspark's bundled jars as ``SPARK_HOME``; the executor's
Python workers run the interpreter the driver names (pyspark ships the driver's
``PYSPARK_PYTHON`` with every Python function), which on the test bed is this
checkout's virtualenv. Only ``executor`` is mapped: a driver pod (cluster deploy mode)
is not needed, since headrace's driver runs in the Job's own pod.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from e2e.testbed.podspec import ConfigError, ImageEntrypoint

#: Spark's executor main class (spark-kubernetes jar), as the image's entrypoint runs it
SPARK_EXECUTOR_CLASS = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
#: the variables Spark's executor pods carry (``BasicExecutorFeatureStep``); the
#: entrypoint cannot run without them
SPARK_EXECUTOR_ENV = (
    "SPARK_DRIVER_URL",
    "SPARK_EXECUTOR_ID",
    "SPARK_EXECUTOR_CORES",
    "SPARK_EXECUTOR_MEMORY",
    "SPARK_APPLICATION_ID",
    "SPARK_EXECUTOR_POD_IP",
    "SPARK_RESOURCE_PROFILE_ID",
    "SPARK_EXECUTOR_POD_NAME",
)
_JAVA_OPT = re.compile(r"^SPARK_JAVA_OPT_(\d+)$")


@dataclass(frozen=True)
class SparkHost:
    """The host's stand-ins for the Spark image's ``JAVA_HOME`` and ``SPARK_HOME``."""

    java: str
    #: pyspark's package directory: its ``jars/`` is a Spark distribution's
    spark_home: Path


class Entrypoint(NamedTuple):
    """What the image's entrypoint would exec: argv and the environment it adds."""

    argv: list[str]
    env: dict[str, str]


#: (container args, resolved environment) -> what runs
Adapter = Callable[[Sequence[str], Mapping[str, str]], Entrypoint]


def spark_entrypoint(host: SparkHost) -> Adapter:
    """Spark's ``entrypoint.sh`` for ``executor``, on the host (see the module)."""

    def run(args: Sequence[str], env: Mapping[str, str]) -> Entrypoint:
        if not args or args[0] != "executor":
            raise ConfigError(
                f"the Spark image runs only 'executor' on the test bed, not {list(args)!r}"
                " (the driver runs in the Job's pod, client deploy mode)"
            )
        missing = [name for name in SPARK_EXECUTOR_ENV if not env.get(name)]
        if missing:
            raise ConfigError(f"a Spark executor pod needs {', '.join(missing)} in its env")
        numbered = sorted(
            (int(m.group(1)), value)
            for name, value in env.items()
            if (m := _JAVA_OPT.match(name)) is not None
        )
        conf_dir = env.get("SPARK_CONF_DIR") or str(host.spark_home / "conf")
        classpath = [conf_dir, str(host.spark_home / "jars" / "*")]
        classpath += [p for p in (env.get("SPARK_EXTRA_CLASSPATH"),) if p]
        memory = env["SPARK_EXECUTOR_MEMORY"]
        argv = [
            host.java,
            *(value for _, value in numbered),
            f"-Xms{memory}",
            f"-Xmx{memory}",
            "-cp",
            ":".join(classpath),
            SPARK_EXECUTOR_CLASS,
            *("--driver-url", env["SPARK_DRIVER_URL"]),
            *("--executor-id", env["SPARK_EXECUTOR_ID"]),
            *("--cores", env["SPARK_EXECUTOR_CORES"]),
            *("--app-id", env["SPARK_APPLICATION_ID"]),
            *("--hostname", env["SPARK_EXECUTOR_POD_IP"]),
            *("--resourceProfileId", env["SPARK_RESOURCE_PROFILE_ID"]),
            *("--podName", env["SPARK_EXECUTOR_POD_NAME"]),
        ]
        return Entrypoint(argv, {"SPARK_HOME": str(host.spark_home)})

    return run


def repository(image: str) -> str:
    """``apache/spark`` of ``docker.io/apache/spark:4.3.0-python3`` (registry, tag and
    digest dropped)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        name = rest  # a registry host
    return name.removeprefix("library/")


def table(spark: SparkHost | None) -> dict[str, Adapter]:
    """The known images: repository -> adapter (Spark's only if the host has it)."""
    known: dict[str, Adapter] = {}
    if spark is not None:
        adapter = spark_entrypoint(spark)
        # headrace's Spark image (``make image-spark``: its entrypoint runs ``executor``
        # as Spark's does), as ``make image-spark`` tags it and as the chart names it
        known.update(
            {
                "apache/spark": adapter,
                "spark": adapter,
                "headrace-spark": adapter,
                "headrace/headrace-spark": adapter,
            }
        )
    return known


def entrypoint(
    known: Mapping[str, Adapter],
    container: Mapping[str, object],
    args: Sequence[str],
    env: Mapping[str, str],
) -> Entrypoint:
    """What a container without ``command`` runs: its image's adapter, or ConfigError."""
    image = str(container.get("image") or "")
    container_name = container.get("name")
    adapter = known.get(repository(image)) if image else None
    if adapter is None:
        mapped = ", ".join(sorted(known)) or "none on this host"
        raise ConfigError(
            f"container {container_name!r} has no command: the test bed ignores images, so"
            " every container must name a program that exists on the host (images with a"
            f" known entrypoint: {mapped}; not {image!r})"
        )
    return adapter(args, env)


def host_images() -> dict[str, Adapter]:
    """The table for this host: Spark's executor if pyspark and ``java`` are here."""
    spec = importlib.util.find_spec("pyspark")
    java = shutil.which("java")
    spark = None
    if spec is not None and spec.origin is not None and java is not None:
        home = Path(spec.origin).parent
        if (home / "jars").is_dir():
            spark = SparkHost(java, home)
    return table(spark)


def host_entrypoints() -> ImageEntrypoint:
    """``podspec.process``'s ``image_entrypoint`` for this host (the runner's)."""
    known = host_images()

    def resolve(
        container: dict[str, Any], args: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        return entrypoint(known, container, args, env)

    return resolve

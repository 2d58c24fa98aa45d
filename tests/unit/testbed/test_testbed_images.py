"""images: a container without ``command`` runs its image's stand-in entrypoint (Spark's
executor), or gets a clear CreateContainerConfigError."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.testbed import images, podspec

SPARK = images.SparkHost(java="/usr/bin/java", spark_home=Path("/venv/pyspark"))
KNOWN = images.table(SPARK)


def executor_env(**extra: str) -> dict[str, str]:
    return {
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.3.4:7078",
        "SPARK_EXECUTOR_ID": "2",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_APPLICATION_ID": "spark-abc",
        "SPARK_EXECUTOR_POD_IP": "127.0.3.5",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "job-exec-2",
        **extra,
    }


def container(image: str = "apache/spark:4.3.0-python3", **extra: Any) -> dict[str, Any]:
    return {"name": "spark-kubernetes-executor", "image": image, "args": ["executor"], **extra}


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("apache/spark:4.3.0-python3", "apache/spark"),
        ("docker.io/apache/spark:4.3.0", "apache/spark"),
        ("registry.local:5000/apache/spark@sha256:abc", "apache/spark"),
        ("spark", "spark"),
        ("library/spark:4.3.0", "spark"),
        ("localhost/team/spark:1", "team/spark"),
        ("ghcr.io/headrace/headrace:latest", "headrace/headrace"),
    ],
)
def test_an_image_is_known_by_its_repository(image: str, repository: str) -> None:
    assert images.repository(image) == repository


def test_a_spark_executor_runs_as_the_image_entrypoint_would() -> None:
    env = executor_env(
        SPARK_JAVA_OPT_10="-Dspark.later=1",
        SPARK_JAVA_OPT_0="-Dspark.driver.port=7078",
        SPARK_JAVA_OPT_2="-Dspark.x=y",
        SPARK_CONF_DIR="/pods/p/volumes/spark-conf-volume-exec",
    )
    argv, added = images.entrypoint(KNOWN, container(), ["executor"], env)
    # the numbered Java options in their numeric order (entrypoint.sh's sort -n), then heap
    assert argv[:6] == [
        "/usr/bin/java",
        "-Dspark.driver.port=7078",
        "-Dspark.x=y",
        "-Dspark.later=1",
        "-Xms512m",
        "-Xmx512m",
    ]
    classpath = argv[argv.index("-cp") + 1]
    assert classpath == "/pods/p/volumes/spark-conf-volume-exec:/venv/pyspark/jars/*"
    assert images.SPARK_EXECUTOR_CLASS in argv
    tail = argv[argv.index(images.SPARK_EXECUTOR_CLASS) + 1 :]
    assert dict(zip(tail[::2], tail[1::2], strict=True)) == {
        "--driver-url": env["SPARK_DRIVER_URL"],
        "--executor-id": "2",
        "--cores": "1",
        "--app-id": "spark-abc",
        "--hostname": "127.0.3.5",
        "--resourceProfileId": "0",
        "--podName": "job-exec-2",
    }
    assert added == {"SPARK_HOME": "/venv/pyspark"}


def test_a_spark_executor_without_a_conf_dir_uses_spark_home_conf() -> None:
    argv, _ = images.entrypoint(KNOWN, container(), ["executor"], executor_env())
    assert argv[argv.index("-cp") + 1].startswith("/venv/pyspark/conf:")


def test_a_spark_pod_missing_its_contract_is_a_config_error() -> None:
    env = executor_env()
    del env["SPARK_DRIVER_URL"]
    with pytest.raises(podspec.ConfigError, match="SPARK_DRIVER_URL"):
        images.entrypoint(KNOWN, container(), ["executor"], env)
    with pytest.raises(podspec.ConfigError, match="only 'executor'"):
        images.entrypoint(KNOWN, container(), ["driver"], executor_env())


@pytest.mark.parametrize("known", [KNOWN, images.table(None)])
def test_an_unknown_image_without_command_is_a_config_error(
    known: dict[str, images.Adapter],
) -> None:
    with pytest.raises(podspec.ConfigError, match="has no command") as caught:
        images.entrypoint(known, container("nginx:1.27"), [], {})
    assert caught.value.reason == "CreateContainerConfigError"
    assert "nginx:1.27" in str(caught.value)


def test_podspec_resolves_the_env_and_mounts_before_the_entrypoint() -> None:
    pod = {
        "metadata": {"name": "job-exec-2", "namespace": "ns", "uid": "u"},
        "spec": {"containers": []},
    }
    env_spec = [{"name": k, "value": v} for k, v in executor_env().items()]
    pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    env_spec[5] = {"name": "SPARK_EXECUTOR_POD_IP", "valueFrom": pod_ip}
    env_spec.append({"name": "SPARK_LOCAL_DIRS", "value": "/var/data/spark-1"})
    spec = container(
        env=env_spec, volumeMounts=[{"name": "spark-local-dir-1", "mountPath": "/var/data/spark-1"}]
    )
    world = podspec.World(pod_ip="127.0.9.9", host_ip="127.0.0.1")
    proc = podspec.process(
        pod,
        spec,
        world,
        {"spark-local-dir-1": Path("/pods/x/volumes/local")},
        image_entrypoint=lambda c, args, env: images.entrypoint(KNOWN, c, args, env),
    )
    assert proc.argv[0] == "/usr/bin/java"
    assert proc.argv[proc.argv.index("--hostname") + 1] == "127.0.9.9"
    assert proc.env["SPARK_LOCAL_DIRS"] == "/pods/x/volumes/local"
    assert proc.env["SPARK_HOME"] == "/venv/pyspark"


def test_podspec_without_an_entrypoint_table_refuses_a_commandless_container() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
    world = podspec.World(pod_ip="127.0.9.9", host_ip="127.0.0.1")
    with pytest.raises(podspec.ConfigError, match="has no command"):
        podspec.process(pod, container(), world, {})


#: the Spark image's entrypoint (Containerfile.spark), which the stand-in's adapter mimics
SPARK_IMAGE_ENTRYPOINT = Path(__file__).resolve().parents[3] / "tools/image/spark-entrypoint.sh"


def run_image_entrypoint(
    tmp_path: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """The Spark image's entrypoint under bash, with a ``java`` that prints its argv."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True, exist_ok=True)
    java.write_text('#!/bin/sh\nfor arg in "$@"; do printf "%s\\n" "$arg"; done\n')
    java.chmod(0o755)
    return subprocess.run(
        ["bash", str(SPARK_IMAGE_ENTRYPOINT), *args],
        env={
            **env,
            "PATH": os.environ["PATH"],
            "JAVA_HOME": str(tmp_path / "jdk"),
            "SPARK_HOME": str(SPARK.spark_home),
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    "image", ["localhost/headrace-spark:src-0123", "ghcr.io/headrace/headrace-spark:0.1.0"]
)
def test_the_spark_image_entrypoint_starts_the_executor_the_stand_in_starts(
    tmp_path: Path, image: str
) -> None:
    env = executor_env(
        SPARK_JAVA_OPT_10="-Dspark.later=1",
        SPARK_JAVA_OPT_0="-Dspark.driver.port=7078",
        SPARK_JAVA_OPT_2="-Dspark.app.name=a name with spaces",
    )
    done = run_image_entrypoint(tmp_path, env, "executor")
    assert done.returncode == 0, done.stderr
    stand_in, _ = images.entrypoint(KNOWN, container(image), ["executor"], env)
    assert done.stdout.splitlines() == stand_in[1:]


def test_the_spark_image_entrypoint_refuses_an_executor_without_its_contract(
    tmp_path: Path,
) -> None:
    env = executor_env()
    del env["SPARK_DRIVER_URL"]
    done = run_image_entrypoint(tmp_path, env, "executor")
    assert done.returncode == 64 and not done.stdout
    assert "SPARK_DRIVER_URL is not set" in done.stderr


def test_the_spark_image_entrypoint_runs_any_other_command_as_given(tmp_path: Path) -> None:
    done = run_image_entrypoint(tmp_path, {}, "sh", "-c", "echo driver")
    assert (done.returncode, done.stdout) == (0, "driver\n")

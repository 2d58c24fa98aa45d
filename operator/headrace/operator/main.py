"""The operator process: take the Lease, then run kopf with the headrace handlers.

Settings are read here, once, from options (or their environment variables)
and handed to the handlers through kopf's ``memo``.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import threading

import click

from headrace.operator.kube import ClientApi, FencedApi, api_client
from headrace.operator.leasing import DEFAULT_LEASE_SECONDS, LeaseElector, LeaseSettings
from headrace.operator.running import RuntimeSettings
from headrace.operator.surfaces import DEFAULT_PORT, Surfaces
from headrace.operator.workloads import (
    DEFAULT_IMAGE,
    DEFAULT_SPARK_IMAGE,
    DEFAULT_SPARK_IMAGE_PULL_POLICY,
    DEFAULT_SPARK_SERVICE_ACCOUNT,
    PULL_POLICIES,
    Advertise,
    WorkloadSettings,
)

log = logging.getLogger(__name__)

#: exit status when the Lease is lost: stop at once, so the replica that took it is the
#: only writer (a Deployment restarts this one, which then waits for the Lease)
EXIT_LEASE_LOST = 3


def parse_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::]:PORT`` for IPv6) as a pair; None for ``off``."""
    if text.strip().lower() == "off":
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise click.BadParameter(f"{text!r}: expected HOST:PORT or off", param_hint="--surfaces")
    return host.strip("[]"), int(port)


@click.command()
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None, help="Else in-cluster config.")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch only this namespace (repeatable); all namespaces when unset.",
)
@click.option(
    "--broker-command",
    envvar="HEADRACE_BROKER_COMMAND",
    default="headrace",
    show_default=True,
    help="The program that runs `headrace` in broker pods (shell words).",
)
@click.option("--image", envvar="HEADRACE_IMAGE", default=DEFAULT_IMAGE)
@click.option(
    "--advertise",
    envvar="HEADRACE_ADVERTISE",
    type=click.Choice([a.value for a in Advertise]),
    default=Advertise.DNS.value,
    show_default=True,
    help="What brokers tell clients and one another to dial: their stable names"
    " (<pod>.<cluster>-brokers.<namespace>.svc) or their pod IPs (a cluster without DNS).",
)
@click.option(
    "--spark-image",
    envvar="HEADRACE_SPARK_IMAGE",
    default=DEFAULT_SPARK_IMAGE,
    show_default=True,
    help="The Spark image (Java, headrace's jobs extra): every Compaction's Job runs its"
    " driver from it, and its executor pods (spark.master: kubernetes) too.",
)
@click.option(
    "--spark-image-pull-policy",
    envvar="HEADRACE_SPARK_IMAGE_PULL_POLICY",
    type=click.Choice(list(PULL_POLICIES)),
    default=DEFAULT_SPARK_IMAGE_PULL_POLICY,
    show_default=True,
    help="The imagePullPolicy of those drivers' and executors' containers.",
)
@click.option(
    "--spark-service-account",
    envvar="HEADRACE_SPARK_SERVICE_ACCOUNT",
    default=DEFAULT_SPARK_SERVICE_ACCOUNT,
    show_default=True,
    help="The service account of those Compactions' driver pods (executors: default).",
)
@click.option("--lease-namespace", envvar="HEADRACE_LEASE_NAMESPACE", default="default")
@click.option("--lease-name", default="headrace-operator", show_default=True)
@click.option("--identity", default=None, help="This replica's name in the Lease.")
@click.option(
    "--lease-duration-seconds",
    type=int,
    default=DEFAULT_LEASE_SECONDS,
    show_default=True,
    help="A holder silent this long is presumed gone (a successor then takes over).",
)
@click.option("--poll-interval-ms", type=int, default=1000, show_default=True)
@click.option(
    "--surfaces",
    envvar="HEADRACE_OPERATOR_SURFACES",
    default=f"127.0.0.1:{DEFAULT_PORT}",
    show_default=True,
    help="HOST:PORT of /healthz, /readyz, /metrics and the dashboard; 'off' for none."
    " Loopback by default; in a pod its IP (the chart: $(POD_IP)), which the probes reach.",
)
@click.option("-v", "--verbose", count=True)
def operator(
    kubeconfig: str | None,
    namespaces: tuple[str, ...],
    broker_command: str,
    image: str,
    advertise: str,
    spark_image: str,
    spark_image_pull_policy: str,
    spark_service_account: str,
    lease_namespace: str,
    lease_name: str,
    identity: str | None,
    lease_duration_seconds: int,
    poll_interval_ms: int,
    surfaces: str,
    verbose: int,
) -> None:
    """Run the headrace operator."""
    address = parse_address(surfaces)
    if kubeconfig:
        # before the client is imported: it reads KUBECONFIG once, at import, and kopf's
        # login goes through it
        os.environ["KUBECONFIG"] = kubeconfig
    import kopf

    from headrace.fleet.clock import SystemClock
    from headrace.operator import compaction_handlers, handlers, principals, snapshot_handlers

    assert compaction_handlers  # imported for its kopf handlers (Compaction, CompactionSchedule)
    assert snapshot_handlers  # imported for its kopf handlers (TopicSnapshot, TopicRestore)
    assert principals  # imported for its kopf handlers (User)

    logging.basicConfig(
        level=logging.INFO if verbose == 0 else logging.DEBUG,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if verbose == 0:
        # kopf logs every handled watch event at INFO ("Handler ... succeeded"): one per
        # status write of ours; its warnings and errors still show
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    identity = identity or f"{socket.gethostname()}-{os.getpid()}"
    # before the Lease: a standby answers its probes too (see surfaces)
    server = None
    if address is not None:
        server = Surfaces(*address, interval_s=poll_interval_ms / 1000)
        server.start()
        log.info("surfaces on http://%s:%d/", address[0], server.port)
    elector = LeaseElector.over(
        api_client(kubeconfig),
        identity,
        LeaseSettings.for_duration(lease_namespace, lease_name, lease_duration_seconds),
    )
    stop = threading.Event()
    elector.acquire(stop)

    def lost() -> None:
        log.critical("lease lost: exiting so that one replica writes")
        logging.shutdown()
        os._exit(EXIT_LEASE_LOST)

    elector.keep(lost, stop)
    context = handlers.OperatorContext(
        api=FencedApi(ClientApi(kubeconfig), elector.leading),
        clock=SystemClock(),
        workload=WorkloadSettings(
            broker_command=tuple(shlex.split(broker_command)),
            default_image=image,
            spark_image=spark_image,
            spark_image_pull_policy=spark_image_pull_policy,
            spark_service_account=spark_service_account,
            advertise=Advertise(advertise),
        ),
        runtime=RuntimeSettings(poll_interval_ms=poll_interval_ms),
    )
    if server is not None:
        context.metrics = server.metrics
        context.surfaces = server
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    try:
        kopf.run(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            settings=settings,
            memo=kopf.Memo(context=context),
        )
    finally:
        stop.set()
        elector.release()
        if server is not None:
            server.stop()

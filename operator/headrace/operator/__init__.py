"""The kopf operator: BrokerCluster, Topic and Unload reconciled into broker pods and CR status.

It drives the same ``ControlLoop`` (``headrace.control.looping``) as the local
controller, through Kubernetes adapters instead of files:

``kube``       the one small API wrapper everything writes through (``KubeApi``)
``statuses``   the loop's ``StatusStore`` as CR status, compare-and-swap on resourceVersion
``workloads``  a BrokerCluster's StatefulSet, Services, PDB, ConfigMap (pure manifests)
``running``    one cluster's loop: its ports (status store, pod fleet, clock) and its pacing
``handlers``   the kopf handlers (thin): indices, workload apply, the loop daemon, kicks
``leasing``    one active replica: a coordination.k8s.io Lease
``install``    the operator's own manifests: ServiceAccount, RBAC, Deployment
``main``       ``python -m headrace.operator``

It sits beside the local controller (``headrace.controller``), never above it: the
two share the brokers' fleet and clock (``headrace.fleet``) and the dashboard's route
(``headrace.dashboard.routes``); see the layers contract in ``pyproject.toml``.
"""

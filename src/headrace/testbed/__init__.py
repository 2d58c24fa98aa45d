"""A real Kubernetes control plane on loopback, without Docker, for end-to-end tests.

Theory of operation
-------------------
``testbed/build.sh`` builds etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl and helm from their upstream Go modules (versions in
``testbed/versions.env``). ``headrace-testbed up`` then:

1. generates a CA, serving and client certificates and the service-account key pair
   (:mod:`headrace.testbed.pki`), and kubeconfigs for every client
   (:mod:`headrace.testbed.kubeconfig`);
2. starts etcd and the three control-plane components as detached processes on
   127.0.0.1 (:mod:`headrace.testbed.controlplane`), authorization mode ``RBAC``;
3. starts the *runner* (:mod:`headrace.testbed.kubelet`), a process standing in for
   the kubelet: it registers a Node, keeps its Lease fresh, runs the containers of
   pods bound to it as local processes (the image is ignored: the command must
   exist on the host), gives each pod its own 127.0.0.N address, runs probes,
   reports status, serves container logs to ``kubectl logs``, and provisions
   PersistentVolumes as directories.

Pure decisions live in modules with no I/O, unit-tested without a cluster:
:mod:`~headrace.testbed.podspec` (env, ``$(VAR)`` expansion, volume paths),
:mod:`~headrace.testbed.probes` (when to probe, what a result means),
:mod:`~headrace.testbed.podstatus` (phase, conditions, restarts) and
:mod:`~headrace.testbed.ipam` (address allocation).
"""

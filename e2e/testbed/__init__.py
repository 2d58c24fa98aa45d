"""A real Kubernetes control plane on loopback, without Docker, for end-to-end tests.

Theory of operation
-------------------
``e2e/testbed/build.sh`` builds etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl and helm from their upstream Go modules (versions in
``e2e/testbed/versions.env``). ``python -m e2e.testbed up`` then:

1. generates a CA, serving and client certificates and the service-account key pair
   (:mod:`e2e.testbed.pki`), and kubeconfigs for every client
   (:mod:`e2e.testbed.kubeconfig`);
2. starts etcd and the three control-plane components as detached processes on
   127.0.0.1 (:mod:`e2e.testbed.controlplane`), authorization mode ``RBAC``;
3. starts the *runner* (:mod:`e2e.testbed.kubelet`), a process standing in for
   the kubelet: it registers a Node, keeps its Lease fresh, runs the containers of
   pods bound to it as local processes (the image is ignored: the command must
   exist on the host), gives each pod its own 127.0.0.N address, runs probes,
   reports status, serves container logs to ``kubectl logs``, and provisions
   PersistentVolumes as directories.

Pure decisions live in modules with no I/O, unit-tested without a cluster:
:mod:`~e2e.testbed.podspec` (env, ``$(VAR)`` expansion, volume paths),
:mod:`~e2e.testbed.probes` (when to probe, what a result means),
:mod:`~e2e.testbed.podstatus` (phase, conditions, restarts) and
:mod:`~e2e.testbed.ipam` (address allocation).
"""

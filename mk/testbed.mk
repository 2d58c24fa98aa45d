# Test bed: a real Kubernetes control plane on loopback (docs/testbed.md).
#   make testbed        build etcd, kube-*, kubectl, helm from Go modules (idempotent)
#   make testbed-up     start it; KUBECONFIG is printed (and in `python -m e2e.testbed env`)
#   make testbed-down   stop it (pods' processes included)
#   make e2e            the end-to-end suite (E2E_PROVIDER=testbed|kind)
#   make e2e-node       the suite on a real node (E2E_NODE=real: containerd, runc, CNI, the
#                       kubelet and kube-proxy; needs root; builds the node and `make image`)
#   make e2e-node-fast  on the real node: pods as containers, and a BrokerCluster Ready where
#                       "restricted" is enforced with a produce/consume (not in `make test` yet)
.PHONY: testbed testbed-up testbed-down testbed-status e2e e2e-node e2e-node-fast

TEST_E2E_PATHS += e2e

testbed:
	bash e2e/testbed/build.sh

testbed-up: setup testbed
	$(PY) -m e2e.testbed up --no-build

testbed-down: setup
	$(PY) -m e2e.testbed down

testbed-status: setup
	$(PY) -m e2e.testbed status

e2e: setup
	$(BIN)/pytest -q e2e

# its own state directory unless one is given: the stand-in's test bed may be up in the default
NODE_STATE ?= $(or $(HEADRACE_TESTBED_STATE),$(HOME)/.cache/headrace/testbed/state-real)
E2E_NODE_FAST = e2e/tests/testbed/test_real_node.py e2e/tests/operator/test_pod_security_e2e.py

e2e-node: setup image
	TESTBED_NODE=1 bash e2e/testbed/build.sh
	E2E_NODE=real HEADRACE_TESTBED_STATE=$(NODE_STATE) $(BIN)/pytest -q e2e

e2e-node-fast: setup image
	TESTBED_NODE=1 bash e2e/testbed/build.sh
	E2E_NODE=real HEADRACE_TESTBED_STATE=$(NODE_STATE) $(BIN)/pytest -q $(E2E_NODE_FAST)

# Test bed: a real Kubernetes control plane on loopback (docs/testbed.md).
#   make testbed        build etcd, kube-*, kubectl, helm from Go modules (idempotent)
#   make testbed-up     start it; KUBECONFIG is printed (and in `python -m e2e.testbed env`)
#   make testbed-down   stop it (pods' processes included)
#   make e2e            the end-to-end suite (E2E_PROVIDER=testbed|kind)
#   make e2e-node       the suite on a real node (E2E_NODE=real: containerd, runc, CNI, the
#                       kubelet and kube-proxy; needs root; builds the node, `make image`
#                       and `make image-spark`)
#   make e2e-node-fast  on the real node: pods as containers, and a BrokerCluster Ready where
#                       "restricted" is enforced with a produce/consume
#   make test-real-node e2e-node-fast as `make test` runs it, after the stand-in suite: its own
#                       state, the image by its content tag; it fails, saying why, where the
#                       real node cannot run (TEST_REAL_NODE=0 leaves it out and says so)
.PHONY: testbed testbed-up testbed-down testbed-status e2e e2e-node e2e-node-fast test-real-node

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

# the image this checkout's `make image` built, by its content tag (build/image/ref): another
# checkout's `make image` may have moved localhost/headrace:<version> since
NODE_IMAGE = E2E_HEADRACE_IMAGE=$$(cat build/image/ref)
# and the Spark image (Compactions' drivers and executors) the same way
NODE_SPARK_IMAGE = E2E_SPARK_IMAGE=$$(cat build/image/spark-ref)

e2e-node: setup image image-spark
	TESTBED_NODE=1 bash e2e/testbed/build.sh
	E2E_NODE=real $(NODE_IMAGE) $(NODE_SPARK_IMAGE) HEADRACE_TESTBED_STATE=$(NODE_STATE) $(BIN)/pytest -q e2e

e2e-node-fast: setup image
	TESTBED_NODE=1 bash e2e/testbed/build.sh
	E2E_NODE=real $(NODE_IMAGE) HEADRACE_TESTBED_STATE=$(NODE_STATE) $(BIN)/pytest -q $(E2E_NODE_FAST)

# `make test`'s real-node step. Never the stand-in's state (the suite before it may have used
# HEADRACE_TESTBED_STATE): its own, beside it. The session starts the node and stops it (one
# left up by hand stays up). The image is rebuilt only when its inputs changed.
TEST_REAL_NODE ?= 1
TEST_NODE_STATE ?= $(if $(HEADRACE_TESTBED_STATE),$(HEADRACE_TESTBED_STATE)-real,$(HOME)/.cache/headrace/testbed/state-real)

test-real-node: setup
	@if [ "$(TEST_REAL_NODE)" = 0 ]; then \
	  echo "make test: the real-node subset was NOT run (TEST_REAL_NODE=0)"; exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "make test: the real-node subset needs root (containerd, runc, the kubelet," \
	    "buildah); run as root, or TEST_REAL_NODE=0 to leave it out" >&2; exit 1; fi; \
	set -e; start=$$(date +%s); \
	bash tools/image/build.sh; \
	TESTBED_NODE=1 bash e2e/testbed/build.sh; \
	echo "make test: real-node subset on $$(cat build/image/ref), state $(TEST_NODE_STATE)"; \
	E2E_NODE=real $(NODE_IMAGE) HEADRACE_TESTBED_STATE=$(TEST_NODE_STATE) \
	  $(BIN)/pytest -q $(E2E_NODE_FAST); \
	echo "make test: real-node subset passed in $$(( $$(date +%s) - start )) s"

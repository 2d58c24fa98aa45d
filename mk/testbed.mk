# Test bed: a real Kubernetes control plane on loopback (docs/testbed.md).
#   make testbed        build etcd, kube-*, kubectl, helm from Go modules (idempotent)
#   make testbed-up     start it; KUBECONFIG is printed (and in `python -m e2e.testbed env`)
#   make testbed-down   stop it (pods' processes included)
#   make e2e            the end-to-end suite (E2E_PROVIDER=testbed|kind)
.PHONY: testbed testbed-up testbed-down testbed-status e2e

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

# The Helm chart, the one image and the GitOps health tools (charts/headrace/README.md).
#   make chart-test   helm lint/template of every charts/headrace/ci scenario, the chart's file
#                     checks, the Argo CD Lua checks, kstatus on live objects (test bed)
#   make kstatus      build tools/kstatus (sigs.k8s.io/cli-utils kstatus) from the Go module proxy
#   make image        build the headrace image with buildah (mmdebstrap base) and run
#                     `headrace --version` in it (needs root, buildah, mmdebstrap)
#   make image-spark  build the Spark image (Java 17, the `jobs` extra: Compaction drivers
#                     and executor pods) the same way; the headrace image stays Java-free
.PHONY: chart-test kstatus image image-spark

chart-test: setup
	$(BIN)/pytest -q tests/unit/charts tests/integration/test_grafana_dashboard.py e2e/tests/chart

kstatus:
	bash tools/kstatus/build.sh

image: setup
	bash tools/image/build.sh

image-spark: setup
	bash tools/image/build.sh spark

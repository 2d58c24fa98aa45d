# Compaction on Kubernetes (docs/operations.md "Compaction and CompactionSchedule").
#   make e2e-cron       the compaction e2e with the CronJob's first real run (waits for the
#                       minute: ~3-4 min); `make test` checks the CronJob's spec only; and
#                       a TopicSnapshotSchedule's first two snapshots (~3 min more)
#   make e2e-spark-k8s  a Compaction with its Spark executors as pods (spark.master:
#                       kubernetes; a run stuck until its deadline, then three JVMs:
#                       3-4 min); `make test` runs the test bed's
#                       Spark image check (e2e/tests/testbed/test_image_entrypoints.py)
.PHONY: e2e-cron e2e-spark-k8s

e2e-cron: setup
	HEADRACE_E2E_CRON=1 $(BIN)/pytest -q e2e/tests/operator/test_compaction_e2e.py \
		e2e/tests/operator/test_snapshot_e2e.py

e2e-spark-k8s: setup
	HEADRACE_E2E_SPARK_K8S=1 $(BIN)/pytest -q e2e/tests/operator/test_compaction_executors_e2e.py

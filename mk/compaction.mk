# Compaction on Kubernetes (docs/operations.md "Compaction and CompactionSchedule").
#   make e2e-cron       the compaction e2e with the CronJob's first real run (waits for the
#                       minute: ~3-4 min); `make test` checks the CronJob's spec only
.PHONY: e2e-cron

e2e-cron: setup
	HEADRACE_E2E_CRON=1 $(BIN)/pytest -q e2e/tests/operator/test_compaction_e2e.py

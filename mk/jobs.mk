# Spark jobs (headrace.jobs, docs/spark.md): their tests run real Spark and MinIO (~2-3 min
# on 2 cores, part of `make test`); the bench measures them on local[2].
#   make test-jobs      just the jobs' tests
#   make bench-jobs     python -m bench.jobs (writes bench/results/jobs.json)
.PHONY: test-jobs bench-jobs

test-jobs: setup
	$(BIN)/pytest -q tests/integration/jobs

bench-jobs: setup
	$(PY) -m bench.jobs

# Fault campaigns that need root: power loss on a FUSE file system (bench/powerfs.py) and
# network partitions between namespaces (bench/netns.py). `make test` runs short versions.
# `make netdelay` measures writes under 200 ms delay and 5% loss on one broker (bench/netdelay.py).
POWERLOSS_CUTS ?= 50
POWERLOSS_SEED ?= 14

.PHONY: powerloss partitions netdelay

powerloss: setup
	$(PY) -m bench.powerloss --fsync always --cuts $(POWERLOSS_CUTS) --seed $(POWERLOSS_SEED)
	$(PY) -m bench.powerloss --fsync interval --cuts $(POWERLOSS_CUTS) --seed $(POWERLOSS_SEED)

partitions: setup
	$(BIN)/pytest -q tests/integration/test_partitions.py

netdelay: setup
	$(PY) -m bench.netdelay --out bench/results/netdelay.json

# MinIO server for tiered-storage tests and local use (docs/object-store.md).
#   make minio          build it from its Go module (idempotent; version in tools/minio/version.env)
.PHONY: minio

minio:
	bash tools/minio/build.sh

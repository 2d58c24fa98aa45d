"""End-to-end tests against a real Kubernetes API server (see e2e/support.py)."""

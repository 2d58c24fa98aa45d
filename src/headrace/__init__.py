"""headrace: a partitioned, replicated, Kubernetes-native message broker."""

__version__ = "0.1.0"

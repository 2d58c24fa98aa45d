#!/bin/bash
# The headrace Spark image's entrypoint (Containerfile.spark).
#   executor   what Spark's driver starts executor pods with (client or cluster deploy
#              mode): the KubernetesExecutorBackend JVM, as Spark's own
#              resource-managers/kubernetes/docker/.../entrypoint.sh runs it, from the
#              environment Spark puts on the pod (BasicExecutorFeatureStep)
#   anything else runs as given (a Compaction's Job names `headrace compact ...`)
set -euo pipefail
if [ "${1:-}" != executor ]; then
  exec "$@"
fi
shift
for name in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
  SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_RESOURCE_PROFILE_ID SPARK_EXECUTOR_POD_NAME; do
  if [ -z "${!name:-}" ]; then
    echo "entrypoint.sh executor: $name is not set (Spark's driver sets it on executor pods)" >&2
    exit 64
  fi
done
# SPARK_JAVA_OPT_<n>: one JVM option each (spark.executor.*JavaOptions), in n's order
java_opts=()
for n in $(env | sed -n 's/^SPARK_JAVA_OPT_\([0-9][0-9]*\)=.*/\1/p' | sort -n); do
  opt=SPARK_JAVA_OPT_$n
  java_opts+=("${!opt}")
done
classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$SPARK_HOME/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
  classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
fi
exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
  "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
  -cp "$classpath" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" \
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME" \
  "$@"

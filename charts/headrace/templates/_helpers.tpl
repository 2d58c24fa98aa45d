{{/* The chart's name, overridable. */}}
{{- define "headrace.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* release-chart, unless the release name already contains the chart's name. */}}
{{- define "headrace.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "headrace.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: headrace
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "headrace.operatorSelector" -}}
app.kubernetes.io/name: {{ include "headrace.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "headrace.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "headrace.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "headrace.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The Spark image (Compactions' drivers and executors): spark.image, else the headrace
image's repository with -spark and the same tag (`make image-spark` beside `make image`).
*/}}
{{- define "headrace.sparkImage" -}}
{{- if .Values.spark.image -}}
{{- .Values.spark.image -}}
{{- else -}}
{{- printf "%s-spark:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
What the operator reads and writes in the namespaces it serves: the same list as
headrace.operator.install.RULES (a unit test keeps them equal).
*/}}
{{- define "headrace.namespacedRules" -}}
# the custom resources: kopf watches them and patches its annotations and finalizer
- apiGroups: [headrace.dev]
  resources: [brokerclusters, topics, unloads]
  verbs: [get, list, watch, patch]
# a cluster's Kafka offsets Topic, created when missing (never updated: a user's stays)
- apiGroups: [headrace.dev]
  resources: [topics]
  verbs: [create]
# their status: compare-and-swap PUTs
- apiGroups: [headrace.dev]
  resources: [brokerclusters/status, topics/status, unloads/status]
  verbs: [get, update, patch]
# Repartitions: watched (no kopf handler that patches them); their status CAS-PUT
- apiGroups: [headrace.dev]
  resources: [repartitions]
  verbs: [get, list, watch]
- apiGroups: [headrace.dev]
  resources: [repartitions/status]
  verbs: [get, update, patch]
# a BrokerCluster's workload, server-side applied; its StatefulSet deleted without its
# pods (orphaned) to take a larger volume size, its brokers' claims grown first
# (and watched: each step reads it from the watch cache)
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [list, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
# the brokers' pod IPs, watched into a cache; a rolling restart deletes one pod at a time
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete]
# elections, moves, failures as Events
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# Compaction and CompactionSchedule: watched, their status written
- apiGroups: [headrace.dev]
  resources: [compactions, compactionschedules]
  verbs: [get, list, watch, patch]
- apiGroups: [headrace.dev]
  resources: [compactions/status, compactionschedules/status]
  verbs: [get, update, patch]
# their Jobs and CronJobs, server-side applied and followed
- apiGroups: [batch]
  resources: [jobs, cronjobs]
  verbs: [get, list, watch, create, patch]
# TopicSnapshot, TopicRestore, TopicSnapshotSchedule: watched, kopf's finalizer on
# snapshots, their status written; a restore creates its Topic and a schedule creates its
# TopicSnapshots and deletes those beyond its count (server-side apply: create and patch)
- apiGroups: [headrace.dev]
  resources: [topicsnapshots, topicrestores, topicsnapshotschedules]
  verbs: [get, list, watch, patch]
- apiGroups: [headrace.dev]
  resources: [topicsnapshots/status, topicrestores/status, topicsnapshotschedules/status]
  verbs: [get, update, patch]
- apiGroups: [headrace.dev]
  resources: [topics]
  verbs: [create]
- apiGroups: [headrace.dev]
  resources: [topicsnapshots]
  verbs: [create, delete]
# Users: watched and listed per cluster, their status written
- apiGroups: [headrace.dev]
  resources: [users]
  verbs: [get, list, watch, patch]
- apiGroups: [headrace.dev]
  resources: [users/status]
  verbs: [get, update, patch]
# the Secrets the operator makes (a cluster's replication token and key, a User's token):
# read back by name and created once; never listed, watched, updated or deleted
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
{{- end -}}

{{/* Cluster-scoped reads kopf makes in every mode (install.CLUSTER_RULES). */}}
{{- define "headrace.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
# whether the brokers' StorageClass allows volume expansion (a larger storage.size)
- apiGroups: [storage.k8s.io]
  resources: [storageclasses]
  verbs: [get, list]
# the zone of each broker pod's node: the rack placement spreads replicas over
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- end -}}

{{/* The client Service of the example cluster, or test.bootstrap. */}}
{{- define "headrace.testBootstrap" -}}
{{- if .Values.test.bootstrap -}}
{{- .Values.test.bootstrap -}}
{{- else -}}
{{- printf "%s.%s.svc:9092" .Values.exampleCluster.name .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The service account of Spark drivers with executors as pods (spark.serviceAccount). */}}
{{- define "headrace.sparkServiceAccountName" -}}
{{- default (printf "%s-spark" (include "headrace.fullname" .)) .Values.spark.serviceAccount.name -}}
{{- end -}}

{{/* Names, labels and the two config files; every template builds on these. */}}

{{- define "vramgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name: "vramgate" for `helm install vramgate`, else release-chart. At
most 46 characters, so that the longest suffix (-operator-metrics, 17) keeps every object
name within the 63 of a DNS-1035 label (Service names are), and the webhook Service within
one DNS label of the certificate's hosts.
*/}}
{{- define "vramgate.fullname" -}}
{{- $full := "" }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $full = .Release.Name }}
{{- else }}
{{- $full = printf "%s-%s" .Release.Name $name }}
{{- end }}
{{- end }}
{{- $full = $full | trunc 46 | trimSuffix "-" }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) }}
{{- fail (printf "resource base name %q (from the release name, nameOverride or fullnameOverride) must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter" $full) }}
{{- end }}
{{- $full }}
{{- end }}

{{- define "vramgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vramgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vramgate
{{- range $key, $_ := .Values.commonLabels }}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (eq $key "helm.sh/chart") }}
{{- fail (printf "commonLabels.%s: the chart sets app.kubernetes.io/* and helm.sh/chart itself (selectors depend on them); use another key" $key) }}
{{- end }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A component's extra pod labels (dict "labels" ... "path" "operator.podLabels"): never
one of the chart's own, which its selectors match. */}}
{{- define "vramgate.podLabels" -}}
{{- range $key, $_ := .labels }}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (eq $key "helm.sh/chart") }}
{{- fail (printf "%s.%s: the chart sets app.kubernetes.io/* and helm.sh/chart itself (selectors depend on them); use another key" $.path $key) }}
{{- end }}
{{- end }}
{{- with .labels }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* Selector labels of one component (operator, agent): stable across upgrades. */}}
{{- define "vramgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vramgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "vramgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The operator's image: the plain one, or with image.trace the one built with the trace
extra (its own digest, or the tag with -trace), which the agent never needs. */}}
{{- define "vramgate.operatorImage" -}}
{{- if not .Values.image.trace }}
{{- include "vramgate.image" . }}
{{- else if and .Values.image.digest (not .Values.image.traceDigest) }}
{{- fail "image.trace=true with image.digest needs image.traceDigest: the -trace image's own digest (a digest pins one image, and the plain one has no trace extra)" }}
{{- else if .Values.image.traceDigest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.traceDigest }}
{{- else }}
{{- printf "%s:%s-trace" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "vramgate.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "vramgate.fullname" .)) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "vramgate.agentServiceAccount" -}}
{{- default (printf "%s-agent" (include "vramgate.fullname" .)) .Values.agent.serviceAccount.name }}
{{- end }}

{{- define "vramgate.webhookService" -}}
{{- printf "%s-webhook" (include "vramgate.fullname" .) }}
{{- end }}

{{/* Both webhook configurations carry this name; the operator injects its CA into them. */}}
{{- define "vramgate.webhookConfigName" -}}
{{- default (include "vramgate.fullname" .) .Values.webhook.configName }}
{{- end }}

{{/* The Secret holding the webhook's serving certificate (generated or cert-manager's). */}}
{{- define "vramgate.certSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "vramgate.fullname" .)) .Values.webhook.certSecretName }}
{{- end }}

{{- define "vramgate.leaseName" -}}
{{- default (printf "%s-operator" (include "vramgate.fullname" .)) .Values.operator.config.leaseName }}
{{- end }}

{{- define "vramgate.selfSignedCerts" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}true{{ end }}
{{- end }}

{{/*
The operator's config file (camelCase keys, read through VRAMGATE_OPERATOR_CONFIG). The
user's operator.config, plus what the chart decides: where the webhook listens and which
Service, configurations, Secret and Lease it uses; and the Kueue and Trainer settings, from
the values' kueue and trainer blocks only (operator.config's schema refuses them: one way to
set each).
*/}}
{{- define "vramgate.operatorConfig" -}}
{{- $svc := include "vramgate.webhookService" . }}
{{- $ns := .Release.Namespace }}
{{- $config := deepCopy .Values.operator.config }}
{{- $_ := set $config "leaseName" (include "vramgate.leaseName" .) }}
{{- $_ = set $config "leaseNamespace" $ns }}
{{- $_ = set $config "webhookAddr" "0.0.0.0" }}
{{- $_ = set $config "webhookPort" (int .Values.operator.ports.webhook) }}
{{- $_ = set $config "webhookConfigName" (include "vramgate.webhookConfigName" .) }}
{{- $_ = set $config "certDir" "/var/run/vramgate/certs" }}
{{- $_ = set $config "certHosts" (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) }}
{{- if include "vramgate.selfSignedCerts" . }}
{{- $_ = set $config "certSecretName" (include "vramgate.certSecretName" .) }}
{{- else }}
{{- $_ = set $config "certSecretName" nil }}
{{- end }}
{{- $_ = set $config "metricsAddr" "0.0.0.0" }}
{{- $_ = set $config "metricsPort" (int .Values.operator.ports.metrics) }}
{{- $_ = set $config "probeAddr" "0.0.0.0" }}
{{- $_ = set $config "probePort" (int .Values.operator.ports.probes) }}
{{- $_ = set $config "kueueAdmissionCheck" .Values.kueue.admissionCheck.enabled }}
{{- $_ = set $config "kueueRetrySeconds" (int .Values.kueue.admissionCheck.retrySeconds) }}
{{- $_ = set $config "trainJobSizing" .Values.trainer.sizing.enabled }}
{{- $_ = set $config "trainJobHoldSeconds" (int .Values.trainer.sizing.holdSeconds) }}
{{- toYaml $config }}
{{- end }}

{{/* The agent's config file (VRAMGATE_AGENT_CONFIG); nodeName comes from the downward API. */}}
{{- define "vramgate.agentConfig" -}}
{{- $config := deepCopy .Values.agent.config }}
{{- $_ := set $config "backend" .Values.agent.backend }}
{{- $_ = set $config "metricsAddress" "0.0.0.0" }}
{{- $_ = set $config "metricsPort" (int .Values.agent.ports.metrics) }}
{{- if eq .Values.agent.backend "static" }}
{{- $_ = set $config "staticFile" "/etc/vramgate/gpus.yaml" }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/* What both webhooks share. */}}
{{- define "vramgate.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
failurePolicy: {{ .Values.webhook.failurePolicy }}
matchPolicy: {{ .Values.webhook.matchPolicy }}
timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
{{- $selector := deepCopy (default dict .Values.webhook.namespaceSelector) }}
{{- with .Values.operator.config.namespaces }}
{{- $watched := dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" (uniq . | sortAlpha) }}
{{- $_ := set $selector "matchExpressions" (append (default list $selector.matchExpressions) $watched) }}
{{- end }}
{{- with $selector }}
namespaceSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The operator's rights on namespaced objects: cluster-wide, or per watched namespace. */}}
{{- define "vramgate.operatorJobRules" -}}
# kopf watches the jobs (caches, wake-ups); the scheduler lists them at each start.
- apiGroups: ["vramgate.dev"]
  resources: ["finetunejobs"]
  verbs: ["get", "list", "watch"]
# Every decision is a status patch (estimate, placement, conditions); the spec is never
# written.
- apiGroups: ["vramgate.dev"]
  resources: ["finetunejobs/status"]
  verbs: ["patch"]
# The workloads' ownerReferences to their job set blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only to who may update the
# owner's finalizers (the operator never writes them).
- apiGroups: ["vramgate.dev"]
  resources: ["finetunejobs/finalizers"]
  verbs: ["update"]
# GPU pods hold GPUs the agents report as used; a job's pods tell its phase.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Workloads of admitted jobs: a Job (Indexed across nodes), watched for its phase,
# deleted on suspend or deletion.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The headless Service of a multi-node job's torchrun rendezvous; get: whether an object
# holding a workload's name is the job's own (a create answered 409).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "delete"]
{{- if eq .Values.operator.config.gpuMode "dra" }}
# gpuMode dra: the claim (template, across nodes) naming the placement's GPUs.
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims", "resourceclaimtemplates"]
  verbs: ["get", "create", "delete"]
{{- end }}
{{- if .Values.trainer.sizing.enabled }}
# trainer.sizing: the TrainingRuntimes (namespaced) TrainJobs name, cached for the TrainJob
# webhook (read only); and the TrainJobs it sized, listed by their hold's label to end the
# holds of those deleted or never made.
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainingruntimes"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["list"]
{{- end }}
# A job's model config from the ConfigMap it names (spec.model.configMapRef), read by
# name: get only, no list or watch of ConfigMaps.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
# kopf reports handler failures as Events on the job (core v1 Events only); list: how a
# workload deleted before the operator saw it end did end (the Job controller's Events
# about that Job, by its uid: controller/workload/lost.py).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- if .Values.kueue.admissionCheck.enabled }}
# Kueue's Workloads (namespaced, like the jobs they queue): kopf watches them for a check to
# answer, and a new leader lists them at start; the answer is vramgate's own entry of
# status.admissionChecks, server-side applied (field manager vramgate-check), never the
# spec. Each answer's Event goes on the Workload's owner (a batch Job, ...) through the
# Events rule above.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# Resize under Kueue: a suspended batch Job gated by vramgate.dev/vram
# (kueue.x-k8s.io/admission-gated-by) gets its GPU count rewritten and vramgate's gate
# removed, in one strategic merge patch with a uid precondition. The Jobs rule above grants
# get, list, watch, create and delete; patch is the one verb it lacks.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["patch"]
{{- end }}
{{- end }}

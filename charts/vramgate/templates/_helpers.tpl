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
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component (operator, agent): stable across upgrades. */}}
{{- define "vramgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vramgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "vramgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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
Service, configurations, Secret and Lease it uses.
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
{{- with .Values.webhook.namespaceSelector }}
namespaceSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

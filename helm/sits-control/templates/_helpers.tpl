{{/* Chart name (nameOverride wins). */}}
{{- define "sits-control.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name, as in the `helm create` scaffold: at most 63 characters (DNS names). */}}
{{- define "sits-control.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sits-control.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sits-control.labels" -}}
helm.sh/chart: {{ include "sits-control.chart" . }}
{{ include "sits-control.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sits-control.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sits-control.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sits-control.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sits-control.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The control-plane pod's image: the slim control image, or the engines' with the local deployer. */}}
{{- define "sits-control.image" -}}
{{- if eq .Values.deployer.type "local" }}
{{- include "sits-control.engineImage" . }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "sits-control.engineImage" -}}
{{- printf "%s:%s" .Values.engines.image.repository (default .Chart.AppVersion .Values.engines.image.tag) }}
{{- end }}

{{/* The namespace the Kubernetes deployer manages variants in (default: the release's). */}}
{{- define "sits-control.deployNamespace" -}}
{{- default .Release.Namespace .Values.deployer.namespace }}
{{- end }}

{{- define "sits-control.authSecretName" -}}
{{- default (printf "%s-auth" (include "sits-control.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "sits-control.prometheusSecretName" -}}
{{- default (printf "%s-prometheus" (include "sits-control.fullname" .)) .Values.metrics.prometheus.existingSecret }}
{{- end }}

{{- define "sits-control.prometheusCredentials" -}}
{{- if or .Values.metrics.prometheus.existingSecret .Values.metrics.prometheus.token .Values.metrics.prometheus.password (include "sits-control.prometheusUrlInSecret" .) }}true{{ end }}
{{- end }}

{{/* The Prometheus URL carries a credential (user:password@, a token-like query parameter): it goes into the Secret. */}}
{{- define "sits-control.prometheusUrlInSecret" -}}
{{- with .Values.metrics.prometheus.url }}
{{- $u := urlParse . }}
{{- if or $u.userinfo (regexMatch "(?i)(token|secret|passw|pwd|key|sig|auth|credential)" $u.query) }}true{{ end }}
{{- end }}
{{- end }}

{{- define "sits-control.notificationsSecretName" -}}
{{- default (printf "%s-notifications" (include "sits-control.fullname" .)) .Values.notifications.existingSecret }}
{{- end }}

{{- define "sits-control.notifications" -}}
{{- if or .Values.notifications.existingSecret .Values.notifications.webhooks .Values.notifications.slackWebhooks }}true{{ end }}
{{- end }}

{{/* --trusted-proxy: the value, "*" by default behind the chart's Ingress, nothing for "-" or without an Ingress. */}}
{{- define "sits-control.trustedProxy" -}}
{{- $p := .Values.controlPlane.trustedProxy }}
{{- if eq $p "-" }}{{ else if $p }}{{ $p }}{{ else if .Values.ingress.enabled }}*{{ end }}
{{- end }}

{{/* A monitoring.coreos.com kind is rendered only where the cluster serves it (a chart must install without the CRDs). */}}
{{- define "sits-control.hasMonitoring" -}}
{{- if .root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) }}true{{ end }}
{{- end }}

{{/* An expression of files/rules.yaml with its placeholders filled: (dict "expr" E "fill" (dict PLACEHOLDER VALUE)). */}}
{{- define "sits-control.fill" -}}
{{- $e := .expr }}
{{- range $k, $v := .fill }}
{{- $e = replace $k $v $e }}
{{- end }}
{{- $e }}
{{- end }}

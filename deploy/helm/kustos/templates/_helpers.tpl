{{/* The release's full name: the release name when it already says kustos. */}}
{{- define "kustos.fullname" -}}
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

{{- define "kustos.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kustos.labels" -}}
{{ include "kustos.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kustos.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kustos.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kustos.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kustos.webhookService" -}}
{{- printf "%s-webhook" (include "kustos.fullname" .) -}}
{{- end -}}

{{- define "kustos.webhookSecret" -}}
{{- printf "%s-webhook-cert" (include "kustos.fullname" .) -}}
{{- end -}}

{{/* Namespaced mode: the controllers whose objects all live in the watched namespace. */}}
{{- define "kustos.controllers" -}}
{{- if .Values.namespaces -}}
etcdcluster,etcdbackup,etcdmaintenance,nodejob
{{- else -}}
all
{{- end -}}
{{- end -}}

{{/* Where the API server sends a webhook's reviews (the operator's webhook Service). */}}
{{- define "kustos.clientConfig" -}}
{{- if .root.Values.webhook.url -}}
url: {{ printf "%s%s" .root.Values.webhook.url .path | quote }}
{{- else -}}
service:
  name: {{ include "kustos.webhookService" .root }}
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- end }}
{{- end -}}

{{/* Namespaced mode: admit only what the operator manages (as the operator's own copy does). */}}
{{- define "kustos.namespaceSelector" -}}
{{- if .Values.namespaces }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- range .Values.namespaces | uniq }}
        - {{ . }}
        {{- end }}
{{- end }}
{{- end -}}

{{/* The leader keeps the CA bundle of the chart's webhook configurations current. */}}
{{- define "kustos.webhookRule" -}}
{{- if .Values.webhook.enabled }}
  # The leader writes the CA bundle into the chart's webhook configurations (manager.py),
  # these two only.
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
    verbs: ["patch"]
    resourceNames: [{{ include "kustos.fullname" . | quote }}]
{{- end }}
{{- end -}}

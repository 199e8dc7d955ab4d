{{- define "hookline.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hookline.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Label matchers that select this release's hookline series in alert expressions. */}}
{{- define "hookline.alertSelector" -}}
{{- if .Values.alerts.selector -}}
{{ .Values.alerts.selector }}
{{- else -}}
namespace="{{ .Release.Namespace }}"
{{- end -}}
{{- end -}}

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

{{/*
A value that is a whole number of seconds, at least .min, printed as an integer; anything else
fails the render naming the key (.key), rather than leaving the API server to refuse the pod.
*/}}
{{- define "hookline.seconds" -}}
{{- if not (or (kindIs "float64" .value) (kindIs "int64" .value) (kindIs "int" .value)) -}}
{{- fail (printf "%s must be a whole number of seconds, got %s" .key (toJson .value)) -}}
{{- end -}}
{{- if ne (float64 .value) (floor .value) -}}
{{- fail (printf "%s must be a whole number of seconds, got %s" .key (toJson .value)) -}}
{{- end -}}
{{- if lt (float64 .value) (float64 .min) -}}
{{- fail (printf "%s must be at least %d, got %v" .key .min .value) -}}
{{- end -}}
{{- int64 .value -}}
{{- end -}}

{{/* The startup probe's failureThreshold: startupSeconds at one probe every 5 s, rounded up. */}}
{{- define "hookline.startupFailureThreshold" -}}
{{- $seconds := include "hookline.seconds" (dict "key" "startupSeconds" "value" .Values.startupSeconds "min" 5) | int -}}
{{- div (add $seconds 4) 5 -}}
{{- end -}}

{{- define "control.tag" -}}
{{- .Values.tag | default .Values.global.tag | default .Chart.AppVersion -}}
{{- end -}}

{{/* The image; `image` with a "/" is a full reference. */}}
{{- define "control.image" -}}
{{- if contains "/" .Values.image -}}
{{- .Values.image -}}
{{- else -}}
{{- printf "%s/%s:%s" (.Values.hub | default .Values.global.hub) .Values.image (include "control.tag" .) -}}
{{- end -}}
{{- end -}}

{{/* istiod's CA. */}}
{{- define "control.istiod" -}}
{{- printf "istiod%s.%s.svc:15012" (ternary (printf "-%s" .Values.revision) "" (ne .Values.revision "")) .Values.istioNamespace -}}
{{- end -}}

{{- define "control.labels" -}}
app: {{ .Values.name }}
release: {{ .Release.Name }}
app.kubernetes.io/name: {{ .Values.name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: ambit
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "control.tag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

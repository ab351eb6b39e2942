{{/* The DaemonSet's and ServiceAccount's name. */}}
{{- define "ztunnel.name" -}}
{{- .Values.resourceName | default "ztunnel" -}}
{{- end -}}

{{- define "ztunnel.tag" -}}
{{- .Values.tag | default .Values.global.tag | default .Chart.AppVersion -}}
{{- end -}}

{{/* The proxy's image; `image` with a "/" is a full reference. */}}
{{- define "ztunnel.image" -}}
{{- if contains "/" .Values.image -}}
{{- .Values.image -}}
{{- else -}}
{{- $variant := .Values.variant | default .Values.global.variant -}}
{{- printf "%s/%s:%s" (.Values.hub | default .Values.global.hub) .Values.image (include "ztunnel.tag" .) -}}
{{- if $variant -}}-{{ $variant }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* istiod's address, for certificates and for xDS. */}}
{{- define "ztunnel.istiod" -}}
{{- printf "istiod%s.%s.svc:15012" (ternary (printf "-%s" .Values.revision) "" (ne .Values.revision "")) .Values.istioNamespace -}}
{{- end -}}

{{- define "ztunnel.labels" -}}
app: ztunnel
release: {{ .Release.Name }}
istio.io/rev: {{ .Values.revision | default "default" }}
app.kubernetes.io/name: ztunnel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: istio
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "ztunnel.tag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.ownerName }}
install.operator.istio.io/owning-resource: {{ . }}
{{- end }}
{{- end -}}

{{- define "ztunnel.clusterScoped" -}}
{{- if has .Values.resourceScope (list "all" "cluster") }}true{{ end -}}
{{- end -}}
{{- define "ztunnel.namespaced" -}}
{{- if has .Values.resourceScope (list "all" "namespace") }}true{{ end -}}
{{- end -}}

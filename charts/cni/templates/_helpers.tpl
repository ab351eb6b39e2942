{{/* The image tag: the chart's tag, the global one, else the chart's appVersion. */}}
{{- define "cni.tag" -}}
{{- .Values.tag | default .Values.global.tag | default .Chart.AppVersion -}}
{{- end -}}

{{/* The agent's image; `image` with a "/" is a full reference. */}}
{{- define "cni.image" -}}
{{- if contains "/" .Values.image -}}
{{- .Values.image -}}
{{- else -}}
{{- $variant := .Values.variant | default .Values.global.variant -}}
{{- printf "%s/%s:%s" (.Values.hub | default .Values.global.hub) .Values.image (include "cni.tag" .) -}}
{{- if $variant -}}-{{ $variant }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The host's CNI binary directory; GKE's when left empty on a GKE cluster. */}}
{{- define "cni.binDir" -}}
{{- if .Values.cniBinDir -}}
{{- .Values.cniBinDir -}}
{{- else if contains "-gke" .Capabilities.KubeVersion.GitVersion -}}
/home/kubernetes/bin
{{- else -}}
/opt/cni/bin
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "cni.labels" -}}
app: istio-cni
release: {{ .Release.Name }}
istio.io/rev: {{ .Values.revision | default "default" }}
operator.istio.io/component: Cni
app.kubernetes.io/name: istio-cni
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: istio
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "cni.tag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.ownerName }}
install.operator.istio.io/owning-resource: {{ . }}
{{- end }}
{{- end -}}

{{/* Whether cluster-scoped / namespaced objects render (global.resourceScope). */}}
{{- define "cni.clusterScoped" -}}
{{- if has .Values.global.resourceScope (list "all" "cluster") }}true{{ end -}}
{{- end -}}
{{- define "cni.namespaced" -}}
{{- if has .Values.global.resourceScope (list "all" "namespace") }}true{{ end -}}
{{- end -}}

{{/*
Deep merge: copies every key of .src into .dst (a dict, changed in place). Maps merge key by
key; anything else, false and "" included, replaces what .dst had. Sprig's mergeOverwrite
skips empty values, which would let a profile's `true` outrank a user's `false`.
*/}}
{{- define "ambit.merge" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- $old := index $dst $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $old) -}}
{{- include "ambit.merge" (dict "dst" $old "src" $v) -}}
{{- else if kindIs "map" $v -}}
{{- $fresh := dict -}}
{{- include "ambit.merge" (dict "dst" $fresh "src" $v) -}}
{{- $_ := set $dst $k $fresh -}}
{{- else -}}
{{- $_ := set $dst $k (deepCopy $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One layer of values, with what it sets under `cni.` moved to the top (the chart's values
used to live under `cni.`, and Istio's shared profiles still put them there).
*/}}
{{- define "ambit.descope" -}}
{{- $layer := .layer -}}
{{- $out := .out -}}
{{- include "ambit.merge" (dict "dst" $out "src" (omit $layer .prefix)) -}}
{{- $scoped := index $layer .prefix -}}
{{- if kindIs "map" $scoped -}}
{{- include "ambit.merge" (dict "dst" $out "src" $scoped) -}}
{{- end -}}
{{- end -}}

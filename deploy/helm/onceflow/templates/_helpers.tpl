{{/* The labels of every object of job `.`. */}}
{{- define "onceflow.labels" -}}
app.kubernetes.io/instance: {{ . | toJson }}
app.kubernetes.io/name: onceflow
{{- end }}

{{/*
The SHA-256 of a ConfigMap's data, as `onceflow deploy render` computes it: over the data as
compact JSON, keys in order. Helm's toJson escapes <, > and & (and U+2028, U+2029), which
render's JSON does not: those escapes are undone, escaped backslashes set aside first so that
a text holding `\u003c` itself keeps it.
*/}}
{{- define "onceflow.configChecksum" -}}
{{- toJson . | replace "\\\\" "\x01" | replace "\\u003c" "<" | replace "\\u003e" ">" | replace "\\u0026" "&" | replace "\\u2028" "\u2028" | replace "\\u2029" "\u2029" | replace "\x01" "\\\\" | sha256sum -}}
{{- end }}

{{/* The image of the pods, from the root context. */}}
{{- define "onceflow.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

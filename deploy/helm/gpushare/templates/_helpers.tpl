{{/* The image of the node daemon and the scheduler service. */}}
{{- define "gpushare.image" -}}
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The resource domain the webhooks and the second scheduler match (the daemon's resourceDomain setting). */}}
{{- define "gpushare.domain" -}}
{{- .Values.daemon.settings.resourceDomain | default "aliyun.com" -}}
{{- end -}}

{{- define "gpushare.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Names are fixed ("corral-auth", ...), not derived from the release: the gateways' Envoy configs
(files/envoy-*.yaml) are generated once from files/kubernetes.yaml and name the upstream Services. So one
release of this chart per namespace.
*/}}

{{- define "corral.labels" -}}
app.kubernetes.io/name: corral
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "auth") */}}
{{- define "corral.selector" -}}
app.kubernetes.io/name: corral
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "corral.image" -}}
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end }}

{{- define "corral.serviceAccountName" -}}
{{- if .root.Values.serviceAccount.create -}}
corral-{{ .component }}
{{- else -}}
default
{{- end -}}
{{- end }}

{{/* What every pod shares: its account, security context, pull secrets, placement. */}}
{{- define "corral.podCommon" -}}
serviceAccountName: {{ include "corral.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A service's certificate directory as corral reads it (services.common.tls.TlsFiles): ca.pem, NAME.pem,
NAME.key, from a Secret holding ca.crt, tls.crt and tls.key. (dict "root" $ "identity" "auth" "secret" NAME)
*/}}
{{- define "corral.tlsSource" -}}
- secret:
    name: {{ .secret }}
    items:
      - {key: ca.crt, path: ca.pem}
      - {key: tls.crt, path: {{ .identity }}.pem}
      - {key: tls.key, path: {{ .identity }}.key}
{{- end }}

{{/* $CORRAL_DATABASE_URL of one account, its password from the database Secret: (dict "root" $ "account" "auth") */}}
{{- define "corral.databaseEnv" -}}
{{- $db := .root.Values.database -}}
{{- $account := index $db.accounts .account -}}
- name: CORRAL_DATABASE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $db.existingSecret }}
      key: {{ $account.passwordKey }}
- name: CORRAL_DATABASE_URL
  value: {{ printf "mysql://%s:$(CORRAL_DATABASE_PASSWORD)@%s:%v/%s" $account.user $db.host $db.port $db.name | quote }}
{{- end }}

{{/* --storage-root and --callback-allow-networks, which the frontend and drivers must share. */}}
{{- define "corral.urlArgs" -}}
{{- range .Values.storage.roots }}
- --storage-root
- {{ . | quote }}
{{- end }}
{{- with .Values.storage.callbackAllowNetworks }}
- --callback-allow-networks
- {{ join "," . | quote }}
{{- end }}
{{- end }}

{{/* --metrics-address when metrics are on. */}}
{{- define "corral.metricsArgs" -}}
{{- if .Values.metrics.enabled }}
- --metrics-address
- {{ printf "0.0.0.0:%v" .Values.metrics.port | quote }}
{{- end }}
{{- end }}

{{/*
Readiness by gRPC health over the service's own TLS (python -m services.health): Kubernetes' grpc probe
speaks plain text, and corral's listeners are all TLS. (dict "port" 8521 "identity" "driver" "service" "")
*/}}
{{- define "corral.healthProbe" -}}
exec:
  command:
    - python
    - -m
    - services.health
    - --address
    - {{ printf "localhost:%v" .port | quote }}
    - --certs-dir
    - /etc/corral/tls
    - --identity
    - {{ .identity }}
    {{- if .service }}
    - --service
    - {{ .service }}
    {{- end }}
    - --timeout-s
    - "3"
periodSeconds: 5
timeoutSeconds: 5
failureThreshold: 2
{{- end }}

{{- define "corral.volumesCommon" -}}
- name: run
  emptyDir: {medium: Memory, sizeLimit: 16Mi}
- name: tmp
  emptyDir: {sizeLimit: 1Gi}
{{- end }}

{{- define "corral.mountsCommon" -}}
- {name: tls, mountPath: /etc/corral/tls, readOnly: true}
- {name: run, mountPath: /var/run/corral}
- {name: tmp, mountPath: /tmp}
{{- end }}

{{- define "corral.gatewayTokenSecret" -}}
{{- .Values.gateway.public.tokenSecret | default "corral-gateway-token" -}}
{{- end }}

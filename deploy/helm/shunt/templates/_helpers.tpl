{{/* The objects' name: fixed ("shunt"), as the agent's RBAC and docs name them. */}}
{{- define "shunt.name" -}}
{{- default "shunt" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shunt.labels" -}}
app.kubernetes.io/name: {{ include "shunt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "shunt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shunt.name" . }}
{{- end -}}

{{- define "shunt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shunt.name" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, repository@digest, or repository:tag@digest. */}}
{{- define "shunt.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if and .Values.image.digest (not .Values.image.tag) -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The CNI network configuration list the init container writes. */}}
{{- define "shunt.cniConfig" -}}
{{- if .Values.cni.config -}}
{{- .Values.cni.config -}}
{{- else -}}
{"cniVersion":"1.1.0","name":"shunt","plugins":[{"type":"shunt-cni","capabilities":{"cgroupPath":true}}]}
{{- end -}}
{{- end -}}

{{/* The values that have one meaning only today: refuse the others by name rather than ignore them. */}}
{{- define "shunt.validate" -}}
{{- if not (has (toString .Values.kubeProxyReplacement) (list "true" "false")) -}}
{{- fail (printf "kubeProxyReplacement %q: use true (shunt translates every Service) or false (ClusterIPs shunt's, NodePorts, load balancer addresses and externalIPs left to kube-proxy)" (toString .Values.kubeProxyReplacement)) -}}
{{- end -}}
{{- if and (eq (toString .Values.kubeProxyReplacement) "false") .Values.removeKubeProxyRules -}}
{{- fail "removeKubeProxyRules with kubeProxyReplacement false: the first removes the rules of the kube-proxy the second works beside; choose one (docs/install.md)" -}}
{{- end -}}
{{- if ne (toString .Values.l7Proxy) "true" -}}
{{- fail "l7Proxy: only true is implemented: the agent always runs its node proxy (idle until an HTTPRoute or an L7 rule sends it traffic)" -}}
{{- end -}}
{{- if not (has .Values.routingMode (list "tunnel" "native" "")) -}}
{{- fail (printf "routingMode %q: use tunnel, native, or \"\" (the host routes pod CIDRs)" .Values.routingMode) -}}
{{- end -}}
{{- if and (has .Values.loadBalancer.mode (list "dsr" "hybrid")) (eq .Values.routingMode "") -}}
{{- fail (printf "loadBalancer.mode %s needs routingMode native or tunnel (DSR sends a flow to its backend's node): set one, or loadBalancer.mode snat" .Values.loadBalancer.mode) -}}
{{- end -}}
{{- if and (eq .Values.routingMode "tunnel") (ne .Values.tunnelProtocol "vxlan") -}}
{{- fail (printf "tunnelProtocol %q: only vxlan is implemented" .Values.tunnelProtocol) -}}
{{- end -}}
{{- end -}}

{{/* shuntd's arguments, from the values. */}}
{{- define "shunt.agentArgs" -}}
- --in-cluster
- --log-level={{ .Values.logLevel }}
- --uninstall-when-removed
{{- if .Values.cni.install }}
- --cni-files=/host/etc/cni/net.d/{{ .Values.cni.confFileName }},/host/opt/cni/bin/shunt-cni
{{- end }}
{{- if eq .Values.routingMode "tunnel" }}
- --routing=tunnel
- --tunnel={{ .Values.tunnelProtocol }}
{{- else if eq .Values.routingMode "native" }}
- --routing=native
{{- end }}
{{- with .Values.clusterCIDR }}
- --cluster-cidr={{ . }}
{{- end }}
{{- with .Values.serviceCIDR }}
- --service-cidr={{ . }}
{{- end }}
{{- if .Values.masquerade }}
- --masquerade
{{- with .Values.masqueradeExclude }}
- --masquerade-exclude={{ join "," . }}
{{- end }}
{{- end }}
{{- if ne .Values.loadBalancer.mode "snat" }}
- --nodeport-mode={{ .Values.loadBalancer.mode }}
{{- end }}
{{- with .Values.nodePort.addresses }}
- --nodeport-addresses={{ join "," . }}
{{- end }}
{{- /* 131072 is shuntd's default: no flag, as for the other defaults */}}
{{- if ne (int .Values.conntrackMax) 131072 }}
- --conntrack-max={{ .Values.conntrackMax }}
{{- end }}
{{- if .Values.socketAcceleration }}
- --socket-acceleration
{{- end }}
{{- if .Values.socketAccelerationWithoutBackpressure }}
- --accelerate-without-backpressure
{{- end }}
{{- with .Values.kernelFallbacks }}
- --kernel-fallbacks={{ . }}
{{- end }}
{{- if .Values.removeKubeProxyRules }}
- --remove-kube-proxy-rules
{{- end }}
{{- if eq (toString .Values.kubeProxyReplacement) "false" }}
- --kube-proxy-replacement=false
{{- end }}
{{- if .Values.prometheus.enabled }}
- --metrics-addr=:{{ .Values.prometheus.port }}
{{- end }}
{{- if .Values.relay.enabled }}
- --flows-addr=:{{ .Values.relay.agentPort }}
- --flows-tls-dir=/etc/shunt/flows-tls
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

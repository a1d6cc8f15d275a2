{{/*
Names and labels. Every object's labels come from gpushare.labels, selectors from
gpushare.selectorLabels, so `-l app.kubernetes.io/instance=<release>` finds all of a release.
*/}}

{{- define "gpushare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpushare.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's object name: gpushare.component (dict "root" $ "component" "controller") */}}
{{- define "gpushare.componentName" -}}
{{- printf "%s-%s" (include "gpushare.fullname" .root | trunc 45 | trimSuffix "-") .component }}
{{- end }}

{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* gpushare.labels (dict "root" $ "component" "controller"); component may be "" */}}
{{- define "gpushare.opportunisticPriorityClass" -}}
{{- .Values.controller.opportunistic.priorityClass.name | default (printf "%s-opportunistic" (include "gpushare.fullname" .)) -}}
{{- end }}

{{- define "gpushare.labels" -}}
{{ include "gpushare.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpushare
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository:tag@digest when image.digest pins it. */}}
{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
kube-scheduler matching the cluster: vX.Y.Z of the API server unless a tag is given. Rendered
without a cluster (Helm's v1.20.0), the Kubernetes version the chart is tested with
(Chart.yaml annotation gpushare.io/tested-kube-version) stands in; the scheduler Deployment
then says so in a comment.
*/}}
{{- define "gpushare.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag }}
{{- if not $tag }}
{{- if include "gpushare.offlineRender" . }}
{{- $tag = index .Chart.Annotations "gpushare.io/tested-kube-version" }}
{{- else }}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- with .Values.scheduler.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* "true" when Helm renders without a cluster and without --kube-version. */}}
{{- define "gpushare.offlineRender" -}}
{{- if eq .Capabilities.KubeVersion.Version "v1.20.0" }}true{{ end }}
{{- end }}

{{- define "gpushare.controllerService" -}}
{{- include "gpushare.componentName" (dict "root" . "component" "controller") }}
{{- end }}

{{/* The extender's Service: it selects only the controller replica holding the Lease. */}}
{{- define "gpushare.extenderService" -}}
{{- printf "%s-extender" (include "gpushare.controllerService" .) }}
{{- end }}

{{/* The URL kube-scheduler calls the extender at: the pinned cluster IP, else the DNS name. */}}
{{- define "gpushare.extenderURL" -}}
{{- $host := printf "%s.%s.svc" (include "gpushare.extenderService" .) .Release.Namespace }}
{{- with .Values.controller.service.clusterIP }}{{ $host = . }}{{ end }}
{{- $scheme := ternary "https" "http" (.Values.controller.extender.tls.enabled | default false) }}
{{- printf "%s://%s:%d/scheduler" $scheme $host (int .Values.controller.extender.port) }}
{{- end }}

{{/* The operator's profile cache ConfigMap: the controller's --profile-cache-name and the one
ConfigMap its RBAC grants. */}}
{{- define "gpushare.profileCacheName" -}}
{{- printf "%s-profile-cache" (include "gpushare.fullname" .) }}
{{- end }}

{{/* How the operator reaches a node agent's /profile: controller.agentURL, else the node's
address at node.metrics.port (published as a host port). */}}
{{- define "gpushare.agentURL" -}}
{{- .Values.controller.agentURL | default (printf "http://{node_ip}:%d" (int .Values.node.metrics.port)) }}
{{- end }}

{{- define "gpushare.webhookConfigName" -}}
{{- include "gpushare.fullname" . }}
{{- end }}

{{/* Node agent: privileged / hostPID default to "only with real GPUs". */}}
{{/*
The node agents' and MPS daemons' affinity: node.affinity, and, for the agents
(.pause) with node.pauseForGpuOperator, no agent while the GPU Operator upgrades the driver or
changes the MIG layout: nvidia.com/gpu-driver-upgrade-state from pod-deletion-required to
pod-restart-required, nvidia.com/mig.config.state pending|rebooting, or an operand label
nvidia.com/gpu.deploy.client|device-plugin paused-for-mig-change|paused-for-driver-upgrade (the
values of gpushare.api.gpu_operator). The DaemonSet controller then deletes the agent there; its
preStop hook waits until the agent has drained the node (gpushare's pods evicted, MPS daemons
stopped: gpushare.node.gpu_operator), and the agent starts again once the labels are back,
reading the GPUs' MIG modes and driver anew. The MPS daemons' pods stay: the agent stops their
daemons after the drain (gone at once, they would fail the pods still draining). Added to every
required node selector term (terms are ORed, their expressions ANDed).
*/}}
{{- define "gpushare.node.affinity" -}}
{{- $root := .root }}
{{- $affinity := deepCopy ($root.Values.node.affinity | default dict) }}
{{- if and .pause $root.Values.node.pauseForGpuOperator }}
{{- $paused := list "paused-for-mig-change" "paused-for-driver-upgrade" }}
{{- $pause := list
      (dict "key" "nvidia.com/gpu-driver-upgrade-state" "operator" "NotIn" "values" (list "pod-deletion-required" "drain-required" "node-maintenance-required" "post-maintenance-required" "pod-restart-required"))
      (dict "key" "nvidia.com/mig.config.state" "operator" "NotIn" "values" (list "pending" "rebooting"))
      (dict "key" "nvidia.com/gpu.deploy.device-plugin" "operator" "NotIn" "values" $paused)
      (dict "key" "nvidia.com/gpu.deploy.client" "operator" "NotIn" "values" $paused) }}
{{- $node := $affinity.nodeAffinity | default dict }}
{{- $required := $node.requiredDuringSchedulingIgnoredDuringExecution | default dict }}
{{- $terms := list }}
{{- range ($required.nodeSelectorTerms | default (list dict)) }}
{{- $terms = append $terms (merge (dict "matchExpressions" (concat (.matchExpressions | default list) $pause)) .) }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ = set $affinity "nodeAffinity" $node }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "gpushare.node.real" -}}
{{- if eq .Values.node.backend "nvml" }}true{{ end }}
{{- end }}

{{/* Where gpushare-mps-launcher runs (nvml backend, node.mpsLauncher.enabled): "daemonSet"
(its own DaemonSet, updateStrategy OnDelete) or "agentPod" (a container of the agent's pod);
empty: the agent starts the daemons itself. A release upgraded with --reuse-values from a
version without runIn gets daemonSet. */}}
{{- define "gpushare.node.mpsLauncher" -}}
{{- $l := .Values.node.mpsLauncher }}
{{- if and (include "gpushare.node.real" .) $l.enabled }}{{ dig "runIn" "daemonSet" $l }}{{ end }}
{{- end }}

{{- define "gpushare.node.privileged" -}}
{{- if kindIs "bool" .Values.node.privileged }}{{ if .Values.node.privileged }}true{{ end }}
{{- else }}{{ include "gpushare.node.real" . }}{{ end }}
{{- end }}

{{- define "gpushare.node.hostPID" -}}
{{- if kindIs "bool" .Values.node.hostPID }}{{ if .Values.node.hostPID }}true{{ end }}
{{- else }}{{ include "gpushare.node.real" . }}{{ end }}
{{- end }}

{{- define "gpushare.serviceAccountName" -}}
{{- include "gpushare.componentName" (dict "root" .root "component" .component) }}
{{- end }}

{{/* Prometheus Operator CRDs served? */}}
{{- define "gpushare.monitoring" -}}
{{- if and .Values.monitoring.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") }}true{{ end }}
{{- end }}

{{/*
Refuse clusters older than 1.30 (webhook matchConditions, ValidatingAdmissionPolicy v1).
Helm renders without a cluster (`helm template` with no --kube-version) as v1.20.0; that
version is taken as "unknown" and rendering goes on, so plain `helm template` works.
*/}}
{{- define "gpushare.checkKubeVersion" -}}
{{- $v := .Capabilities.KubeVersion.Version }}
{{- if and (not (include "gpushare.offlineRender" .)) (semverCompare "<1.30.0-0" $v) }}
{{- fail (printf "gpushare needs Kubernetes >= 1.30 (webhook matchConditions, ValidatingAdmissionPolicy v1); this cluster is %s" $v) }}
{{- end }}
{{- end }}

{{/* The DRA driver name (gpushare.api.dra.DRIVER): ResourceSlices' driver, the DeviceClass'
selector, the kubelet plugin's registered name. */}}
{{- define "gpushare.dra.driver" -}}gpu.gpushare.io{{- end }}

{{/*
The node pools, as a JSON list of {name, mode, nodeSelector, daemonSet}: the one node.nodeSelector
picks (name "", mode `mode`, DaemonSet <fullname>-node-agent), then each of node.extraPools
(DaemonSet <fullname>-node-agent-<name>). DRA needs resource.k8s.io/v1 (Kubernetes >= 1.34).
*/}}
{{- define "gpushare.node.pools" -}}
{{- $base := include "gpushare.componentName" (dict "root" . "component" "node-agent") }}
{{- $pools := list (dict "name" "" "mode" .Values.mode "nodeSelector" .Values.node.nodeSelector "daemonSet" $base) }}
{{- range .Values.node.extraPools }}
{{- $pools = append $pools (dict "name" .name "mode" .mode "nodeSelector" .nodeSelector "daemonSet" (printf "%s-%s" $base .name | trunc 63 | trimSuffix "-")) }}
{{- end }}
{{- $v := .Capabilities.KubeVersion.Version }}
{{- range $pools }}
{{- if and (eq .mode "dra") (not (include "gpushare.offlineRender" $)) (semverCompare "<1.34.0-0" $v) }}
{{- fail (printf "node pool %q runs in dra mode, which needs Kubernetes >= 1.34 (resource.k8s.io/v1) with the DRAConsumableCapacity feature gate; this cluster is %s: use mode deviceplugin there (docs/dra.md)" (default "node.nodeSelector" .name) $v) }}
{{- end }}
{{- end }}
{{- toJson $pools }}
{{- end }}

{{/* "true" when some node pool runs in dra mode. */}}
{{- define "gpushare.dra.enabled" -}}
{{- range include "gpushare.node.pools" . | fromJsonArray }}{{ if eq .mode "dra" }}true{{ end }}{{ end }}
{{- end }}

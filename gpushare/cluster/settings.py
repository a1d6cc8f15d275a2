"""Settings of the controller process, parsed from the command line.

Every bad value is reported as an :class:`InvalidInputError` naming the flag and the fix, before
anything starts listening.
"""

import argparse
import ipaddress
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from gpushare.api.dra import DEVICE_CLASS
from gpushare.api.endpoints import (
    DEFAULT_AGENT_URL,
    DEFAULT_PROFILE_CACHE,
    check_agent_url,
    check_configmap_name,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.flags import field_docs
from gpushare.api.tolerations import check_runtime_class, parse_toleration
from gpushare.cluster.state.tenancy import RULES_GRANTED, RULES_MODES
from gpushare.packing.policy import DEFAULT_POLICY, Policy
from gpushare.packing.tenancy import TENANCY_MODES, TENANCY_NAMESPACE

PROG = "gpushare-controller"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MODE_DEVICEPLUGIN = "deviceplugin"
MODE_DRA = "dra"
ANNOTATION_MODES = (MODE_DEVICEPLUGIN, MODE_DRA)
PLACEMENT_GPUSHARE = "gpushare"
PLACEMENT_KUBE_SCHEDULER = "kube-scheduler"
DRA_PLACEMENTS = (PLACEMENT_GPUSHARE, PLACEMENT_KUBE_SCHEDULER)

METRICS_AUTH_MODES = ("tokenreview", "none")

# Host directories a gpushare pod must not mount: they would let it talk to the MPS control
# daemon, the kubelet's device-plugin, DRA-plugin or pod-resources sockets directly, bypassing
# its share, or write CDI specs other containers get. Every other pod: the chart's
# host-path policy (docs/security.md).
DEFAULT_PROTECTED_HOST_PATHS: tuple[str, ...] = (
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/plugins",
    "/var/lib/kubelet/plugins_registry",
    "/var/run/cdi",
    "/run/cdi",
    "/etc/cdi",
    "/run/gpushare",
    "/var/run/gpushare",
    "/var/lib/gpushare",
    "/tmp/nvidia-mps",
    "/var/log/nvidia-mps",
)


@dataclass(frozen=True)
class Settings:
    """Everything the controller process can be told. Defaults suit a developer's machine."""

    kubeconfig: Path | None = None
    """Kubeconfig file; None uses in-cluster config, then $KUBECONFIG, then ~/.kube/config."""

    extender_host: str = "127.0.0.1"
    """Address the scheduler extender (and /healthz, /readyz, /metrics) listens on."""
    extender_port: int = 8888
    """Port of the extender; kube-scheduler's extender urlPrefix points here."""
    extender_tls_cert: Path | None = None
    """PEM certificate for the extender; with ``extender_tls_key`` the extender serves HTTPS."""
    extender_tls_key: Path | None = None
    """PEM private key matching ``extender_tls_cert``."""
    extender_client_ca: Path | None = None
    """PEM CA bundle: the extender then answers only clients presenting a certificate it
    signed (kube-scheduler's extender tlsConfig certFile/keyFile; mutual TLS). Needs the
    extender's own certificate. /healthz and /readyz stay on the webhook port for probes."""
    cert_reload_seconds: float = 10.0
    """How often certificate files are checked for a change (rotation): a changed set is
    loaded for new connections, and the webhook configurations get the new CA bundle first."""

    tenancy: str = TENANCY_NAMESPACE
    """``namespace``: a GPU is shared only by pods of one namespace (or of one sharing group an
    admin set with the namespace label gpushare.io/sharing-group). ``cluster``: pods of every
    namespace may share a GPU (cross-namespace sharing, an explicit opt-in)."""
    neighbour_rules: str = RULES_GRANTED
    """``granted-namespaces``: packing-policy exclusive and profiling alone on a GPU take effect
    only in namespaces an admin labelled gpushare.io/neighbour-rules=granted. ``everyone``:
    in every namespace."""

    agent_lease_namespace: str = ""
    """Where the node agents renew their Leases (gpushare.api.agent_lease; the chart: the
    release namespace); a node whose agent's Lease expired gets no new pod. Empty: the
    Lease namespace of leader election (``leader_elect_namespace``)."""
    leader_elect: bool = False
    """Run as one of several replicas: a Lease elects the one that binds pods, serves the
    extender and runs the operator; the others serve the admission webhook and keep their
    view warm for a takeover."""
    leader_elect_namespace: str = "default"
    """Namespace of the Lease (the chart: the release namespace)."""
    leader_elect_name: str = "gpushare-controller"
    """Name of the Lease."""
    leader_elect_lease_seconds: float = 8.0
    """A leader that has not renewed for this long is replaced."""
    leader_elect_renew_seconds: float = 2.0
    """How often the leader renews, and a standby tries to take over."""
    leader_identity: str = ""
    """This replica's name in the Lease; empty: $POD_NAME, else host name and PID."""
    leader_pod: str = ""
    """``namespace/name`` of this replica's pod, labelled gpushare.io/controller-role=leader or
    standby (the extender Service selects the leader); empty: $POD_NAMESPACE/$POD_NAME when
    set, else no label (a host process)."""

    webhook_enabled: bool = True
    """Serve the admission webhook (/mutate, /validate) over HTTPS."""
    webhook_host: str = "127.0.0.1"
    """Address the webhook listens on."""
    webhook_port: int = 9443
    """Port of the webhook."""
    webhook_cert_dir: Path | None = None
    """Directory with ``tls.crt``, ``tls.key`` and ``ca.crt``. Missing files are generated there
    (a self-signed CA and a serving certificate); None keeps generated files in a temporary
    directory for the life of the process."""
    register_webhooks: bool = False
    """Create or update the Mutating/ValidatingWebhookConfiguration with our CA bundle."""
    webhook_url: str | None = None
    """``https://host:port`` the API server calls, when registering (dev: the host process)."""
    webhook_service: str | None = None
    """``namespace/name[:port]`` of the Service in front of the webhook, when registering
    in-cluster (the chart). Exactly one of ``webhook_url`` and ``webhook_service``."""
    webhook_config_name: str = "gpushare"
    """Name of the registered webhook configurations."""
    webhook_timeout_seconds: int = 5
    """How long the API server waits for the webhook (1..30)."""
    webhook_exclude_namespaces: tuple[str, ...] = ("kube-system",)
    """Namespaces the webhook never sees (the control plane keeps working if we are down)."""
    webhook_namespace_label: str | None = None
    """``key=value``: only namespaces with this label are sent to the webhook (e.g. to confine
    a test controller in a shared cluster); None sends every namespace but the excluded ones."""
    protected_host_paths: tuple[str, ...] = DEFAULT_PROTECTED_HOST_PATHS
    """Host directories gpushare pods may not mount (MPS pipes, device-plugin sockets)."""
    pod_tolerations: tuple[str, ...] = ("nvidia.com/gpu:NoSchedule",)
    """Tolerations the webhook adds to gpushare pods that lack them, as KEY[=VALUE]:EFFECT.
    The default tolerates the nvidia.com/gpu taint GKE puts on GPU nodes: gpushare pods ask
    for gpushare.io/gpu-percent, so nothing else adds it (gpushare.cluster.webhook.scheduling).
    'none' adds none."""
    pod_runtime_class: str = ""
    """RuntimeClass the webhook sets on gpushare pods that name none (e.g. nvidia, where the
    GPU Operator's container runtime needs it); empty sets none."""
    annotation_mode: str = MODE_DEVICEPLUGIN
    """What the webhook makes of a pod's gpushare.io/gpu-fraction (or share) annotations:
    ``deviceplugin``, the gpushare.io/gpu-percent resource placed by gpushare-scheduler; ``dra``,
    a ResourceClaim of ``dra_device_class`` (docs/dra.md, "Keeping
    annotations"; placed as ``dra_placement`` says). The chart sets it from its ``mode``."""
    dra_device_class: str = DEVICE_CLASS
    """DeviceClass of the claims made in ``--annotation-mode=dra`` (the chart's
    dra.deviceClass.name)."""
    dra_placement: str | None = None
    """Who allocates DRA claims of pods gated by ``gpushare.io/placement``: ``gpushare``, the
    controller with the placement policy (in ``--annotation-mode=dra`` the webhook gates
    annotated pods; docs/dra.md "Who places a claim"); ``kube-scheduler``, its DRA allocator
    (first fit; nothing is gated). Unset: ``gpushare`` in ``--annotation-mode=dra``, else
    ``kube-scheduler``. The chart sets it from dra.placement wherever a node pool runs in dra
    mode."""
    metrics_auth: str = "tokenreview"
    """Who may read ``/metrics`` (it names every namespace's GpuShares and their profiles):
    ``tokenreview``, a caller whose bearer token the API server authenticates and allows to
    get the non-resource URL /metrics (TokenReview + SubjectAccessReview, as Prometheus
    scrapes kubelets); ``none``, anyone who reaches the port (docs/security.md)."""
    dra_templates_per_namespace: int = 32
    """In ``--annotation-mode=dra``: most ResourceClaimTemplates gpushare makes in one namespace
    (one per distinct request its annotated pods make); a pod asking for one more is refused
    at admission, naming this bound (gpushare.cluster.dra.templates)."""
    dra_template_idle_seconds: float = 600.0
    """A ResourceClaimTemplate gpushare made that no pod has referred to for this long is
    deleted (it is made again for the next pod that asks)."""

    @property
    def places_claims(self) -> bool:
        """The controller allocates the claims of gated pods (see ``dra_placement``)."""
        default = (
            PLACEMENT_GPUSHARE if self.annotation_mode == MODE_DRA else PLACEMENT_KUBE_SCHEDULER
        )
        return (self.dra_placement or default) == PLACEMENT_GPUSHARE

    policy: Policy = DEFAULT_POLICY
    """Placement policy of filter, prioritize and bind: ``gpushare`` (fragmentation-aware,
    measured against the pod mix the controller learns; what the openb benchmarks measured,
    docs/packing.md), ``binpack`` (fullest GPU and node) or ``spread`` (emptiest)."""
    interference_admission: bool = True
    """Leave out GPUs where a pod, or a tenant already there, is predicted slower than its
    class accepts (latency 1.15x, batch 2.0x) by the shipped interference model. Applies only
    where a GpuShare profile was measured (docs/packing.md, "Admission")."""
    stale_assume_seconds: float = 120.0
    """A pod whose placement annotations were written but which never got bound (the
    controller died between the two writes) stops holding its share after this long."""
    bind_gate_seconds: float = 5.0
    """Longest a bind waits for the pods bound just before it on the same node to get their
    Allocate (kept below kube-scheduler's extender httpTimeout); a bind that cannot even start
    in that time is answered "busy" and retried by the scheduler."""
    hold_in_filter: bool = True
    """Filter picks the best node itself and holds the GPU there until the bind, offering the
    scheduler that node only: no bind collisions between pods scheduled back to back, at the
    cost of the scheduler's own scores among GPU-feasible nodes (see docs/scheduling.md).
    --no-hold-in-filter lets the scheduler choose among all GPU-feasible nodes."""
    resync_seconds: float = 300.0
    """Re-list pods and nodes this often, as a guard against a missed watch event."""
    opportunistic_placement: bool = True
    """Honour opt-ins to opportunistic placement (pods asking for
    ``gpushare.io/opportunistic-gpu-percent``, which node agents advertise). Off: the webhook
    refuses an opt-in, naming this flag (docs/packing.md, "The sharing contract")."""
    opportunistic_priority_class: str = "gpushare-opportunistic"
    """PriorityClass the webhook gives opted-in pods that name none (the chart creates it,
    value -10, preemptionPolicy Never): kube-scheduler tries higher priorities first, so a
    guaranteed pod waiting beside an opportunistic one is placed first instead of preempting
    it right after. Read from the API server every 15 s; while it does not exist no priority is
    given. Empty gives none."""
    opportunistic_default: bool = False
    """Batch pods of one GPU or less opt in to opportunistic placement unless they (or their
    GpuShare) say otherwise: where no GPU has their request free, they may run preemptible
    beyond a GPU's guaranteed capacity when gpushare predicts it pays (docs/packing.md, "The
    sharing contract"). Off: only pods that opt in (gpushare.io/opportunistic: "true", a
    GpuShare's spec.opportunistic) do."""
    governor_period_seconds: float = 30.0
    """How often the leader judges GPUs with opportunistic tenants by their measured counters
    (the node agent's /profile), and learns its interference corrections from every shared
    GPU."""
    governor_settle_seconds: float = 60.0
    """How long an opportunistic pod runs before the governor judges it (its start-up, then a
    window of counters taken with it)."""
    operator_enabled: bool = True
    """Run the Kopf operator (``gpushare.cluster.operator``) in the same event loop."""
    agent_url: str = DEFAULT_AGENT_URL
    """The operator's way to a node agent's metrics server (its profiler is ``/profile``
    below it): an http(s) URL template where {node} and {node_ip} (the node's InternalIP) are
    substituted. The chart derives it from node.metrics.port."""
    profile_cache_name: str = DEFAULT_PROFILE_CACHE
    """Name of the operator's profile cache ConfigMap in the controller's namespace (the chart:
    <release>-profile-cache, the one its RBAC grants)."""
    log_level: str = "INFO"
    """Python logging level name."""
    field_manager: str = PROG
    """Field manager name on every write."""

    extra: dict[str, str] = field(default_factory=dict)
    """Free-form ``--set key=value`` options for components hooked into the process."""

    def validate(self) -> "Settings":
        """Raise InvalidInputError naming the flag of the first bad value; return self."""
        for name, seconds in (
            ("--governor-period-seconds", self.governor_period_seconds),
            ("--governor-settle-seconds", self.governor_settle_seconds),
        ):
            if not 1.0 <= seconds <= 86400.0:
                raise InvalidInputError(name, f"{seconds} is out of range", "use 1..86400 seconds")
        for name, port in (
            ("--extender-port", self.extender_port),
            ("--webhook-port", self.webhook_port),
        ):
            if not 1 <= port <= 65535:
                raise InvalidInputError(name, f"{port} is not a TCP port", "use 1..65535")
        if (
            self.webhook_enabled
            and self.extender_port == self.webhook_port
            and (self.extender_host == self.webhook_host)
        ):
            raise InvalidInputError(
                "--webhook-port", "equals --extender-port", "give the two servers different ports"
            )
        if (self.extender_tls_cert is None) != (self.extender_tls_key is None):
            raise InvalidInputError(
                "--extender-tls-cert",
                "needs --extender-tls-key too (and the other way round)",
                "give both files, or neither for plain HTTP",
            )
        if self.extender_client_ca is not None and self.extender_tls_cert is None:
            raise InvalidInputError(
                "--extender-client-ca",
                "needs --extender-tls-cert and --extender-tls-key (mutual TLS is TLS first)",
                "give the extender its own certificate too",
            )
        for name, path in (
            ("--extender-tls-cert", self.extender_tls_cert),
            ("--extender-tls-key", self.extender_tls_key),
            ("--extender-client-ca", self.extender_client_ca),
            ("--kubeconfig", self.kubeconfig),
        ):
            if path is not None and not path.is_file():
                raise InvalidInputError(
                    name, f"{str(path)!r} is not a readable file", "fix the path"
                )
        if (
            self.webhook_cert_dir is not None
            and self.webhook_cert_dir.exists()
            and (not self.webhook_cert_dir.is_dir())
        ):
            raise InvalidInputError(
                "--webhook-cert-dir",
                f"{str(self.webhook_cert_dir)!r} is not a directory",
                "name a directory (it is created when missing)",
            )
        if not 1 <= self.webhook_timeout_seconds <= 30:
            raise InvalidInputError(
                "--webhook-timeout-seconds",
                f"{self.webhook_timeout_seconds} is outside 1..30",
                "the API server accepts 1 to 30 seconds",
            )
        if self.register_webhooks:
            if not self.webhook_enabled:
                raise InvalidInputError(
                    "--register-webhooks", "needs the webhook server", "drop --no-webhook"
                )
            if (self.webhook_url is None) == (self.webhook_service is None):
                raise InvalidInputError(
                    "--register-webhooks",
                    "needs exactly one of --webhook-url and --webhook-service",
                    "e.g. --webhook-url https://127.0.0.1:9443 on a developer machine",
                )
        if self.webhook_url is not None:
            parts = urlsplit(self.webhook_url)
            if parts.scheme != "https" or not parts.hostname:
                raise InvalidInputError(
                    "--webhook-url",
                    f"{self.webhook_url!r} is not an https:// URL",
                    "write it like https://127.0.0.1:9443 (the API server only calls HTTPS)",
                )
            if parts.path not in ("", "/"):
                raise InvalidInputError(
                    "--webhook-url",
                    "must not have a path",
                    "give only https://host:port; /mutate and /validate are appended",
                )
        if self.webhook_service is not None:
            parse_service(self.webhook_service)
        if self.webhook_namespace_label is not None:
            key, sep, _ = self.webhook_namespace_label.partition("=")
            if not sep or not key or "," in self.webhook_namespace_label:
                raise InvalidInputError(
                    "--webhook-namespace-label",
                    f"{self.webhook_namespace_label!r} is not key=value",
                    "write one label like gpushare.io/webhook=enabled",
                )
        for flag, value in (
            ("--stale-assume-seconds", self.stale_assume_seconds),
            ("--resync-seconds", self.resync_seconds),
            ("--bind-gate-seconds", self.bind_gate_seconds),
            ("--cert-reload-seconds", self.cert_reload_seconds),
            ("--leader-elect-lease-seconds", self.leader_elect_lease_seconds),
            ("--leader-elect-renew-seconds", self.leader_elect_renew_seconds),
            ("--dra-template-idle-seconds", self.dra_template_idle_seconds),
        ):
            if value <= 0:
                raise InvalidInputError(flag, f"{value} is not positive", "give seconds > 0")
        if not 1 <= self.dra_templates_per_namespace <= 10_000:
            raise InvalidInputError(
                "--dra-templates-per-namespace",
                f"{self.dra_templates_per_namespace} is outside 1..10000",
                "give how many distinct requests a namespace's pods may make, e.g. 32",
            )
        if self.leader_elect_renew_seconds * 2 > self.leader_elect_lease_seconds:
            raise InvalidInputError(
                "--leader-elect-renew-seconds",
                f"{self.leader_elect_renew_seconds} is more than half the lease "
                f"({self.leader_elect_lease_seconds})",
                "renew at least twice per lease",
            )
        if self.leader_pod and self.leader_pod.count("/") != 1:
            raise InvalidInputError(
                "--leader-pod", f"{self.leader_pod!r} is not namespace/name", "write ns/pod-name"
            )
        if logging.getLevelName(self.log_level.upper()) == f"Level {self.log_level.upper()}":
            raise InvalidInputError(
                "--log-level",
                f"unknown level {self.log_level!r}",
                "use DEBUG, INFO, WARNING or ERROR",
            )
        check_agent_url(self.agent_url)
        check_configmap_name(self.profile_cache_name)
        if self.annotation_mode not in ANNOTATION_MODES:
            raise InvalidInputError(
                "--annotation-mode",
                f"{self.annotation_mode!r} is not a mode",
                f"use one of {', '.join(ANNOTATION_MODES)}",
            )
        if self.opportunistic_priority_class and (
            len(self.opportunistic_priority_class) > 253
            or not _DNS_SUBDOMAIN.match(self.opportunistic_priority_class)
        ):
            raise InvalidInputError(
                "--opportunistic-priority-class",
                f"{self.opportunistic_priority_class!r} is not a PriorityClass name",
                "use lower-case letters, digits, '-' and '.', or '' for none",
            )
        if len(self.dra_device_class) > 253 or not _DNS_SUBDOMAIN.match(self.dra_device_class):
            raise InvalidInputError(
                "--dra-device-class",
                f"{self.dra_device_class!r} is not a valid DeviceClass name",
                "use lower-case letters, digits, '-' and '.', e.g. mps.gpushare.io",
            )
        for toleration in self.pod_tolerations:
            parse_toleration(toleration)
        check_runtime_class(self.pod_runtime_class)
        for host_path in self.protected_host_paths:
            if not host_path.startswith("/"):
                raise InvalidInputError(
                    "--protected-host-path",
                    f"{host_path!r} is not absolute",
                    "give absolute host paths",
                )
        return self

    def webhook_required_hosts(self) -> list[str]:
        """Host names the API server calls the webhook by: the serving certificate must
        cover them."""
        hosts: list[str] = []
        if self.webhook_url is not None:
            host = urlsplit(self.webhook_url).hostname
            if host:
                hosts.append(host)
        if self.webhook_service is not None:
            namespace, name, _ = parse_service(self.webhook_service)
            hosts += [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        return hosts

    def webhook_hosts(self) -> list[str]:
        """Every name a generated webhook certificate is made for."""
        hosts = [*self.webhook_required_hosts(), "localhost", "127.0.0.1"]
        if self.webhook_host not in ("0.0.0.0", "::", ""):
            hosts.append(self.webhook_host)
        return list(dict.fromkeys(hosts))


def parse_service(text: str) -> tuple[str, str, int]:
    """``namespace/name[:port]`` -> (namespace, name, port)."""
    fix = "write namespace/name or namespace/name:port, e.g. gpushare/gpushare-controller:443"
    namespace, sep, rest = text.partition("/")
    name, _, port_text = rest.partition(":")
    if not sep or not namespace or not name:
        raise InvalidInputError("--webhook-service", f"{text!r} is not namespace/name", fix)
    try:
        port = int(port_text) if port_text else 443
    except ValueError:
        raise InvalidInputError(
            "--webhook-service", f"port {port_text!r} is not a number", fix
        ) from None
    return namespace, name, port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _doc(name: str) -> str:
    """The docstring under a Settings field, reused as its --help text (gpushare.api.flags)."""
    return field_docs(Settings).get(name, "")


def build_parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "gpushare controller: kube-scheduler extender (filter/prioritize/bind), admission "
            "webhook (mutate/validate) and the GpuShare operator in one process."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--kubeconfig", type=Path, default=d.kubeconfig, help=_doc("kubeconfig"))
    g = p.add_argument_group("scheduler extender")
    g.add_argument("--extender-host", default=d.extender_host, help=_doc("extender_host"))
    g.add_argument("--extender-port", type=int, default=d.extender_port, help=_doc("extender_port"))
    g.add_argument("--extender-tls-cert", type=Path, help=_doc("extender_tls_cert"))
    g.add_argument("--extender-tls-key", type=Path, help=_doc("extender_tls_key"))
    g.add_argument("--extender-client-ca", type=Path, help=_doc("extender_client_ca"))
    g.add_argument(
        "--cert-reload-seconds",
        type=float,
        default=d.cert_reload_seconds,
        help=_doc("cert_reload_seconds"),
    )
    g.add_argument("--tenancy", default=d.tenancy, choices=TENANCY_MODES, help=_doc("tenancy"))
    g.add_argument(
        "--neighbour-rules",
        default=d.neighbour_rules,
        choices=RULES_MODES,
        help=_doc("neighbour_rules"),
    )
    g.add_argument(
        "--policy",
        default=str(d.policy),
        choices=[str(x) for x in Policy],
        help=_doc("policy"),
    )
    g.add_argument(
        "--interference-admission",
        action=argparse.BooleanOptionalAction,
        default=d.interference_admission,
        help=_doc("interference_admission"),
    )
    g.add_argument(
        "--stale-assume-seconds",
        type=float,
        default=d.stale_assume_seconds,
        help=_doc("stale_assume_seconds"),
    )
    g.add_argument(
        "--resync-seconds", type=float, default=d.resync_seconds, help=_doc("resync_seconds")
    )
    g.add_argument(
        "--opportunistic-placement",
        action=argparse.BooleanOptionalAction,
        default=d.opportunistic_placement,
        help=_doc("opportunistic_placement"),
    )
    g.add_argument(
        "--opportunistic-default",
        action=argparse.BooleanOptionalAction,
        default=d.opportunistic_default,
        help=_doc("opportunistic_default"),
    )
    g.add_argument(
        "--opportunistic-priority-class",
        default=d.opportunistic_priority_class,
        help=_doc("opportunistic_priority_class"),
    )
    g.add_argument(
        "--governor-period-seconds",
        type=float,
        default=d.governor_period_seconds,
        help=_doc("governor_period_seconds"),
    )
    g.add_argument(
        "--governor-settle-seconds",
        type=float,
        default=d.governor_settle_seconds,
        help=_doc("governor_settle_seconds"),
    )
    g.add_argument(
        "--hold-in-filter",
        action=argparse.BooleanOptionalAction,
        default=d.hold_in_filter,
        help=_doc("hold_in_filter"),
    )
    g.add_argument(
        "--bind-gate-seconds",
        type=float,
        default=d.bind_gate_seconds,
        help=_doc("bind_gate_seconds"),
    )
    w = p.add_argument_group("admission webhook")
    w.add_argument(
        "--no-webhook",
        dest="webhook_enabled",
        action="store_false",
        help="do not serve the webhook",
    )
    w.add_argument("--webhook-host", default=d.webhook_host, help=_doc("webhook_host"))
    w.add_argument("--webhook-port", type=int, default=d.webhook_port, help=_doc("webhook_port"))
    w.add_argument("--webhook-cert-dir", type=Path, help=_doc("webhook_cert_dir"))
    w.add_argument("--register-webhooks", action="store_true", help=_doc("register_webhooks"))
    w.add_argument("--webhook-url", help=_doc("webhook_url"))
    w.add_argument("--webhook-service", help=_doc("webhook_service"))
    w.add_argument(
        "--webhook-config-name", default=d.webhook_config_name, help=_doc("webhook_config_name")
    )
    w.add_argument(
        "--webhook-timeout-seconds",
        type=int,
        default=d.webhook_timeout_seconds,
        help=_doc("webhook_timeout_seconds"),
    )
    w.add_argument(
        "--webhook-exclude-namespace",
        dest="webhook_exclude_namespaces",
        action="append",
        help=_doc("webhook_exclude_namespaces") + " Repeatable; default kube-system.",
    )
    w.add_argument("--webhook-namespace-label", help=_doc("webhook_namespace_label"))
    w.add_argument(
        "--protected-host-path",
        dest="protected_host_paths",
        action="append",
        help=_doc("protected_host_paths") + " Repeatable; replaces the built-in list.",
    )
    w.add_argument(
        "--pod-toleration",
        dest="pod_tolerations",
        action="append",
        help=_doc("pod_tolerations") + " Repeatable; replaces the default.",
    )
    w.add_argument(
        "--pod-runtime-class", default=d.pod_runtime_class, help=_doc("pod_runtime_class")
    )
    w.add_argument(
        "--annotation-mode",
        default=d.annotation_mode,
        choices=ANNOTATION_MODES,
        help=_doc("annotation_mode"),
    )
    w.add_argument("--dra-device-class", default=d.dra_device_class, help=_doc("dra_device_class"))
    w.add_argument(
        "--dra-placement",
        default=d.dra_placement,
        choices=DRA_PLACEMENTS,
        help=_doc("dra_placement"),
    )
    w.add_argument(
        "--metrics-auth",
        default=d.metrics_auth,
        choices=METRICS_AUTH_MODES,
        help=_doc("metrics_auth"),
    )
    w.add_argument(
        "--dra-templates-per-namespace",
        type=int,
        default=d.dra_templates_per_namespace,
        help=_doc("dra_templates_per_namespace"),
    )
    w.add_argument(
        "--dra-template-idle-seconds",
        type=float,
        default=d.dra_template_idle_seconds,
        help=_doc("dra_template_idle_seconds"),
    )
    o = p.add_argument_group("process")
    o.add_argument(
        "--no-operator",
        dest="operator_enabled",
        action="store_false",
        help="do not run the operator",
    )
    o.add_argument("--agent-url", default=d.agent_url, help=_doc("agent_url"))
    o.add_argument(
        "--profile-cache-name", default=d.profile_cache_name, help=_doc("profile_cache_name")
    )
    o.add_argument("--log-level", default=d.log_level, help=_doc("log_level"))
    o.add_argument(
        "--agent-lease-namespace",
        default=d.agent_lease_namespace,
        help=_doc("agent_lease_namespace"),
    )
    le = p.add_argument_group("high availability")
    le.add_argument("--leader-elect", action="store_true", help=_doc("leader_elect"))
    le.add_argument(
        "--leader-elect-namespace",
        default=d.leader_elect_namespace,
        help=_doc("leader_elect_namespace"),
    )
    le.add_argument(
        "--leader-elect-name", default=d.leader_elect_name, help=_doc("leader_elect_name")
    )
    le.add_argument(
        "--leader-elect-lease-seconds",
        type=float,
        default=d.leader_elect_lease_seconds,
        help=_doc("leader_elect_lease_seconds"),
    )
    le.add_argument(
        "--leader-elect-renew-seconds",
        type=float,
        default=d.leader_elect_renew_seconds,
        help=_doc("leader_elect_renew_seconds"),
    )
    le.add_argument("--leader-identity", default=d.leader_identity, help=_doc("leader_identity"))
    le.add_argument("--leader-pod", default=d.leader_pod, help=_doc("leader_pod"))
    o.add_argument(
        "--set",
        dest="extra",
        action="append",
        metavar="KEY=VALUE",
        help=_doc("extra") + " Repeatable.",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """Parse and validate the command line; raises InvalidInputError on a bad value."""
    ns = build_parser().parse_args(argv)
    values = vars(ns)
    extra: dict[str, str] = {}
    for item in values.pop("extra") or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInputError("--set", f"{item!r} is not KEY=VALUE", "write --set key=value")
        extra[key] = value
    excludes = values.pop("webhook_exclude_namespaces")
    protected = values.pop("protected_host_paths")
    tolerations = values.pop("pod_tolerations")
    if tolerations is not None:
        tolerations = [t for t in tolerations if t != "none"]
    known = {f.name for f in fields(Settings)}
    kwargs = {k: v for k, v in values.items() if k in known}
    kwargs["policy"] = Policy(values["policy"])
    settings = Settings(
        **kwargs,
        extra=extra,
        webhook_exclude_namespaces=tuple(excludes)
        if excludes
        else Settings.webhook_exclude_namespaces,
        protected_host_paths=tuple(protected) if protected else DEFAULT_PROTECTED_HOST_PATHS,
        pod_tolerations=Settings.pod_tolerations if tolerations is None else tuple(tolerations),
    )
    return settings.validate()

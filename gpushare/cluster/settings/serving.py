"""Settings of the controller's listeners and its place among replicas: the process, the
scheduler extender, the admission webhook and what it refuses or adds, leader election."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from gpushare.api.errors import InvalidInputError
from gpushare.api.flags import flag_meta, option, repeated
from gpushare.api.tolerations import check_runtime_class, parse_toleration
from gpushare.cluster.settings.checks import (
    DEFAULT_PROTECTED_HOST_PATHS,
    METRICS_AUTH_MODES,
    PROG,
    key_values,
    known_level,
    namespace_name,
    parse_service,
    port,
    positive,
    readable,
    within,
)


@dataclass(frozen=True)
class ProcessSettings:
    """The process itself: where the API server is, logs, who may read /metrics."""

    kubeconfig: Path | None = None
    """Kubeconfig file; None uses in-cluster config, then $KUBECONFIG, then ~/.kube/config."""
    log_level: str = "INFO"
    """Python logging level name."""
    field_manager: str = option(PROG, no_flag=True)
    """Field manager name on every write."""
    metrics_auth: str = option("tokenreview", choices=METRICS_AUTH_MODES)
    """Who may read ``/metrics`` (it names every namespace's GpuShares and their profiles):
    ``tokenreview``, a caller whose bearer token the API server authenticates and allows to
    get the non-resource URL /metrics (TokenReview + SubjectAccessReview, as Prometheus
    scrapes kubelets); ``none``, anyone who reaches the port (docs/security.md)."""
    cert_reload_seconds: float = 10.0
    """How often certificate files are checked for a change (rotation): a changed set is
    loaded for new connections, and the webhook configurations get the new CA bundle first."""
    extra: dict[str, str] = field(
        default_factory=dict,
        metadata=flag_meta(
            flags=("--set",),
            action="append",
            metavar="KEY=VALUE",
            convert=key_values,
            help_suffix="Repeatable.",
        ),
    )
    """Free-form ``--set key=value`` options for components hooked into the process."""

    def validate(self) -> None:
        readable(("--kubeconfig", self.kubeconfig))
        positive(("--cert-reload-seconds", self.cert_reload_seconds))
        known_level("--log-level", self.log_level)


@dataclass(frozen=True)
class ExtenderSettings:
    """The scheduler extender's listener (also /healthz, /readyz, /metrics)."""

    PREFIX: ClassVar[str] = "extender"
    host: str = "127.0.0.1"
    """Address the scheduler extender (and /healthz, /readyz, /metrics) listens on."""
    port: int = 8888
    """Port of the extender; kube-scheduler's extender urlPrefix points here."""
    tls_cert: Path | None = None
    """PEM certificate for the extender; with ``extender_tls_key`` the extender serves HTTPS."""
    tls_key: Path | None = None
    """PEM private key matching ``extender_tls_cert``."""
    client_ca: Path | None = None
    """PEM CA bundle: the extender then answers only clients presenting a certificate it
    signed (kube-scheduler's extender tlsConfig certFile/keyFile; mutual TLS). Needs the
    extender's own certificate. /healthz and /readyz stay on the webhook port for probes."""

    def validate(self, *, files_exist: bool = True) -> None:
        """``files_exist``: the certificate files must be readable now (not when the
        controller writes them itself from its Secrets)."""
        port("--extender-port", self.port)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidInputError(
                "--extender-tls-cert",
                "needs --extender-tls-key too (and the other way round)",
                "give both files, or neither for plain HTTP",
            )
        if self.client_ca is not None and self.tls_cert is None:
            raise InvalidInputError(
                "--extender-client-ca",
                "needs --extender-tls-cert and --extender-tls-key (mutual TLS is TLS first)",
                "give the extender its own certificate too",
            )
        if files_exist:
            readable(
                ("--extender-tls-cert", self.tls_cert),
                ("--extender-tls-key", self.tls_key),
                ("--extender-client-ca", self.client_ca),
            )


@dataclass(frozen=True)
class WebhookSettings:
    """The admission webhook's listener and its registration with the API server."""

    PREFIX: ClassVar[str] = "webhook"
    enabled: bool = option(
        True, flags=("--no-webhook",), action="store_false", help="do not serve the webhook"
    )
    """Serve the admission webhook (/mutate, /validate) over HTTPS."""
    host: str = "127.0.0.1"
    """Address the webhook listens on."""
    port: int = 9443
    """Port of the webhook."""
    cert_dir: Path | None = None
    """Directory with ``tls.crt``, ``tls.key`` and ``ca.crt``. Missing files are generated there
    (a self-signed CA and a serving certificate); None keeps generated files in a temporary
    directory for the life of the process."""
    register: bool = option(False, flat="register_webhooks", action="store_true")
    """Create or update the Mutating/ValidatingWebhookConfiguration with our CA bundle."""
    url: str | None = None
    """``https://host:port`` the API server calls, when registering (dev: the host process)."""
    service: str | None = None
    """``namespace/name[:port]`` of the Service in front of the webhook, when registering
    in-cluster (the chart). Exactly one of ``webhook_url`` and ``webhook_service``."""
    config_name: str = "gpushare"
    """Name of the registered webhook configurations."""
    timeout_seconds: int = 5
    """How long the API server waits for the webhook (1..30)."""
    exclude_namespaces: tuple[str, ...] = repeated(
        ("kube-system",), "--webhook-exclude-namespace", "Repeatable; default kube-system."
    )
    """Namespaces the webhook never sees (the control plane keeps working if we are down)."""
    namespace_label: str | None = None
    """``key=value``: only namespaces with this label are sent to the webhook (e.g. to confine
    a test controller in a shared cluster); None sends every namespace but the excluded ones."""
    client_ca: Path | None = None
    """PEM CA bundle of the client certificate the API server presents to the webhook (its
    AdmissionConfiguration's kubeconfig for the webhook's host): /mutate and /validate then
    answer only a caller presenting one it signed, so no pod can forge a review to read other
    namespaces' GpuShares; the probes and /metrics stay open to callers without one."""

    def validate(self) -> None:
        port("--webhook-port", self.port)
        readable(("--webhook-client-ca", self.client_ca))
        if self.cert_dir is not None and self.cert_dir.exists() and not self.cert_dir.is_dir():
            raise InvalidInputError(
                "--webhook-cert-dir",
                f"{str(self.cert_dir)!r} is not a directory",
                "name a directory (it is created when missing)",
            )
        within(
            "--webhook-timeout-seconds",
            self.timeout_seconds,
            (1, 30),
            "the API server accepts 1 to 30 seconds",
        )
        if self.register:
            if not self.enabled:
                raise InvalidInputError(
                    "--register-webhooks", "needs the webhook server", "drop --no-webhook"
                )
            if (self.url is None) == (self.service is None):
                raise InvalidInputError(
                    "--register-webhooks",
                    "needs exactly one of --webhook-url and --webhook-service",
                    "e.g. --webhook-url https://127.0.0.1:9443 on a developer machine",
                )
        if self.url is not None:
            self._check_url(self.url)
        if self.service is not None:
            parse_service(self.service)
        if self.namespace_label is not None:
            key, sep, _ = self.namespace_label.partition("=")
            if not sep or not key or "," in self.namespace_label:
                raise InvalidInputError(
                    "--webhook-namespace-label",
                    f"{self.namespace_label!r} is not key=value",
                    "write one label like gpushare.io/webhook=enabled",
                )

    @staticmethod
    def _check_url(url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise InvalidInputError(
                "--webhook-url",
                f"{url!r} is not an https:// URL",
                "write it like https://127.0.0.1:9443 (the API server only calls HTTPS)",
            )
        if parts.path not in ("", "/"):
            raise InvalidInputError(
                "--webhook-url",
                "must not have a path",
                "give only https://host:port; /mutate and /validate are appended",
            )

    def required_hosts(self) -> list[str]:
        """Host names the API server calls the webhook by: the serving certificate must
        cover them."""
        hosts: list[str] = []
        if self.url is not None:
            host = urlsplit(self.url).hostname
            if host:
                hosts.append(host)
        if self.service is not None:
            namespace, name, _ = parse_service(self.service)
            hosts += [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        return hosts

    def hosts(self) -> list[str]:
        """Every name a generated webhook certificate is made for."""
        hosts = [*self.required_hosts(), "localhost", "127.0.0.1"]
        if self.host not in ("0.0.0.0", "::", ""):
            hosts.append(self.host)
        return list(dict.fromkeys(hosts))


def _tolerations(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(t for t in items if t != "none")


@dataclass(frozen=True)
class PodRules:
    """What the webhook refuses or adds on gpushare pods."""

    protected_host_paths: tuple[str, ...] = repeated(
        DEFAULT_PROTECTED_HOST_PATHS,
        "--protected-host-path",
        "Repeatable; replaces the built-in list.",
    )
    """Host directories gpushare pods may not mount (MPS pipes, device-plugin sockets)."""
    pod_tolerations: tuple[str, ...] = repeated(
        ("nvidia.com/gpu:NoSchedule",),
        "--pod-toleration",
        "Repeatable; replaces the default.",
        convert=_tolerations,
    )
    """Tolerations the webhook adds to gpushare pods that lack them, as KEY[=VALUE]:EFFECT.
    The default tolerates the nvidia.com/gpu taint GKE puts on GPU nodes: gpushare pods ask
    for gpushare.io/gpu-percent, so nothing else adds it (gpushare.cluster.webhook.scheduling).
    'none' adds none."""
    pod_runtime_class: str = ""
    """RuntimeClass the webhook sets on gpushare pods that name none (e.g. nvidia, where the
    GPU Operator's container runtime needs it); empty sets none."""

    def validate(self) -> None:
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


@dataclass(frozen=True)
class LeaderSettings:
    """High availability: several replicas, a Lease electing the one that binds."""

    PREFIX: ClassVar[str] = "leader_elect"
    enabled: bool = option(False, flat="leader_elect", action="store_true")
    """Run as one of several replicas: a Lease elects the one that binds pods, serves the
    extender and runs the operator; the others serve the admission webhook and keep their
    view warm for a takeover."""
    namespace: str = "default"
    """Namespace of the Lease (the chart: the release namespace)."""
    name: str = "gpushare-controller"
    """Name of the Lease."""
    lease_seconds: float = 8.0
    """A leader that has not renewed for this long is replaced."""
    renew_seconds: float = 2.0
    """How often the leader renews, and a standby tries to take over."""
    identity: str = option("", flat="leader_identity")
    """This replica's name in the Lease; empty: $POD_NAME, else host name and PID."""
    pod: str = option("", flat="leader_pod")
    """``namespace/name`` of this replica's pod, labelled gpushare.io/controller-role=leader or
    standby (the extender Service selects the leader); empty: $POD_NAMESPACE/$POD_NAME when
    set, else no label (a host process)."""

    def validate(self) -> None:
        positive(
            ("--leader-elect-lease-seconds", self.lease_seconds),
            ("--leader-elect-renew-seconds", self.renew_seconds),
        )
        namespace_name(
            "--leader-elect-namespace",
            self.namespace,
            "also where the node agents' Leases are read unless --agent-lease-namespace says",
        )
        if self.renew_seconds * 2 > self.lease_seconds:
            raise InvalidInputError(
                "--leader-elect-renew-seconds",
                f"{self.renew_seconds} is more than half the lease ({self.lease_seconds})",
                "renew at least twice per lease",
            )
        if self.pod and self.pod.count("/") != 1:
            raise InvalidInputError(
                "--leader-pod", f"{self.pod!r} is not namespace/name", "write ns/pod-name"
            )

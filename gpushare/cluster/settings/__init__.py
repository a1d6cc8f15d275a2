"""Settings of the controller process, parsed from the command line: one small dataclass per
concern (Kopf's ``configuration.py``), each validating its own values, the flags generated from
them (gpushare.api.flags).

Every bad value is reported as an :class:`InvalidInputError` naming the flag and the fix, before
anything starts listening.
"""

import argparse
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.flags import add_group, flat_name, read_group
from gpushare.cluster.certificates import CertificateSettings
from gpushare.cluster.settings.checks import (
    ANNOTATION_MODES,
    DEFAULT_PROTECTED_HOST_PATHS,
    DRA_PLACEMENTS,
    METRICS_AUTH_MODES,
    MODE_DEVICEPLUGIN,
    MODE_DRA,
    PLACEMENT_GPUSHARE,
    PLACEMENT_KUBE_SCHEDULER,
    PROG,
    is_ip,
    parse_service,
)
from gpushare.cluster.settings.decisions import (
    DraSettings,
    OperatorSettings,
    OpportunisticSettings,
    PlacementSettings,
)
from gpushare.cluster.settings.serving import (
    ExtenderSettings,
    LeaderSettings,
    PodRules,
    ProcessSettings,
    WebhookSettings,
)

__all__ = [
    "ANNOTATION_MODES",
    "DEFAULT_PROTECTED_HOST_PATHS",
    "DRA_PLACEMENTS",
    "GROUPS",
    "METRICS_AUTH_MODES",
    "MODE_DEVICEPLUGIN",
    "MODE_DRA",
    "PLACEMENT_GPUSHARE",
    "PLACEMENT_KUBE_SCHEDULER",
    "PROG",
    "CertificateSettings",
    "DraSettings",
    "ExtenderSettings",
    "LeaderSettings",
    "OperatorSettings",
    "OpportunisticSettings",
    "PlacementSettings",
    "PodRules",
    "ProcessSettings",
    "Settings",
    "WebhookSettings",
    "build_parser",
    "is_ip",
    "parse_args",
    "parse_service",
]

GROUPS: tuple[tuple[str, type, str], ...] = (
    ("process", ProcessSettings, "process"),
    ("extender", ExtenderSettings, "scheduler extender"),
    ("placement", PlacementSettings, "placement"),
    ("opportunistic", OpportunisticSettings, "opportunistic placement"),
    ("webhook", WebhookSettings, "admission webhook"),
    ("pods", PodRules, "what the webhook refuses or adds"),
    ("dra", DraSettings, "DRA mode"),
    ("leader", LeaderSettings, "high availability"),
    ("operator", OperatorSettings, "operator"),
    ("certificates", CertificateSettings, "certificates kept in Secrets"),
)
"""Each concern: its attribute of :class:`Settings`, its dataclass, its title in ``--help``."""


@functools.cache
def _flat_names() -> dict[str, tuple[str, str]]:
    """Flat name (the flag's destination, e.g. ``extender_port``) -> (group, field)."""
    return {flat_name(cls, f): (attr, f.name) for attr, cls, _ in GROUPS for f in fields(cls)}


@dataclass(frozen=True)
class Settings:
    """Everything the controller process can be told, one small dataclass per concern, each
    field one flag (``--<group prefix>-<field>``, gpushare.api.flags) with its docstring as its
    help. Defaults suit a developer's machine.

    The flat names of the flags read through (``settings.extender_port`` is
    ``settings.extender.port``) for code written before the groups; new code reads the groups.
    """

    process: ProcessSettings = field(default_factory=ProcessSettings)
    """The process: kubeconfig, logs, /metrics access, certificate reloads, ``--set``."""
    extender: ExtenderSettings = field(default_factory=ExtenderSettings)
    """The scheduler extender's listener."""
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    """The placement policy and tenancy."""
    opportunistic: OpportunisticSettings = field(default_factory=OpportunisticSettings)
    """Opportunistic placement and its governor."""
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    """The admission webhook's listener and registration."""
    pods: PodRules = field(default_factory=PodRules)
    """What the webhook refuses or adds on gpushare pods."""
    dra: DraSettings = field(default_factory=DraSettings)
    """DRA mode."""
    leader: LeaderSettings = field(default_factory=LeaderSettings)
    """Leader election among replicas."""
    operator: OperatorSettings = field(default_factory=OperatorSettings)
    """The operator in this process."""
    certificates: CertificateSettings = field(default_factory=CertificateSettings)
    """Certificates kept in Secrets by the controller (gpushare.cluster.certificates)."""

    @classmethod
    def of(cls, **flat: Any) -> "Settings":
        """Settings from flat names (``Settings.of(extender_port=9000)``), the rest default."""
        by_group: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            if name not in _flat_names():
                raise TypeError(f"Settings has no setting {name!r}")
            group, attr = _flat_names()[name]
            by_group.setdefault(group, {})[attr] = value
        return cls(**{g: kind(**by_group.get(g, {})) for g, kind, _ in GROUPS})

    def __getattr__(self, name: str) -> Any:
        found = _flat_names().get(name) if not name.startswith("_") else None
        if found is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        group, attr = found
        return getattr(getattr(self, group), attr)

    @property
    def places_claims(self) -> bool:
        return self.dra.places_claims

    def webhook_required_hosts(self) -> list[str]:
        return self.webhook.required_hosts()

    def webhook_hosts(self) -> list[str]:
        return self.webhook.hosts()

    def validate(self) -> "Settings":
        """Raise InvalidInputError naming the flag of the first bad value; return self."""
        for attr, _, _ in GROUPS:
            if attr == "extender":
                # Files the controller writes itself from its certificate Secrets need not
                # exist yet.
                self.extender.validate(files_exist=not self.certificates.writes_files)
            else:
                getattr(self, attr).validate()
        web, ext = self.webhook, self.extender
        if web.enabled and (web.port, web.host) == (ext.port, ext.host):
            raise InvalidInputError(
                "--webhook-port", "equals --extender-port", "give the two servers different ports"
            )
        return self


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "gpushare controller: kube-scheduler extender (filter/prioritize/bind), admission "
            "webhook (mutate/validate) and the GpuShare operator in one process."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for _, cls, title in GROUPS:
        add_group(parser, cls, title)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """Parse and validate the command line; raises InvalidInputError on a bad value."""
    values = vars(build_parser().parse_args(argv))
    groups: dict[str, Any] = {attr: read_group(cls, values) for attr, cls, _ in GROUPS}
    return Settings(**groups).validate()

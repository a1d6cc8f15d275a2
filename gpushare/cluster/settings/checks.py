"""The controller's settings' constants and the checks several groups share."""

import ipaddress
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from gpushare.api.errors import InvalidInputError

PROG = "gpushare-controller"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
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


def positive(*values: tuple[str, float]) -> None:
    """Each (flag, seconds) more than 0."""
    for flag, value in values:
        if value <= 0:
            raise InvalidInputError(flag, f"{value} is not positive", "give seconds > 0")


def port(flag: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise InvalidInputError(flag, f"{port} is not a TCP port", "use 1..65535")


def readable(*paths: tuple[str, Path | None]) -> None:
    """Each (flag, file) a readable file, where given."""
    for flag, path in paths:
        if path is not None and not path.is_file():
            raise InvalidInputError(flag, f"{str(path)!r} is not a readable file", "fix the path")


def object_name(flag: str, name: str, what: str, example: str) -> None:
    if len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        raise InvalidInputError(
            flag, f"{name!r} is not {what}", f"use lower-case letters, digits, '-' and '.'{example}"
        )


def namespace_name(flag: str, name: str, why: str) -> None:
    """A namespace's name: never empty, which a watch would read as every namespace."""
    if not DNS_LABEL.match(name):
        raise InvalidInputError(
            flag,
            f"{name!r} is not a namespace name ({why})",
            "use up to 63 lower-case letters, digits and '-', e.g. the release namespace",
        )


def key_values(items: Sequence[str]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInputError("--set", f"{item!r} is not KEY=VALUE", "write --set key=value")
        extra[key] = value
    return extra


def known_level(flag: str, level: str) -> None:
    """A Python logging level name."""
    if logging.getLevelName(level.upper()) == f"Level {level.upper()}":
        raise InvalidInputError(
            flag, f"unknown level {level!r}", "use DEBUG, INFO, WARNING or ERROR"
        )


def within(flag: str, value: int, bounds: tuple[int, int], fix: str) -> None:
    """``value`` between the two ``bounds``, both included."""
    low, high = bounds
    if not low <= value <= high:
        raise InvalidInputError(flag, f"{value} is outside {low}..{high}", fix)

"""The webhook's pod tolerations and runtime class as the controller's flags name them
(``--pod-toleration KEY[=VALUE]:EFFECT``, ``--pod-runtime-class``), checked at start
(gpushare.cluster.webhook.scheduling adds them to pods)."""

import re

from gpushare.api.errors import InvalidInputError

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUALIFIED = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def parse_toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE]:EFFECT`` (``kubectl taint``'s form) as a pod toleration: operator Equal
    with a value, else Exists. InvalidInputError naming ``--pod-toleration`` otherwise."""
    fix = "write KEY[=VALUE]:EFFECT, e.g. nvidia.com/gpu:NoSchedule"
    spec, sep, effect = text.rpartition(":")
    key, eq, value = spec.partition("=")
    if not sep or effect not in EFFECTS:
        raise InvalidInputError(
            "--pod-toleration", f"{text!r} names no effect ({', '.join(EFFECTS)})", fix
        )
    if len(key) > 316 or not _QUALIFIED.fullmatch(key):
        raise InvalidInputError("--pod-toleration", f"{key!r} is not a taint key", fix)
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise InvalidInputError("--pod-toleration", f"{value!r} is not a taint value", fix)
    if eq:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def check_runtime_class(name: str) -> str:
    """``name`` when it is a RuntimeClass name (or empty: none added)."""
    if name and (len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name)):
        raise InvalidInputError(
            "--pod-runtime-class",
            f"{name!r} is not a RuntimeClass name",
            "use lower-case letters, digits, '-' and '.', e.g. nvidia",
        )
    return name

"""The Mutating/ValidatingWebhookConfiguration the controller registers for itself.

Failure policy (see docs/scheduling.md): the API server only calls us for gpushare pods, decided
by a CEL ``matchCondition`` it evaluates itself, so a controller outage never blocks any other
pod. For gpushare pods the policy is ``Fail``: admitting one unchecked and unmutated would bind
it with the default scheduler and no GPU placement, which is worse than a clear refusal.
A second mutating webhook, with policy ``Ignore``, sees the labelled pods of namespaces whose
admin enabled GpuShare selectors (:func:`_selector_hook`).
"""

import base64
from typing import Any

from gpushare.api.names import (
    GPU_RESOURCES,
    GROUP,
    LABEL_SHARE_SELECTORS,
    SHARE_SELECTORS_ENABLED,
)
from gpushare.cluster.settings import Settings, parse_service


def match_condition_expression() -> str:
    """CEL the API server evaluates before calling us: only gpushare pods are ever sent, so an
    outage of the controller cannot block any other pod (see docs/scheduling.md)."""
    gpushare_ann = (
        "has(object.metadata.annotations) && "
        "object.metadata.annotations.exists(k, k.startsWith('gpushare.io/'))"
    )
    # Both GPU resources: a pod asking for gpushare.io/opportunistic-gpu-percent directly, with
    # no gpushare annotation, was never sent, so the webhook could not refuse it (#45).
    held = " || ".join(
        f"(has(c.resources.{part}) && '{r}' in c.resources.{part})"
        for r in GPU_RESOURCES
        for part in ("limits", "requests")
    )
    asks = f"exists(c, has(c.resources) && ({held}))"
    resource = f"object.spec.containers.{asks}"
    init = f"has(object.spec.initContainers) && object.spec.initContainers.{asks}"
    return f"({gpushare_ann}) || ({resource}) || ({init})"


def _client_config(settings: Settings, ca_pem: bytes, path: str) -> dict[str, Any]:
    config: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode()}
    if settings.webhook.url is not None:
        config["url"] = settings.webhook.url.rstrip("/") + path
    else:
        assert settings.webhook.service is not None
        namespace, name, port = parse_service(settings.webhook.service)
        config["service"] = {"namespace": namespace, "name": name, "port": port, "path": path}
    return config


def _webhook(settings: Settings, ca_pem: bytes, *, kind: str, path: str) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": f"{kind}.pods.{GROUP}",
        "admissionReviewVersions": ["v1"],
        # No side effects: a DRA-mode pod's ResourceClaimTemplate is made once the pod is
        # stored (gpushare.cluster.dra.templates), never by an admission review.
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": settings.webhook.timeout_seconds,
        "clientConfig": _client_config(settings, ca_pem, path),
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "matchConditions": [{"name": "gpushare-pods", "expression": match_condition_expression()}],
        "matchPolicy": "Equivalent",
    }
    expressions: list[dict[str, Any]] = []
    if settings.webhook.exclude_namespaces:
        expressions.append(
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(settings.webhook.exclude_namespaces),
            }
        )
    if settings.webhook.namespace_label is not None:
        key, _, value = settings.webhook.namespace_label.partition("=")
        expressions.append({"key": key, "operator": "In", "values": [value]})
    if expressions:
        hook["namespaceSelector"] = {"matchExpressions": expressions}
    if kind == "mutate":
        hook["reinvocationPolicy"] = "IfNeeded"
    return hook


def _selector_hook(settings: Settings, ca_pem: bytes) -> dict[str, Any]:
    """The second mutating webhook: the pods the first is not sent (no gpushare annotation or
    resource) that have labels, in namespaces an admin labelled ``gpushare.io/share-selectors=
    enabled``, so a GpuShare's ``spec.selector`` can link them (gpushare.cluster.webhook.
    share_match). Failure policy ``Ignore``: these pods asked nothing of gpushare, so a
    controller outage must not block them; one admitted unlinked meanwhile is reported by the
    operator on the pod and the share (docs/operator.md, "Which pods a share governs")."""
    hook = _webhook(settings, ca_pem, kind="mutate", path="/mutate")
    hook["name"] = f"selector.pods.{GROUP}"
    hook["failurePolicy"] = "Ignore"
    hook["matchConditions"] = [
        {
            "name": "labelled-pods",
            "expression": (f"has(object.metadata.labels) && !({match_condition_expression()})"),
        }
    ]
    selector = hook.get("namespaceSelector", {"matchExpressions": []})
    selector["matchExpressions"] = [
        *selector["matchExpressions"],
        {"key": LABEL_SHARE_SELECTORS, "operator": "In", "values": [SHARE_SELECTORS_ENABLED]},
    ]
    hook["namespaceSelector"] = selector
    return hook


def webhook_configurations(
    settings: Settings, ca_pem: bytes
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(mutating, validating) configuration documents."""
    labels = {"app.kubernetes.io/name": "gpushare", "app.kubernetes.io/component": "controller"}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": settings.webhook.config_name, "labels": labels},
        "webhooks": [
            _webhook(settings, ca_pem, kind="mutate", path="/mutate"),
            _selector_hook(settings, ca_pem),
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": settings.webhook.config_name, "labels": labels},
        "webhooks": [_webhook(settings, ca_pem, kind="validate", path="/validate")],
    }
    return mutating, validating

"""The chart's webhook configurations are exactly what the controller applies over them.

The chart creates them (so `helm uninstall` deletes them) and the controller server-side-applies
its own version with the CA bundle. Any other difference would flip back and forth between the
two writers on every upgrade or restart.
"""

from typing import Any

import pytest

from gpushare.cluster.settings import parse_args
from gpushare.cluster.webhook.registration import webhook_configurations
from tests.chart.controller_flags import parseable
from tests.fixtures.helm_chart import Chart, container

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def _applied_by_controller(rendered: Any, release_name: str) -> dict[str, dict[str, Any]]:
    deploy = rendered.get("Deployment", f"{release_name}-controller")
    settings = parse_args(parseable(container(deploy, "controller")["args"]))
    mutating, validating = webhook_configurations(settings, b"-----BEGIN CERTIFICATE-----")
    for doc in (mutating, validating):
        for hook in doc["webhooks"]:
            hook["clientConfig"].pop("caBundle")
    return {mutating["kind"]: mutating, validating["kind"]: validating}


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"webhook": {"timeoutSeconds": 12, "excludeNamespaces": ["kube-system", "batch-infra"]}},
        {"webhook": {"excludeNamespaces": ["gpu-system"]}},
    ],
)
def test_chart_and_controller_write_the_same_webhooks(chart: Chart, values: dict) -> None:  # type: ignore[type-arg]
    rendered = chart.render(values)
    expected = _applied_by_controller(rendered, "gpushare")
    for kind in KINDS:
        mine = rendered.get(kind, "gpushare")
        assert mine["webhooks"] == expected[kind]["webhooks"], kind
        assert mine["metadata"]["name"] == expected[kind]["metadata"]["name"]
        # The controller's own labels must not fight Helm's either.
        assert expected[kind]["metadata"]["labels"].items() <= mine["metadata"]["labels"].items()


def test_webhooks_call_the_controller_service_over_https(chart: Chart) -> None:
    rendered = chart.render(release="edge", namespace="gpu")
    for kind in KINDS:
        hook = rendered.get(kind, "edge-gpushare")["webhooks"][0]
        assert hook["clientConfig"]["service"] == {
            "namespace": "gpu",
            "name": "edge-gpushare-controller",
            "port": 443,
            "path": "/mutate" if kind.startswith("Mutating") else "/validate",
        }
        assert hook["failurePolicy"] == "Fail"
        assert hook["matchConditions"], "without matchConditions every pod would hit the webhook"


def test_cert_manager_injects_the_ca(chart: Chart) -> None:
    rendered = chart.render({"webhook": {"certManager": {"enabled": True}}})
    for kind in KINDS:
        annotations = rendered.get(kind, "gpushare")["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == (
            "gpushare-system/gpushare-controller-webhook"
        )

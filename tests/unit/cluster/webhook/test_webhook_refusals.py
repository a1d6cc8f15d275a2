"""Every refusal names the field the user wrote: a misspelt gpushare annotation is named with the
closest one, a qualifier without a request says what it lacks, and none of these pods is told
about spec.schedulerName, which its author never wrote (issue 68)."""

from typing import Any

import pytest

from gpushare.api import dra, gpushare_crd, names
from gpushare.cluster.webhook.annotation_keys import KNOWN_KEYS
from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

FACTS = webhook_facts()
NODE_KEYS = {
    names.ANN_NODE_GPUS,
    names.ANN_AGENT_READY,
    names.ANN_AGENT_MODE,
    names.ANN_NODE_EXCLUSIVE,
    names.ANN_NODE_SEPARATED,
}


def refusals(pod: dict[str, Any]) -> list[str]:
    """What the mutating webhook says, and the validating one if the pod got past it (the API
    server's default scheduler filled in, as it is by then)."""
    said = []
    verdict = review(pod, namespace="default", facts=FACTS, mutate=True)
    if not verdict.allowed:
        said.append(verdict.message)
    else:
        stored = apply_patch(pod, verdict.patch)
        stored["spec"].setdefault("schedulerName", "default-scheduler")
        checked = review(stored, namespace="default", facts=FACTS, mutate=False)
        if not checked.allowed:
            said.append(checked.message)
    return said


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (
            {"gpushare.io/gpu-memory": "6Gi"},
            "gpushare.io/gpu-memory: is set, but the pod asks for no GPU: it has neither "
            "gpushare.io/gpu-fraction nor gpushare.io/share; add gpushare.io/gpu-fraction "
            '(e.g. "0.25") or gpushare.io/share: <GpuShare>, or remove gpushare.io/gpu-memory',
        ),
        (
            {"gpushare.io/fraction": "0.25"},
            "gpushare.io/fraction: is not a gpushare annotation; did you mean "
            "gpushare.io/gpu-fraction?",
        ),
        (
            {"gpushare.io/class": "latency"},
            "gpushare.io/class: is set, but the pod asks for no GPU",
        ),
        (
            {"gpushare.io/gpu-fracton": "0.25"},
            "gpushare.io/gpu-fracton: is not a gpushare annotation; did you mean "
            "gpushare.io/gpu-fraction? Rename the annotation",
        ),
        (
            {"gpushare.io/gpu-fraction": "0.25", "gpushare.io/gpu-memroy": "6Gi"},
            "gpushare.io/gpu-memroy: is not a gpushare annotation; did you mean "
            "gpushare.io/gpu-memory?",
        ),
        (
            {"gpushare.io/fancy": "yes"},
            "gpushare.io/fancy: is not a gpushare annotation; remove it",
        ),
    ],
)
def test_the_refusal_names_the_key_written_and_never_the_scheduler(
    annotations: dict[str, str], expected: str
) -> None:
    (said,) = refusals(pod_json("p", annotations=annotations))
    assert said.startswith(expected), said
    assert "schedulerName" not in said


def test_a_pod_that_skipped_the_mutating_webhook_is_told_so() -> None:
    pod = pod_json("p", fraction="0.25", extra_spec={"schedulerName": "default-scheduler"})
    verdict = review(pod, namespace="default", facts=FACTS, mutate=False)
    assert "spec.schedulerName: is 'default-scheduler': the pod did not pass gpushare's " in (
        verdict.message
    )


def test_every_pod_annotation_gpushare_defines_is_known_to_the_webhook() -> None:
    """A key added to the contract and forgotten here would refuse every pod carrying it."""
    defined = {
        value
        for module in (names, gpushare_crd, dra)
        for key, value in vars(module).items()
        if key.startswith("ANN_") and isinstance(value, str)
    }
    assert defined - NODE_KEYS <= KNOWN_KEYS, defined - NODE_KEYS - KNOWN_KEYS

"""Which GPU models a pod's node constraints admit (issue 69): Kubernetes' node selector and
required node affinity semantics over the nodes' labels, and hand-made nonsense read as no
limit, never an error."""

from typing import Any

import pytest

from gpushare.cluster.state.allowed_models import AllowedModels


def _models() -> AllowedModels:
    models = AllowedModels()
    models.node("a", {"pool": "small", "gen": "3"}, "T4")
    models.node("b", {"pool": "big", "gen": "9"}, "H100")
    models.node("c", {"pool": "big", "gen": "8"}, "A100")
    models.node("cpu-only", {"pool": "small"}, None)  # no gpushare GPUs: not a GPU model
    return models


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


def test_terms_are_ored_and_expressions_anded_as_in_kubernetes() -> None:
    models = _models()
    assert models.of({}) is None
    assert models.of({"nodeSelector": {"pool": "big"}}) == "A100|H100"
    assert models.of(_required(_expr("gen", "Gt", "8"))) == "H100"
    assert models.of(_required(_expr("gen", "Lt", "8"), _expr("gen", "Gt", "8"))) == "H100|T4"
    both = {"matchExpressions": [_expr("pool", "In", "big")["matchExpressions"][0]]}
    both["matchExpressions"].append({"key": "gen", "operator": "NotIn", "values": ["9"]})
    assert models.of(_required(both)) == "A100"
    fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
    assert models.of(_required(fields)) == "T4"
    assert models.of(_required(_expr("pool", "DoesNotExist"))) is None  # admits none
    assert models.of(_required(_expr("pool", "Exists"))) is None  # admits every model
    # Selector and affinity both hold.
    assert models.of({"nodeSelector": {"pool": "big"}, **_required(_expr("gen", "Gt", "8"))}) == (
        "H100"
    )
    # A node relabelled or gone changes the answer.
    models.node("a", {"pool": "big", "gen": "3"}, "T4")
    assert models.of({"nodeSelector": {"pool": "big"}}) is None
    models.drop("a")
    assert models.of({"nodeSelector": {"pool": "big"}}) is None  # every model left


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": "pool=big"},
        {"affinity": "yes"},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 3}}},
        _required("term"),  # type: ignore[arg-type]
        _required({}),
        _required({"matchExpressions": "x"}),
        _required({"matchExpressions": [{"key": 1, "operator": "In"}]}),
        _required(_expr("gen", "Gt", "eight")),
        _required(_expr("gen", "Gt", "1", "2")),
        _required({"matchExpressions": [{"key": "gen", "operator": "Near", "values": ["9"]}]}),
        {"nodeSelector": {"pool": object()}},
    ],
)
def test_nonsense_reads_as_no_limit(spec: dict[str, Any]) -> None:
    assert _models().of(spec) is None

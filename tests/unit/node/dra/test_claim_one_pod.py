"""A claim on gpushare's GPUs is one pod's share (issue 67): one claim shared by 8 pods was
prepared and accounted once. The agent refuses to prepare a claim reserved for several pods
(the chart's claim-sharing policy refuses the reservation itself on the API server)."""

from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.node.dra.claims import parse_claim
from tests.unit.node.dra.helpers import NODE, claim
from tests.unit.node.dra.test_claims import GPUS, REF


def _refused(manifest: dict[str, Any]) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as caught:
        parse_claim(manifest, ref=REF, pool=NODE, gpus=GPUS)
    return caught.value


def test_a_claim_reserved_for_eight_pods_is_refused() -> None:
    shared = claim(consumed={"gpuPercent": "10"})
    first = shared["status"]["reservedFor"][0]
    shared["status"]["reservedFor"] = [
        {**first, "name": f"pod-{i}", "uid": f"uid-{i}"} for i in range(8)
    ]
    error = _refused(shared)
    assert error.field == "status.reservedFor"
    assert "for 8 pods" in str(error)


@pytest.mark.parametrize("reserved", ["pods", {"resource": "pods"}, 7])
def test_a_reservation_that_is_no_list_is_refused_not_an_exception(reserved: object) -> None:
    broken = claim(consumed={"gpuPercent": "10"})
    broken["status"]["reservedFor"] = reserved
    assert _refused(broken).field == "status.reservedFor"

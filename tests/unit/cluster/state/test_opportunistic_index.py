"""The GPUs the opportunistic duties read come from an index the view keeps as tenants change
(``ClusterView.opportunistic_gpus``, ``governed_gpus``), not from a scan of every GPU every few
seconds. Held to the scan on a random stream of placements: opportunistic and guaranteed pods,
profiled or not, finishing, deleted and promoted, GPUs whose node arrives after its pods."""

import json
import random
from datetime import UTC, datetime

from gpushare.api.gpushare_crd import ANN_PROFILE
from gpushare.api.names import TIER_GUARANTEED, TIER_OPPORTUNISTIC
from gpushare.api.placement import Placement
from gpushare.api.profile import GpuProfile
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import GpuState
from tests.fixtures.builders import GIB, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NODES = {f"n{i}": [f"GPU-{i}-{j}" for j in range(4)] for i in range(5)}
PROFILE = json.dumps(
    GpuProfile(gpu_model="NVIDIA H100 80GB HBM3", fp32=0.3, sm_occupancy=0.2)
    .stored(now=NOW)
    .to_status(),
    separators=(",", ":"),
)


def scanned(view: ClusterView, keep: str) -> list[tuple[str, GpuState]]:
    """What the duties found by scanning every GPU of every node before the index."""

    def wanted(g: GpuState) -> bool:
        profiled = sum(1 for t in g.tenants if t.profile is not None)
        return g.has_opportunistic_tenant or (keep == "governed" and profiled >= 2)

    return sorted(
        ((name, g) for name, node in view.nodes().items() for g in node.gpus if wanted(g)),
        key=lambda pair: (pair[0], pair[1].index),
    )


def a_pod(rng: random.Random, name: str) -> dict[str, object]:
    node = rng.choice(list(NODES))
    uuid = rng.choice(NODES[node])
    tier = rng.choice((TIER_GUARANTEED, TIER_OPPORTUNISTIC))
    placement = Placement((uuid,), 20, 5 * GIB, NOW, "allocated", 20, tier)
    return pod_json(
        name,
        fraction="0.2",
        node=node,
        placement=placement,
        phase=rng.choice(("Running", "Running", "Running", "Succeeded")),
        annotations={ANN_PROFILE: PROFILE} if rng.random() < 0.5 else None,
    )


def test_the_kept_gpus_are_those_a_scan_of_every_gpu_finds() -> None:
    rng = random.Random(7)
    view = ClusterView(clock=lambda: NOW)
    late = "n4"  # its GPUs' pods arrive before its inventory
    view.replace_nodes(
        [
            node_json(n, [gpu(u, index=j) for j, u in enumerate(uuids)])
            for n, uuids in NODES.items()
            if n != late
        ]
    )
    view.replace_pods([])
    names = [f"p{i}" for i in range(60)]
    seen_opportunistic = seen_governed_only = 0
    for step in range(600):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.15:
            view.delete_pod(f"default/{name}")
        elif roll < 0.2 and view.pod(f"default/{name}") is not None:
            view.promote(f"default/{name}")
        else:
            view.upsert_pod(a_pod(rng, name))
        if step == 300:
            uuids = NODES[late]
            view.upsert_node(node_json(late, [gpu(u, index=j) for j, u in enumerate(uuids)]))
        assert view.opportunistic_gpus() == scanned(view, "opportunistic"), step
        assert view.governed_gpus() == scanned(view, "governed"), step
        seen_opportunistic += bool(view.opportunistic_gpus())
        seen_governed_only += len(view.governed_gpus()) > len(view.opportunistic_gpus())
    # The stream reached both kinds of GPU, so the comparisons above were not of empty lists.
    assert seen_opportunistic > 100 and seen_governed_only > 100

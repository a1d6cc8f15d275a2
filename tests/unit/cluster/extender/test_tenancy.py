"""The tenancy boundary: a GPU is shared only by pods of one namespace (or of one sharing group
an admin made), in every placement check: filter, bind's reservation, and the packing fit."""

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from gpushare.api.names import LABEL_SHARING_GROUP, STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BindingArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.reservations import ReservationError
from gpushare.cluster.state.tenancy import Tenancies
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.fit import fit_reason
from gpushare.packing.model import Assignment, Demand, GpuState, Tenant
from gpushare.packing.tenancy import TENANCY_CLUSTER
from tests.fixtures.builders import GIB, PodStore, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_fit_refuses_a_gpu_holding_another_tenancys_pod_and_says_why() -> None:
    g = GpuState("G0", 80 * GIB, tenants=[Tenant("alpha/a", 10, GIB, tenancy="alpha")])
    reason = fit_reason(g, Demand(percent=10, tenancy="beta"))
    assert reason is not None and "another tenancy" in reason and "sharing group" in reason
    assert "alpha" not in reason  # the refused pod's owner reads it: no other tenant named
    assert fit_reason(g, Demand(percent=10, tenancy="alpha")) is None
    assert fit_reason(g, Demand(percent=10)) is None  # no boundary (simulations)
    unknown = GpuState("G1", 80 * GIB, tenants=[Tenant("x/a", 10, GIB)])
    assert fit_reason(unknown, Demand(percent=10, tenancy="beta")) is not None


def view_with(tenant_ns: str, namespaces: list[dict[str, Any]] | None = None) -> ClusterView:
    view = ClusterView(clock=lambda: NOW)
    view.replace_namespaces(namespaces or [])
    view.replace_nodes([node_json("n0", [gpu("G0")]), node_json("n1", [gpu("G1")])])
    placement = Placement(("G0",), 10, 8 * GIB, NOW, STATE_ALLOCATED)
    view.replace_pods(
        [
            pod_json(
                "a",
                namespace=tenant_ns,
                fraction="0.1",
                node="n0",
                placement=placement,
                phase="Running",
            )
        ]
    )
    return view


def filter_nodes(view: ClusterView, namespace: str) -> list[str]:
    ext = Extender(view=view, writer=None, hold_in_filter=False)
    pod = pod_json("b", namespace=namespace, fraction="0.1")
    return list(
        ext.filter(parse_extender_args({"Pod": pod, "NodeNames": ["n0", "n1"]}))["NodeNames"]
    )


def test_filter_keeps_another_namespace_off_a_shared_gpu() -> None:
    view = view_with("alpha")
    assert filter_nodes(view, "beta") == ["n1"]
    assert filter_nodes(view, "alpha") == ["n0", "n1"]


def test_an_admin_sharing_group_lets_namespaces_share_and_relabelling_applies_at_once() -> None:
    group = {LABEL_SHARING_GROUP: "research"}
    view = view_with(
        "alpha",
        [{"metadata": {"name": n, "labels": group}} for n in ("alpha", "beta")],
    )
    assert filter_nodes(view, "beta") == ["n0", "n1"]
    view.upsert_namespace({"metadata": {"name": "alpha", "labels": {}}})  # alpha leaves
    assert filter_nodes(view, "beta") == ["n1"]


def test_cross_namespace_sharing_is_an_explicit_mode() -> None:
    view = view_with("alpha")
    view.tenancies = Tenancies(mode=TENANCY_CLUSTER)
    assert filter_nodes(view, "beta") == ["n0", "n1"]


def test_bind_and_reserve_honour_the_boundary_too() -> None:
    view = view_with("alpha")
    with pytest.raises(ReservationError, match="tenancy"):
        view.reserve(
            key="beta/b",
            uid="u",
            node="n0",
            assignment=Assignment("n0", ("G0",), 10, GIB),
            demand=Demand(percent=10, tenancy="beta"),
            bind_time=NOW,
        )
    store = PodStore()
    pod = store.add(pod_json("b", namespace="beta", fraction="0.1", scheduled=True))
    view.upsert_pod(pod)
    ext = Extender(view=view, writer=store, hold_in_filter=False)
    ext.offers.offer("beta/b", "", ["n0"])  # as if filter had passed n0 (it would not)
    error = asyncio.run(ext.bind(BindingArgs("b", "beta", pod["metadata"]["uid"], "n0")))["Error"]
    assert "GPU shared by another tenancy than 'beta'" in error
    # The reason says how to go on: wait, or share by a label only an admin can set.
    assert "wait for a free GPU" in error and "gpushare.io/sharing-group=" in error
    assert "alpha" not in error  # beta's pod events do not name another tenant's namespace
    assert "nodeName" not in pod["spec"]

"""A dead node agent is noticed from its Lease (gpushare.api.agent_lease): the extender refuses
its node, naming the node and the fix, once the Lease went unrenewed for its duration, and
places pods there again as soon as an agent renews it. A node whose agent never had a Lease
(an older agent) is judged as before."""

from typing import Any

import pytest

from gpushare.api.agent_lease import AGENT_LEASE_DURATION_S, agent_lease_name, lease_node
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.cluster.extender.args import parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.settings import parse_args
from gpushare.cluster.state.agents import AgentLeases
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.policy import Policy
from tests.fixtures.builders import gpu, node_json, pod_json


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease(node: str, renew: str, *, duration: object = AGENT_LEASE_DURATION_S) -> dict[str, Any]:
    return {
        "metadata": {"name": agent_lease_name(node), "namespace": "gpushare-system"},
        "spec": {
            "holderIdentity": f"gpushare-node-agent/{node}",
            "leaseDurationSeconds": duration,
            "renewTime": renew,
        },
    }


def cluster(clock: Clock) -> Extender:
    view = ClusterView()
    view.agents = AgentLeases(namespace="gpushare-system", clock=clock)
    view.replace_nodes(
        [node_json("leased", [gpu("L0")]), node_json("older", [gpu("O0")])],
    )
    view.replace_pods([])
    view.replace_agent_leases([lease("leased", "t0")])
    return Extender(view=view, writer=None, policy=Policy.BINPACK)


def placeable(extender: Extender) -> tuple[list[str], dict[str, str]]:
    pod = pod_json("p", fraction="0.2")
    result = extender.filter(parse_extender_args({"Pod": pod, "NodeNames": ["leased", "older"]}))
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    return list(result["NodeNames"]), refused


def test_a_node_whose_agent_stopped_renewing_is_refused_naming_the_node_and_the_fix() -> None:
    clock = Clock()
    extender = cluster(clock)
    assert placeable(extender)[0] == ["leased", "older"]
    # Renewals keep it placeable however long it runs.
    for second in range(1, 30, 2):
        clock.now += 2
        extender.view.upsert_agent_lease(lease("leased", f"t{second}"))
        extender.view.check_agent_leases()
    assert placeable(extender)[0] == ["leased", "older"]
    # SIGKILL: no renewal after this one.
    clock.now += AGENT_LEASE_DURATION_S
    assert extender.view.check_agent_leases() == set()
    clock.now += 1
    assert extender.view.check_agent_leases() == {"leased"}
    names, refused = placeable(extender)
    assert names == ["older"]
    reason = refused["leased"]
    assert "node agent of node leased is gone" in reason
    assert "gpushare-system/gpushare-agent-leased" in reason
    assert "fix:" in reason and "spec.nodeName=leased" in reason


def test_a_new_agents_renewal_brings_the_node_back_at_once() -> None:
    clock = Clock()
    extender = cluster(clock)
    clock.now += AGENT_LEASE_DURATION_S + 1
    extender.view.check_agent_leases()
    assert placeable(extender)[0] == ["older"]
    back = extender.view.agents_back
    extender.view.upsert_agent_lease(lease("leased", "t-new-agent"))
    assert placeable(extender)[0] == ["leased", "older"]
    # The controller then asks kube-scheduler to retry the pods it refused meanwhile.
    assert extender.view.agents_back == back + 1


def test_a_node_whose_agent_never_had_a_lease_keeps_working() -> None:
    clock = Clock()
    extender = cluster(clock)
    clock.now += 3600
    extender.view.check_agent_leases()
    assert "older" in placeable(extender)[0]
    assert extender.view.agents.down("older") is None


def test_a_deleted_lease_makes_the_node_one_without_a_lease() -> None:
    clock = Clock()
    extender = cluster(clock)
    clock.now += AGENT_LEASE_DURATION_S + 1
    extender.view.check_agent_leases()
    extender.view.delete_agent_lease(lease("leased", "t0"))
    assert placeable(extender)[0] == ["leased", "older"]


def test_a_restarted_controller_gives_every_agent_one_duration_before_judging() -> None:
    """The controller never compares renewTime with its own clock (the hosts' clocks may
    disagree): a Lease first seen counts as renewed then."""
    clock = Clock()
    leases = AgentLeases(clock=clock)
    leases.replace([lease("n", "2000-01-01T00:00:00.000000Z")])
    assert leases.down("n") is None
    clock.now += AGENT_LEASE_DURATION_S + 0.5
    assert leases.check() == {"n"} and leases.down("n") is not None


def test_a_node_published_while_its_agent_is_gone_stays_refused() -> None:
    clock = Clock()
    extender = cluster(clock)
    clock.now += AGENT_LEASE_DURATION_S + 1
    extender.view.check_agent_leases()
    # The node object changes meanwhile (the kubelet's status, say): still refused.
    extender.view.upsert_node(node_json("leased", [gpu("L0")]))
    assert placeable(extender)[0] == ["older"]


def test_a_hostile_lease_duration_is_bounded() -> None:
    clock = Clock()
    leases = AgentLeases(clock=clock)
    leases.upsert(lease("n", "t0", duration=10**9))
    clock.now += 61
    assert leases.check() == {"n"}
    for odd in ("6", True, float("nan"), None, -5):
        leases.upsert(lease("m", f"t-{odd!r}", duration=odd))
    clock.now += 61
    assert leases.check() == {"m"}


def test_the_lease_bound_is_the_controllers_setting() -> None:
    """--agent-lease-max-seconds bounds a Lease written once with a huge duration; below the
    agents' own duration it is refused at start (live agents would be judged gone)."""
    assert parse_args([]).placement.agent_lease_max_seconds == 60.0
    settings = parse_args(["--agent-lease-max-seconds", "20"])
    clock = Clock()
    leases = AgentLeases(clock=clock, max_duration_s=settings.placement.agent_lease_max_seconds)
    leases.upsert(lease("n", "t0", duration=10**9))
    clock.now += 19
    assert leases.check() == set()
    clock.now += 2
    assert leases.check() == {"n"}
    assert "more than 20 s" in (leases.down("n") or "")
    for bad in ("5", "3601"):
        with pytest.raises(InvalidInputError, match="--agent-lease-max-seconds"):
            parse_args(["--agent-lease-max-seconds", bad])


def test_other_leases_of_the_namespace_are_not_agents() -> None:
    leases = AgentLeases(clock=Clock())
    assert leases.upsert({"metadata": {"name": "gpushare-controller"}, "spec": {}}) == set()
    assert lease_node("gpushare-controller") is None
    assert lease_node("gpushare-agent-") is None
    assert agent_lease_name("n" * 250) is None


def test_the_dead_agent_is_the_reason_given_when_the_kubelet_also_lost_its_devices() -> None:
    """A killed agent's kubelet drops the node's allocatable count at its next status update:
    the refusal still names the agent's expired Lease, the cause; once an agent renews it the
    kubelet's own reason shows until the devices are back."""
    clock = Clock()
    extender = cluster(clock)
    clock.now += AGENT_LEASE_DURATION_S + 1
    extender.view.check_agent_leases()
    no_devices = node_json("leased", [gpu("L0")])
    no_devices["status"] = {"allocatable": {RESOURCE_GPU_PERCENT: "0"}}
    extender.view.upsert_node(no_devices)
    assert "node agent of node leased is gone" in placeable(extender)[1]["leased"]
    extender.view.upsert_agent_lease(lease("leased", "t-new-agent"))
    assert "no allocatable" in placeable(extender)[1]["leased"]
    extender.view.upsert_node(node_json("leased", [gpu("L0")]))
    assert placeable(extender)[0] == ["leased", "older"]


def test_a_lease_named_like_an_agents_in_another_namespace_counts_for_nothing() -> None:
    """A tenant may write Leases in its own namespace (issue 45): one named like an agent's
    there neither revives a dead agent's node (renewed), nor judges a live one (left to
    expire), nor, deleted, takes the node out of the rule."""
    clock = Clock()
    extender = cluster(clock)

    def tenants(renew: str) -> dict[str, Any]:
        forged = lease("leased", renew, duration=1)
        forged["metadata"]["namespace"] = "tenant"
        return forged

    extender.view.upsert_agent_lease(tenants("stale"))
    clock.now += 2
    extender.view.check_agent_leases()
    assert placeable(extender)[0] == ["leased", "older"]
    # The agent dies; the tenant renews its own Lease every second: the node stays refused.
    clock.now += AGENT_LEASE_DURATION_S
    for second in range(5):
        extender.view.upsert_agent_lease(tenants(f"t{second}"))
        clock.now += 1
        extender.view.check_agent_leases()
    assert placeable(extender)[0] == ["older"]
    extender.view.delete_agent_lease(tenants("t4"))
    extender.view.replace_agent_leases([lease("leased", "t0"), tenants("t5")])
    extender.view.check_agent_leases()
    assert "node agent of node leased is gone" in placeable(extender)[1]["leased"]


def test_the_controller_never_reads_agent_leases_of_every_namespace() -> None:
    """An empty namespace would make the Lease watch cover every namespace (the informer's
    "all namespaces"), where any tenant writes Leases: refused at start, naming the flag."""
    with pytest.raises(InvalidInputError, match="--leader-elect-namespace"):
        parse_args(["--leader-elect-namespace", ""])
    with pytest.raises(InvalidInputError, match="--agent-lease-namespace"):
        parse_args(["--agent-lease-namespace", "Not_A_Namespace"])
    settings = parse_args(["--agent-lease-namespace", "gpushare-system"])
    assert settings.placement.agent_lease_namespace == "gpushare-system"


def test_a_node_whose_kubelet_has_the_devices_again_counts_as_back() -> None:
    """A new agent renews its Lease before its device plugin is registered again: the node is
    refused for a while on the kubelet's allocatable count. kube-scheduler retries a refused
    pod on the Node event that restores the count, possibly before this view saw it, and no
    event follows; the view counts the node as back so the controller asks for the retry."""
    clock = Clock()
    extender = cluster(clock)
    lost = node_json("leased", [gpu("L0")]) | {
        "status": {"allocatable": {RESOURCE_GPU_PERCENT: "0"}}
    }
    extender.view.upsert_node(lost)
    names, refused = placeable(extender)
    assert names == ["older"] and "no allocatable" in refused["leased"]
    back = extender.view.nodes_back
    extender.view.upsert_node(lost)  # the same refusal again is no change
    assert extender.view.nodes_back == back
    registered = node_json("leased", [gpu("L0")]) | {
        "status": {"allocatable": {RESOURCE_GPU_PERCENT: "200"}}
    }
    extender.view.upsert_node(registered)
    assert placeable(extender)[0] == ["leased", "older"]
    assert extender.view.nodes_back == back + 1
    extender.view.upsert_node(registered)  # an update of a placeable node is not a return
    assert extender.view.nodes_back == back + 1

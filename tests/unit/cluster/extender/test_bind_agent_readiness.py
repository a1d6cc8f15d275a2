"""Bind asks a node's agent whether it is ready just before writing the Binding: a pod the
kubelet admits while the agent's device plugin is gone fails for good (UnexpectedAdmissionError),
and the agent's Lease says so only 6 s later. The agent here is the node agent's own HTTP server
(gpushare.node.metrics.MetricsServer) with a /readyz route as the agent serves it."""

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpushare.cluster.agent_readiness import AgentReadiness
from gpushare.cluster.extender.args import BindingArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.agents import AgentLeases
from gpushare.cluster.state.view import ClusterView
from gpushare.node.metrics import MetricsServer, Reply
from tests.fixtures.builders import PodStore, gpu, node_json, pod_json


class Agent:
    """A node agent's /readyz: ready, or not with the agent's words."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.server = MetricsServer(registry=CollectorRegistry(), host="127.0.0.1", port=0)
        self.server.add_route("/readyz", self._readyz)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def _readyz(self, _query: str) -> Reply:
        if self.reason is None:
            return Reply(200, "text/plain", b"ready\n")
        return Reply(503, "text/plain", f"not ready: {self.reason}\n".encode())


def lease(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"gpushare-agent-{node}", "namespace": "gpushare-system"},
        "spec": {"holderIdentity": f"gpushare-node-agent/{node}", "renewTime": "t0"},
    }


def extender(agent_url: str, *, leased: bool = True) -> tuple[Extender, PodStore]:
    view = ClusterView()
    view.agents = AgentLeases(namespace="gpushare-system")
    view.replace_nodes([node_json("a", [gpu("A0")])])
    view.replace_pods([])
    view.replace_agent_leases([lease("a")] if leased else [])
    store = PodStore()
    check = AgentReadiness(url_template=agent_url)
    return Extender(view=view, writer=store, agent_check=check), store


def bind(ext: Extender, store: PodStore, name: str, fraction: str) -> str:
    """Bind pod ``name``; each test pod asks another size, so no bind waits at the gate
    behind an earlier one's Allocate (no kubelet runs here)."""
    pod = store.add(pod_json(name, fraction=fraction, scheduled=True))
    ext.view.upsert_pod(pod)
    ext.filter(parse_extender_args({"Pod": pod, "NodeNames": ["a"]}))  # the scheduler's
    meta = pod["metadata"]
    args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "a")
    return asyncio.run(ext.bind(args))["Error"]


def test_a_pod_is_bound_only_while_the_nodes_agent_is_ready() -> None:
    agent = Agent()
    ext, store = extender(agent.url)
    try:
        assert bind(ext, store, "p1", "0.1") == ""
        agent.reason = "the kubelet has not listed the devices yet"
        error = bind(ext, store, "p2", "0.2")
        assert "not ready: the kubelet has not listed the devices yet" in error
        assert "the pod will be retried" in error
        assert "nodeName" not in store.pods["default/p2"]["spec"]
        agent.reason = None
        assert bind(ext, store, "p3", "0.3") == ""
    finally:
        agent.server.stop()
    # Killed: nothing listens where the agent answered a moment ago.
    error = bind(ext, store, "p4", "0.15")
    assert "does not answer" in error and "connection refused" in error, error
    assert "nodeName" not in store.pods["default/p4"]["spec"]


def test_an_agent_url_that_never_answered_does_not_stop_binds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A wrong --agent-url or a network that keeps the controller off the agents' port: binds
    go on as before, and the log says why once per node."""
    agent = Agent()
    agent.server.stop()
    ext, store = extender(agent.url)
    with caplog.at_level(logging.WARNING, logger="gpushare.cluster.agent_readiness"):
        assert bind(ext, store, "p1", "0.1") == ""
        assert bind(ext, store, "p2", "0.2") == ""
    told = [r for r in caplog.records if "cannot ask the node agent" in r.getMessage()]
    assert len(told) == 1 and "--agent-url" in told[0].getMessage()


def test_a_node_whose_agent_keeps_no_lease_is_not_asked() -> None:
    """An older agent (or none, as on a KWOK node) keeps no Lease: nothing to ask, as before."""
    agent = Agent()
    agent.reason = "never asked"
    ext, store = extender(agent.url, leased=False)
    try:
        assert bind(ext, store, "p1", "0.1") == ""
    finally:
        agent.server.stop()


def test_an_agent_that_does_not_answer_in_time_does_not_hold_the_bind() -> None:
    """An agent that accepts the connection and says nothing (hung, or a port some other
    program holds): the bind goes on after the probe's timeout."""

    async def scenario() -> tuple[str | None, float]:
        async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        check = AgentReadiness(url_template=f"http://127.0.0.1:{port}", timeout_s=0.2)
        loop = asyncio.get_running_loop()
        start = loop.time()
        answer = await check.not_ready("a", None)
        server.close()
        return answer, loop.time() - start

    answer, took = asyncio.run(scenario())
    assert answer is None and took < 1.0

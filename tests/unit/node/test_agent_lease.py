"""The node agent's Lease (gpushare.node.publishing.AgentLease): renewed under the name the
controller reads, its failures said once per outage, and none kept when no namespace is set
(the node is then judged as an older agent's)."""

import logging

import pytest

from gpushare.api.agent_lease import AGENT_LEASE_DURATION_S
from gpushare.node.publishing import AgentLease


class Writer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.fail = False

    def renew_agent_lease(self, *, namespace: str, name: str, duration_s: int) -> None:
        if self.fail:
            raise ConnectionError("API server unreachable")
        self.calls.append((namespace, name, duration_s))


def test_the_agent_renews_the_lease_the_controller_reads_for_its_node() -> None:
    writer = Writer()
    lease = AgentLease(node_name="gpu-1", namespace="gpushare-system", kube=writer)
    lease.renew()
    lease.renew()
    assert writer.calls == [("gpushare-system", "gpushare-agent-gpu-1", AGENT_LEASE_DURATION_S)] * 2
    assert lease.renewals == 2


def test_an_unreachable_api_server_is_logged_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = Writer()
    lease = AgentLease(node_name="gpu-1", namespace="ns", kube=writer)
    writer.fail = True
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            lease.renew()
        writer.fail = False
        lease.renew()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not renew" in warnings[0].getMessage()
    assert lease.renewals == 1


def test_without_a_namespace_no_lease_is_kept() -> None:
    writer = Writer()
    AgentLease(node_name="gpu-1", namespace="", kube=writer).renew()
    AgentLease(node_name="n" * 250, namespace="ns", kube=writer).renew()
    assert writer.calls == []

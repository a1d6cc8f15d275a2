"""The holder of the scheduler's client certificate cannot feed a list of millions of nodes
(issue 67: a 45 MiB NodeNames list): past MAX_NODES the call is refused before filtering."""

import pytest

from gpushare.cluster.extender.args import MAX_NODES, BadRequestError, parse_extender_args
from tests.fixtures.builders import pod_json


def test_a_list_of_more_nodes_than_any_cluster_holds_is_refused() -> None:
    pod = pod_json("p", fraction="0.5")
    names = [f"node-{i}" for i in range(MAX_NODES + 1)]
    with pytest.raises(BadRequestError, match=f"at most {MAX_NODES}"):
        parse_extender_args({"Pod": pod, "NodeNames": names})
    with pytest.raises(BadRequestError, match=f"at most {MAX_NODES}"):
        parse_extender_args(
            {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": n}} for n in names]}}
        )
    assert len(parse_extender_args({"Pod": pod, "NodeNames": names[:5000]}).node_names) == 5000

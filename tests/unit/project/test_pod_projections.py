"""One pod projection per process: the controller reads a pod's placement annotations in
``cluster.state.pod_facts`` (``PodFacts``), the node agent in ``api.pod`` (``PodInfo``, a pod
manifest read once), and every other reader of either process takes the placement from that
projection. The CLI, a process of its own that may import neither program (docs/cli.md), reads
each pod it lists into the same ``PodInfo``."""

import ast
from collections import Counter

from tests import REPO

PROJECTIONS = {
    "gpushare/cluster/state/pod_facts.py": 1,
    "gpushare/api/pod.py": 1,
}


def calls(name: str) -> Counter[str]:
    """Calls of ``name`` (as a bare name or an attribute) in each module of the package."""
    found: Counter[str] = Counter()
    for path in sorted((REPO / "gpushare").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == name)
                or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
            ):
                found[path.relative_to(REPO).as_posix()] += 1
    return found


def test_placement_annotations_are_parsed_only_by_each_processs_pod_projection() -> None:
    assert dict(calls("parse_placement")) == PROJECTIONS

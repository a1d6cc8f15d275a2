"""The extender protocol's floor: gpushare's controller with its placement taken out.

``python -m bench.scale.floor ARGS`` runs the controller exactly as ``python -m gpushare.cluster
ARGS`` does (HTTP server, watches, view, Binding client, event loop) except for two verbs:
filter offers the first node kube-scheduler offered and holds nothing, and bind writes the
Binding and nothing else. The scale bench runs it with ``--protocol-floor`` to measure what an
extender costs before it decides anything, beside the stock scheduler in the same run
(docs/scale.md, "The protocol's floor"). Its pods get no GPUs, so the bench's invariant check
counts each bound pod as a violation: it is a yardstick, never a way to run gpushare.
"""

import sys
from typing import Any

from gpushare.cluster import main as controller
from gpushare.cluster.extender.args import BindingArgs, ExtenderArgs
from gpushare.cluster.extender.verbs import Extender


class FloorExtender(Extender):
    """filter and bind without placement; everything else is the controller's own."""

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """The first node offered, alone: no cost, no hold (the request is still parsed)."""
        first = args.node_names[:1]
        return {
            "NodeNames": first if args.nodes is None else None,
            "Nodes": None if args.nodes is None else {"items": args.nodes[:1]},
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }

    async def bind(self, args: BindingArgs) -> dict[str, str]:
        """The Binding alone: no GPU chosen, no annotation written."""
        return await self._plain_bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)


def install() -> None:
    """Make the controller build :class:`FloorExtender` (``gpushare.cluster.main._extender``
    builds the class its module calls ``Extender``); refuses when that is no longer so, rather
    than measure the real extender under the floor's name."""
    names = vars(controller)
    if names.get("Extender") is not Extender and names.get("Extender") is not FloorExtender:
        raise RuntimeError("gpushare.cluster.main no longer builds Extender: update the floor")
    names["Extender"] = FloorExtender


def main(argv: list[str] | None = None) -> int:
    """Run the controller with :class:`FloorExtender` in place of its extender."""
    install()
    return controller.main(argv)


if __name__ == "__main__":
    sys.exit(main())

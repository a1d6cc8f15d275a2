"""The API calls ``kubectl gpushare`` makes: nodes and pods (and, for DRA-mode nodes, gpushare's
ResourceSlices and the ResourceClaims), with the caller's kubeconfig.

Only this module talks to the API server; the commands get plain dicts in a :class:`Snapshot`,
so they render the same from any source.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.api.dra import DRIVER
from gpushare.api.errors import InvalidInputError
from gpushare.api.selector import FLAG as SELECTOR_FLAG
from gpushare.api.selector import Requirement

ALL_NAMESPACES = "*"


@dataclass(frozen=True)
class Query:
    """What to read. ``namespace`` None: the kubeconfig context's namespace ("default" when it
    names none); ``ALL_NAMESPACES``: every namespace."""

    kubeconfig: Path | None
    context: str | None
    namespace: str | None
    pod_selector: tuple[Requirement, ...] = ()
    node_selector: tuple[Requirement, ...] = ()
    node: str | None = None
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    namespace: str
    """The namespace the pods were read from (``ALL_NAMESPACES`` for every one)."""
    slices: list[dict[str, Any]] = field(default_factory=list)
    """ResourceSlices of gpushare's DRA driver (DRA-mode nodes' GPUs)."""
    claims: list[dict[str, Any]] = field(default_factory=list)
    """ResourceClaims of the same namespace(s) as ``pods`` (DRA-mode pods' shares)."""


def _server_selector(requirements: tuple[Requirement, ...]) -> dict[str, Any] | None:
    """lightkube takes one operator per key; a second requirement on a key is left to the
    local check (gpushare.api.selector.matches) every command applies anyway."""
    from lightkube import operators  # noqa: PLC0415  (slow import, only when needed)

    def operator(r: Requirement) -> Any:
        if r.op == "=":
            return operators.equal(r.values[0])
        if r.op == "!=":
            return operators.not_equal(r.values[0])
        if r.op == "in":
            return operators.in_(r.values)
        if r.op == "notin":
            return operators.not_in(r.values)
        return operators.exists() if r.op == "exists" else operators.not_exists()

    out: dict[str, Any] = {}
    for r in requirements:
        if r.key not in out:
            out[r.key] = operator(r)
    return out or None


def read_cluster(query: Query) -> Snapshot:
    """Nodes and the pods ``query`` asks for; every failure is an InvalidInputError naming the
    flag (or KUBECONFIG) and the fix."""
    import httpx2 as httpx  # noqa: PLC0415  (lightkube's HTTP client)
    from lightkube import Client, KubeConfig  # noqa: PLC0415  (slow import, only when needed)
    from lightkube.core.exceptions import ApiError, ConfigError  # noqa: PLC0415
    from lightkube.resources.core_v1 import Node, Pod  # noqa: PLC0415

    namespace = query.namespace or "default"
    try:
        if query.kubeconfig is not None:
            if not query.kubeconfig.is_file():
                raise InvalidInputError(
                    "--kubeconfig", f"{query.kubeconfig} does not exist", "give a kubeconfig file"
                )
            config = KubeConfig.from_file(query.kubeconfig)
        else:
            config = KubeConfig.from_env()
        single = config.get(context_name=query.context)
        if single is None:
            raise InvalidInputError(
                "--context", f"no context {query.context!r}", "pick one from the kubeconfig"
            )
        namespace = query.namespace or single.namespace or "default"
        client = Client(config=single, timeout=httpx.Timeout(query.timeout_s))
        pod_filter: dict[str, Any] = {
            "namespace": namespace,
            "labels": _server_selector(query.pod_selector),
        }
        if query.node:
            pod_filter["fields"] = {"spec.nodeName": query.node}
        nodes = [
            n.to_dict() for n in client.list(Node, labels=_server_selector(query.node_selector))
        ]
        pods = [p.to_dict() for p in client.list(Pod, **pod_filter)]
        slices, claims = _dra_objects(client, namespace)
    except ConfigError as exc:
        raise InvalidInputError(
            "KUBECONFIG", f"no usable kubeconfig ({exc})", "set KUBECONFIG or pass --kubeconfig"
        ) from None
    except ApiError as exc:
        raise _refused(exc, namespace) from None
    except httpx.HTTPError as exc:
        raise InvalidInputError(
            "cluster",
            f"cannot reach the API server ({exc})",
            "check KUBECONFIG / --context and that the cluster is up",
        ) from None
    return Snapshot(nodes=nodes, pods=pods, namespace=namespace, slices=slices, claims=claims)


def _refused(exc: Any, namespace: str) -> InvalidInputError:
    """The API server's refusal (lightkube's ApiError) as the flag to fix."""
    from gpushare.kube.errors import BadRequestError, NotFoundError, wrap  # noqa: PLC0415

    error, message = wrap(exc, ""), exc.status.message
    if isinstance(error, BadRequestError) and "selector" in (message or "").lower():
        return InvalidInputError(SELECTOR_FLAG, f"the API server refused it: {message}", "fix it")
    if isinstance(error, NotFoundError) and namespace != ALL_NAMESPACES:
        return InvalidInputError(
            "-n/--namespace",
            f"the API server refused: {message}",
            "check the namespace exists (kubectl get namespaces)",
        )
    return InvalidInputError(
        "cluster",
        f"the API server refused: {message}",
        "check your permissions: list nodes cluster-wide and pods in the namespace asked "
        "for (all namespaces with -A)",
    )


def _dra_objects(client: Any, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The slices of gpushare's DRA driver and the namespace's claims; none when the cluster
    serves no ``resource.k8s.io/v1`` (before Kubernetes 1.34) or the user may not list them:
    DRA mode is optional, and the device-plugin view still shows."""
    from lightkube.core.exceptions import ApiError  # noqa: PLC0415

    from gpushare.kube.errors import ForbiddenError, NotFoundError, wrap  # noqa: PLC0415
    from gpushare.kube.resources import (  # noqa: PLC0415
        ResourceClaimResource,
        ResourceSliceResource,
    )

    try:
        slices = [
            dict(s) for s in client.list(ResourceSliceResource, fields={"spec.driver": DRIVER})
        ]
        claims = [dict(c) for c in client.list(ResourceClaimResource, namespace=namespace)]
    except ApiError as exc:
        if isinstance(wrap(exc, "list DRA objects"), (ForbiddenError, NotFoundError)):
            return [], []
        raise  # read_cluster names the fix
    return slices, claims

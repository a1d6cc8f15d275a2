"""The API calls ``kubectl gpushare`` makes: nodes and pods (and, for DRA-mode nodes, gpushare's
ResourceSlices and the ResourceClaims), with the caller's kubeconfig, over
:mod:`gpushare.kube.rest` (the standard library only).

Only this module talks to the API server; the commands get plain dicts in a :class:`Snapshot`,
so they render the same from any source. :func:`read_cluster` lists once; :func:`follow_cluster`
lists once and then follows the watch API (``-w``), keeping only the current objects.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.api.dra import DRIVER
from gpushare.api.errors import InvalidInputError
from gpushare.api.selector import FLAG as SELECTOR_FLAG
from gpushare.api.selector import Requirement
from gpushare.kube.rest import Access, ApiStatusError, UnreachableError, kubectl_config

ALL_NAMESPACES = "*"
BAD_REQUEST, FORBIDDEN, NOT_FOUND, GONE = 400, 403, 404, 410
DRA_API = "/apis/resource.k8s.io/v1"


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


@dataclass(frozen=True)
class _Kind:
    """One list/watch: its path, its selectors, and whether a refusal just leaves it out."""

    name: str
    path: str
    params: dict[str, str]
    optional: bool = False


def _selector(requirements: tuple[Requirement, ...]) -> str:
    return ",".join(r.encode() for r in requirements)


def _kinds(query: Query, namespace: str) -> list[_Kind]:
    scoped = "" if namespace == ALL_NAMESPACES else f"/namespaces/{namespace}"
    pod_params = {"labelSelector": _selector(query.pod_selector)}
    if query.node:
        pod_params["fieldSelector"] = f"spec.nodeName={query.node}"
    return [
        _Kind("nodes", "/api/v1/nodes", {"labelSelector": _selector(query.node_selector)}),
        _Kind("pods", f"/api/v1{scoped}/pods", pod_params),
        # DRA mode is optional: a cluster without resource.k8s.io/v1 (before 1.34) or a user
        # who may not list them gets the device-plugin view alone.
        _Kind(
            "slices",
            f"{DRA_API}/resourceslices",
            {"fieldSelector": f"spec.driver={DRIVER}"},
            optional=True,
        ),
        _Kind("claims", f"{DRA_API}{scoped}/resourceclaims", {}, optional=True),
    ]


def _refused(exc: ApiStatusError, namespace: str) -> InvalidInputError:
    if exc.status == BAD_REQUEST and "selector" in exc.message.lower():
        return InvalidInputError(
            SELECTOR_FLAG, f"the API server refused it: {exc.message}", "fix it"
        )
    if exc.status == NOT_FOUND and namespace != ALL_NAMESPACES:
        return InvalidInputError(
            "-n/--namespace",
            f"the API server refused: {exc.message}",
            "check the namespace exists (kubectl get namespaces)",
        )
    return InvalidInputError(
        "cluster",
        f"the API server refused: {exc.message}",
        "check your permissions: list nodes cluster-wide and pods in the namespace asked "
        "for (all namespaces with -A)",
    )


def _unreachable(exc: UnreachableError) -> InvalidInputError:
    return InvalidInputError(
        "cluster",
        f"cannot reach the API server ({exc})",
        "check KUBECONFIG / --context and that the cluster is up",
    )


class _Session:
    """The kubeconfig read once, and the lists of one query."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.access = Access.from_config(kubectl_config(query.kubeconfig, query.context))
        self.namespace = query.namespace or self.access.namespace or "default"
        self.kinds = _kinds(query, self.namespace)

    def list(self, kind: _Kind) -> tuple[list[dict[str, Any]], str] | None:
        """The items and the list's resourceVersion; None for an optional kind refused."""
        try:
            doc = self.access.get(kind.path, kind.params, timeout_s=self.query.timeout_s)
        except ApiStatusError as exc:
            if kind.optional and exc.status in (FORBIDDEN, NOT_FOUND):
                return None
            raise _refused(exc, self.namespace) from None
        except UnreachableError as exc:
            raise _unreachable(exc) from None
        version = str((doc.get("metadata") or {}).get("resourceVersion") or "")
        return list(doc.get("items") or []), version


def _snapshot(state: dict[str, dict[str, dict[str, Any]]], namespace: str) -> Snapshot:
    def items(kind: str) -> list[dict[str, Any]]:
        return [state[kind][k] for k in sorted(state.get(kind, {}))]

    return Snapshot(
        nodes=items("nodes"),
        pods=items("pods"),
        namespace=namespace,
        slices=items("slices"),
        claims=items("claims"),
    )


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def read_cluster(query: Query) -> Snapshot:
    """Nodes and the pods ``query`` asks for; every failure is an InvalidInputError naming the
    flag (or KUBECONFIG) and the fix."""
    session = _Session(query)
    state: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in session.kinds:
        listed = session.list(kind)
        if listed is not None:
            state[kind.name] = {_key(o): o for o in listed[0]}
    return _snapshot(state, session.namespace)


def follow_cluster(
    query: Query, *, stop: threading.Event | None = None
) -> Iterator[Snapshot | InvalidInputError]:
    """``-w``: one list per kind, then the watch API from each list's resourceVersion. Yields
    the first snapshot, then a new one whenever events arrived (all queued events applied at
    once). A watch the server ends is opened again where it stopped; one whose version is too
    old (410 Gone) lists that kind again. A failure of the first lists is raised; a failure
    after them is yielded (the caller reports it) and that watch is tried again after a pause."""
    stop = stop or threading.Event()
    session = _Session(query)
    state: dict[str, dict[str, dict[str, Any]]] = {}
    versions: dict[str, str] = {}
    events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
    for kind in session.kinds:
        listed = session.list(kind)
        if listed is not None:
            state[kind.name] = {_key(o): o for o in listed[0]}
            versions[kind.name] = listed[1]
    for kind in session.kinds:
        if kind.name in versions:
            threading.Thread(
                target=_follow,
                args=(session, kind, versions[kind.name], events.put, stop),
                name=f"watch-{kind.name}",
                daemon=True,
            ).start()
    yield _snapshot(state, session.namespace)
    while not stop.is_set():
        batch = [events.get()]
        while not events.empty():
            batch.append(events.get_nowait())
        changed = False
        for name, event, obj in batch:
            if event == "FAILED":
                yield obj
                continue
            changed = True
            if event == "RELISTED":
                state[name] = {_key(o): o for o in obj}
            elif event == "DELETED":
                state.setdefault(name, {}).pop(_key(obj), None)
            elif event in ("ADDED", "MODIFIED"):
                state.setdefault(name, {})[_key(obj)] = obj
        if changed:
            yield _snapshot(state, session.namespace)


def _follow(
    session: _Session,
    kind: _Kind,
    version: str,
    put: Callable[[tuple[str, str, Any]], None],
    stop: threading.Event,
) -> None:
    """One kind's watch, forever: events to ``put``; failures as ``FAILED`` events, retried
    after a pause."""
    while not stop.is_set():
        try:
            for event in session.access.watch(
                kind.path, kind.params, resource_version=version, timeout_s=session.query.timeout_s
            ):
                kind_of, obj = event.get("type"), event.get("object") or {}
                if kind_of == "ERROR":
                    if obj.get("code") == GONE:
                        raise ApiStatusError(GONE, str(obj.get("message") or "too old"))
                    raise ApiStatusError(int(obj.get("code") or 500), str(obj.get("message")))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind_of != "BOOKMARK":
                    put((kind.name, str(kind_of), obj))
        except ApiStatusError as exc:
            if exc.status == GONE:
                listed = _relist(session, kind, put)
                if listed is not None:
                    version = listed
                    continue
            else:
                put((kind.name, "FAILED", _refused(exc, session.namespace)))
        except UnreachableError as exc:
            put((kind.name, "FAILED", _unreachable(exc)))
        except InvalidInputError as exc:  # an exec credential plugin failing mid-watch
            put((kind.name, "FAILED", exc))
        else:
            continue  # the server ended the watch window: open the next one
        stop.wait(session.query.timeout_s)


def _relist(
    session: _Session, kind: _Kind, put: Callable[[tuple[str, str, Any]], None]
) -> str | None:
    try:
        listed = session.list(kind)
    except InvalidInputError as exc:
        put((kind.name, "FAILED", exc))
        return None
    if listed is None:
        return None
    put((kind.name, "RELISTED", listed[0]))
    return listed[1]

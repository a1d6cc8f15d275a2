"""ResourceClaimTemplates of annotated pods in DRA mode, made only for pods the API server stored.

In ``--annotation-mode=dra`` the webhook points an annotated pod at a ResourceClaimTemplate
named for its request (``gpushare-30pct-4gi-latency``, gpushare.cluster.webhook.claims). The
webhook port answers whoever reaches it: an AdmissionReview carries no proof that the API
server sent it. When the webhook made the template, any pod could post forged reviews and have
the controller create a template per distinct request in any namespace, without bound (issue
#45). So the webhook makes nothing; :class:`TemplateKeeper`, on the leader, makes the template
for a pod the pod watch shows: a stored pod was created by someone the API server
authenticated and allowed to create pods in that namespace. kube-controller-manager retries a
pod whose template is missing (backing off from 5 ms), so the claim follows a moment after the
template appears (docs/dra.md, "Keeping annotations").

Bounded: at most ``per_namespace`` templates of gpushare's in one namespace, and a template of
gpushare's that no pod has referred to for ``idle_s`` is deleted (one gpushare made: its label
and exactly the spec its name stands for). A pod over the bound waits, with an Event that names
the bound and the fix. :class:`ClaimTemplates` is what the template watch shows, kept only for
names of gpushare's form; the webhook reads it too (a template of gpushare's name with another
spec is refused at admission, never used).
"""

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare.api.dra import POD_CLAIM
from gpushare.api.errors import InvalidInputError
from gpushare.api.limit import check_limit
from gpushare.api.names import ANN_FRACTION, ANN_SHARE, CLASS_BATCH, CLASS_LATENCY, SLICES_PER_GPU
from gpushare.api.quantities import parse_memory
from gpushare.api.request import GpuRequest
from gpushare.cluster.state.quarantine import Quarantine, Take, take_plainly
from gpushare.cluster.webhook import claims

log = logging.getLogger(__name__)

PREFIX = "gpushare-"
DEFAULT_PER_NAMESPACE = 32
"""Templates of gpushare's in one namespace (one per distinct request its pods make)."""
DEFAULT_IDLE_S = 600.0
"""A template of gpushare's that no pod has referred to for this long is deleted."""
MAX_WHOLE_GPUS = 64
"""Most whole GPUs a template name may stand for."""
PERIOD_S = 5.0
"""How often the keeper looks again without being woken (bound freed, idle templates)."""
RECHECK_S = 10.0
"""A pod still waiting for its claim this long after its template was made has it read again
(someone may have deleted it)."""
OVER_BOUND_REASON = "GpushareTemplateBound"
CONFLICT_REASON = "GpushareTemplateConflict"
_NAME = re.compile(
    r"gpushare-([1-9][0-9]{0,4})pct(?:-([1-9][0-9]{0,18}(?:[kmgtpe]i)?))?"
    r"(?:-(latency))?(?:-limit([1-9][0-9]{0,2}))?"
)
Key = tuple[str, str]
"""(namespace, template name)."""


def request_of_template(name: str) -> GpuRequest | None:
    """The request a template name of gpushare's form stands for (the inverse of
    :func:`claims.template_name`); None for any other name, or a name that is not the one
    gpushare would give that request (``gpushare-050pct``, a limit below the share)."""
    match = _NAME.fullmatch(name) if len(name) <= 63 else None
    if match is None:
        return None
    percent = int(match.group(1))
    if percent > SLICES_PER_GPU and (
        percent % SLICES_PER_GPU or percent // SLICES_PER_GPU > MAX_WHOLE_GPUS
    ):
        return None
    memory = match.group(2)
    try:
        memory_bytes = (
            parse_memory(memory[:-2] + memory[-2:].capitalize(), field="name")
            if memory is not None and memory[-1] == "i"
            else parse_memory(memory, field="name")
            if memory is not None
            else None
        )
        limit = int(match.group(4)) if match.group(4) else None
        if limit is not None and limit > SLICES_PER_GPU:
            return None
        check_limit(limit, percent)
    except InvalidInputError:
        return None
    request = GpuRequest(
        percent=percent,
        memory_bytes=memory_bytes,
        gpu_class=CLASS_LATENCY if match.group(3) else CLASS_BATCH,
        limit_percent=limit,
    )
    return request if claims.template_name(request) == name else None


@dataclass(frozen=True)
class Seen:
    """A template of gpushare's name form as the watch showed it."""

    uid: str
    ours: bool
    """Labelled as gpushare's and exactly the spec its name stands for: the keeper may
    delete it when idle."""
    matches: bool
    """Its spec is the one its name stands for (whoever made it): pods may use it."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


class ClaimTemplates:
    """The templates of gpushare's name form in every namespace, from the template watch;
    nothing is kept of other templates."""

    def __init__(self, *, device_class: str, quarantine: Quarantine | None = None) -> None:
        self.device_class = device_class
        self.quarantine = quarantine or Quarantine()
        self._seen: dict[Key, Seen] = {}
        self._ours_in: dict[str, int] = {}
        self.synced = False

    def wanted(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The template gpushare makes under ``name`` in ``namespace``; None when ``name`` is
        not of gpushare's form."""
        request = request_of_template(name)
        if request is None:
            return None
        return claims.claim_template(request, namespace=namespace, device_class=self.device_class)

    def _read(self, obj: Mapping[str, Any]) -> tuple[Key, Seen] | None:
        meta = _meta(obj)
        namespace, name = _str(meta.get("namespace")), _str(meta.get("name"))
        if not name.startswith(PREFIX) or not namespace:
            return None
        wanted = self.wanted(namespace, name)
        matches = wanted is not None and claims.covers(obj.get("spec"), wanted["spec"])
        labels = meta.get("labels")
        labelled = isinstance(labels, Mapping) and all(
            labels.get(k) == v for k, v in claims.MANAGED_BY.items()
        )
        return (namespace, name), Seen(_str(meta.get("uid")), labelled and matches, matches)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        read = self._read(obj)
        if read is not None:
            self._put(*read)

    def _put(self, key: Key, seen: Seen) -> None:
        old = self._seen.get(key)
        self._seen[key] = seen
        self._ours_in[key[0]] = (
            self._ours_in.get(key[0], 0) + int(seen.ours) - int(bool(old and old.ours))
        )

    def delete(self, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        self._drop((_str(meta.get("namespace")), _str(meta.get("name"))))

    def _drop(self, key: Key) -> None:
        old = self._seen.pop(key, None)
        if old is not None and old.ours:
            self._ours_in[key[0]] -= 1
            if not self._ours_in[key[0]]:
                del self._ours_in[key[0]]

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: what it holds is all there is."""
        self._seen.clear()
        self._ours_in.clear()
        for obj in items:
            self.quarantine.take("ResourceClaimTemplate", obj, self.upsert)
        self.synced = True

    def get(self, namespace: str, name: str) -> Seen | None:
        return self._seen.get((namespace, name))

    def ours_in(self, namespace: str) -> int:
        """Templates of gpushare's in ``namespace``."""
        return self._ours_in.get(namespace, 0)

    def ours(self) -> list[tuple[Key, Seen]]:
        return [(k, s) for k, s in self._seen.items() if s.ours]

    def made(self, key: Key, uid: str) -> None:
        """The keeper created it (counted before the watch shows it)."""
        self._put(key, Seen(uid, ours=True, matches=True))

    def admission_error(self, namespace: str, name: str, *, bound: int) -> InvalidInputError | None:
        """Why the webhook refuses a pod asking for template ``name``: one of that name
        exists with another spec (made by someone else, or edited), or the namespace holds
        ``bound`` templates of gpushare's and this would be one more. None: admit."""
        seen = self._seen.get((namespace, name))
        if seen is not None and not seen.matches:
            return claims.template_conflict(namespace, name)
        if seen is None and self.ours_in(namespace) >= bound:
            return over_bound(namespace, name, bound)
        return None


def over_bound(namespace: str, name: str, bound: int) -> InvalidInputError:
    return InvalidInputError(
        f"ResourceClaimTemplate {namespace}/{name}",
        f"would be one more of gpushare's templates in namespace {namespace!r}, which holds "
        f"{bound} (the bound: one per distinct request its pods make)",
        "ask for a share another pod of the namespace asks for, wait until unused templates "
        "are removed (10 minutes after their last pod), or raise the controller's "
        "--dra-templates-per-namespace (chart: dra.templatesPerNamespace)",
    )


class TemplateApi(Protocol):
    """The API calls of the keeper (gpushare.kube.controller.Kube)."""

    async def create_claim_template(self, body: Mapping[str, Any]) -> bool: ...

    async def get_claim_template(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def delete_claim_template(self, *, namespace: str, name: str) -> None: ...

    async def pod_event(
        self, *, pod: Mapping[str, Any], reason: str, message: str, warning: bool
    ) -> None: ...


@dataclass
class _User:
    """A stored pod that refers to a template of gpushare's form."""

    pod: Mapping[str, Any]
    key: Key
    needs_claim: bool
    """Its claim was not made yet (no resourceClaimStatuses entry): it needs the template."""
    told: str = ""
    """The last Event reason it got (said once)."""


def template_user(pod: Mapping[str, Any]) -> tuple[Key, bool] | None:
    """(namespace, template) of a pod's gpushare claim and whether its claim is still to be
    made; None for pods that do not refer to a template of gpushare's form, that carry no
    gpushare request annotation, or that have ended or are being deleted."""
    meta = _meta(pod)
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping) or not (
        ANN_FRACTION in annotations or ANN_SHARE in annotations
    ):
        return None
    if meta.get("deletionTimestamp"):
        return None
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec")
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    template = next(
        (
            c.get("resourceClaimTemplateName")
            for c in (entries if isinstance(entries, list) else [])
            if isinstance(c, Mapping) and c.get("name") == POD_CLAIM
        ),
        None,
    )
    if not isinstance(template, str) or not template.startswith(PREFIX):
        return None
    made = status.get("resourceClaimStatuses")
    has_claim = any(
        isinstance(s, Mapping) and s.get("name") == POD_CLAIM and s.get("resourceClaimName")
        for s in (made if isinstance(made, list) else [])
    )
    return (_str(meta.get("namespace")), template), not has_claim


class TemplateKeeper:
    """Makes the templates stored pods wait for, deletes idle ones of gpushare's; fed by the pod
    watch on every replica, acting on the leader (:meth:`run`)."""

    def __init__(
        self,
        *,
        templates: ClaimTemplates,
        api: TemplateApi,
        per_namespace: int = DEFAULT_PER_NAMESPACE,
        idle_s: float = DEFAULT_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.templates = templates
        self.api = api
        self.per_namespace = per_namespace
        self.idle_s = idle_s
        self.clock = clock
        self._users: dict[str, _User] = {}
        self._by_template: dict[Key, set[str]] = {}
        self._unused_since: dict[Key, float] = {}
        self._made_at: dict[Key, float] = {}
        self._wake = asyncio.Event()
        self.created = 0
        self.deleted = 0
        self.refused = 0

    # ---- fed by the pod watch ------------------------------------------------------------

    def pod_event(self, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        pod_key = f"{_str(meta.get('namespace'))}/{_str(meta.get('name'))}"
        use = template_user(pod)
        if use is None:
            self.pod_gone(pod_key)
            return
        key, needs = use
        old = self._users.get(pod_key)
        if old is not None and old.key != key:
            self.pod_gone(pod_key)
            old = None
        if old is None:
            self._users[pod_key] = _User(pod, key, needs)
            self._by_template.setdefault(key, set()).add(pod_key)
            self._unused_since.pop(key, None)
        else:
            old.pod, old.needs_claim = pod, needs
        if needs:
            self._wake.set()

    def pod_gone(self, pod_key: str) -> None:
        user = self._users.pop(pod_key, None)
        if user is None:
            return
        users = self._by_template.get(user.key)
        if users is not None:
            users.discard(pod_key)
            if not users:
                del self._by_template[user.key]
                self._unused_since[user.key] = self.clock()

    def pods_listed(self, pods: Iterable[Mapping[str, Any]], *, take: Take = take_plainly) -> None:
        """A full list of pods (each taken in through ``take``, the view's quarantine)."""
        listed = set()
        for pod in pods:
            meta = _meta(pod)
            listed.add(f"{_str(meta.get('namespace'))}/{_str(meta.get('name'))}")
            take("Pod", pod, self.pod_event)
        for pod_key in [k for k in self._users if k not in listed]:
            self.pod_gone(pod_key)

    def users(self, namespace: str, name: str) -> int:
        return len(self._by_template.get((namespace, name), ()))

    # ---- on the leader -------------------------------------------------------------------

    async def run(self, *, period_s: float = PERIOD_S) -> None:
        """Forever: make what waiting pods need, delete what no pod needs any more."""
        while True:
            try:
                await self.round()
            except Exception as exc:  # an API outage: try again next round
                log.warning("claim template round failed", extra={"error": str(exc)})
            self._wake.clear()
            try:
                async with asyncio.timeout(period_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def round(self) -> None:
        if not self.templates.synced:
            return
        now = self.clock()
        for key, pod_keys in list(self._by_template.items()):
            waiting = [
                self._users[k] for k in pod_keys if k in self._users and self._users[k].needs_claim
            ]
            if waiting:
                await self._ensure(key, waiting, now)
        for key, _ in self.templates.ours():
            if key in self._by_template:
                continue
            since = self._unused_since.setdefault(key, now)
            if now - since >= self.idle_s:
                await self.api.delete_claim_template(namespace=key[0], name=key[1])
                self._unused_since.pop(key, None)
                self.deleted += 1
                log.info("unused claim template deleted", extra={"template": "/".join(key)})
        for key in [k for k in self._unused_since if self.templates.get(*k) is None]:
            del self._unused_since[key]

    async def _ensure(self, key: Key, waiting: list[_User], now: float) -> None:
        namespace, name = key
        seen = self.templates.get(namespace, name)
        if seen is not None and not seen.matches:
            await self._tell(waiting, CONFLICT_REASON, claims.template_conflict(namespace, name))
            return
        if seen is not None:
            made = self._made_at.get(key)
            if made is None or now - made < RECHECK_S:
                return
            # Still waiting long after it was made: read it (deleted behind the watch's back?).
            self._made_at[key] = now
            if await self.api.get_claim_template(namespace=namespace, name=name) is not None:
                return
        if self.templates.ours_in(namespace) >= self.per_namespace:
            self.refused += 1
            await self._tell(
                waiting, OVER_BOUND_REASON, over_bound(namespace, name, self.per_namespace)
            )
            return
        body = self.templates.wanted(namespace, name)
        if body is None:
            return
        created = await self.api.create_claim_template(body)
        self._made_at[key] = now
        if created:
            self.created += 1
            self.templates.made(key, "")
            log.info(
                "claim template made for a stored pod",
                extra={"template": f"{namespace}/{name}", "pods": len(waiting)},
            )

    async def _tell(self, waiting: list[_User], reason: str, error: InvalidInputError) -> None:
        for user in waiting:
            if user.told == reason:
                continue
            user.told = reason
            try:
                await self.api.pod_event(
                    pod=user.pod, reason=reason, message=f"gpushare: {error}", warning=True
                )
            except Exception as exc:
                log.warning("could not post a template event", extra={"error": str(exc)})

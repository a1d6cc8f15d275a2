"""Preparing and unpreparing claims: the DRA plugin's work, without gRPC.

Prepare reads the claim (``claims``), decides the container's answer with the node's shared
functions (``gpushare.node.core.answer``, as the device plugin does: the GPU's MPS pipe and shm
directories, ``CUDA_MPS_*`` client limits and priority, or whole GPUs without MPS), raises the
GPU's MPS server limits to the claim's share before any container can start (client
environment alone is not enforced: docs/security.md), writes the CDI spec and records the
claim in the checkpoint. A claim already prepared returns its recorded answer. Unprepare
removes the spec and the record and lets the limit keeper lower the server limits; an unknown
claim is already unprepared.

The tenancy boundary (gpushare.packing.tenancy) holds for claims too: kube-scheduler allocates
them without gpushare's rules, so prepare refuses a shared claim on a GPU whose MPS server
already serves claims of another namespace or sharing group. The pod waits with the reason in
its events, and starts once the GPU's other claims are gone or an admin groups the namespaces
(docs/dra.md, "Tenancy").
"""

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from gpushare.api.dra import device_name
from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import (
    AllocationContext,
    DeviceNode,
    MpsLayout,
    check_uid,
    mps_allocation,
    whole_allocation,
)
from gpushare.node.core.vendor_cdi import VendorCdi, names_for
from gpushare.node.dra import cdi
from gpushare.node.dra.cdi import CdiDir
from gpushare.node.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from gpushare.node.dra.claims import (
    AllocatedGpu,
    ClaimPlan,
    ClaimRef,
    ClaimSource,
    parse_claim,
)
from gpushare.node.mps.client import runs_under_mps
from gpushare.packing.model import Demand, GpuState, Tenant
from gpushare.packing.tenancy import TENANCY_NAMESPACE, sharing_group, tenancy_key
from gpushare.packing.threads import assign_thread_percent

log = logging.getLogger(__name__)


class LimitRaiser(Protocol):
    """Raises a GPU's MPS server limits (gpushare.node.mps.limits.MpsLimitKeeper)."""

    def raise_for(self, uuid: str, thread_percent: int, memory_bytes: int) -> None: ...


class DraDriver:
    """Prepared claims of this node, kept in memory and in the checkpoint. Thread-safe."""

    def __init__(
        self,
        *,
        node_name: str,
        gpus: Callable[[], list[GpuInfo]],
        claims: ClaimSource,
        checkpoint: Checkpoint,
        cdi_dir: CdiDir,
        mps: MpsLayout,
        limits: LimitRaiser | None = None,
        on_release: Callable[[], None] | None = None,
        device_nodes: Callable[[str], list[DeviceNode]] | None = None,
        nvidia_runtime_env: bool = False,
        vendor_cdi: VendorCdi | None = None,
        pods: Callable[[], Iterable[PodInfo]] | None = None,
        tenancy: str = TENANCY_NAMESPACE,
        namespace_labels: Callable[[str], Mapping[str, str] | None] | None = None,
        on_dropped: Callable[[str, str], None] | None = None,
    ) -> None:
        """``gpus``: the GPUs gpushare manages here; ``on_release``: called after an
        unprepare (the agent re-syncs the MPS server limits); ``pods``: this node's pods read
        fresh, for the one-UID-per-MPS-server check (None: not checked); ``tenancy``: the
        boundary's mode (``namespace`` or ``cluster``: none); ``namespace_labels``: a
        Namespace's labels, for its sharing group (None: each namespace is its own);
        ``on_dropped``: told (claim key, why) of each checkpoint entry dropped at start (an
        Event on the node)."""
        self.tenancy = tenancy
        self.namespace_labels = namespace_labels
        self.node_name = node_name
        self.pool = node_name
        self.gpus = gpus
        self.claims = claims
        self.checkpoint = checkpoint
        self.cdi_dir = cdi_dir
        self.mps = mps
        self.limits = limits
        self.on_release = on_release
        self.device_nodes = device_nodes
        self.nvidia_runtime_env = nvidia_runtime_env
        self.vendor_cdi = vendor_cdi
        self.pods = pods
        self._lock = threading.Lock()
        self._on_dropped = on_dropped
        self._prepared = self._verified(checkpoint.load(on_dropped=on_dropped))
        self.prepared_total = 0
        self.failed_total = 0

    def _verified(self, loaded: Mapping[str, PreparedClaim]) -> dict[str, PreparedClaim]:
        """The checkpoint's claims the agent would have written itself: on a GPU it manages,
        with its own CDI device ID, and with the CDI edits rebuilt from the claim's devices and
        limits (never the file's: issue #45, a crafted entry added a host mount to a claim's
        CDI spec; a spec on disk that differs is written again). Others are dropped."""
        gpus = {g.uuid: g for g in self.gpus()}
        kept: dict[str, PreparedClaim] = {}
        for uid, claim in loaded.items():
            try:
                unknown = [d.gpu_uuid for d in claim.devices if d.gpu_uuid not in gpus]
                if unknown:
                    raise InvalidInputError(
                        "devices[].gpu_uuid",
                        f"{unknown[0]!r} is no GPU gpushare manages here",
                        "none: the kubelet prepares the claim again",
                    )
                if claim.cdi_ids != (cdi.device_id(uid),):
                    raise InvalidInputError(
                        "cdi_ids",
                        f"{list(claim.cdi_ids)[:2]!r} are not the claim's own",
                        "none: the kubelet prepares the claim again",
                    )
                edits = self._edits_of(claim, gpus)
            except Exception as exc:
                why = str(exc)[:300]
                log.error("DRA checkpoint entry %s dropped (%s)", claim.key, why)
                if self._on_dropped is not None:
                    self._on_dropped(claim.key, why)
                continue
            if edits != claim.edits:
                log.warning(
                    "DRA checkpoint entry %s: its CDI edits are not what the agent writes; "
                    "rebuilt from its devices and limits",
                    claim.key,
                )
                if self.cdi_dir.exists(uid):
                    self.cdi_dir.write(uid, edits)
            kept[uid] = replace(claim, edits=edits)
        return kept

    def _edits_of(self, claim: PreparedClaim, gpus: Mapping[str, GpuInfo]) -> dict[str, Any]:
        """The CDI container edits ``_decide`` makes for this claim's devices and limits."""
        ctx = AllocationContext(
            node_name=self.node_name,
            gpus=dict(gpus),
            mps=self.mps,
            device_nodes=self.device_nodes,
            nvidia_runtime_env=self.nvidia_runtime_env,
        )
        if claim.mps:
            allocation = mps_allocation(
                ctx,
                claim.devices[0].gpu_uuid,
                thread_percent=claim.thread_percent,
                memory_limit_bytes=claim.memory_limit_bytes,
                gpu_class=claim.gpu_class,
                pod=claim.pod,
                request_percent=claim.percent,
            )
        else:
            allocation = whole_allocation(ctx, [d.gpu_uuid for d in claim.devices], pod=claim.pod)
        return cdi.container_edits(allocation)

    def cdi_ids(self, claim: PreparedClaim) -> list[str]:
        """The CDI device IDs the kubelet hands the runtime for a prepared claim: its own spec's
        device, then the NVIDIA devices of its GPUs on CDI nodes (gpushare.node.core.vendor_cdi;
        worked out afresh, never kept in the checkpoint)."""
        gpus = {g.uuid: g for g in self.gpus()}
        vendor = names_for(self.vendor_cdi, gpus, [d.gpu_uuid for d in claim.devices])
        return [*claim.cdi_ids, *vendor]

    def prepared(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._prepared)

    def shares(self) -> dict[str, list[tuple[int, int]]]:
        """GPU uuid -> (thread percent, memory bytes) of each prepared claim sharing it through
        MPS: what the GPU's MPS server must allow (gpushare.node.mps.limits)."""
        out: dict[str, list[tuple[int, int]]] = defaultdict(list)
        with self._lock:
            for claim in self._prepared.values():
                if claim.mps:
                    for device in claim.devices:
                        out[device.gpu_uuid].append(
                            (claim.thread_percent, claim.memory_limit_bytes)
                        )
        return out

    # --- prepare -------------------------------------------------------------------------

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """The claim's devices and CDI IDs; InvalidInputError says why it cannot be prepared."""
        cdi.check_uid(ref.uid)
        with self._lock:
            done = self._prepared.get(ref.uid)
            if done is not None:
                if not self.cdi_dir.exists(ref.uid):
                    self.cdi_dir.write(ref.uid, done.edits)
                    log.info("CDI spec of claim %s written again from the checkpoint", ref.key)
                return done
        manifest = self.claims.get_claim(namespace=ref.namespace, name=ref.name)
        if manifest is None:
            raise InvalidInputError(
                "claim", f"ResourceClaim {ref.key} does not exist", "create it or delete the pod"
            )
        gpus = self.gpus()
        plan = parse_claim(
            manifest, ref=ref, pool=self.pool, gpus={device_name(g.index): g for g in gpus}
        )
        record = self._decide(plan, gpus, tenancy=self._tenancy_of(ref.namespace))
        current = (
            self._neighbour_tenancies(record.devices[0].gpu_uuid)
            if record.mps and record.tenancy
            else {}
        )
        with self._lock:
            done = self._prepared.get(ref.uid)
            if done is not None:
                return done
            if record.mps:
                self._check_tenancy(record, current)
            if record.mps and self.limits is not None:
                self.limits.raise_for(
                    record.devices[0].gpu_uuid, record.thread_percent, record.memory_limit_bytes
                )
            self.cdi_dir.write(ref.uid, record.edits)
            self._prepared[ref.uid] = record
            try:
                self.checkpoint.save(self._prepared)
            except Exception:
                del self._prepared[ref.uid]
                self.cdi_dir.remove(ref.uid)
                raise
            self.prepared_total += 1
        log.info(
            "prepared claim %s for pod %s: GPU %s, %s",
            ref.key,
            plan.pod,
            ",".join(d.gpu_uuid for d in record.devices),
            f"MPS, {record.thread_percent}% threads, {record.memory_limit_bytes} bytes, "
            f"class {record.gpu_class}"
            if record.mps
            else "whole GPU(s) without MPS",
        )
        return record

    def _tenancy_of(self, namespace: str) -> str:
        """The claim's tenancy key; empty without a boundary."""
        labels = self.namespace_labels(namespace) if self.namespace_labels else None
        return tenancy_key(namespace, sharing_group(labels), self.tenancy) or ""

    def _neighbour_tenancies(self, uuid: str) -> dict[str, str]:
        """namespace -> its tenancy now, for the claims prepared on GPU ``uuid``: read outside
        the lock (an API call per namespace), since an admin may have grouped namespaces after
        those claims were prepared."""
        with self._lock:
            namespaces = {
                c.namespace
                for c in self._prepared.values()
                if c.mps and c.devices and c.devices[0].gpu_uuid == uuid
            }
        return {ns: self._tenancy_of(ns) for ns in sorted(namespaces)}

    def _check_tenancy(self, record: PreparedClaim, current: dict[str, str]) -> None:
        """Refuse (InvalidInputError) a shared claim on a GPU whose MPS server serves claims of
        another tenancy: one server's clients share its limits, faults and memory pressure
        (docs/security.md). ``current``: the neighbours' tenancies read just before; a claim
        prepared since then counts with the tenancy it was prepared with. Called under the
        lock, so two prepares cannot both pass."""
        if not record.tenancy:
            return
        uuid = record.devices[0].gpu_uuid
        others = sorted(
            {
                (tenancy, c.key)
                for c in self._prepared.values()
                if c.mps and c.devices and c.devices[0].gpu_uuid == uuid
                for tenancy in [current.get(c.namespace, c.tenancy or c.namespace)]
                if tenancy != record.tenancy
            }
        )
        if not others:
            return
        tenancy, claim = others[0]
        raise InvalidInputError(
            "claim",
            f"GPU {uuid} (device {record.devices[0].device}) already serves claim {claim} of "
            f"tenancy {tenancy!r} through its MPS server, and claim {record.key} is of tenancy "
            f"{record.tenancy!r}: GPUs are shared only inside one namespace or sharing group",
            "the pod starts once the GPU's other claims end; or an admin labels both namespaces "
            "gpushare.io/sharing-group=<group>, or sets tenancy.crossNamespaceSharing=true "
            "(docs/dra.md, 'Tenancy')",
        )

    def _decide(self, plan: ClaimPlan, gpus: list[GpuInfo], *, tenancy: str) -> PreparedClaim:
        ctx = AllocationContext(
            node_name=self.node_name,
            gpus={g.uuid: g for g in gpus},
            mps=self.mps,
            device_nodes=self.device_nodes,
            nvidia_runtime_env=self.nvidia_runtime_env,
        )
        first = plan.gpus[0]
        uuids = [g.gpu.uuid for g in plan.gpus]
        threads = self._thread_percent(first)
        shared = runs_under_mps(
            gpus=len(uuids), thread_percent=threads, requested_percent=first.percent
        )
        if shared:
            self._check_uid(plan, first.gpu.uuid)
            allocation = mps_allocation(
                ctx,
                first.gpu.uuid,
                thread_percent=threads,
                memory_limit_bytes=first.memory_bytes,
                gpu_class=first.config.gpu_class,
                pod=plan.pod,
                request_percent=first.percent,
            )
        else:
            allocation = whole_allocation(ctx, uuids, pod=plan.pod)
        return PreparedClaim(
            uid=plan.ref.uid,
            namespace=plan.ref.namespace,
            name=plan.ref.name,
            pod=plan.pod,
            devices=tuple(
                PreparedDevice(g.request, g.pool, g.device, g.gpu.uuid) for g in plan.gpus
            ),
            cdi_ids=(cdi.device_id(plan.ref.uid),),
            mps=shared,
            thread_percent=threads if shared else 100,
            memory_limit_bytes=first.memory_limit_bytes if shared else first.gpu.memory_bytes,
            gpu_class=first.config.gpu_class,
            edits=cdi.container_edits(allocation),
            tenancy=tenancy if shared else "",
            percent=first.percent if shared else 100,
        )

    def _thread_percent(self, gpu: AllocatedGpu) -> int:
        """The claim's MPS thread cap by the rule the device plugin applies to annotated pods
        (gpushare.packing.threads): ``gpuPercent`` is the request, ``MpsConfig.limit`` the
        limit; a batch claim without one may use the whole GPU unless a latency-class claim is
        prepared on it already, then at most half of it; latency-class claims are uncapped."""
        with self._lock:
            tenants = [
                Tenant(
                    key=c.pod,
                    percent=c.thread_percent,
                    memory_bytes=c.memory_limit_bytes,
                    gpu_class=c.gpu_class,
                )
                for c in self._prepared.values()
                if c.mps and c.devices and c.devices[0].gpu_uuid == gpu.gpu.uuid
            ]
        state = GpuState(uuid=gpu.gpu.uuid, memory_bytes=gpu.gpu.memory_bytes, tenants=tenants)
        demand = Demand(
            percent=gpu.percent, limit_percent=gpu.config.limit, gpu_class=gpu.config.gpu_class
        )
        return assign_thread_percent(demand, state)

    def _check_uid(self, plan: ClaimPlan, uuid: str) -> None:
        """Refuse a pod whose UID differs from the pods of the claims already sharing ``uuid``:
        an MPS server serves one UID at a time, so its CUDA calls would wait until they exit
        (AllocationError names the field and the fix)."""
        if self.pods is None:
            return
        by_key = {p.key: p for p in self.pods()}
        pod = by_key.get(plan.pod)
        if pod is None:
            log.warning("pod %s is not on this node yet: its UID is not checked", plan.pod)
            return
        with self._lock:
            others = {
                c.pod
                for c in self._prepared.values()
                if c.mps and c.pod != plan.pod and any(d.gpu_uuid == uuid for d in c.devices)
            }
        neighbours = [by_key[k] for k in sorted(others) if k in by_key and not by_key[k].finished]
        warning = check_uid(pod, neighbours, uuid)
        if warning:
            log.warning("%s", warning)

    # --- unprepare -----------------------------------------------------------------------

    def unprepare(self, uid: str) -> None:
        """Remove the claim's CDI spec and record; an unknown claim is already unprepared."""
        cdi.check_uid(uid)
        with self._lock:
            self.cdi_dir.remove(uid)
            record = self._prepared.pop(uid, None)
            if record is None:
                return
            try:
                self.checkpoint.save(self._prepared)
            except Exception:
                self._prepared[uid] = record
                raise
        log.info("unprepared claim %s/%s of pod %s", record.namespace, record.name, record.pod)
        if self.on_release is not None:
            try:
                self.on_release()
            except Exception:
                log.exception("re-syncing MPS limits after unprepare failed")

"""The placement rules a GpuShare adds to its pods through annotations (pure, no I/O).

The operator writes them (gpushare.api.gpushare_crd); the extender applies them in filter and
again in bind: a hold while the share elects or profiles a pod, a profiling pod alone on its GPU,
the exclusive policy, the max-pods-per-gpu limit, and the stored profile for the interference
check. Rules about *which GPUs* a pod may use work by narrowing a node to its permitted GPUs, so
the ordinary packing fit and GPU choice run unchanged on what is left.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
    LIGHTLY_LOADED_PERCENT,
    POLICIES,
    POLICY_AGGRESSIVE,
    POLICY_EXCLUSIVE,
    PROFILING_ACTIVE,
    parse_profile_annotation,
    scheduling_hold,
)
from gpushare.api.names import (
    ANN_SHARE,
    LABEL_NEIGHBOUR_RULES,
    MPS_MAX_CLIENTS,
    NEIGHBOUR_RULES_GRANTED,
)
from gpushare.packing.model import Demand, GpuState, NodeState, PipeProfile
from gpushare.packing.stored_profile import pipe_profile


@dataclass(frozen=True)
class ShareRules:
    """What a pod's GpuShare annotations ask of its placement."""

    namespace: str
    share: str | None = None
    policy: str | None = None
    max_pods: int | None = None
    profiling: bool = False
    profile: PipeProfile | None = None
    peak_memory_bytes: int | None = None
    """The stored profile's measured peak GPU memory (what an opportunistic cap may come to)."""
    pod_name: str = ""
    granted: bool = True
    """The namespace may keep others off its GPUs (gpushare.cluster.state.tenancy): without the
    grant, ``exclusive`` is refused and a profiling pod is placed like any other."""

    @property
    def constrains_gpus(self) -> bool:
        """True when the rules narrow which GPUs the pod may use (answers then depend on the
        pod, so they are not cached per pod shape)."""
        return self.profiling or self.policy == POLICY_EXCLUSIVE or self.max_pods is not None

    @property
    def blocks_others(self) -> bool:
        """True when, placed on a GPU, this pod keeps (some) other pods off that GPU."""
        return self.granted and (self.profiling or self.policy == POLICY_EXCLUSIVE)

    @property
    def label(self) -> str:
        return f"GpuShare {self.share}" if self.share else f"pod {self.pod_name}"

    def same_owner(self, other: "ShareRules | None") -> bool:
        return (
            other is not None
            and self.share is not None
            and other.share == self.share
            and other.namespace == self.namespace
        )


NO_RULES = ShareRules(namespace="")
GRANT_LABEL = f"{LABEL_NEIGHBOUR_RULES}={NEIGHBOUR_RULES_GRANTED}"


def rules_of(
    *, name: str, namespace: str, annotations: Mapping[str, str], granted: bool = True
) -> ShareRules:
    """Read the rule annotations; raises InvalidInputError naming the annotation and the fix."""
    share = annotations.get(ANN_SHARE, "").strip() or None
    policy = annotations.get(ANN_PACKING_POLICY)
    if policy is not None and policy not in POLICIES:
        raise InvalidInputError(
            ANN_PACKING_POLICY, f"unknown policy {policy!r}", f"use one of {', '.join(POLICIES)}"
        )
    max_pods: int | None = None
    max_text = annotations.get(ANN_MAX_PODS_PER_GPU)
    if max_text is not None:
        try:
            max_pods = int(max_text)
        except ValueError:
            max_pods = 0
        if not 1 <= max_pods <= MPS_MAX_CLIENTS:
            raise InvalidInputError(
                ANN_MAX_PODS_PER_GPU,
                f"{max_text!r} is not a whole number from 1 to {MPS_MAX_CLIENTS}",
                "set spec.packing.maxPodsPerGpu on the GpuShare, or remove the annotation",
            )
    profile: PipeProfile | None = None
    peak_memory: int | None = None
    profile_text = annotations.get(ANN_PROFILE)
    if profile_text is not None:
        stored = parse_profile_annotation(profile_text)
        profile, peak_memory = pipe_profile(stored), stored.peak_memory_bytes
    return ShareRules(
        namespace=namespace,
        share=share,
        policy=policy,
        max_pods=max_pods,
        profiling=annotations.get(ANN_PROFILING) == PROFILING_ACTIVE,
        profile=profile,
        peak_memory_bytes=peak_memory,
        pod_name=name,
        granted=granted,
    )


def with_profile(demand: Demand, rules: ShareRules) -> Demand:
    """The demand carrying the share's stored profile, so the interference check sees it."""
    if rules.profile is None or demand.profile == rules.profile:
        return demand
    return replace(demand, profile=rules.profile, peak_memory_bytes=rules.peak_memory_bytes)


def hold_reason(rules: ShareRules, *, share_status: Mapping[str, Any] | None) -> str | None:
    """Why the pod must wait before any GPU is considered (its GpuShare is electing or
    profiling another pod), or None."""
    if rules.share is None:
        return None
    annotations = {ANN_SHARE: rules.share}
    if rules.profiling:
        annotations[ANN_PROFILING] = PROFILING_ACTIVE
    return scheduling_hold(
        pod_name=rules.pod_name, pod_annotations=annotations, share_status=share_status
    )


def gpu_refusal(
    gpu: GpuState,
    *,
    rules: ShareRules,
    tenant_rules: Mapping[str, ShareRules],
) -> str | None:
    """Why the rules (the pod's own, or those of pods already on ``gpu``) keep the pod off this
    GPU, or None. ``tenant_rules``: pod key -> rules, for tenants that have any."""
    if rules.policy == POLICY_EXCLUSIVE and not rules.granted:
        return (
            f"{rules.label} (policy exclusive) would keep other pods off its GPUs, which needs an "
            f"admin's grant: label namespace {rules.namespace} {GRANT_LABEL}, or use policy "
            "cautious"
        )
    foreign = False
    for tenant in gpu.tenants:
        other = tenant_rules.get(tenant.key)
        if other is not None and other.profiling and other.granted:
            return f"{other.label} is profiling pod {other.pod_name} alone on this GPU"
        same = rules.same_owner(other)
        if other is not None and other.policy == POLICY_EXCLUSIVE and other.granted and not same:
            return f"{other.label} (policy exclusive) keeps this GPU to its own pods"
        foreign = foreign or not same
    if rules.profiling and rules.granted:
        if rules.policy == POLICY_AGGRESSIVE:
            if gpu.used_percent > LIGHTLY_LOADED_PERCENT:
                return (
                    f"{rules.label} profiles pod {rules.pod_name} only on a lightly loaded GPU "
                    f"(at most {LIGHTLY_LOADED_PERCENT}% guaranteed); this one has "
                    f"{gpu.used_percent}%"
                )
        elif gpu.tenants:
            return f"{rules.label} profiles pod {rules.pod_name} alone, on a GPU with no tenants"
    if rules.policy == POLICY_EXCLUSIVE and foreign:
        return f"{rules.label} (policy exclusive) shares a GPU only with its own pods"
    if rules.max_pods is not None and len(gpu.tenants) >= rules.max_pods:
        return (
            f"{rules.label} allows at most {rules.max_pods} pod(s) per GPU; "
            f"this GPU holds {len(gpu.tenants)}"
        )
    return None


def permitted(
    node: NodeState,
    *,
    rules: ShareRules,
    tenant_rules: Mapping[str, ShareRules],
    others_block: bool = True,
) -> tuple[NodeState, str | None]:
    """The node narrowed to the GPUs the rules permit, and the first refusal when they took
    any GPU away (the message when nothing is left). ``others_block`` False (no pod anywhere
    blocks others) skips the scan for pods whose own rules need none."""
    if not others_block and not rules.constrains_gpus:
        return node, None
    keep: list[GpuState] = []
    first: str | None = None
    for gpu in node.gpus:
        reason = gpu_refusal(gpu, rules=rules, tenant_rules=tenant_rules)
        if reason is None:
            keep.append(gpu)
        elif first is None:
            first = reason
    if first is None:
        return node, None
    return replace(node, gpus=keep), first

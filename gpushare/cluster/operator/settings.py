"""Operator settings: one dataclass, a docstring under each field."""

import os
from dataclasses import dataclass, field

from gpushare.api.endpoints import AGENT_TOKEN_FILE, DEFAULT_AGENT_URL, DEFAULT_PROFILE_CACHE
from gpushare.cluster.operator.protection import ProtectionPolicy

DEFAULT_NAMESPACE = "gpushare-system"


@dataclass(frozen=True)
class OperatorConfig:
    namespace: str = field(
        default_factory=lambda: os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    )
    """The operator's own namespace: where the profile cache ConfigMap lives. Default: the
    pod's namespace (``POD_NAMESPACE``, which the chart sets), else gpushare-system; the chart
    grants the cache ConfigMap only in the release namespace."""
    cache_configmap: str = DEFAULT_PROFILE_CACHE
    """Name of the profile cache ConfigMap (the controller's ``--profile-cache-name``)."""
    cache_max_entries: int = 512
    """Oldest cache entries are dropped beyond this (a ConfigMap holds at most 1 MiB)."""
    cache_per_tenancy: int = 32
    """A tenancy's oldest cache entries are dropped beyond this, so one tenant cannot push
    every other tenant's profiles out."""
    agent_url: str = DEFAULT_AGENT_URL
    """Base URL of a node agent's metrics server; ``{node}`` and ``{node_ip}`` (the node's
    InternalIP) are substituted. The profiler lives at ``<agent_url>/profile``. The
    controller's ``--agent-url``; checked by gpushare.api.endpoints.check_agent_url."""
    agent_token_file: str = AGENT_TOKEN_FILE
    """The token the operator presents to node agents for /profile (Authorization: Bearer),
    read afresh for each call (the kubelet rotates it): a projected ServiceAccount token bound
    to the audience gpushare.io/node-agent, which the chart mounts here. Missing: no token is
    sent (an agent run with --metrics-auth none still answers)."""
    agent_timeout_s: float = 10.0
    """Timeout of one profiler call, on top of the window it samples."""
    reconcile_interval_s: float = 5.0
    """How often each GpuShare is reconciled even without events (profiling clock, retries)."""
    measure_grace_s: float = 300.0
    """How long after the profiling window the operator keeps asking an unreachable node
    agent before packing the share without a profile."""
    profiling_warmup_s: float = 10.0
    """Seconds after the profiling pod starts running before its window opens, so start-up
    (imports, data loading, the node agent noticing the pod) stays out of the profile."""
    profiling_start_timeout_s: float = 300.0
    """An elected profiling pod that is not running on a GPU after this long is given up
    (its mark set to ``done``) and another pod is elected."""
    protection: bool = True
    """Run the latency protection loop."""
    protection_interval_s: float = 5.0
    """Seconds between readings of each GPU holding a latency-class pod."""
    protection_window_s: int = 5
    """Averaging window of each protection reading."""
    protection_policy: ProtectionPolicy = field(default_factory=ProtectionPolicy)
    """Saturation threshold, slowdown bound and hysteresis (readings in a row, cool-down)."""
    watch_namespaces: tuple[str, ...] = ()
    """Namespaces whose GpuShares and pods the operator handles; empty: the whole cluster.
    Protection only ever evicts pods it sees, so tests on a shared cluster scope it here."""
    dra_claims: bool = False
    """The operator on its own: watch ResourceSlices and ResourceClaims of gpushare's DRA
    driver, so that DRA-mode pods count where their claims put them (a GpuShare's
    ``status.placements``, latency protection). Inside the controller, its claim watch does
    this whenever it places claims."""
    standalone: bool = True
    """Run Kopf without peering (one controller replica, or leader election done outside)."""

"""Allocate latency with 8 GPUs and 50 pods placed: the kubelet's view of the device plugin.

The real device plugin (Allocator + gRPC servicer over a unix socket) on simulated GPUs, against
the real API server of the local cluster: each Allocate lists the node's pods, picks the pod
from its placement annotations and PATCHes it ``allocated``, exactly as on a node. The node is
a Node object without a kubelet (so nothing else admits the pods); the client plays the kubelet:
GetPreferredAllocation, then Allocate with the slices it suggested, pod after pod in bind order.

    PYTHONPATH=. .venv/bin/python -m bench.deviceplugin.allocate_latency --kubeconfig ...
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, NodeSpec, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from bench.deviceplugin.results import machine, merge, now
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    RESOURCE_GPU_PERCENT,
)
from gpushare.api.placement import format_time
from gpushare.api.pod import pod_info
from gpushare.kube.node import NodeKube
from gpushare.node.core.health import DeviceHealth
from gpushare.node.core.serving import wait_until_accepting
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.devices import device_id
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.mps.manager import MpsManager

LABEL = {"gpushare.io/bench": "allocate-latency"}
SIZES = (5, 10, 15, 20)
GIB = 2**30


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--node", default="gpushare-bench-allocate")
    parser.add_argument("--namespace", default="kube-system")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.kubeconfig is None:
        parser.error("--kubeconfig (or $KUBECONFIG) is required: the bench uses a real API server")

    client = Client(config=KubeConfig.from_file(args.kubeconfig), field_manager="gpushare-bench")
    backend = SimulatedBackend(f"{args.gpus}xH100-80GB", node_name=args.node)
    gpus = backend.inventory()
    node = Node(metadata=ObjectMeta(name=args.node, labels=LABEL), spec=NodeSpec())
    try:
        client.create(node)
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    # Pods i -> GPU i % 8, sizes cycling 5..20: 50 pods fill each GPU to 60-90 %.
    start = datetime.now(UTC) - timedelta(minutes=5)
    plan = []
    for i in range(args.pods):
        gpu = gpus[i % len(gpus)]
        size = SIZES[(i // len(gpus)) % len(SIZES)]
        plan.append((f"alloc-bench-{i:03d}", gpu.uuid, size, start + timedelta(milliseconds=i)))
    for name, uuid, size, bind in plan:
        pod = Pod(
            metadata=ObjectMeta(
                name=name,
                namespace=args.namespace,
                labels=LABEL,
                annotations={
                    ANN_GPU_UUID: uuid,
                    ANN_THREAD_PERCENT: str(size),
                    ANN_MEMORY_LIMIT: str(size * GIB // 2),
                    ANN_BIND_TIME: format_time(bind),
                    ANN_STATE: "assumed",
                    ANN_CLASS: "batch",
                },
            ),
            spec=PodSpec(
                nodeName=args.node,
                containers=[
                    Container(
                        name="main",
                        image="none",
                        resources=ResourceRequirements(limits={RESOURCE_GPU_PERCENT: str(size)}),
                    )
                ],
            ),
        )
        try:
            client.create(pod)
        except ApiError as exc:
            if exc.status.code != 409:
                raise

    kube = NodeKube(node_name=args.node, project=pod_info, kubeconfig=args.kubeconfig)
    allocate_ms: list[float] = []
    preferred_ms: list[float] = []
    wrong = 0
    with tempfile.TemporaryDirectory() as tmp:
        mps = MpsManager(root=Path(tmp) / "mps", simulated=True)
        for _ in range(args.rounds):
            for name, *_ in plan:
                client.patch(
                    Pod,
                    name,
                    {"metadata": {"annotations": {ANN_STATE: "assumed"}}},
                    namespace=args.namespace,
                    patch_type=PatchType.MERGE,
                )
            # A fresh plugin each round, as after an agent restart (it remembers handled pods).
            allocator = Allocator(node_name=args.node, gpus=backend.inventory, pods=kube, mps=mps)
            servicer = DevicePluginServicer(
                allocator=allocator, health=DeviceHealth(g.uuid for g in gpus)
            )
            server = grpc.server(ThreadPoolExecutor(max_workers=4))
            api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
            sock = Path(tmp) / "bench.sock"
            server.add_insecure_port(f"unix://{sock}")
            server.start()
            wait_until_accepting(sock, timeout_s=5)
            free = {g.uuid: list(range(100)) for g in gpus}
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                for _name, uuid, size, _bind in plan:
                    available = [device_id(u, n) for u, slices in free.items() for n in slices]
                    t0 = time.perf_counter()
                    hint = stub.GetPreferredAllocation(
                        api_pb2.PreferredAllocationRequest(
                            container_requests=[
                                api_pb2.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=available, allocation_size=size
                                )
                            ]
                        ),
                        timeout=10,
                    )
                    t1 = time.perf_counter()
                    ids = list(hint.container_responses[0].deviceIDs)
                    answer = stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                        ),
                        timeout=10,
                    )
                    t2 = time.perf_counter()
                    preferred_ms.append((t1 - t0) * 1000)
                    allocate_ms.append((t2 - t1) * 1000)
                    envs = answer.container_responses[0].envs
                    if envs["CUDA_VISIBLE_DEVICES"] != uuid or envs[
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
                    ] != str(size):
                        wrong += 1
                    for ident in ids:
                        gpu_uuid, index = ident.rsplit("::", 1)
                        free[gpu_uuid].remove(int(index))
            servicer.stop()
            server.stop(grace=0).wait()

    for name, *_ in plan:
        client.delete(Pod, name, namespace=args.namespace, grace_period=0)
    client.delete(Node, args.node)
    kube.close()

    result = {
        "allocate_p50_ms": round(statistics.median(allocate_ms), 3),
        "allocate_p99_ms": round(percentile(allocate_ms, 99), 3),
        "allocate": {
            "date": now(),
            "machine": machine(),
            "gpus": args.gpus,
            "pods": args.pods,
            "samples": len(allocate_ms),
            "max_ms": round(max(allocate_ms), 3),
            "mean_ms": round(statistics.fmean(allocate_ms), 3),
            "preferred_p50_ms": round(statistics.median(preferred_ms), 3),
            "preferred_p99_ms": round(percentile(preferred_ms, 99), 3),
            "wrong_pod": wrong,
            "backend": "simulated (8xH100-80GB)",
            "method": (
                "Each Allocate lists the node's pods from the API server, selects the pod by "
                "its placement annotations (GPU, state assumed, oldest bind-time) and PATCHes it "
                "allocated; latency is client-side, gRPC included. 'pods given the wrong "
                "placement' counts answers whose GPU or thread % differ from the pod's "
                "placement."
            ),
        },
    }
    print(
        f"Allocate p50 {result['allocate_p50_ms']:.2f} ms, p99 {result['allocate_p99_ms']:.2f} "
        f"ms over {len(allocate_ms)} calls; wrong placements: {wrong}"
    )
    if not args.no_write:
        merge(result)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

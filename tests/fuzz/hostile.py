"""Hostile inputs for the total-parsing fuzz: values that broke Python's own parsers (decimal
overflow, the 4300-digit limit of ``int``/``json``, recursion in ``json``), shapes the API
server does not forbid (any string in an annotation), and random mutations of valid objects.

Deterministic from a seed, fast (hundreds of thousands per minute), no hypothesis: the fuzz
needs volume, and each input is reproducible from ``(seed, index)``.
"""

import json
import random
from collections.abc import Callable
from typing import Any

from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
)
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_EVICT,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_MEMORY_LIMIT,
    ANN_NODE_EXCLUSIVE,
    ANN_NODE_GPUS,
    ANN_NODE_SEPARATED,
    ANN_OPPORTUNISTIC,
    ANN_REQUEST_PERCENT,
    ANN_SHARE,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
)

GPU_UUIDS = ["GPU-aaaaaaaa-0001", "GPU-aaaaaaaa-0002", "GPU-bbbbbbbb-0003"]
NODES = ["n0", "n1", "n2"]

POD_KEYS = [
    ANN_FRACTION,
    ANN_MEMORY,
    ANN_CLASS,
    ANN_SHARE,
    ANN_CONTAINER,
    ANN_AVOID_GPUS,
    ANN_GPU_UUID,
    ANN_THREAD_PERCENT,
    ANN_MEMORY_LIMIT,
    ANN_BIND_TIME,
    ANN_STATE,
    ANN_PROFILE,
    ANN_PROFILING,
    ANN_PACKING_POLICY,
    ANN_MAX_PODS_PER_GPU,
    ANN_EVICT,
    ANN_OPPORTUNISTIC,
    ANN_TIER,
    ANN_LIMIT,
    ANN_REQUEST_PERCENT,
]


def _deep(n: int, open_: str = "[", close: str = "]") -> str:
    return open_ * n + close * n


NUMBERS = [
    "1e999999999",
    "-1e999999999",
    "1e-999999999",
    "1E+999999999%",
    "9" * 5000,
    "9" * 4301,
    "0." + "0" * 5000 + "1",
    "1" + "0" * 40,
    "NaN",
    "sNaN",
    "-NaN",
    "Infinity",
    "-inf",
    "-0",
    "0",
    "-1",
    "\u0663",  # an Arabic-Indic three: isdigit() says yes
    "\u00b2",
    "0x10",
    "1_000",
    "+5",
    " 25 % ",
    "25%%",
    "%",
    "",
    " ",
    "\x00",
    "\ud800",
    "1.5",
    "101%",
    "1e3",
    "0.25",
    "25%",
    "1",
    "2",
    "100",
    "10Gi",
    "512Mi",
    "1Ei",
    "999999Ei",
    "1e3Gi",
    "99999999999999999999999Gi",
]
JSON_TEXTS = [
    _deep(100_000),
    _deep(2_000, "{\"a\":", "}").replace("}", "}", 1),
    '{"gpuModel":"H100","memoryBytes":' + "9" * 5000 + "}",
    '{"gpuModel":"H100","memoryBytes":1e999}',
    '{"gpuModel":"H100","fp16":NaN}',
    '{"gpuModel":"H100","fp16":Infinity}',
    '{"gpuModel":"H100","sampledSeconds":' + "9" * 30 + "}",
    '[{"uuid":"GPU-x","index":' + "9" * 5000 + ',"model":"m","memory_bytes":1}]',
    '[{"uuid":"GPU-x","index":0,"model":"m","memory_bytes":' + "9" * 60 + "}]",
    '[{"uuid":"GPU-x","index":0,"model":"m","memory_bytes":1e308}]',
    '[{"uuid":' + "1" * 30 + ',"index":-1,"model":[],"memory_bytes":"x"}]',
    '[{"uid":"w","faults":' + "9" * 4500 + "}]",
    json.dumps([{"uuid": "GPU-1", "index": 1, "model": "m", "memory_bytes": 1}] * 2000),
    '"\\ud800"',
    "\"" + "\\\\" * 50_000 + "\"",
    "null",
    "true",
    "[]",
    "{}",
    "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]",
    '{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
    "x" * 300_000,
]  # fmt: skip
STRINGS = [
    "GPU-" + "a" * 100_000,
    ",".join(GPU_UUIDS * 500),
    "GPU-aaaaaaaa-0001,,,,",
    "2000-01-01T00:00:00Z",
    "9999-99-99T99:99:99Z",
    "2026-01-01T00:00:00" + "." + "9" * 5000 + "Z",
    "allocated",
    "assumed",
    "true",
    "exclusive",
    "cautious",
    "latency",
    "urgent",
    "main",
    "guaranteed",
    "opportunistic",
    "Opportunistic ",
    "TRUE",
    " false",
    "yes",
    "\u202e",
    "a" * 1_000_000,
]
QUANTITIES = [
    "1e999999",
    "9E999999",
    "1e999998",
    "-1e999999",
    "1e-999999",
    "1E+999998",
    "1e" + "9" * 60,
    "999999Ei",
    "1E",
    ".5",
    "5.",
    "+1",
    "1.5e3",
    "1.5e3m",
    "0.000000001n",
    "9" * 64,
    "9" * 65,
    "100m",
    "16Gi",
]
"""Resource quantities the API server stores (CPU, memory, overhead, node allocatable): issue
#45's "1e999999" froze the controller's pod list through decimal.Overflow."""
SCALARS: list[Any] = [None, True, False, 0, -1, 2**63, 10**4000, -(10**4000), 1e308, 1.5, [], {}]


class Hostile:
    """Random hostile values and objects from one seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def text(self) -> str:
        pool = self.rng.random()
        if pool < 0.45:
            return self.rng.choice(NUMBERS)
        if pool < 0.7:
            return self.rng.choice(JSON_TEXTS)
        if pool < 0.9:
            return self.rng.choice(STRINGS)
        return "".join(
            self.rng.choice('0123456789.e%-+ GiMk,[{"}]') for _ in range(self.rng.randint(0, 12))
        )

    def value(self) -> Any:
        """Anything JSON could carry, and Python objects a lax decoder could produce."""
        if self.rng.random() < 0.7:
            return self.text()
        choice = self.rng.choice(SCALARS)
        return (
            self._nested(self.rng.randint(1, 3000))
            if choice == [] and self.rng.random() < 0.3
            else choice
        )

    def _nested(self, depth: int) -> Any:
        out: Any = 1
        for _ in range(depth):
            out = [out]
        return out

    def annotations(self) -> dict[str, Any]:
        ann: dict[str, Any] = {}
        if self.rng.random() < 0.6:
            ann[ANN_FRACTION] = self.rng.choice(["0.25", "0.5", "25%", "1"])
        for _ in range(self.rng.randint(1, 4)):
            key = self.rng.choice(POD_KEYS)
            ann[key] = self.text() if self.rng.random() < 0.95 else self.value()
        if self.rng.random() < 0.2:
            ann.update(
                {
                    ANN_GPU_UUID: self.rng.choice(GPU_UUIDS),
                    ANN_THREAD_PERCENT: "25",
                    ANN_MEMORY_LIMIT: str(20 * 2**30),
                    ANN_BIND_TIME: "2026-01-01T00:00:00.000000Z",
                    ANN_STATE: "assumed",
                }
            )
            key = self.rng.choice(POD_KEYS)
            ann[key] = self.text()
        return ann

    def quantity(self) -> Any:
        """A resource quantity: mostly hostile spellings, sometimes any value at all."""
        roll = self.rng.random()
        if roll < 0.7:
            return self.rng.choice(QUANTITIES)
        if roll < 0.9:
            return self.rng.choice(NUMBERS)
        return self.value()

    def container(self) -> dict[str, Any]:
        c: dict[str, Any] = {"name": self.rng.choice(["main", "side", self.text()])}
        roll = self.rng.random()
        if roll < 0.5:
            amount = self.rng.choice([self.text(), "25", "50", 25, 10**4000, -5, None, []])
            resource = self.rng.choice([RESOURCE_GPU_PERCENT, RESOURCE_GPU_OPPORTUNISTIC])
            c["resources"] = {"limits": {resource: amount}}
        elif roll < 0.6:
            c["resources"] = self.value()
        if self.rng.random() < 0.4:
            resources = c.get("resources")
            if not isinstance(resources, dict):
                resources = c["resources"] = {}
            resources["requests"] = {
                "cpu": self.quantity(),
                "memory": self.quantity(),
                **({RESOURCE_GPU_PERCENT: self.quantity()} if self.rng.random() < 0.3 else {}),
                **(
                    {RESOURCE_GPU_OPPORTUNISTIC: self.quantity()} if self.rng.random() < 0.2 else {}
                ),
            }
        if self.rng.random() < 0.1:
            resources = c.get("resources")
            if not isinstance(resources, dict):
                resources = c["resources"] = {}
            resources["limits"] = {
                self.rng.choice(["cpu", "memory", "ephemeral-storage", "hugepages-2Mi"]): (
                    self.quantity()
                ),
                **(
                    {RESOURCE_GPU_OPPORTUNISTIC: self.quantity()} if self.rng.random() < 0.5 else {}
                ),
            }
        if self.rng.random() < 0.2:
            c["env"] = [
                {
                    "name": self.rng.choice(
                        ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "A", self.text()]
                    ),
                    "value": "100",
                }
            ]
        return c

    def pod(self, *, name: str | None = None, namespace: str = "team") -> dict[str, Any]:
        containers = [self.container() for _ in range(self.rng.randint(1, 3))]
        spec: dict[str, Any] = {"containers": containers}
        if self.rng.random() < 0.2:
            spec["initContainers"] = [self.container()]
        if self.rng.random() < 0.3:
            spec["nodeName"] = self.rng.choice([*NODES, self.text()])
        if self.rng.random() < 0.1:
            spec["schedulerName"] = self.value()
        if self.rng.random() < 0.1:
            spec["overhead"] = {"cpu": self.quantity(), "memory": self.quantity()}
        if self.rng.random() < 0.05:
            spec = self.value()  # type: ignore[assignment]
        meta: dict[str, Any] = {
            "name": name or f"p{self.rng.randint(0, 200)}",
            "namespace": namespace,
            "uid": f"uid-{self.rng.randint(0, 10**6)}",
            "annotations": self.annotations(),
        }
        if self.rng.random() < 0.05:
            meta["annotations"] = self.value()
        if self.rng.random() < 0.05:
            meta["ownerReferences"] = [{"controller": True, "uid": self.value()}]
        if self.rng.random() < 0.05:
            meta["labels"] = self.rng.choice([self.value(), {self.text(): self.value()}])
        status = {"phase": self.rng.choice(["Pending", "Running", "Succeeded", self.text()])}
        return {"metadata": meta, "spec": spec, "status": status}

    def node(self, name: str) -> dict[str, Any]:
        ann: dict[str, Any] = {}
        for key in (ANN_NODE_GPUS, ANN_NODE_EXCLUSIVE, ANN_NODE_SEPARATED):
            if self.rng.random() < 0.6:
                ann[key] = self.rng.choice(JSON_TEXTS) if self.rng.random() < 0.8 else self.value()
        node: dict[str, Any] = {"metadata": {"name": name, "annotations": ann}}
        if self.rng.random() < 0.2:
            node["status"] = {"allocatable": {RESOURCE_GPU_PERCENT: self.value()}}
        elif self.rng.random() < 0.3:
            node["status"] = {"allocatable": {"cpu": self.quantity(), "memory": self.quantity()}}
        return node

    def device_ids(self) -> list[str]:
        roll = self.rng.random()
        uuid = self.rng.choice(GPU_UUIDS)
        if roll < 0.2:
            return [f"{uuid}::{n:02d}" for n in range(self.rng.randint(1, 100))]
        if roll < 0.35:
            return [f"{uuid}::o{n:03d}" for n in range(self.rng.randint(1, 120))]
        if roll < 0.45:  # both resources in one call
            return [f"{uuid}::{n:02d}" for n in range(5)] + [f"{uuid}::o{n:03d}" for n in range(5)]
        if roll < 0.7:
            return [self.device_id() for _ in range(self.rng.randint(1, 4))]
        return [self.text() for _ in range(self.rng.randint(0, 3))]

    def device_id(self) -> str:
        """One device ID as the kubelet could pass it: ``<UUID>::NN`` or ``<UUID>::oNNN``
        mangled (marks doubled or cased, widths and signs off, separators repeated)."""
        uuid = self.rng.choice([*GPU_UUIDS, "", ":", "GPU-a::b", self.text()[:40]])
        mark = self.rng.choice(["", "o", "O", "oo", "o-", "o+", " o", "o\u0663", "\u00b2"])
        number = self.rng.choice(
            ["00", "99", "100", "0", "000", "299", "300", "0299", "-1", "", " 1", "1 ", "١٢"]
        )
        if self.rng.random() < 0.2:
            number = self.rng.choice(NUMBERS)[:70]
        sep = self.rng.choice(["::", "::", ":", ":::", "::::"])
        return f"{uuid}{sep}{mark}{number}"

    def body(self, valid: Callable[[], Any]) -> bytes:
        """An HTTP body: a hostile mutation of ``valid()``'s JSON, or raw hostile bytes."""
        roll = self.rng.random()
        if roll < 0.15:
            return self.rng.choice(JSON_TEXTS).encode(errors="surrogatepass")
        if roll < 0.2:
            return bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(0, 64)))
        doc = valid()
        text = json.dumps(doc, default=str, allow_nan=True)
        if roll < 0.3:
            # splice a hostile number or nesting into the document
            at = self.rng.randint(0, len(text))
            text = (
                text[:at] + self.rng.choice(["9" * 5000, "1e999", "NaN", _deep(3000)]) + text[at:]
            )
        return text.encode(errors="surrogatepass")

"""PyTorch workloads on synthetic data (imported only inside worker processes).

The kinds the shipped interference model was fit on are written out here with torch alone; the
kinds it never saw (``catalog.UNSEEN_KINDS``) are built from ``transformers`` and
``torchvision`` with random weights (no download), as packages on the GPU host provide them,
and a bf16 GEMM from torch alone.
``tiny=True`` shrinks every model so the harness can be smoke-tested on a CPU; results from
tiny models are never benchmark results.
"""

# torch has no complete type stubs for every call used here; keep mypy out of this file.
# mypy: ignore-errors

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from bench.gpu.catalog import KINDS, JobKind


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(width)
        self.down = _shortcut(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.down(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * 4
        self.c1 = nn.Conv2d(cin, width, 1, bias=False)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(width)
        self.c3 = nn.Conv2d(width, out, 1, bias=False)
        self.b3 = nn.BatchNorm2d(out)
        self.down = _shortcut(cin, out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        return F.relu(self.b3(self.c3(y)) + self.down(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """ResNet-18 (basic blocks 2-2-2-2) or ResNet-50 (bottlenecks 3-4-6-3)."""

    def __init__(self, block: type, layers: list[int], *, classes: int, small_input: bool):
        super().__init__()
        if small_input:  # CIFAR stem: 3x3 conv, no max-pool
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
        blocks: list[nn.Module] = []
        cin = 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class _Lstm(nn.Module):
    def __init__(self, inp: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(inp, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


class _Encoder(nn.Module):
    def __init__(self, d: int, heads: int, layers: int, *, classes: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x).mean(1))


@dataclass
class Workload:
    """One job's unit of work: ``step()`` runs one iteration (or one request) and waits for it."""

    step: Callable[[], None]
    sync: Callable[[], None]


def _training(
    model: nn.Module,
    make_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    *,
    device: torch.device,
    bf16: bool,
    optim: str = "sgd",
) -> Callable[[], None]:
    model.train()
    opt: torch.optim.Optimizer
    if optim == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_batch()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step


def _mostly_idle(
    train: Callable[[], None], *, sync: Callable[[], None], spec: JobKind
) -> Callable[[], None]:
    """One step of a job that sits mostly idle, as a notebook does: a burst of ``spec.burst``
    training steps, waited for, then ``spec.idle_s`` with nothing on the GPU."""

    def step() -> None:
        for _ in range(spec.burst):
            train()
        sync()
        time.sleep(spec.idle_s)

    return step


def build(name: str, *, device: torch.device, tiny: bool = False) -> Workload:
    """Build a job kind's model and synthetic batch on ``device``."""
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    step: Callable[[], None]

    def batch(
        shape: tuple[int, ...], classes: int, *, channels_last: bool = False
    ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        def make() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(*shape, device=device)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return x, torch.randint(0, classes, (shape[0],), device=device)

        return make

    if name in ("resnet18", "notebook"):
        model = ResNet(_Basic, [2, 2, 2, 2], classes=10, small_input=True).to(device)
        step = _training(
            model, batch((4 if tiny else 32, 3, 32, 32), 10), device=device, bf16=False
        )
        if name == "notebook":
            step = _mostly_idle(step, sync=sync, spec=KINDS[name])
    elif name in ("resnet50", "resnet50_xl", "infer"):
        model = ResNet(_Bottleneck, [3, 4, 6, 3], classes=1000, small_input=False)
        model = model.to(device).to(memory_format=torch.channels_last)
        side = 64 if tiny else 224
        if name != "infer":
            bsz = 2 if tiny else (256 if name == "resnet50_xl" else 128)
            step = _training(
                model,
                batch((bsz, 3, side, side), 1000, channels_last=True),
                device=device,
                bf16=True,
            )
        else:
            model.eval()
            x = torch.randn(1 if tiny else 8, 3, side, side, device=device)
            x = x.contiguous(memory_format=torch.channels_last)

            def step() -> None:
                with (
                    torch.inference_mode(),
                    torch.autocast(device_type=device.type, dtype=torch.bfloat16),
                ):
                    model(x)
    elif name in ("transformer", "transformer_xl"):
        d, heads, layers, seq, bsz = (64, 4, 1, 32, 2) if tiny else (1024, 16, 6, 512, 32)
        if name == "transformer_xl" and not tiny:
            bsz = 64
        model = _Encoder(d, heads, layers, classes=16).to(device)
        step = _training(model, batch((bsz, seq, d), 16), device=device, bf16=True, optim="adamw")
    elif name == "lstm":
        inp, hidden, seq, bsz = (16, 32, 8, 4) if tiny else (512, 1024, 64, 32)
        model = _Lstm(inp, hidden, 10).to(device)
        step = _training(model, batch((bsz, seq, inp), 10), device=device, bf16=False)
    elif name == "gpt2":
        # A GPT-style decoder built from a transformers config: random weights, no download.
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415

        layers, d, heads, seq, bsz = (1, 64, 2, 32, 2) if tiny else (12, 768, 12, 512, 8)
        config = GPT2Config(
            n_layer=layers, n_embd=d, n_head=heads, n_positions=seq, vocab_size=32000
        )
        model = GPT2LMHeadModel(config).to(device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, config.vocab_size, (bsz, seq), device=device)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
    elif name == "bert":
        # BERT-base (transformers' BertConfig defaults) answering offline batches.
        from transformers import BertConfig, BertModel  # noqa: PLC0415

        config = (
            BertConfig(
                hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128
            )
            if tiny
            else BertConfig()
        )
        model = BertModel(config).to(device).eval()
        seq, bsz = (16, 2) if tiny else (128, 32)
        tokens = torch.randint(0, config.vocab_size, (bsz, seq), device=device)

        def step() -> None:
            with (
                torch.inference_mode(),
                torch.autocast(device_type=device.type, dtype=torch.bfloat16),
            ):
                model(input_ids=tokens)
    elif name == "vit":
        from torchvision.models import vit_b_16  # noqa: PLC0415

        side, bsz = (32, 2) if tiny else (224, 32)
        if tiny:
            from torchvision.models import VisionTransformer  # noqa: PLC0415

            model = VisionTransformer(side, 16, 1, 2, 32, 64, num_classes=10).to(device)
        else:
            model = vit_b_16(weights=None, num_classes=1000).to(device)
        step = _training(
            model, batch((bsz, 3, side, side), 10 if tiny else 1000), device=device, bf16=True
        )
    elif name == "dgemm":
        n = 256 if tiny else 8192
        a = torch.randn(n, n, dtype=torch.float64, device=device)
        b = torch.randn(n, n, dtype=torch.float64, device=device)
        c = torch.empty(n, n, dtype=torch.float64, device=device)

        def step() -> None:
            torch.matmul(a, b, out=c)
    elif name == "bgemm":
        n = 256 if tiny else 8192
        x = torch.randn(n, n, dtype=torch.bfloat16, device=device)
        y = torch.randn(n, n, dtype=torch.bfloat16, device=device)
        z = torch.empty(n, n, dtype=torch.bfloat16, device=device)
        # A step is several GEMMs: one takes 1-2 ms on an H100, so a sync after each would
        # leave the GPU idle between them.
        steps = 8

        def step() -> None:
            for _ in range(steps):
                torch.matmul(x, y, out=z)
    else:
        raise ValueError(f"unknown job kind {name!r}")

    def synced() -> None:
        step()
        sync()

    return Workload(step=synced, sync=sync)

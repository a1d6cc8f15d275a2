"""Gather the tenant-safety measurements into bench/results/security.json and .md.

Inputs, from a directory (``--from``, default $GPUSHARE_SECURITY_OUT) the tests write into:

- ``fuzz.json``: tests/fuzz/test_fuzz_total_parsing.py (inputs and uncaught exceptions);
- ``attacks.json``: tests/faults/test_security_cluster.py (each attack, refused or not);
- ``ha.json``: tests/faults/test_controller_ha_cluster.py (leader takeover, rotation, poison);
- ``flood.json``: tests/faults/test_flood_cluster.py (one address flooding every port while
  kube-scheduler places pods: filter p99 quiet and flooded, admissions, agent restarts);
- ``--gpu FILE``: mps_limits_gpu.json from tests/gpu/test_mps_limits_gpu.py on a real GPU;
- ``--flood-elsewhere FILE --elsewhere MACHINE``: flood.json from the same test run on a machine
  with more cores (hack/bundle-host-pytest.sh), kept apart as ``flood_elsewhere``: the 2-core
  development VM's attacker and controller share its two cores (docs/security.md).

Sections not given keep their previous value; attacks run again replace their own result (each
dated), the others keep theirs. Run the tests, then:

    GPUSHARE_SECURITY_OUT=/tmp/sec GPUSHARE_FUZZ_INPUTS=250000 \\
        .venv/bin/pytest tests/fuzz/test_fuzz_total_parsing.py
    GPUSHARE_SECURITY_OUT=/tmp/sec GPUSHARE_HA_PODS=200 \\
        hack/run-pytest.sh tests/faults/test_security_cluster.py \\
        tests/faults/test_controller_ha_cluster.py tests/faults/test_flood_cluster.py
    .venv/bin/python -m bench.faults.security --from /tmp/sec --gpu mps_limits_gpu.json
"""

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.faults.summary import machine

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench" / "results" / "security"
TAKEOVER_TARGET_S = 15.0


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def merge(
    previous: dict[str, Any],
    source: Path,
    gpu: Path | None,
    flood_elsewhere: Path | None = None,
    elsewhere: str = "",
) -> dict[str, Any]:
    doc = dict(previous)
    fuzz = _load(source / "fuzz.json")
    if fuzz is not None:
        doc["fuzz"] = fuzz
        doc["fuzz"]["machine"] = machine()
    attacks = _load(source / "attacks.json")
    if attacks is not None:
        today = datetime.now(UTC).strftime("%Y-%m-%d")
        fresh = {name: {**result, "date": today} for name, result in attacks.items()}
        doc["attacks"] = {**(doc.get("attacks") or {}), **fresh}
        doc["attacks_machine"] = machine()
    flood = _load(source / "flood.json")
    if flood is not None:
        doc["flood"] = {**flood, "machine": machine()}
    if flood_elsewhere is not None:
        doc["flood_elsewhere"] = {**json.loads(flood_elsewhere.read_text()), "machine": elsewhere}
    ha = _load(source / "ha.json")
    if ha is not None:
        doc["ha"] = {**doc.get("ha", {}), **ha}
    if gpu is not None:
        doc["gpu"] = json.loads(gpu.read_text())
    attacks = doc.get("attacks") or {}
    doc["attacks_tried"] = len(attacks)
    doc["attacks_succeeded"] = sum(1 for a in attacks.values() if not a.get("refused"))
    doc["attacks_disturbing_others"] = sum(
        1 for a in attacks.values() if not a.get("victim_undisturbed")
    )
    doc["fuzz_inputs"] = (doc.get("fuzz") or {}).get("fuzz_inputs")
    doc["fuzz_uncaught"] = (doc.get("fuzz") or {}).get("fuzz_uncaught")
    surfaces = ((doc.get("fuzz") or {}).get("surfaces") or {}).values()
    measured = [s for s in surfaces if "slowest_input_s" in s]
    doc["fuzz_slowest_input_s"] = max((s["slowest_input_s"] for s in measured), default=None)
    doc["fuzz_inputs_over_1s"] = sum(s.get("over_1s", 0) for s in measured) if measured else None
    doc["fuzz_max_input_growth_mib"] = max(
        (s["max_input_growth_mib"] for s in measured if s.get("memory_measured")), default=None
    )
    doc["fuzz_inputs_over_64mib"] = (
        sum(s.get("over_64mib", 0) for s in measured) if measured else None
    )
    kill = (doc.get("ha") or {}).get("leader_kill") or {}
    doc["leader_takeover_s"] = kill.get("takeover_s")
    doc["gpu_escape_bounded"] = (doc.get("gpu") or {}).get("bounded_by_server")
    doc["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return doc


def _flood_row(flood: dict[str, Any], where: str) -> str:
    quiet, flooded = flood.get("filter_p99_quiet_ms"), flood.get("filter_p99_flood_ms")
    missed = isinstance(quiet, int | float) and isinstance(flooded, int | float)
    missed = missed and flooded > 2 * quiet
    return (
        "| one address floods every port while kube-scheduler places pods (quiet and flooded "
        f"phases interleaved, {where}): filter p99 <= 2x quiet, every admission within "
        "2 s, 0 agent restarts | "
        f"filter p99 {quiet} ms quiet, {flooded} ms flooded"
        f"{' (**missed**)' if missed else ''}; "
        f"{flood.get('admissions_answered')}/{flood.get('admissions_tried')} admissions; "
        f"{flood.get('agent_restarts')} agent restarts |"
    )


def markdown(doc: dict[str, Any]) -> str:
    kill = (doc.get("ha") or {}).get("leader_kill") or {}
    rotation = (doc.get("ha") or {}).get("certificate_rotation") or {}
    poison = (doc.get("ha") or {}).get("poison_watch") or {}
    gpu = doc.get("gpu") or {}
    phases = gpu.get("phases") or {}
    lines = [
        "# Tenant safety",
        "",
        "Generated by `python -m bench.faults.security` (see its docstring); trust model in",
        "docs/security.md.",
        "",
        "| target | result |",
        "| --- | --- |",
        f"| hostile-tenant attacks: >= 40 classes, 0 succeed, 0 disturb another pod | "
        f"{doc.get('attacks_tried')} tried, {doc.get('attacks_succeeded')} succeeded, "
        f"{doc.get('attacks_disturbing_others')} disturbed another pod |",
        f"| fuzz: >= 250,000 hostile inputs, 0 uncaught, none over 1 s, none growing memory "
        f"past 64 MiB | {doc.get('fuzz_inputs')} inputs, {doc.get('fuzz_uncaught')} uncaught; "
        f"slowest {doc.get('fuzz_slowest_input_s')} s ({doc.get('fuzz_inputs_over_1s')} over "
        f"1 s); largest growth {doc.get('fuzz_max_input_growth_mib')} MiB "
        f"({doc.get('fuzz_inputs_over_64mib')} over 64 MiB) |",
        f"| leader killed during a burst: takeover <= {TAKEOVER_TARGET_S:g} s, 0 oversubscribed, "
        f"0 lost | takeover {doc.get('leader_takeover_s')} s over {kill.get('pods')} pods, "
        f"{len(kill.get('oversubscribed') or [])} oversubscribed, "
        f"{len(kill.get('lost') or [])} lost |",
        f"| certificate rotation: 0 failed admissions or binds | "
        f"{rotation.get('failed_admissions')} failed admissions of {rotation.get('admissions')}, "
        f"{rotation.get('failed_binds')} failed binds |",
        _flood_row(doc.get("flood") or {}, "this 2-core VM"),
        *(
            [_flood_row(doc["flood_elsewhere"], doc["flood_elsewhere"].get("machine", "elsewhere"))]
            if doc.get("flood_elsewhere")
            else []
        ),
        f"| poison pod: restarted controller ready, pods placed | "
        f"placed after poison: {poison.get('pod_scheduled_after_poison')}, watch failures "
        f"{poison.get('watch_failures')} |",
        f"| real GPU: a client exceeding its thread or memory limit is bounded | "
        f"{doc.get('gpu_escape_bounded')} |",
        "",
        "## Attacks",
        "",
        "| attack | refused | reason (first 160 characters) |",
        "| --- | --- | --- |",
    ]
    for name, attack in sorted((doc.get("attacks") or {}).items()):
        reason = str(attack.get("reason", "")).replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| {name.replace('_', ' ')} | {attack.get('refused')} | {reason} |")
    lines += [
        "",
        f"Machine: {doc.get('attacks_machine', 'unknown')}; the local cluster of `hack/` with",
        "simulated GPUs.",
        "",
        "## MPS limits on a real GPU",
        "",
        f"{gpu.get('gpu_model')}, driver {gpu.get('driver')}, compute mode "
        f"{gpu.get('compute_mode')}, {gpu.get('date')}. Every client re-exports",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G; the",
        "node agent's MpsLimitKeeper sets the daemon's and servers' limits from the placed pods.",
        "",
        "| phase | largest placed share | bf16 GEMM TFLOP/s | 3 GiB allocation refused |",
        "| --- | --- | --- | --- |",
    ]
    placed = {
        "env_only": "100 % (limits only in the environment)",
        "daemon_limit": "25 % / 2 GiB",
        "running_server": "25 % / 2 GiB, set while the server ran",
        "pipe_unset": "25 % / 2 GiB, CUDA_MPS_PIPE_DIRECTORY unset",
        "empty_pipe_dir": "25 % / 2 GiB, pipe pointed at an empty directory",
    }
    for name, label in placed.items():
        phase = phases.get(name) or {}
        refused = (phase.get("memory") or {}).get("3GiB_refused", "-")
        lines.append(f"| {name} | {label} | {phase.get('tflops', '-')} | {refused} |")
    lines += [
        "",
        f"Criterion: {gpu.get('criterion')}. The empty pipe directory escapes MPS in compute mode",
        "Default; EXCLUSIVE_PROCESS (the admin's step, docs/security.md) closes it; it was not",
        "changed on the GPU host.",
        "",
        "## Leader failover",
        "",
        "```",
        json.dumps(kill, indent=2, sort_keys=True),
        "```",
        "",
    ]
    flood = doc.get("flood") or {}
    lines += [
        "## Flood (issue 67)",
        "",
        f"Machine: {flood.get('machine', 'unknown')}; the local cluster of `hack/` with",
        "simulated GPUs; the attacker is one process of one client address.",
        "",
        "```",
        json.dumps(flood, indent=2, sort_keys=True),
        "```",
        "",
    ]
    elsewhere = doc.get("flood_elsewhere") or {}
    if elsewhere:
        lines += [
            "### The same flood on a larger machine",
            "",
            f"Machine: {elsewhere.get('machine', 'unknown')}; the local cluster from the GPU-host",
            "bundle's binaries (`hack/bundle-host-pytest.sh`), the same test.",
            "",
            "```",
            json.dumps(elsewhere, indent=2, sort_keys=True),
            "```",
            "",
        ]
    fuzz = doc.get("fuzz") or {}
    lines += [
        "## Fuzz",
        "",
        f"Seed {fuzz.get('seed')}; machine: {fuzz.get('machine')}. Each input is timed (input",
        "generation included) and its memory growth is the peak resident set while it ran",
        "(VmHWM, reset before it) less the resident set before it.",
        "",
        "| surface | inputs | uncaught | slowest input (s) | largest growth (MiB) | seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, surface in (fuzz.get("surfaces") or {}).items():
        lines.append(
            f"| {name} | {surface.get('inputs')} | {surface.get('uncaught')} | "
            f"{surface.get('slowest_input_s', '-')} | {surface.get('max_input_growth_mib', '-')} "
            f"| {surface.get('seconds')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=Path(os.environ.get("GPUSHARE_SECURITY_OUT") or "."),
    )
    parser.add_argument("--gpu", type=Path, default=None)
    parser.add_argument(
        "--flood-elsewhere",
        type=Path,
        default=None,
        metavar="FILE",
        help="flood.json of tests/faults/test_flood_cluster.py run on another machine",
    )
    parser.add_argument(
        "--elsewhere",
        default="",
        metavar="MACHINE",
        help="that machine, in words (cores, memory, Python): required with --flood-elsewhere",
    )
    args = parser.parse_args(argv)
    if args.flood_elsewhere is not None and not args.elsewhere.strip():
        parser.error("--flood-elsewhere needs --elsewhere MACHINE (its cores, memory, Python)")
    previous = _load(OUT.with_suffix(".json")) or {}
    doc = merge(previous, args.source, args.gpu, args.flood_elsewhere, args.elsewhere.strip())
    OUT.with_suffix(".json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    OUT.with_suffix(".md").write_text(markdown(doc))
    print(OUT.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

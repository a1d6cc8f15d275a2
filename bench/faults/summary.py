"""Merge the reliability measurements into bench/results/reliability.json and .md.

Inputs (each optional; sections not given keep their previous value):

- ``--faults FILE``: what tests/faults/test_faults_cluster.py wrote ($GPUSHARE_RELIABILITY_OUT);
  bench/faults/run_faults.py produces it with 200 pods per fault. ``--faults-ci FILE``: the same
  from a CI-sized run, kept as ``faults_ci``.
- ``--gpu FILE``: reliability_gpu.json from tests/gpu/test_mps_fault_gpu.py on a real GPU.
- ``--gpushare-fuzz FILE``: counts from tests/faults/test_hostile_input_cluster.py.
- ``--fuzz``: run the HTTP fuzzers here (tests/fuzz, tests/faults/test_fuzz_profiler.py) and
  count their generated cases and failures.

    .venv/bin/python -m bench.faults.summary --fuzz --faults faults.json --gpu gpu.json
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench" / "results" / "reliability"
FUZZERS = ("tests/fuzz/test_fuzz_endpoints.py", "tests/faults/test_fuzz_profiler.py")
TARGET_CONVERGE_S = 30.0


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(
            int(line.split()[1]) / 2**20
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        mem = 0.0
    return (
        f"{cpu} ({os.cpu_count()} cores, {mem:.1f} GiB, shared with other work), "
        f"Python {platform.python_version()}"
    )


def run_fuzzers() -> dict[str, Any]:
    """Run the HTTP fuzzers; count generated cases from hypothesis' statistics."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--hypothesis-show-statistics", *FUZZERS],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=1800,
    )  # fmt: skip
    cases = 0
    failing = 0
    per_test: dict[str, int] = {}
    current = ""
    phase = ""
    for line in proc.stdout.splitlines():
        if line.endswith(":") and "::" in line:
            current = line.rstrip(":").split("::", 1)[1]
        elif "during " in line and " phase" in line:
            phase = line.strip()
        match = re.search(r"(\d+) passing, (\d+) failing", line)
        if match and phase.startswith("- during generate"):
            passed, failed = int(match[1]), int(match[2])
            cases += passed + failed
            failing += failed
            per_test[current] = per_test.get(current, 0) + passed + failed
    summary = re.search(r"(\d+) passed(?:, (\d+) failed)?", proc.stdout)
    failed_tests = int(summary[2] or 0) if summary else len(per_test)
    return {
        "cases": cases,
        "failing_cases": failing,
        "failed_tests": failed_tests,
        "per_test": per_test,
        "exit_code": proc.returncode,
    }


def load(path: str | None) -> Any:
    return json.loads(Path(path).read_text()) if path else None


def _both_involved(raw: dict[str, Any]) -> bool | None:
    """Every recorded fault listed its faulter and its neighbour as involved."""
    trials = (raw.get("attribution") or {}).get("trials") or []
    if not trials:
        return None
    return all({t["faulter_pid"], t["victim_pid"]} <= set(t.get("involved") or []) for t in trials)


def gpu_section(raw: dict[str, Any]) -> dict[str, Any]:
    a = raw.get("a_neighbour_breaks", {})
    b = raw.get("b_recovery", {})
    c = raw.get("c_lingering_victim", {})
    incident = a.get("incident", {})
    attribution = raw.get("attribution") or {}
    return {
        "device": raw.get("device"),
        "date": raw.get("date"),
        "fault": (a.get("faulter") or {}).get("how"),
        "faulter_error_code": (a.get("faulter") or {}).get("rc"),
        "neighbour_failed": a.get("victim_failed"),
        "neighbour_error": a.get("victim_error"),
        "neighbour_failed_after_s": a.get("victim_failed_after_fault_s"),
        "server_logged_after_s": incident.get("logged_after_fault_s"),
        "detection_s": incident.get("detection_s"),
        "detection_s_c": (c.get("incident") or {}).get("detection_s"),
        "both_involved": _both_involved(raw),
        "attribution": {k: v for k, v in attribution.items() if k != "trials"},
        "attribution_trials": [
            {
                k: t.get(k)
                for k in (
                    "scenario",
                    "faulter_started_first",
                    "faulter_pid",
                    "victim_pid",
                    "named",
                    "xid_pid",
                )
            }
            for t in attribution.get("trials", [])
        ],
        "evidence": incident.get("evidence", [])[:1],
        "recovery_s": b.get("recovery_s"),
        "daemon_healthy_same_pid": bool(b.get("daemon_up") and b.get("daemon_same_pid")),
        "lingering_victim": {
            "new_client_while_lingering": c.get("probe_while_lingering"),
            "recovered_after_exit": c.get("recovered_after_victim_exit")
            or c.get("recovered_after_victim_exit_s"),
        },
        "exclusive_marked": raw.get("d_exclusive"),
        "separated": raw.get("d_separated"),
        "xid_events": raw.get("xid_events"),
        "kernel_log": [line for line in raw.get("dmesg_xid", []) if "Xid" in line],
        "notes": raw.get("notes", []),
    }


def _named(gpu: dict[str, Any]) -> str:
    a = gpu.get("attribution") or {}
    if not a:
        return "not recorded"
    nobody = int(a.get("faults", 0)) - int(a.get("server_named_one", 0))
    return (
        f"{a.get('server_named_faulter')} of {a.get('faults')} faults (named the victim "
        f"{a.get('server_named_victim')}, nobody {nobody}); kernel Xid 31 pid = the faulter "
        f"{a.get('xid_named_faulter')} of {a.get('faults')}, "
        f"= the server's choice {a.get('xid_agrees_with_server')}"
    )


GPU_HEADING = "## A faulting MPS client on a real GPU"


def splice_gpu_section(old: str, new: str) -> str:
    """``old`` (the .md as it is, maybe edited by hand) with its GPU section, the last one,
    replaced by the one in ``new``; the rest is kept as it is."""
    section = new[new.index(GPU_HEADING) :] if GPU_HEADING in new else ""
    kept = old[: old.index(GPU_HEADING)] if GPU_HEADING in old else old.rstrip("\n") + "\n\n"
    return kept + section


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Reliability and security",
        "",
        f"Measured {doc['date']} on {doc['machine']}.",
        "",
        "## Faults during a burst of fractional pods (local cluster)",
        "",
        f"{doc.get('pods_per_fault', '?')} pods per fault, each component killed with SIGKILL, "
        f"kept down {doc.get('down_s', '?')} s and started again. Converge = time from the "
        "component being back until every pod runs with its placement's environment or waits "
        "with a scheduling reason and every invariant holds, the rest of the burst arriving "
        f"meanwhile (target <= {TARGET_CONVERGE_S:.0f} s); also from the last pod created.",
        "",
        "| component | converge (s) | after the last pod (s) | violations | running "
        "| pending with reason | notes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, f in doc.get("faults", {}).items():
        extra = {
            k: v
            for k, v in f.items()
            if k
            not in (
                "converge_s",
                "after_last_pod_s",
                "violations",
                "running",
                "pending_with_reason",
                "pods",
                "down_s",
            )
        }
        notes = ", ".join(f"{k} {v}" for k, v in extra.items())
        lines.append(
            f"| {name} | {f.get('converge_s')} | {f.get('after_last_pod_s')} | "
            f"{len(f.get('violations', []))} | "
            f"{f.get('running')} | {f.get('pending_with_reason')} | {notes} |"
        )
    ci = doc.get("faults_ci")
    if ci:
        lines += [
            "",
            f"CI-sized run ({ci.get('pods_per_fault')} pods per fault), violations per component: "
            + ", ".join(
                f"{name} {len(f.get('violations', []))}"
                for name, f in ci.items()
                if isinstance(f, dict)
            )
            + " (details in faults_ci; docs/reliability.md explains them).",
        ]
    lines += ["", "## Hostile input", ""]
    http = doc.get("fuzz_http") or {}
    lines.append(
        f"- In all {doc.get('fuzz_cases')} fuzz cases, {doc.get('fuzz_crashes')} crashes. HTTP "
        f"(extender, webhook, node agent /profile): {http.get('cases')} generated cases over "
        f"{len(http.get('per_test', {}))} properties, {http.get('failed_tests')} failed "
        "(a 5xx, an answer without a reason, or a server that stopped)."
    )
    gs = doc.get("gpushare_fuzz")
    if gs:
        lines.append(
            f"- GpuShare objects against the real API server: {gs.get('cases')} cases, "
            f"{gs.get('accepted')} stored, {gs.get('refused')} refused with a 4xx naming the "
            f"field, {gs.get('crashes')} server errors; {gs.get('disagreements')} stored specs "
            "the operator's parser refuses (it reports them on the object)."
        )
    gpu = doc.get("gpu_fault")
    if gpu:
        dev = gpu.get("device") or {}
        lines += [
            "",
            f"{GPU_HEADING} ({dev.get('model')}, driver {dev.get('driver')}, {gpu.get('date')})",
            "",
            "| what | value |",
            "| --- | --- |",
            f"| fault | {gpu.get('fault')} (CUDA error {gpu.get('faulter_error_code')}) |",
            f"| neighbour's next GEMM failed | {gpu.get('neighbour_failed')}, "
            f"{gpu.get('neighbour_failed_after_s')} s after the fault: "
            f"{gpu.get('neighbour_error')} |",
            f"| MPS server logged it after | {gpu.get('server_logged_after_s')} s |",
            f"| gpushare detected it after (0.5 s polling) | {gpu.get('detection_s')} s "
            f"(second fault: {gpu.get('detection_s_c')} s) |",
            f"| both clients reported involved, every fault | {gpu.get('both_involved')} |",
            f"| MPS server named the real faulter | {_named(gpu)} |",
            f"| server takes new clients again after | {gpu.get('recovery_s')} s |",
            f"| MPS control daemon healthy, not restarted | {gpu.get('daemon_healthy_same_pid')} |",
            "| workload common to two faults (different neighbours) marked exclusive, "
            f"victims not | {', '.join(gpu.get('exclusive_marked') or {}) or 'none'} |",
        ]
        for note in gpu.get("notes", []):
            lines.append(f"\n{note}")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", action="append", default=[])
    parser.add_argument("--faults-ci", help="the CI-sized run (24 pods), kept apart as faults_ci")
    parser.add_argument("--gpu")
    parser.add_argument("--gpu-note", action="append", default=[])
    parser.add_argument("--gpushare-fuzz")
    parser.add_argument("--fuzz", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    json_path = args.out.with_suffix(".json")
    doc: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {}
    for path in args.faults:
        raw = load(path)
        doc.setdefault("faults", {}).update(raw.get("faults", {}))
        doc["pods_per_fault"] = raw.get("pods_per_fault")
        doc["down_s"] = raw.get("down_s")
    if args.faults_ci:
        raw = load(args.faults_ci)
        doc["faults_ci"] = {"pods_per_fault": raw.get("pods_per_fault"), **raw.get("faults", {})}
    if args.gpu:
        raw = load(args.gpu)
        raw["notes"] = args.gpu_note
        doc["gpu_fault"] = gpu_section(raw)
    if args.gpushare_fuzz:
        doc["gpushare_fuzz"] = load(args.gpushare_fuzz)
    if args.fuzz:
        fuzz = run_fuzzers()
        doc["fuzz_http"] = fuzz
    http = doc.get("fuzz_http", {})
    gs = doc.get("gpushare_fuzz") or {}
    doc["fuzz_cases"] = int(http.get("cases", 0)) + int(gs.get("cases", 0))
    doc["fuzz_crashes"] = int(http.get("failed_tests", 0)) + int(gs.get("crashes", 0))
    if args.faults or args.faults_ci or args.fuzz or args.gpushare_fuzz or not doc.get("date"):
        # Only sections measured on this machine date the file; a GPU run carries its own.
        doc["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc["machine"] = machine()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    md_path = args.out.with_suffix(".md")
    text = markdown(doc)
    local = args.faults or args.faults_ci or args.fuzz or args.gpushare_fuzz
    if args.gpu and not local and md_path.exists():
        # Only the GPU section is new: keep the rest as written (it may carry hand-made notes).
        text = splice_gpu_section(md_path.read_text(), text)
    md_path.write_text(text)
    print(f"wrote {json_path} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.exporter.standalone`` on its own (no agent, no cluster): what its /metrics
says about itself. Its GPU series against a real Prometheus: tests/cluster/
test_exporter_prometheus.py."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import gpushare
from tests import REPO


def test_the_standalone_exporter_says_its_version(tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"items": []}))
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.exporter.standalone",
            "--backend",
            "simulated:1xH100-80GB",
            "--node-name",
            "n",
            "--pods-file",
            str(pods),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--address",
            "127.0.0.1",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the exporter did not start"
            time.sleep(0.1)
        url = f"http://127.0.0.1:{int(port_file.read_text())}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    (info,) = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gpushare_build_info"
    ]
    assert info.value == 1.0
    assert info.labels == {
        "version": gpushare.__version__,
        "component": "exporter",
        "python_version": info.labels["python_version"],
        "simulated": "true",  # as every series of the simulated backend says
    }

"""A GPU's compute mode: read with nvidia-smi, set to EXCLUSIVE_PROCESS where gpushare may, and
whether the agent may use the GPU in it.

In any compute mode but EXCLUSIVE_PROCESS a CUDA process that does not reach the MPS daemon (a
container that points CUDA_MPS_PIPE_DIRECTORY at an empty directory) runs on the GPU directly,
outside every MPS limit (measured: 694 TFLOP/s beside a 25 % server limit; docs/security.md).
In EXCLUSIVE_PROCESS only one process may hold a context on the GPU, and with MPS that process
is the MPS server, so such a container's CUDA calls fail instead. NVIDIA's device plugin sets
EXCLUSIVE_PROCESS on every GPU it shares through MPS for the same reason.

With ``close`` on (the chart's ``node.setExclusiveProcess``, default true; the agent's
``--set-exclusive-process``), the agent sets EXCLUSIVE_PROCESS on a GPU it manages before it
starts that GPU's MPS daemon, and only while no compute process is on the GPU (a process
already there keeps its mode; the agent says so and warns). What it costs: nothing but the MPS
server can open the GPU while gpushare manages it (no CUDA tool run outside gpushare's pods on
it, no non-MPS process of another device plugin). Tests never change a real GPU's mode: every
real-GPU path turns it off explicitly; unit tests use a stand-in ``nvidia-smi``.
"""

import logging
import subprocess
import threading

log = logging.getLogger("gpushare.node.mps.manager")

EXCLUSIVE_PROCESS = "Exclusive_Process"


def _is_exclusive(mode: str) -> bool:
    return mode.lower().replace(" ", "_") == EXCLUSIVE_PROCESS.lower()


class ComputeModeGate:
    """Reads compute modes, sets EXCLUSIVE_PROCESS when told to, and says why a GPU must not
    be used. Thread-safe."""

    def __init__(
        self,
        *,
        required: bool,
        simulated: bool,
        timeout_s: float,
        close: bool = False,
        smi: str = "nvidia-smi",
    ) -> None:
        self.required = required
        self.simulated = simulated
        self.timeout_s = timeout_s
        self.close_door = close
        self.smi = smi
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def _run(self, *args: str) -> str | None:
        """nvidia-smi's output, None when it failed."""
        try:
            done = subprocess.run(
                [self.smi, *args],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    def mode(self, uuid: str) -> str:
        """The GPU's compute mode as nvidia-smi names it (``Default``, ``Exclusive_Process``);
        ``unknown`` when it cannot be read. Read only."""
        if self.simulated:
            return "Default (simulated)"
        out = self._run("--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid)
        return (out or "").strip() or "unknown"

    def close(self, uuid: str) -> str | None:
        """Set EXCLUSIVE_PROCESS on the GPU when told to and no compute process is on it;
        returns what was done (for the GPU's Event), None when nothing was."""
        if not self.close_door or self.simulated:
            return None
        mode = self.mode(uuid)
        if _is_exclusive(mode) or mode == "unknown":
            return None
        apps = self._run("--query-compute-apps=pid", "--format=csv,noheader", "-i", uuid)
        if apps is None or apps.strip():
            log.warning(
                "GPU %s stays in compute mode %s: %s; a container can leave MPS there until "
                "the GPU is idle when its MPS daemon next starts",
                uuid,
                mode,
                "compute processes run on it" if apps else "its processes cannot be listed",
            )
            return None
        if self._run("-i", uuid, "-c", EXCLUSIVE_PROCESS.upper()) is None:
            log.warning("could not set compute mode EXCLUSIVE_PROCESS on GPU %s", uuid)
            return None
        done = self.mode(uuid)
        if not _is_exclusive(done):
            log.warning("GPU %s reads compute mode %s after setting EXCLUSIVE_PROCESS", uuid, done)
            return None
        log.info("GPU %s set to compute mode EXCLUSIVE_PROCESS (was %s)", uuid, mode)
        return f"compute mode of GPU {uuid} set to EXCLUSIVE_PROCESS (was {mode})"

    def refusal(self, uuid: str) -> str | None:
        """Why the GPU must not be used: EXCLUSIVE_PROCESS is required and not set."""
        mode = self.mode(uuid)
        if _is_exclusive(mode):
            return None
        if not self.required:
            with self._lock:
                warned = uuid in self._warned
                self._warned.add(uuid)
            if not warned:
                log.warning(
                    "GPU %s is in compute mode %s: a container can run outside MPS (and its "
                    "limits) by pointing CUDA at an empty pipe directory; close this with "
                    "--set-exclusive-process (the chart's node.setExclusiveProcess) on an idle "
                    "GPU, or nvidia-smi -i %s -c EXCLUSIVE_PROCESS",
                    uuid,
                    mode,
                    uuid,
                )
            return None
        return (
            f"compute mode of {uuid} is {mode}, not EXCLUSIVE_PROCESS, and the agent runs with "
            f"--require-exclusive-process; fix: nvidia-smi -i {uuid} -c EXCLUSIVE_PROCESS (as an "
            "admin, with no process on the GPU), or drop the flag"
        )

"""A GPU's compute mode, read with nvidia-smi, and whether the agent may use the GPU in it.

In any compute mode but EXCLUSIVE_PROCESS a CUDA process that does not reach the MPS daemon (a
container that points CUDA_MPS_PIPE_DIRECTORY at an empty directory) runs on the GPU directly,
outside every MPS limit (docs/security.md). gpushare never changes the mode: it warns once per
GPU, or, with ``--require-exclusive-process``, refuses the GPU.
"""

import logging
import subprocess
import threading

log = logging.getLogger("gpushare.node.mps.manager")


class ComputeModeGate:
    """Reads compute modes and says why a GPU must not be used. Thread-safe."""

    def __init__(self, *, required: bool, simulated: bool, timeout_s: float) -> None:
        self.required = required
        self.simulated = simulated
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def mode(self, uuid: str) -> str:
        """The GPU's compute mode as nvidia-smi names it (``Default``, ``Exclusive_Process``);
        ``unknown`` when it cannot be read. Read only."""
        if self.simulated:
            return "Default (simulated)"
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        return done.stdout.strip() or "unknown" if done.returncode == 0 else "unknown"

    def refusal(self, uuid: str) -> str | None:
        """Why the GPU must not be used: EXCLUSIVE_PROCESS is required and not set."""
        mode = self.mode(uuid)
        if mode.lower().replace(" ", "_") == "exclusive_process":
            return None
        if not self.required:
            with self._lock:
                warned = uuid in self._warned
                self._warned.add(uuid)
            if not warned:
                log.warning(
                    "GPU %s is in compute mode %s: a container can run outside MPS (and its "
                    "limits) by pointing CUDA at an empty pipe directory; an admin closes this "
                    "with nvidia-smi -i %s -c EXCLUSIVE_PROCESS and --require-exclusive-process",
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

"""The driver's checkpoint API (r570+), by PID, for :mod:`bench.gpu.offload_probe`.

A pause (cgroup freezer) gives a pod's compute back but keeps its GPU memory. Checkpointing a
CUDA process (lock, then checkpoint: the driver finishes its submitted work, copies its device
memory to host and releases the GPU) would give the memory back too, so that a guaranteed pod
that needs the memory would not have to evict it. On an H200 with driver 580.159.04 the lock of
an MPS client fails with CUDA_ERROR_NOT_SUPPORTED (docs/node-agent.md, "Pausing a pod"), and
every gpushare pod is an MPS client, so the product does not use it. This wraps
``cuCheckpointProcess*`` through ``ctypes`` for the probe that measured that; it loads
``libcuda.so.1`` only when first used.
"""

import ctypes
import threading
from enum import IntEnum
from typing import Final

LIBCUDA: Final = "libcuda.so.1"
ARGS_BYTES: Final = 256
"""Room for any of the calls' argument structs (64 bytes today): zeroed, so every reserved
field is 0 as the driver requires."""
DEFAULT_LOCK_TIMEOUT_MS: Final = 10_000
"""How long a lock waits for the process's CUDA calls in flight before it fails."""


class CudaProcessState(IntEnum):
    """``CUprocessState``: where a process's CUDA state is."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class CheckpointError(RuntimeError):
    """A checkpoint call failed; ``code`` is the driver's CUresult (0 where none was made)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class CudaCheckpoint:
    """The driver's checkpoint calls for any process, by PID (one instance per agent)."""

    def __init__(self, library: str = LIBCUDA) -> None:
        self._library = library
        self._lib: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def _cuda(self) -> ctypes.CDLL:
        with self._lock:
            if self._lib is None:
                try:
                    lib = ctypes.CDLL(self._library)
                except OSError as exc:
                    raise CheckpointError(
                        f"cannot load {self._library} ({exc}): the NVIDIA driver's CUDA library "
                        "must be visible to the node agent"
                    ) from exc
                if not hasattr(lib, "cuCheckpointProcessCheckpoint"):
                    raise CheckpointError(
                        f"{self._library} has no checkpoint API: NVIDIA driver 570 or newer "
                        "is needed to give a paused pod's GPU memory back"
                    )
                self._check(lib, lib.cuInit(0), "cuInit")
                self._lib = lib
            return self._lib

    @staticmethod
    def _check(lib: ctypes.CDLL, code: int, call: str, pid: int | None = None) -> None:
        if code == 0:
            return
        name = ctypes.c_char_p()
        lib.cuGetErrorName(code, ctypes.byref(name))
        text = name.value.decode() if name.value else f"CUresult {code}"
        where = f" for process {pid}" if pid is not None else ""
        raise CheckpointError(f"{call}{where} failed: {text}", code)

    def state(self, pid: int) -> CudaProcessState:
        """Where ``pid``'s CUDA state is (CheckpointError for a process without CUDA)."""
        lib = self._cuda()
        out = ctypes.c_int()
        self._check(lib, lib.cuCheckpointProcessGetState(pid, ctypes.byref(out)), "state", pid)
        return CudaProcessState(out.value)

    def _call(self, call: str, pid: int, first_word: int = 0) -> None:
        lib = self._cuda()
        args = (ctypes.c_uint32 * (ARGS_BYTES // 4))()
        args[0] = first_word
        self._check(lib, getattr(lib, call)(pid, ctypes.byref(args)), call, pid)

    def lock(self, pid: int, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        """Block ``pid``'s CUDA calls once those in flight return (at most ``timeout_ms``)."""
        self._call("cuCheckpointProcessLock", pid, timeout_ms)

    def checkpoint(self, pid: int) -> None:
        """Finish ``pid``'s submitted work, copy its device memory to host, release the GPU."""
        self._call("cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int) -> None:
        """Take the GPU again and copy ``pid``'s device memory back to the same addresses."""
        self._call("cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        """Let ``pid``'s CUDA calls run again."""
        self._call("cuCheckpointProcessUnlock", pid)

"""Worker processes and the coordinator's view of them (JSON lines over pipes)."""

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.gpu.worker import EVENT_PREFIX

log = logging.getLogger("bench.gpu")


class WorkerError(RuntimeError):
    """A worker reported an error, exited, or did not answer in time."""


@dataclass(frozen=True)
class Event:
    label: str
    name: str
    fields: dict[str, Any]


@dataclass
class Worker:
    label: str
    proc: subprocess.Popen[str]
    stderr_path: Path
    events: "queue.Queue[Event]" = field(default_factory=queue.Queue)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(
                f"{self.label}: cannot send {msg['cmd']}: {exc}; {self.tail()}"
            ) from exc

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no stderr)"
        return "stderr: " + " | ".join(text[-lines:]) if text else "(empty stderr)"

    def ask_to_quit(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(WorkerError):
                self.send({"cmd": "quit"})

    def close(self, *, timeout_s: float = 15.0) -> None:
        self.ask_to_quit()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Workers:
    """Starts workers and funnels their events into one queue the coordinator waits on."""

    def __init__(self, *, device: str, tiny: bool, log_dir: Path, base_env: dict[str, str]):
        self.device = device
        self.tiny = tiny
        self.log_dir = log_dir
        self.base_env = base_env
        self.all_events: queue.Queue[Event] = queue.Queue()
        self.workers: dict[str, Worker] = {}

    def spawn(self, label: str, *, preload: str = "") -> Worker:
        """Start a worker process; it imports torch (and what kind ``preload`` is built from)
        and then reads commands: a command sent now waits in its pipe, so nothing here waits
        for the import."""
        env = {**os.environ, **self.base_env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        # MPS settings are applied per command by the worker, never inherited by accident.
        for key in list(env):
            if key.startswith("CUDA_MPS_"):
                del env[key]
        cmd = [sys.executable, "-m", "bench.gpu.worker", "--device", self.device, "--label", label]
        if self.tiny:
            cmd.append("--tiny")
        if preload:
            cmd += ["--preload", preload]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
        stderr_path = self.log_dir / f"{safe}.stderr"
        with stderr_path.open("w") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                cwd=os.getcwd(),
            )
        worker = Worker(label=label, proc=proc, stderr_path=stderr_path)
        assert proc.stdout is not None
        threading.Thread(
            target=self._read, args=(worker, proc.stdout), daemon=True, name=f"read-{label}"
        ).start()
        self.workers[label] = worker
        return worker

    def _read(self, worker: Worker, stream: IO[str]) -> None:
        for line in stream:
            if not line.startswith(EVENT_PREFIX):
                continue
            data = json.loads(line[len(EVENT_PREFIX) :])
            ev = Event(worker.label, str(data.pop("event")), data)
            worker.events.put(ev)
            self.all_events.put(ev)
        ev = Event(worker.label, "exit", {"rc": worker.proc.wait()})
        worker.events.put(ev)
        self.all_events.put(ev)

    def expect(self, worker: Worker, name: str, *, timeout_s: float) -> dict[str, Any]:
        """Wait for ``name`` from one worker; errors and exits become WorkerError."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{worker.label}: no {name!r} within {timeout_s:.0f}s")
            try:
                ev = worker.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev.name == name:
                return ev.fields
            if ev.name in ("error", "exit"):
                raise WorkerError(f"{worker.label}: {ev.name} {ev.fields}; {worker.tail()}")

    def start_many(self, labels: list[str], *, timeout_s: float) -> list[Worker]:
        """Spawn workers in parallel and wait until each has imported torch."""
        started = [self.spawn(label) for label in labels]
        for w in started:
            self.expect(w, "imported", timeout_s=timeout_s)
        return started

    def close_all(self) -> None:
        close_together(list(self.workers.values()))
        self.workers.clear()
        # Drop stale events so the next phase starts clean.
        while not self.all_events.empty():
            self.all_events.get_nowait()


def close_together(workers: list[Worker]) -> None:
    """Ask every worker to quit first, then wait: their CUDA teardowns overlap."""
    for w in workers:
        w.ask_to_quit()
    for w in workers:
        w.close()

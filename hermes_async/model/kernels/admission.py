"""Admission of fast paths: each is probed in a child process before this one runs it.

:func:`admit` returns a :class:`Verdict` per path: cached ones from the :class:`VerdictStore`,
the rest probed by :func:`probe_in_child`, which runs them one after another in a child
(:mod:`.child`) and turns whatever happens to it into a verdict: a probe that reports is
admitted or refused on its numbers; one that dies is refused with the signal (``killed by
SIGILL (illegal instruction)``) or exit status and the last words of its log; one that does
not answer within ``timeout_s`` is killed and refused as hung. After a death or a hang the
remaining paths go on in a fresh child. The server process itself never runs an unproven
kernel, so SIGILL, ``std::terminate`` or a deadlock in one becomes a refusal, not a dead server.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from hermes_async.model.kernels.paths import KernelPath, Verdict
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.kernels.store import VerdictStore

log = logging.getLogger("hermes_async.model.kernels")

DEFAULT_TIMEOUT_S = 120.0
SIGNAL_MEANINGS = {"SIGILL": "illegal instruction", "SIGABRT": "aborted",
                   "SIGSEGV": "segmentation fault", "SIGBUS": "bus error",
                   "SIGFPE": "arithmetic error", "SIGKILL": "killed"}


def admit(paths: Sequence[KernelPath], shapes: ProbeShapes, cpu_flags: str, *,
          timeout_s: float = DEFAULT_TIMEOUT_S, fresh: bool = False,
          store: VerdictStore | None = None) -> dict[str, Verdict]:
    """A verdict for each of ``paths`` on ``shapes`` (in their order): from the store unless
    ``fresh``, else probed in a child process and stored."""
    store = store or VerdictStore()
    keys = {p.name: store.key(p, shapes, cpu_flags) for p in paths}
    found: dict[str, Verdict] = {}
    todo = []
    for p in paths:
        cached = None if fresh else store.get(keys[p.name])
        if cached is not None and cached.kind == p.kind:
            found[p.name] = cached
        else:
            todo.append(p)
    if todo:
        log.info("probing %d kernel path(s) in a child process (%s): %s", len(todo),
                 shapes.describe(), ", ".join(p.name for p in todo))
        for verdict in probe_in_child(todo, shapes, timeout_s):
            store.put(keys[verdict.name], verdict)
            found[verdict.name] = verdict
    return {p.name: found[p.name] for p in paths}


def describe_exit(returncode: int) -> str:
    """``killed by SIGILL (illegal instruction)``, ``exited with status 3``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"killed by signal {-returncode}"
        meaning = SIGNAL_MEANINGS.get(name)
        return f"killed by {name}" + (f" ({meaning})" if meaning else "")
    return f"exited with status {returncode}"


def _last_words(log_path: Path, limit: int = 3) -> str:
    """What the child's log says of its death: a C++ exception's ``what()`` or
    ``terminate called ...``, and the innermost Python frame of a fatal signal (faulthandler:
    ``in attend (fake_kernels.py:29)``)."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith(("onednn_verbose", "Extension "))]
    frames = [ln for ln in lines if ln.startswith("File ")]
    words = [ln for ln in lines if not ln.startswith(("File ", "Current thread", "Thread ",
                                                      "Fatal Python error"))][-limit:]
    if frames:  # most recent call first
        where, _, func = frames[0].partition(" in ")
        file, _, line = where.removeprefix("File ").partition(", line ")
        words.append(f"in {func} ({Path(file.strip(chr(34))).name}:{line})")
    return " / ".join(words)[:500]


class _Child:
    """One probe process and the line-reader of its report pipe."""

    def __init__(self, paths: Sequence[KernelPath], shapes: ProbeShapes, log_path: Path) -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.setdefault("ONEDNN_VERBOSE", "1")
        self.log_file = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes_async.model.kernels.child", str(write_fd)],
            stdin=subprocess.PIPE, stdout=self.log_file, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,), env=env)
        os.close(write_fd)
        assert self.proc.stdin is not None
        job = {"shapes": shapes.to_json(), "paths": [p.to_json() for p in paths]}
        try:
            self.proc.stdin.write(json.dumps(job).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.reader = os.fdopen(read_fd, "rb", buffering=0)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.reader, selectors.EVENT_READ)
        self.buffer = b""

    def next_event(self, deadline: float) -> dict[str, object] | None:
        """The next report line, or None at EOF (the child ended) or past ``deadline``
        (then :attr:`timed_out` is set)."""
        self.timed_out = False
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(remaining):
                self.timed_out = True
                return None
            chunk = self.reader.read(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait()
        self.selector.close()
        self.reader.close()
        self.log_file.close()
        return rc


def probe_in_child(paths: Sequence[KernelPath], shapes: ProbeShapes,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Verdict]:
    """Probe ``paths`` in child processes; one verdict per path, in order."""
    todo = list(paths)
    verdicts: dict[str, Verdict] = {}
    with tempfile.TemporaryDirectory(prefix="hermes-probe-") as tmp:
        attempt = 0
        while todo:
            attempt += 1
            log_path = Path(tmp) / f"child-{attempt}.log"
            child = _Child(todo, shapes, log_path)
            current: KernelPath | None = None
            ready = False
            started = time.monotonic()
            deadline = started + timeout_s  # the start-up: importing torch, asking for AMX
            try:
                while todo:
                    event = child.next_event(deadline)
                    if event is None:
                        break
                    if "ready" in event:
                        ready = True
                    elif "start" in event:
                        current = next(p for p in todo if p.name == event["start"])
                        started = time.monotonic()
                        deadline = started + timeout_s
                    elif "done" in event:
                        done = next(p for p in todo if p.name == event["done"])
                        verdicts[done.name] = Verdict(
                            done.name, done.kind, bool(event["ok"]), str(event["reason"]),
                            float(event.get("seconds", 0.0)),  # type: ignore[arg-type]
                            extra=dict(event.get("extra") or {}))  # type: ignore[call-overload]
                        todo.remove(done)
                        current = None
                timed_out = child.timed_out if todo else False
            finally:
                rc = child.close()
            if not todo:
                break
            elapsed = time.monotonic() - started
            if timed_out:
                why = f"hung: no answer within {timeout_s:g} s (killed)"
            else:
                why = describe_exit(rc)
                words = _last_words(log_path)
                if words:
                    why += f": {words}"
            if current is None and ready:  # died between two probes: blame the next one
                current = todo[0]
            if current is None:  # died before its first probe started: every path refused
                for p in todo:
                    verdicts[p.name] = Verdict(p.name, p.kind, False,
                                               f"the probe process failed to start: {why}",
                                               round(elapsed, 3))
                break
            verdicts[current.name] = Verdict(current.name, current.kind, False, why,
                                             round(elapsed, 3))
            todo.remove(current)
    return [verdicts[p.name] for p in paths]

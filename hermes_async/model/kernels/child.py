"""The probe process: ``python -m hermes_async.model.kernels.child FD``.

Reads one job from stdin (JSON: the shapes, the threads, the paths to probe), runs each path's
probe in turn and reports on file descriptor ``FD``, one JSON object per line:
``{"start": name}`` before a probe and ``{"done": name, "ok": ..., "reason": ...}`` after it.
A probe that kills the process (SIGILL, an abort) or hangs never reports ``done``: the parent
(:mod:`.admission`) names the signal or the timeout and goes on in a new process. stdout and
stderr go to a log the parent reads for the last words of a crash (``faulthandler`` writes the
Python stack there). oneDNN's verbose log is on, for the probes that report which
implementation ran.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from typing import TextIO


def _emit(out: TextIO, event: dict[str, object]) -> None:
    out.write(json.dumps(event) + "\n")
    out.flush()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def run_job(job: dict[str, object], out: TextIO) -> None:
    import torch

    from hermes_async.model.cpu_features import current, request_amx
    from hermes_async.model.kernels.paths import KernelPath, NotApplicable, ProbeReport, resolve
    from hermes_async.model.kernels.shapes import ProbeShapes

    shapes = ProbeShapes.from_json(job["shapes"])  # type: ignore[arg-type]
    torch.set_num_threads(max(1, shapes.num_threads))
    amx = request_amx(current())
    _emit(out, {"ready": True, "amx": amx})
    for data in job["paths"]:  # type: ignore[attr-defined]
        path = KernelPath.from_json(data)
        _emit(out, {"start": path.name})
        started = time.perf_counter()
        try:
            report = resolve(path.probe)(shapes, **dict(path.options))
            if not isinstance(report, ProbeReport):
                raise TypeError(f"the probe returned {type(report).__name__}, not a ProbeReport")
            detail = f"; {report.detail}" if report.detail else ""
            if report.ok:
                reason = (f"matches the float64 reference (max error {report.max_error:.2g} "
                          f"<= {report.tolerance:.2g}){detail}")
            else:
                reason = (f"wrong numbers: max error {report.max_error:.3g} against the float64 "
                          f"reference, tolerance {report.tolerance:.2g}{detail}")
            event: dict[str, object] = {"ok": report.ok, "reason": reason,
                                        "extra": {"max_error": report.max_error,
                                                  "tolerance": report.tolerance}}
        except NotApplicable as e:
            event = {"ok": False, "reason": f"not used here: {e}", "extra": {}}
        except Exception as e:  # a refusal: unsupported shape or dtype, a library error
            event = {"ok": False, "reason": f"raised {_first_line(e)}", "extra": {}}
        event.update(done=path.name, seconds=round(time.perf_counter() - started, 3))
        _emit(out, event)


def main(argv: list[str]) -> int:
    faulthandler.enable()
    out = os.fdopen(int(argv[1]), "w", buffering=1)
    job = json.load(sys.stdin)
    run_job(job, out)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

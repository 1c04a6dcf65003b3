"""``hermes-async kernels``: which fast kernels this CPU admits for a model, and why.

Runs (or reads from the cache) the kernel probes that a server start runs for the model and
config (``hermes_async.model.kernels``: each fast path in a child process against a float64
reference) and prints one row per path: admitted, refused with its reason (the signal that
killed it, a hang, an error, wrong numbers) or not used here; then the attention backend and
layer ops a server would take. ``--probe`` probes again instead of reading cached verdicts;
``make setup`` runs it once for the default model, so that the first ``make serve`` pays
nothing.

Exit codes: 0 after the table (refusals are findings, not failures), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hermes_async.config import DTYPE_CHOICES


def register(subparsers: Any) -> None:
    """Add ``kernels`` to the top-level subparsers; it sets ``func=run``."""
    p = subparsers.add_parser(
        "kernels", help="the fast kernels this CPU admits for a model (probed, cached)",
        description="Probe (or read the cached verdicts of) every fast kernel path for the "
                    "model on this CPU and print the table: admitted, refused and why.")
    p.add_argument("--model", help="local Hugging Face directory (default: the config's, else "
                                   "the embedded default model)")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="override model.dtype")
    p.add_argument("--backend", help="override model.attention_backend (e.g. vllm-cpu:vec)")
    p.add_argument("--probe", action="store_true", help="probe again, ignoring cached verdicts")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``hermes-async kernels``."""
    from hermes_async.config import ConfigError, EngineConfig, load

    try:
        cfg = load(args.config) if args.config else EngineConfig()
        overrides: dict[str, Any] = {}
        if args.dtype:
            overrides["dtype"] = args.dtype
        if args.backend:
            overrides["attention_backend"] = args.backend
        if args.model:
            overrides["path"] = args.model
        cfg = cfg.replace(model=overrides) if overrides else cfg
    except (ConfigError, OSError, ValueError) as e:
        print(f"hermes-async kernels: {e}", file=sys.stderr)
        return 2
    from hermes_async.model.kernel_report import kernel_report

    try:
        report = kernel_report(cfg.model, cfg.cache, fresh=args.probe)
    except (OSError, ValueError) as e:
        print(f"hermes-async kernels: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0


def render(report: dict[str, Any]) -> str:
    """The table of :func:`hermes_async.model.kernel_report.kernel_report`."""
    lines = [f"CPU: {report['cpu_kind']} ({report['cpu_flags']}); torch {report['torch']}",
             f"model: {report['model']}",
             f"shapes: {report['shapes']}", ""]
    rows = [("kind", "path", "verdict", "s", "reason")]
    for v in report["verdicts"]:
        verdict = ("admitted" if v["ok"] else
                   "not used" if v["reason"].startswith("not used") else "REFUSED")
        seconds = "cached" if v["cached"] else f"{v['seconds']:.2f}"
        rows.append((v["kind"], v["name"], verdict, seconds, v["reason"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  "
                     + r[4])
    lines += ["", f"attention backend: {report['attention']}",
              f"layer ops: {report['layer_ops']}"]
    return "\n".join(lines)

"""Prompt doctor: offline diagnosis of captured requests against the usual prefix-cache
pitfalls (dynamic fields, low reuse, prompts too short to hit, tool results rendered under
another role).

The parts, one job each:

* :mod:`~hermes_async.observe.doctor_reader`: JSONL lines -> :class:`CapturedPrompt` objects,
  assembled exactly as the server would;
* :mod:`~hermes_async.observe.doctor_roles`: tool-role tags vs ``tool`` messages vs assistant
  tool calls, and tool output rendered as user turns;
* :mod:`~hermes_async.observe.doctor_simulator`: shared prefixes, the simulated block cache and
  the dynamic fields it shows;
* :mod:`~hermes_async.observe.doctor_report`: the report, its findings and advice, the text.

:func:`diagnose` composes them. It takes plain values (the block size, the tokenizer's
``decode``): resolving a model directory is the command line's job. Usage::

    prompts = PromptReader(tokenizer).read(path, namespace_key="user")
    report = diagnose(prompts, block_size=32, decode=tokenizer.decode)
    report.to_dict()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from hermes_async.observe.doctor_reader import CapturedPrompt
from hermes_async.observe.doctor_report import DoctorReport
from hermes_async.observe.doctor_roles import RoleTotals
from hermes_async.observe.doctor_simulator import simulate


def diagnose(prompts: Iterable[CapturedPrompt], *, block_size: int,
             decode: Callable[[Sequence[int]], str], top: int = 10,
             unknown_roles: dict[str, int] | None = None) -> DoctorReport:
    """Simulate the block cache over ``prompts`` (file order) and collect every finding.

    Divergence points carry ``last_seen`` = the line number of their latest request.
    """
    prompts = list(prompts)
    roles = RoleTotals()
    for p in prompts:
        if p.roles is not None:
            roles.add(p.line, p.roles)
    return DoctorReport(
        block_size=block_size, prompts=len(prompts),
        reuse=simulate(prompts, block_size=block_size, decode=decode, top=top),
        roles=roles, unknown_roles=dict(unknown_roles or {}))

"""Prompt doctor: offline diagnosis of captured requests against the seed's pitfalls (seed 5).

Input: JSONL, one captured request per line: an OpenAI chat body (``messages``, optional
``tools`` and ``add_generation_prompt``; other keys ignored) or a raw ``prompt`` (text, tokenized
with ``add_special_tokens`` as ``/v1/completions`` does, or a list of token ids). Each line is
assembled exactly as the server would (:class:`~hermes_async.prompt.PromptAssembler`), then:

* shared prefixes: per prompt, the longest common token prefix with any earlier prompt of its
  namespace, and what a block cache would serve (a real
  :class:`~hermes_async.cache.prefix_tree.PrefixTree` of the block size, no eviction: match,
  then insert the prompt's full blocks); the reusable share is served tokens / prompt tokens;
* dynamic fields: :class:`~hermes_async.observe.divergence.DivergenceDetector` fed with those
  simulated matches, the whole file as its sample window;
* prompts of at most one block (never a hit);
* the role check (seed 2.1 / 5.2): tool-role tags in the rendered prompt vs ``tool`` messages vs
  assistant tool calls, and tool output rendered as user turns.

Usage::

    prompts = PromptReader(tokenizer).read(path, namespace_key="user")
    report = diagnose(prompts, block_size=32, decode=tokenizer.decode)
    report.to_dict()
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.cli_render import is_tool_tag, role_tags  # one definition of a tool tag
from hermes_async.observe.divergence import DivergenceDetector, DivergencePoint
from hermes_async.prompt import ChatTemplate, PromptAssembler, PromptError
from hermes_async.prompt.roles import ROLE_TABLE

_USER_WORDS = tuple(raw for raw, role in ROLE_TABLE.items() if role == "user")
DEFAULT_NAMESPACE = "default"


class DoctorInputError(ValueError):
    """Unreadable input; ``line`` is the 1-based JSONL line at fault, when there is one."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass(frozen=True)
class RoleCheck:
    """Tool-role figures of one rendered chat prompt (seed 5.2: count tool tags vs calls)."""

    tool_messages: int
    tool_calls: int
    tool_tags: int
    user_messages: int
    user_tags: int

    @property
    def problem(self) -> str | None:
        """``tool_as_user``: tool results came out as user turns (no tool tag at all, and the
        extra user tags account for them); ``tool_tags``: tool tags differ from tool messages;
        ``tool_calls``: assistant tool calls differ from tool results; None when consistent."""
        if (self.tool_messages and not self.tool_tags
                and self.user_tags >= self.user_messages + self.tool_messages):
            return "tool_as_user"
        if self.tool_tags != self.tool_messages:
            return "tool_tags"
        if self.tool_calls and self.tool_calls != self.tool_messages:
            return "tool_calls"
        return None


@dataclass(frozen=True)
class CapturedPrompt:
    """One input line as the engine would see it; ``roles`` is None for a raw prompt."""

    line: int
    namespace: str
    token_ids: tuple[int, ...]
    roles: RoleCheck | None = None


class PromptReader:
    """Reads a JSONL capture into :class:`CapturedPrompt` objects with the server's assembly.

    ``template``: a chat template to use instead of the model's own.
    """

    def __init__(self, tokenizer: Any, template: ChatTemplate | None = None) -> None:
        self.tokenizer = tokenizer
        self.assembler = PromptAssembler(tokenizer, template, None)

    def read(self, path: str | Path, namespace_key: str | None = None) -> list[CapturedPrompt]:
        """Every non-blank line of ``path``; raises :class:`DoctorInputError` (with the line
        number) for a line that is not a JSON object with ``messages`` or ``prompt``, or whose
        messages the server would refuse, and for an unreadable file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DoctorInputError(f"cannot read {path}: {e}") from e
        out = []
        for no, raw in enumerate(text.splitlines(), 1):
            if raw.strip():
                out.append(self.parse_line(no, raw, namespace_key))
        return out

    def parse_line(self, no: int, raw: str, namespace_key: str | None) -> CapturedPrompt:
        """One JSONL line (``no`` is its 1-based number)."""
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DoctorInputError(f"invalid JSON: {e}", no) from e
        if not isinstance(obj, dict) or ("messages" in obj) == ("prompt" in obj):
            raise DoctorInputError("expected a JSON object with 'messages' or 'prompt'", no)
        ns = DEFAULT_NAMESPACE
        if namespace_key is not None and obj.get(namespace_key) is not None:
            ns = str(obj[namespace_key])
        try:
            if "prompt" in obj:
                return CapturedPrompt(no, ns, self._raw_prompt(obj["prompt"], obj))
            inspected = self.assembler.inspect(
                obj["messages"], tools=obj.get("tools"),
                add_generation_prompt=bool(obj.get("add_generation_prompt", True)))
        except PromptError as e:
            raise DoctorInputError(f"{e} (param: {e.param})", no) from e
        prompt = inspected.prompt
        tags = role_tags(inspected)
        check = RoleCheck(
            tool_messages=prompt.role_counts.get("tool", 0),
            tool_calls=sum(len(m.tool_calls) for m in inspected.messages),
            tool_tags=sum(n for tag, n in tags.items() if is_tool_tag(tag)),
            user_messages=prompt.role_counts.get("user", 0),
            user_tags=sum(n for tag, n in tags.items() if tag.lower().endswith(_USER_WORDS)))
        return CapturedPrompt(no, ns, prompt.token_ids, check)

    def _raw_prompt(self, prompt: Any, obj: dict[str, Any]) -> tuple[int, ...]:
        if isinstance(prompt, str):
            special = bool(obj.get("add_special_tokens", True))
            ids = tuple(self.tokenizer.encode(prompt, add_special_tokens=special))
        elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
            ids = tuple(prompt)
        else:
            raise PromptError("prompt must be a string or a list of token ids", param="prompt")
        if not ids:
            raise PromptError("the prompt is empty", param="prompt")
        return ids

    def unknown_roles(self) -> dict[str, int]:
        """Unknown raw roles mapped to ``user`` while reading (a tool-role mix-up suspect)."""
        return self.assembler.roles.unknown_role_counts()


@dataclass(frozen=True)
class Distribution:
    """Nearest-rank percentiles of per-prompt token counts."""

    p50: int
    p90: int
    max: int
    mean: float

    @classmethod
    def of(cls, values: Sequence[int]) -> Distribution:
        if not values:
            return cls(0, 0, 0, 0.0)
        v = sorted(values)

        def rank(q: float) -> int:
            return v[max(math.ceil(q * len(v)) - 1, 0)]

        return cls(rank(0.5), rank(0.9), v[-1], round(sum(v) / len(v), 1))


@dataclass(frozen=True)
class RoleFinding:
    """A prompt whose tool roles do not add up."""

    line: int
    problem: str
    check: RoleCheck


@dataclass(frozen=True)
class NamespaceSummary:
    """Per-namespace figures: prompts, tokens, block-cache served tokens, short prompts."""

    prompts: int
    tokens: int
    served_tokens: int
    short_prompts: int

    @property
    def reusable_share(self) -> float:
        return self.served_tokens / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class DoctorReport:
    """Everything the doctor found; :meth:`to_dict` is the ``--json`` document."""

    block_size: int
    prompts: int
    tokens: int
    served_tokens: int
    shared_prefix: Distribution
    served: Distribution
    short_prompt_lines: list[int]
    divergence: list[tuple[str, DivergencePoint, float]]
    role_findings: list[RoleFinding]
    chat_prompts: int
    tool_prompts: int
    tool_messages: int
    tool_calls: int
    tool_tags: int
    unknown_roles: dict[str, int]
    namespaces: dict[str, NamespaceSummary] = field(default_factory=dict)

    @property
    def reusable_share(self) -> float:
        """Served tokens / prompt tokens at the block size (0 without prompts)."""
        return self.served_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "prompts": self.prompts,
            "tokens": self.tokens,
            "served_tokens": self.served_tokens,
            "reusable_share": round(self.reusable_share, 4),
            "shared_prefix_tokens": asdict(self.shared_prefix),
            "served_tokens_per_prompt": asdict(self.served),
            "short_prompts": {"count": len(self.short_prompt_lines),
                              "lines": self.short_prompt_lines},
            "divergence": [{"namespace": ns, **p.to_dict(), "share_of_prefill": round(s, 4)}
                           for ns, p, s in self.divergence],
            "roles": {
                "chat_prompts": self.chat_prompts, "prompts_with_tools": self.tool_prompts,
                "tool_messages": self.tool_messages, "tool_calls": self.tool_calls,
                "tool_tags": self.tool_tags, "unknown_roles": self.unknown_roles,
                "problems": [{"line": f.line, "problem": f.problem, **asdict(f.check)}
                             for f in self.role_findings],
            },
            "namespaces": {ns: {**asdict(s), "reusable_share": round(s.reusable_share, 4)}
                           for ns, s in self.namespaces.items()},
        }


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (binary search over C-speed slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Simulator:
    """The block cache of one file (one tree, a namespace per group) and the sorted earlier
    prompts per namespace: the longest common prefix with any earlier prompt is with a
    neighbour in lexicographic order."""

    def __init__(self, block_size: int, detector: DivergenceDetector) -> None:
        self.tree = PrefixTree(block_size)
        self.detector = detector
        self._blocks = itertools.count()
        self._sorted: dict[str, list[tuple[int, ...]]] = defaultdict(list)

    def feed(self, p: CapturedPrompt) -> tuple[int, int]:
        """``(shared prefix, served tokens)`` of ``p``; then ``p`` joins the cache."""
        ids, bs = p.token_ids, self.tree.block_size
        seen = self._sorted[p.namespace]
        i = bisect.bisect_left(seen, ids)
        shared = max((common_prefix_len(ids, seen[k]) for k in (i - 1, i) if 0 <= k < len(seen)),
                     default=0)
        seen.insert(i, ids)
        match = self.tree.match(p.namespace, ids)
        self.detector.observe(p.namespace, ids, match.matched_len)
        full = len(ids) // bs
        self.tree.insert(p.namespace, ids[match.matched_len:full * bs],
                         [next(self._blocks) for _ in range(full - match.matched_len // bs)],
                         parent=match.last_node)
        return shared, match.matched_len


def diagnose(prompts: Iterable[CapturedPrompt], *, block_size: int,
             decode: Callable[[Sequence[int]], str], top: int = 10,
             unknown_roles: dict[str, int] | None = None) -> DoctorReport:
    """Simulate the block cache over ``prompts`` (file order) and collect every finding.

    Divergence points carry ``last_seen`` = the line number of their latest request.
    """
    prompts = list(prompts)
    line = [0]  # the detector's clock: a point's last_seen is the line of its latest request
    detector = DivergenceDetector(block_size, decode, sample_size=max(len(prompts), 1),
                                  warn_share=1.0, max_points=max(4 * top, 64),
                                  clock=lambda: float(line[0]))
    sim = _Simulator(block_size, detector)
    shared, served = [], []
    per_ns: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    roles: Counter[str] = Counter()
    findings = []
    for p in prompts:
        line[0] = p.line
        s, m = sim.feed(p)
        shared.append(s)
        served.append(m)
        figures = per_ns[p.namespace]
        figures[0] += 1
        figures[1] += len(p.token_ids)
        figures[2] += m
        figures[3] += len(p.token_ids) <= block_size
        if p.roles is not None:
            c = p.roles
            roles.update(chat=1, tools=bool(c.tool_messages or c.tool_calls or c.tool_tags),
                         messages=c.tool_messages, calls=c.tool_calls, tags=c.tool_tags)
            if c.problem is not None:
                findings.append(RoleFinding(p.line, c.problem, c))
    divergence = []
    for ns in detector.namespaces():
        rep = detector.report(ns, top)
        divergence += [(ns, pt, rep.share(pt)) for pt in rep.points]
    divergence.sort(key=lambda d: -d[1].tokens_lost)
    return DoctorReport(
        block_size=block_size, prompts=len(prompts),
        tokens=sum(len(p.token_ids) for p in prompts), served_tokens=sum(served),
        shared_prefix=Distribution.of(shared), served=Distribution.of(served),
        short_prompt_lines=[p.line for p in prompts if len(p.token_ids) <= block_size],
        divergence=divergence[:top], role_findings=findings, chat_prompts=roles["chat"],
        tool_prompts=roles["tools"], tool_messages=roles["messages"], tool_calls=roles["calls"],
        tool_tags=roles["tags"], unknown_roles=dict(unknown_roles or {}),
        namespaces={ns: NamespaceSummary(*f) for ns, f in sorted(per_ns.items())})

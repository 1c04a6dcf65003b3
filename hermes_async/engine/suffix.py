"""Drafts from earlier answers (``speculative.method = "suffix"``): a bounded suffix trie of the
answers a namespace's sequences wrote, shared by its later sequences.

Every suffix of every stored answer, cut to ``depth`` tokens, is a path from the root; a node
counts the stored suffixes through it. A sequence's draft starts at the deepest node its own
tail reaches (the longest match) and follows the most frequent child while the product of the
children's shares (the chance the whole draft is right, by the counts) stays at or above
``min_probability``, and never for more tokens than it matched (a short match earns a short
draft). Answers leave first in, first out once the tree holds more than ``max_answers`` of them
or ``max_tokens`` of their tokens; each namespace has its own tree (tenants never draft from
each other's answers, as with the prefix cache), the least recently used dropped past
``max_namespaces``. Torch-free.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] | None = None


@dataclass(frozen=True, slots=True)
class TreeDraft:
    """A draft from the tree: its tokens, the length of the context it matched and its
    expected number of accepted tokens (the sum of each prefix's probability)."""

    tokens: tuple[int, ...]
    matched: int
    expected: float


class AnswerTree:
    """The suffix trie of one namespace's earlier answers (see the module docstring)."""

    def __init__(self, depth: int, max_answers: int, max_tokens: int,
                 min_probability: float) -> None:
        if depth < 2 or max_answers < 1 or max_tokens < 1 or not 0.0 < min_probability <= 1.0:
            raise ValueError("depth >= 2, max_answers >= 1, max_tokens >= 1 and "
                             "0 < min_probability <= 1 must hold")
        self.depth, self.max_answers, self.max_tokens = depth, max_answers, max_tokens
        self.min_probability = min_probability
        self._root = _Node()
        self._answers: deque[tuple[int, ...]] = deque()
        self.num_tokens = 0  # tokens of the stored answers
        self.num_nodes = 1

    @property
    def num_answers(self) -> int:
        return len(self._answers)

    def add(self, answer: Sequence[int]) -> None:
        """Store one answer (its output tokens), dropping the oldest ones past the bounds."""
        tokens = tuple(answer)[-self.max_tokens:]
        if not tokens:
            return
        self._answers.append(tokens)
        self.num_tokens += len(tokens)
        self._walk(tokens, +1)
        while len(self._answers) > self.max_answers or self.num_tokens > self.max_tokens:
            old = self._answers.popleft()
            self.num_tokens -= len(old)
            self._walk(old, -1)

    def propose(self, context: Sequence[int], k: int, min_match: int = 1) -> TreeDraft | None:
        """Up to ``k`` tokens to follow ``context`` (a sequence's prompt and output), from its
        longest tail of at least ``min_match`` tokens found in the tree; None when none is."""
        longest = min(self.depth - min(k, self.depth // 2), len(context))  # room to draft
        for m in range(longest, max(min_match, 1) - 1, -1):
            node: _Node | None = self._root
            for t in context[len(context) - m:]:
                node = node.children.get(t) if node.children else None  # type: ignore[union-attr]
                if node is None:
                    break
            if node is None or not node.children:
                continue
            tokens, chance, expected = [], 1.0, 0.0
            while node.children and len(tokens) < min(k, m):
                token, child = max(node.children.items(), key=lambda kv: kv[1].count)
                chance *= child.count / node.count
                if chance < self.min_probability:
                    break
                tokens.append(token)
                expected += chance
                node = child
            return TreeDraft(tuple(tokens), m, expected) if tokens else None
        return None

    def _walk(self, tokens: tuple[int, ...], delta: int) -> None:
        """Add (``+1``) or remove (``-1``) every suffix of ``tokens``, cut to ``depth``."""
        for start in range(len(tokens)):
            node = self._root
            node.count += delta
            for t in tokens[start:start + self.depth]:
                if node.children is None:
                    node.children = {}
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                    self.num_nodes += 1
                child.count += delta
                if child.count == 0:  # its last suffix left: so did every node below it
                    self.num_nodes -= _size(child)
                    del node.children[t]
                    break
                node = child


def _size(node: _Node) -> int:
    stack, total = [node], 0
    while stack:
        n = stack.pop()
        total += 1
        if n.children:
            stack.extend(n.children.values())
    return total


class AnswerTrees:
    """One :class:`AnswerTree` per cache namespace, the least recently used dropped past
    ``max_namespaces``."""

    def __init__(self, max_namespaces: int, depth: int, max_answers: int, max_tokens: int,
                 min_probability: float) -> None:
        self.max_namespaces = max_namespaces
        self._args = (depth, max_answers, max_tokens, min_probability)
        self._trees: OrderedDict[str | None, AnswerTree] = OrderedDict()

    def get(self, namespace: str | None) -> AnswerTree | None:
        tree = self._trees.get(namespace)
        if tree is not None:
            self._trees.move_to_end(namespace)
        return tree

    def add(self, namespace: str | None, answer: Sequence[int]) -> None:
        tree = self.get(namespace)
        if tree is None:
            tree = self._trees[namespace] = AnswerTree(*self._args)
            while len(self._trees) > self.max_namespaces:
                self._trees.popitem(last=False)
        tree.add(answer)

    def drop(self, namespace: str | None) -> None:
        """Forget one namespace's tree (None: every tree)."""
        if namespace is None:
            self._trees.clear()
        else:
            self._trees.pop(namespace, None)

    def stats(self) -> dict[str, int]:
        trees = self._trees.values()
        return {"namespaces": len(self._trees), "answers": sum(t.num_answers for t in trees),
                "tokens": sum(t.num_tokens for t in trees),
                "nodes": sum(t.num_nodes for t in trees)}

"""Drafts from earlier answers (``speculative.method = "suffix"``): a bounded suffix trie of the
answers a namespace's sequences wrote, shared by its later sequences.

Every suffix of every stored answer, cut to ``depth`` tokens, is a path from the root; a node
counts the stored suffixes through it. A sequence's draft starts at the deepest node its own
tail reaches (the longest match) and follows the most frequent child while the product of the
children's shares (the chance the whole draft is right, by the counts) stays at or above
``min_probability``, and never for more tokens than it matched (a short match earns a short
draft). Each namespace has its own tree (tenants never draft from each other's answers, as with
the prefix cache) of at most ``max_answers`` answers, first in, first out; all trees together
stay under ``max_bytes`` (``NODE_BYTES`` a node, measured with ``tracemalloc``: about
``depth`` nodes per stored token of text that does not repeat), the oldest answers of any
namespace leaving first. Torch-free.
"""

from __future__ import annotations

from collections import deque
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


NODE_BYTES = 264  # one trie node with its share of its parent's child dict (CPython 3.11)


class AnswerTree:
    """The suffix trie of one namespace's earlier answers (see the module docstring)."""

    def __init__(self, depth: int, max_answers: int, min_probability: float) -> None:
        if depth < 2 or max_answers < 1 or not 0.0 < min_probability <= 1.0:
            raise ValueError("depth >= 2, max_answers >= 1 and 0 < min_probability <= 1 "
                             "must hold")
        self.depth, self.max_answers = depth, max_answers
        self.min_probability = min_probability
        self._root = _Node()
        self._answers: deque[tuple[int, tuple[int, ...]]] = deque()  # (serial, tokens)
        self.num_tokens = 0  # tokens of the stored answers
        self.num_nodes = 1

    @property
    def num_answers(self) -> int:
        return len(self._answers)

    @property
    def oldest(self) -> int | None:
        """The serial number of the oldest stored answer (None: empty)."""
        return self._answers[0][0] if self._answers else None

    def add(self, answer: Sequence[int], serial: int = 0) -> None:
        """Store one answer (its output tokens), dropping the oldest past ``max_answers``."""
        tokens = tuple(answer)
        if not tokens:
            return
        self._answers.append((serial, tokens))
        self.num_tokens += len(tokens)
        self._walk(tokens, +1)
        while len(self._answers) > self.max_answers:
            self.pop_oldest()

    def pop_oldest(self) -> None:
        """Forget the oldest stored answer."""
        _, old = self._answers.popleft()
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
    """One :class:`AnswerTree` per cache namespace, all of them under ``max_bytes``."""

    def __init__(self, max_bytes: int, depth: int, max_answers: int,
                 min_probability: float) -> None:
        self.max_bytes = max_bytes
        self._args = (depth, max_answers, min_probability)
        self._trees: dict[str, AnswerTree] = {}
        self._order: deque[tuple[int, str]] = deque()  # (serial, namespace), oldest first
        self._serial = 0

    @property
    def num_bytes(self) -> int:
        return NODE_BYTES * sum(t.num_nodes for t in self._trees.values())

    def get(self, namespace: str) -> AnswerTree | None:
        return self._trees.get(namespace)

    def add(self, namespace: str, answer: Sequence[int]) -> None:
        tree = self._trees.get(namespace)
        if tree is None:
            tree = self._trees[namespace] = AnswerTree(*self._args)
        self._serial += 1
        tree.add(answer, self._serial)
        self._order.append((self._serial, namespace))
        while self._order and self.num_bytes > self.max_bytes:
            serial, ns = self._order.popleft()
            old = self._trees.get(ns)
            if old is not None and old.oldest == serial:  # else it already left its tree
                old.pop_oldest()
                if not old.num_answers:
                    del self._trees[ns]
        stored = sum(t.num_answers for t in self._trees.values())
        if len(self._order) > 2 * stored + 64:  # answers that left by max_answers or drop
            self._order = deque(sorted((serial, ns) for ns, t in self._trees.items()
                                       for serial, _ in t._answers))

    def drop(self, namespace: str | None) -> None:
        """Forget one namespace's tree (None: every tree)."""
        if namespace is None:
            self._trees.clear()
            self._order.clear()
        else:
            self._trees.pop(namespace, None)  # its entries in the order are skipped later

    def stats(self) -> dict[str, int]:
        trees = self._trees.values()
        return {"namespaces": len(self._trees), "answers": sum(t.num_answers for t in trees),
                "tokens": sum(t.num_tokens for t in trees),
                "nodes": sum(t.num_nodes for t in trees), "bytes": self.num_bytes}

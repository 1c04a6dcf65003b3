"""Attention backends that misbehave inside their kernel, for the probe tests: one dies of
SIGILL, one aborts (as ``std::terminate`` does), one hangs, one computes wrong numbers. Each
is the torch reference with a fault in ``attend``; named in ``model.attention_backend`` by
import path (``tests.model.fake_kernels:SigillBackend``), as a user's own backend would be."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

import torch

from hermes_async.model.attention import AttentionBackend, AttentionPlan, Ordering, TorchBackend
from hermes_async.step import SequenceStep


class _FaultyPlan(AttentionPlan):
    def __init__(self, inner: AttentionPlan, fault: str) -> None:
        self.inner, self.fault = inner, fault

    def attend(self, kv: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, scale: float, window: int | None,
               softcap: float | None = None) -> torch.Tensor:
        out = self.inner.attend(kv, q, k, v, scale, window)
        if self.fault == "sigill":
            os.kill(os.getpid(), signal.SIGILL)
        elif self.fault == "abort":
            os.abort()
        elif self.fault == "hang":
            time.sleep(3600)
        elif self.fault == "wrong":
            out = out + 0.25
        return out


class _FaultyBackend(AttentionBackend):
    fault = ""
    kv_layout = "nhd"

    def __init__(self, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        self.inner = TorchBackend(block_size, torch.device("cpu"))

    def order(self, steps: Sequence[SequenceStep]) -> Ordering:
        return self.inner.order(steps)

    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> AttentionPlan:
        return _FaultyPlan(self.inner.plan(packed, slot_mapping, ordering), self.fault)


class SigillBackend(_FaultyBackend):
    name = "fake-sigill"
    fault = "sigill"


class AbortBackend(_FaultyBackend):
    name = "fake-abort"
    fault = "abort"


class HangBackend(_FaultyBackend):
    name = "fake-hang"
    fault = "hang"


class WrongBackend(_FaultyBackend):
    name = "fake-wrong"
    fault = "wrong"


class HonestBackend(_FaultyBackend):
    """No fault: the reference under another name (a probe that passes)."""

    name = "fake-honest"


FAKES = ",".join(f"tests.model.fake_kernels:{c.__name__}"
                 for c in (SigillBackend, AbortBackend, HangBackend, WrongBackend))

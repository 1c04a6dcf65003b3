"""The model runner: loads a model, owns the KV pool, executes packed steps.

The only place (with the rest of ``hermes_async.model``) that imports torch. The engine hands
it a sequence of :class:`~hermes_async.step.SequenceStep` per forward pass; the runner packs
every sequence's new tokens into one flat batch (decodes first, then prefill chunks), runs one
forward, and returns the logits of each sequence's last new token in the order given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.attention import NATIVE_SCHEMES, select_for_config
from hermes_async.model.dtype import resolve_dtype
from hermes_async.model.host_memory import keep_freed_memory, return_freed_memory
from hermes_async.model.kernels.paths import LAYER_OP
from hermes_async.model.kv_pool import KVPool, plan_num_blocks
from hermes_async.model.loader import DTYPES, load_model
from hermes_async.model.quant.apply import GGUF, QuantReport, quantize_model, to_kernel_layout
from hermes_async.model.quant.smooth import ActivationRecorder, calibration_sequences
from hermes_async.model.quant.weights import PAIRS, ROWS, W8A8
from hermes_async.model.slots import positions_and_slots
from hermes_async.model.tokenizer import load_tokenizer
from hermes_async.step import SequenceStep

log = logging.getLogger("hermes_async.model")


class StepError(ValueError):
    """A step description the runner cannot execute (bad block table, too long, empty)."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else as torch spells it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


class ModelRunner:
    """Executes forward steps of one model over its paged KV pool."""

    def __init__(self, model_dir: str | Path, model_config: ModelConfig | None = None,
                 cache_config: CacheConfig | None = None) -> None:
        self.model_config = model_config or ModelConfig()
        self.cache_config = cache_config or CacheConfig()
        if self.model_config.num_threads:
            torch.set_num_threads(self.model_config.num_threads)
        self.device = resolve_device(self.model_config.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.dtype_name, self.dtype_reason = resolve_dtype(self.model_config.dtype, self.device)
        if self.dtype_name == "float16" and self.device.type == "cpu":
            raise ValueError("float16 is supported on CUDA only; use bfloat16 on the CPU")
        log.info("model dtype: %s", self.dtype_reason)
        self.dtype = DTYPES[self.dtype_name]
        self.model_dir = Path(model_dir)
        self.model = load_model(self.model_dir, self.dtype_name, self.device,
                                self.model_config.quantization)
        spec = self.spec = self.model.spec
        choice = select_for_config(self.model_config, self.cache_config, spec, self.dtype,
                                   self.device)
        self.attention, self.attention_reason = choice.backend, choice.reason
        self.block_size = choice.block_size
        self.kernel_verdicts = choice.verdicts
        self.layer_op_parts = self._wanted_parts(choice.layer_op_parts)
        log.info("attention backend: %s", self.attention_reason)
        self.max_model_len = min(self.model_config.max_model_len or spec.max_position_embeddings,
                                 spec.max_position_embeddings)
        shape = plan_num_blocks(
            num_layers=spec.num_layers, block_size=self.block_size,
            num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, dtype=self.dtype,
            device=self.device, kv_cache_bytes=self.cache_config.kv_cache_bytes,
            memory_fraction=self.cache_config.kv_cache_memory_fraction,
        )
        self.pool = KVPool(shape, self.device, self.attention.kv_layout)
        self.graphs = None  # (W8A8's calibration runs forwards before the graphs exist)
        self.quantization = None
        if self.model_config.quantization == GGUF:
            self.quantization = self._blocks_to_kernels(self.layer_op_parts)
            log.info("quantization: %s", self.quantization.describe())
        elif self.model_config.quantization != "none":
            layout = PAIRS if self._pairs_layout(self.layer_op_parts) else ROWS
            maxima = self._calibrate() if self.model_config.quantization == W8A8 else None
            self.quantization = quantize_model(self.model, self.model_config.quantization,
                                               layout, maxima)
            log.info("quantization: %s", self.quantization.describe())
        prepared = self.attention.prepare_weights(self.model, self.dtype, self.layer_op_parts)
        if prepared:
            log.info("weights: %s", prepared)
        self.model.ops = self.attention.layer_ops(spec, self.dtype, self.model.matmul_weights(),
                                                  self.layer_op_parts)
        # a tied table's lookup reads the GEMV's copy once released (ops.embedding)
        released = self.model.ops.release_float_weights()
        if released:
            return_freed_memory()
            log.info("weights: %.0f MiB of loaded float weights released (read through the "
                     "kernels' own copies)", released / 2**20)
        refused = [f"{v.name} ({v.reason})" for v in choice.verdicts
                   if v.kind == LAYER_OP and not v.ok]
        log.info("layer ops: %s%s", self.model.ops.name,
                 f"; not used: {'; '.join(refused)}" if refused else "")
        # CUDA graphs of decode batches (model/cuda_graphs.py): flashinfer on CUDA only; they
        # keep the pool's last block as scratch (num_blocks leaves it out)
        self.graphs = None
        if self.device.type == "cuda":
            from hermes_async.model.cuda_graphs import maybe_capture

            self.graphs = maybe_capture(self)

    def _wanted_parts(self, parts: frozenset[str]) -> frozenset[str]:
        """The admitted layer ops the config asks for: W4A8 / W8A8 only with ``activations =
        int8`` (logged where asked and not admitted)."""
        from hermes_async.model.attention.native_cpu import NATIVE_A8

        if self.model_config.activations != "int8":
            return parts - set(NATIVE_A8)
        if not parts & set(NATIVE_A8):
            why = [f"{v.name}: {v.reason}" for v in self.kernel_verdicts if v.name in NATIVE_A8]
            log.warning("activations = int8: no int8-activation kernel here (%s); the "
                        "activations stay float",
                        "; ".join(why) or f"{self.attention.name} has none")
        return parts

    def _calibrate(self) -> dict[int, torch.Tensor]:
        """Each float linear's input channel maxima over the calibration sequences
        (:mod:`.quant.smooth`), through the plain ops, for W8A8's smoothing."""
        try:
            tokenizer = load_tokenizer(self.model_dir)
        except Exception as e:  # noqa: BLE001 - no usable tokenizer here: random ids only
            log.info("W8A8 calibration without the text (no tokenizer: %s)", e)
            encode = None
        else:
            def encode(text: str) -> list[int]:
                return list(tokenizer(text, add_special_tokens=True)["input_ids"])
        recorder = ActivationRecorder(self.model.ops)
        self.model.ops = recorder
        start = time.perf_counter()
        try:
            for ids in calibration_sequences(encode, self.spec.vocab_size):
                ids = ids[:self.max_model_len]
                blocks = tuple(range(-(-len(ids) // self.block_size)))
                if ids and len(blocks) <= self.pool.num_blocks:
                    with torch.no_grad():
                        self.forward([SequenceStep(blocks, 0, tuple(ids))])
        finally:
            self.model.ops = recorder._ops
        log.info("W8A8 calibration: %d linears' input maxima in %.1f s", len(recorder.maxima),
                 time.perf_counter() - start)
        return recorder.maxima

    def _blocks_to_kernels(self, parts: frozenset[str]) -> QuantReport:
        """A GGUF's blocks (read by the loader in the rows layout) moved into the pairs layout
        of the int8 / int4 kernels that were admitted; the loader's report, its layout set."""
        from hermes_async.model.attention.native_cpu import NATIVE_INT4, NATIVE_INT8

        report = self.model.quant_report
        assert report is not None
        kernels = {"int8": NATIVE_INT8, "int4": NATIVE_INT4}
        schemes = frozenset(s for s, kernel in kernels.items()
                            if kernel in parts and self.device.type == "cpu")
        moved = to_kernel_layout(self.model, schemes)
        table = self.model.quantized_embed  # packed bytes, the untied table's blocks too
        report.bytes_after = (sum(q.nbytes for q in self.model.quantized_weights())
                              + (table.nbytes if table is not None else 0))
        if moved:
            report.layout = (PAIRS if moved == report.quantized
                             else f"{PAIRS} for {moved}, {ROWS} for the rest")
        return report

    def _pairs_layout(self, parts: frozenset[str]) -> bool:
        """Whether the quantized weights go to our GEMV (``int8_gemv`` / ``int4_gemv``:
        admitted by its probe in this dtype, on the CPU)."""
        from hermes_async.model.attention.native_cpu import NATIVE_INT4, NATIVE_INT8

        scheme = self.model_config.quantization
        if scheme not in NATIVE_SCHEMES:  # W8A8: oneDNN prepacks its own
            return False
        kernel = NATIVE_INT8 if scheme == "int8" else NATIVE_INT4
        return kernel in parts and self.device.type == "cpu"

    @property
    def num_blocks(self) -> int:
        """Blocks the engine may use: the pool's, less the CUDA graphs' scratch block."""
        return self.pool.num_blocks - (0 if self.graphs is None else 1)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def forward(self, steps: Sequence[SequenceStep]) -> torch.Tensor:
        """Run one packed forward; return float32 logits in step order: one row per step (its
        last new token), or, for a step with drafts, one for each of its last ``1 +
        num_drafts`` tokens (``[sum of those, vocab]``: ``[len(steps), vocab]`` without drafts).

        Each step's new tokens have their K/V written into the pool at the slots its block
        table names; positions before ``start_pos`` are read from the pool as they are.
        """
        if not steps:
            raise StepError("a step needs at least one sequence")
        for i, s in enumerate(steps):
            self._validate(i, s)
        ordering = self.attention.order(steps)
        order = ordering.indices
        packed = [steps[i] for i in order]
        input_ids: list[int] = []
        last: list[int] = []
        for s in packed:
            input_ids.extend(s.token_ids)
            last.append(len(input_ids) - 1)
        positions, slots = positions_and_slots(packed, self.block_size)
        dev = self.device
        inverse = [0] * len(order)  # packed index of each step
        for packed_idx, original in enumerate(order):
            inverse[original] = packed_idx
        if self.graphs is not None and self.graphs.can_run(packed):  # replay a decode graph
            logits = self.graphs.run(packed, input_ids, positions, slots)  # packed order
            return logits[torch.tensor(inverse, dtype=torch.long, device=dev)]
        plan = self.attention.plan(packed, slots.to(dev), ordering)
        # the LM head reads each step's last token (and its drafts' positions) in step order:
        # no gather of the logits
        rows = [r for i, p in enumerate(inverse)
                for r in range(last[p] - steps[i].num_drafts, last[p] + 1)]
        logits_indices = torch.tensor(rows, dtype=torch.long, device=dev)
        return self.model(torch.tensor(input_ids, dtype=torch.long, device=dev),
                          positions.to(dev), plan, self.pool, logits_indices)

    def _validate(self, i: int, s: SequenceStep) -> None:
        if not s.token_ids:
            raise StepError(f"sequence {i}: no new tokens")
        if s.draft_sampling and (s.sampling is None or s.num_drafts >= len(s.token_ids)):
            raise StepError(f"sequence {i}: {s.num_drafts} drafts need sampling and a token "
                            f"before them")
        if s.start_pos < 0:
            raise StepError(f"sequence {i}: negative start_pos {s.start_pos}")
        if s.context_len > self.max_model_len:
            raise StepError(f"sequence {i}: {s.context_len} tokens exceed max_model_len "
                            f"{self.max_model_len}")
        need = -(-s.context_len // self.block_size)
        if len(s.block_table) < need:
            raise StepError(f"sequence {i}: block table has {len(s.block_table)} blocks, "
                            f"{s.context_len} tokens need {need}")
        for b in s.block_table[:need]:
            if not 0 <= b < self.num_blocks:
                raise StepError(f"sequence {i}: block id {b} outside the pool "
                                f"[0, {self.num_blocks})")

"""The CUDA path: the ``flashinfer`` attention backend and CUDA graphs of decode batches.

Three kinds of check:
- CPU, always: the backend module imports without flashinfer (lazy import) and refuses what it
  cannot run (the CPU, float32); the config switch.
- CPU, always: the backend's plumbing (page tables, slot writes, decode/prefill row split,
  windows, one wrapper per window) and the CUDA graphs' padded static-buffer path, through the
  runner, against the reference backend, with :class:`StandInFlashInfer` standing in for
  flashinfer: a plain-torch implementation of the two wrappers as FlashInfer documents them
  (NHD paged K/V, CSR page tables, causal mask aligned to the end of the context, inclusive
  ``window_left``). It checks our use of the API, not FlashInfer's kernels.
- CUDA only (skipped with "no CUDA device" where ``torch.cuda.is_available()`` is False, as on
  this project's CPU machines): the real kernels against the reference backend, graph replay
  against eager decoding, and auto selection. ``scripts/device_check.sh`` runs them.
The parity of the flashinfer backend with transformers is the shared suite
(test_runner_parity.py, test_default_model_parity.py), which includes it on CUDA.
"""

from __future__ import annotations

import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from hermes_async.config import CacheConfig, ConfigError, ModelConfig
from hermes_async.model.attention import BackendUnavailable, select_backend
from hermes_async.model.attention import flashinfer_cuda as fic
from hermes_async.model.cuda_graphs import BATCH_BUCKETS, DecodeGraphs
from hermes_async.model.runner import ModelRunner
from hermes_async.model.spec import read_spec
from hermes_async.step import SequenceStep
from tests.model.conftest import BlockAllocator, flashinfer_imports, make_runner

CPU = torch.device("cpu")
HEAD_DIM = 64  # the default model's head size: on CUDA the tests share its compiled kernels

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
needs_flashinfer = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashinfer_imports()),
    reason="no CUDA device" if not torch.cuda.is_available() else "flashinfer not installed")


def prompt(n: int, seed: int, vocab: int = 320) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def blocks_for(n_tokens: int, bs: int) -> int:
    return -(-n_tokens // bs)


def next_token(ids: list[int]) -> int:
    return 3 + (ids[-1] * 7 + 1) % 300  # inside the tiny models' vocabulary


def decode_steps(batch) -> list[SequenceStep]:
    """One decode step for each ``[table, ids]`` of ``batch``; appends the token fed."""
    steps = []
    for seq in batch:
        table, ids = seq
        steps.append(SequenceStep(table, len(ids), (next_token(ids),)))
        seq[1] = ids + [next_token(ids)]
    return steps


# --- CPU: lazy import, refusals, config -------------------------------------------------------

def test_the_backend_module_imports_without_flashinfer():
    code = ("import sys, hermes_async.model.attention.flashinfer_cuda, hermes_async.model.runner,"
            " hermes_async.model.cuda_graphs; assert 'flashinfer' not in sys.modules, 'eager'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_flashinfer_on_the_cpu_refuses(tiny_models):
    spec = read_spec(tiny_models("llama", HEAD_DIM))
    with pytest.raises(BackendUnavailable, match="CUDA only"):
        select_backend("flashinfer", spec, 32, torch.bfloat16, CPU)
    auto = select_backend("auto", spec, 32, torch.bfloat16, CPU)
    assert auto.backend.name != "flashinfer"


def test_flashinfer_refuses_float32_before_anything_else():
    with pytest.raises(BackendUnavailable, match="float16 or bfloat16"):
        fic.FlashInferBackend(32, 4, 2, HEAD_DIM, torch.float32, torch.device("cuda"), [None])


def test_a_missing_or_broken_flashinfer_is_named(tmp_path, monkeypatch):
    with pytest.raises(BackendUnavailable, match=r"not installed.*\[gpu\]"):
        fic.import_flashinfer("flashinfer_missing_here")
    (tmp_path / "broken_fi").mkdir()
    (tmp_path / "broken_fi" / "__init__.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendUnavailable, match="does not import: ModuleNotFoundError"):
        fic.import_flashinfer("broken_fi")


def test_cuda_graphs_switch_is_a_bool():
    assert ModelConfig().cuda_graphs is False  # off until it has run on a GPU
    assert ModelConfig(cuda_graphs=True).cuda_graphs is True
    with pytest.raises(ConfigError, match="cuda_graphs"):
        ModelConfig(cuda_graphs="yes")  # type: ignore[arg-type]


def test_page_tables_and_windows():
    steps = [SequenceStep((7, 3, 9), 40, (1,)), SequenceStep((4,), 0, tuple(range(16)))]
    indptr, indices, last = fic.page_table(steps, 16, pad_rows=2, pad_block=99)
    assert indptr.tolist() == [0, 3, 4, 5, 6] and indices.tolist() == [7, 3, 9, 4, 99, 99]
    assert last.tolist() == [9, 16, 1, 1] and indptr.dtype == torch.int32
    assert fic.qo_indptr(steps).tolist() == [0, 1, 17]
    assert fic.window_left(None) == -1 and fic.window_left(40) == 39


def test_buckets_cover_the_default_batch_limit():
    from hermes_async.config import SchedulerConfig

    assert BATCH_BUCKETS[-1] >= SchedulerConfig().max_num_seqs


# --- CPU: the plumbing, with a stand-in for flashinfer ---------------------------------------

class _Wrapper:
    """FlashInfer's paged wrappers as documented, in plain torch (float32 math)."""

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend="auto"):
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.graph = use_cuda_graph
        self.buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer,
                        paged_kv_last_page_len_buffer)
        self.plans = 0

    def _plan(self, indptr, indices, last, page_size, window_left, q_data_type, kv_data_type,
              sm_scale, pos_encoding_mode):
        assert indptr.dtype == indices.dtype == last.dtype == torch.int32
        assert pos_encoding_mode == "NONE" and q_data_type == kv_data_type
        assert int(last.min()) >= 1 and int(last.max()) <= page_size
        if self.graph:  # the real one copies into the fixed buffers; run() reads them back
            b_indptr, b_indices, b_last = self.buffers
            assert len(b_last) == len(last), "batch size is fixed in graph mode"
            b_indptr.copy_(indptr)
            b_last.copy_(last)
            b_indices[:len(indices)].copy_(indices)
        else:
            self.buffers = (indptr, indices, last)
        self.page_size, self.window_left, self.sm_scale = page_size, window_left, sm_scale
        self.dtype = q_data_type
        self.plans += 1

    def _context(self, cache, i):
        indptr, indices, last = self.buffers
        pages = indices[int(indptr[i]):int(indptr[i + 1])].long()
        n = (len(pages) - 1) * self.page_size + int(last[i])
        return cache[pages].flatten(0, 1)[:n].float()  # [n, kvh, d]

    def _attend(self, q, keys, values, q_pos):
        """q [r, H, d] at absolute positions q_pos; keys/values [n, kvh, d]."""
        group = q.shape[1] // keys.shape[1]
        k = keys.repeat_interleave(group, dim=1)
        v = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("rhd,nhd->hrn", q.float(), k) * self.sm_scale
        k_pos = torch.arange(keys.shape[0])[None, :]
        allowed = k_pos <= q_pos[:, None]
        if self.window_left >= 0:
            allowed &= k_pos >= q_pos[:, None] - self.window_left
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        return torch.einsum("hrn,nhd->rhd", scores.softmax(-1), v)

    def _run(self, q, kv, out, rows):
        k_cache, v_cache = kv
        assert q.dtype == self.dtype and q.is_contiguous() and out.is_contiguous()
        for i, (s, e) in enumerate(rows):
            keys, values = self._context(k_cache, i), self._context(v_cache, i)
            q_pos = torch.arange(keys.shape[0] - (e - s), keys.shape[0])
            out[s:e] = self._attend(q[s:e], keys, values, q_pos).to(out.dtype)
        return out


class _Decode(_Wrapper):
    def plan(self, indptr, indices, last, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode, window_left, q_data_type, kv_data_type, sm_scale):
        self._plan(indptr, indices, last, page_size, window_left, q_data_type, kv_data_type,
                   sm_scale, pos_encoding_mode)

    def run(self, q, kv, out):
        return self._run(q, kv, out, [(i, i + 1) for i in range(len(self.buffers[2]))])


class _Prefill(_Wrapper):
    def plan(self, qo_indptr, indptr, indices, last, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, causal, pos_encoding_mode, window_left, q_data_type, kv_data_type,
             sm_scale):
        assert causal and qo_indptr.dtype == torch.int32
        self.qo = qo_indptr.tolist()
        self._plan(indptr, indices, last, page_size, window_left, q_data_type, kv_data_type,
                   sm_scale, pos_encoding_mode)

    def run(self, q, kv, out):
        assert self.qo[-1] == q.shape[0]
        return self._run(q, kv, out, list(zip(self.qo[:-1], self.qo[1:], strict=True)))


StandInFlashInfer = SimpleNamespace(__version__="stand-in",
                                    BatchDecodeWithPagedKVCacheWrapper=_Decode,
                                    BatchPrefillWithPagedKVCacheWrapper=_Prefill)


def cpu_runner(path, backend: str, block_size: int = 16) -> ModelRunner:
    """A float32 runner on the CPU (the stand-in's math is float32: compared at 1e-3)."""
    return ModelRunner(path, ModelConfig(dtype="float32", device="cpu",
                                         attention_backend=backend),
                       CacheConfig(block_size=block_size, kv_cache_bytes=4 << 20))


@pytest.fixture
def stand_in(monkeypatch):
    """flashinfer replaced by :data:`StandInFlashInfer`, allowed on the CPU and in float32
    (its math is float32), so the plumbing is compared with the reference at 1e-3."""
    monkeypatch.setattr(fic, "import_flashinfer", lambda: StandInFlashInfer)
    monkeypatch.setattr(fic, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(fic, "SUPPORTED_DTYPES", (torch.float16, torch.bfloat16, torch.float32))
    monkeypatch.setattr(fic, "WORKSPACE_BYTES", 1 << 10)


def mixed_steps(runners, bs: int, seed: int) -> list[SequenceStep]:
    """Decodes (after histories, some past mistral's window of 40) and prefill chunks (fresh
    and after cached blocks), their earlier tokens written through every runner alike."""
    alloc = BlockAllocator(runners[0].num_blocks, seed=seed)
    decodes, prefills = [], []
    for i, n in enumerate((5, bs, 17, 47, 70)):
        ids = prompt(n + 1, seed=100 + i + seed)
        table = tuple(alloc.take(blocks_for(n + 1, bs)))
        for r in runners:
            r.forward([SequenceStep(table, 0, tuple(ids[:n]))])
        decodes.append(SequenceStep(table, n, (ids[n],)))
    for i, (n, cached) in enumerate(((23, 0), (2 * bs + 22, 2), (bs + 50, 1))):
        ids = prompt(n, seed=200 + i + seed)
        table = tuple(alloc.take(blocks_for(n, bs)))
        if cached:
            for r in runners:
                r.forward([SequenceStep(table, 0, tuple(ids[:cached * bs]))])
        prefills.append(SequenceStep(table, cached * bs, tuple(ids[cached * bs:])))
    return [decodes[0], prefills[0], decodes[1], decodes[2], prefills[1], decodes[3],
            prefills[2], decodes[4]]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_the_backend_plumbing_equals_the_reference(stand_in, tiny_models, arch):
    path = tiny_models(arch, HEAD_DIM)
    ours, ref = cpu_runner(path, "flashinfer"), cpu_runner(path, "torch")
    assert ours.attention.name == "flashinfer" and ours.dtype_name == "float32"
    assert ours.graphs is None  # graphs are captured on CUDA only
    windows = set(ours.spec.sliding_windows)
    assert set(ours.attention.windows) == {fic.window_left(w) for w in windows}
    steps = mixed_steps([ours, ref], 16, seed=1)
    got, want = ours.forward(steps), ref.forward(steps)
    assert (got - want).abs().max().item() < 1e-3
    for step in (steps[1], steps[0]):  # a prefill alone, a decode alone
        assert (ours.forward([step]) - ref.forward([step])).abs().max().item() < 1e-3


def test_the_graph_path_pads_into_the_scratch_block_only(stand_in, tiny_models):
    """DecodeGraphs without capture (the same static buffers, padding and re-planning as a
    replay) equals eager decoding, and padding rows touch the scratch block alone."""
    path = tiny_models("mistral", HEAD_DIM)
    graphed, eager = cpu_runner(path, "flashinfer"), cpu_runner(path, "flashinfer")
    graphed.graphs = DecodeGraphs(graphed.model, graphed.pool, graphed.attention,
                                  graphed.max_model_len, graphed.pool.num_blocks - 1,
                                  buckets=(1, 4, 8), capture=False)
    assert graphed.num_blocks == eager.num_blocks - 1
    alloc = BlockAllocator(graphed.num_blocks, seed=5)
    seqs = []
    for i, n in enumerate((3, 15, 16, 40, 63)):
        ids = prompt(n, seed=700 + i)
        table = tuple(alloc.take(blocks_for(n + 12, 16)))
        for r in (graphed, eager):
            r.forward([SequenceStep(table, 0, tuple(ids))])
        seqs.append([table, ids])
    for step in range(12):  # batches of 1, 3 (bucket 4), 5 (bucket 8), across block edges
        steps = decode_steps(seqs[: (1, 3, 5)[step % 3]])
        before = graphed.graphs.replays
        got, want = graphed.forward(steps), eager.forward(steps)
        assert graphed.graphs.replays == before + 1
        assert (got - want).abs().max().item() < 1e-3, step
    real = slice(0, graphed.num_blocks)  # every block but the scratch one: as if eager
    assert torch.allclose(graphed.pool.tensor[:, :, real], eager.pool.tensor[:, :, real],
                          atol=1e-5)
    assert graphed.pool.tensor[:, :, -1].abs().sum() > 0  # the padding went there
    mixed = [SequenceStep(seqs[0][0], len(seqs[0][1]), (5,)),
             SequenceStep(tuple(alloc.take(2)), 0, tuple(prompt(20, seed=9)))]
    before = graphed.graphs.replays
    assert (graphed.forward(mixed) - eager.forward(mixed)).abs().max().item() < 1e-3
    assert graphed.graphs.replays == before  # a prefill in the step: eager


# --- CUDA only: the real kernels, graph replay ------------------------------------------------

@needs_flashinfer
def test_auto_picks_flashinfer_on_cuda_and_float32_falls_back(tiny_models):
    spec = read_spec(tiny_models("llama", HEAD_DIM))
    cuda = torch.device("cuda")
    choice = select_backend("auto", spec, 32, torch.bfloat16, cuda)
    assert choice.backend.name == "flashinfer" and choice.reason == "flashinfer (auto)"
    choice = select_backend("auto", spec, 32, torch.float32, cuda)
    assert choice.backend.name == "torch" and "float16 or bfloat16" in choice.reason


@needs_flashinfer
@pytest.mark.parametrize(("arch", "dtype"), [  # no bfloat16 window: one JIT module fewer
    ("llama", "float16"), ("mistral", "float16"), ("llama", "bfloat16")])
def test_flashinfer_kernels_equal_the_reference_on_cuda(tiny_models, arch, dtype):
    path = tiny_models(arch, HEAD_DIM)
    ours = make_runner(path, block_size=16, dtype=dtype, backend="flashinfer",
                       cuda_graphs=False)
    ref = make_runner(path, block_size=16, dtype=dtype, backend="torch")
    steps = mixed_steps([ours, ref], 16, seed=2)
    got, want = ours.forward(steps), ref.forward(steps)
    tol = (1e-2 if dtype == "float16" else 8e-2) * want.abs().max().item()
    assert (got - want).abs().max().item() < tol


@needs_flashinfer
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_graph_replay_equals_eager_decoding(tiny_models, dtype):
    path = tiny_models("llama", HEAD_DIM)
    graphed = make_runner(path, block_size=8, dtype=dtype, backend="flashinfer")
    eager = make_runner(path, block_size=8, dtype=dtype, backend="flashinfer", cuda_graphs=False)
    assert graphed.graphs is not None and eager.graphs is None
    assert graphed.graphs.buckets == BATCH_BUCKETS
    alloc = BlockAllocator(graphed.num_blocks, seed=11)
    seqs = []
    for i in range(17):
        ids = prompt(3 + 5 * i, seed=800 + i)
        table = tuple(alloc.take(blocks_for(len(ids) + 40, 8)))
        for r in (graphed, eager):
            r.forward([SequenceStep(table, 0, tuple(ids))])
        seqs.append([table, ids])
    sizes = (1, 3, 5, 8, 17)  # buckets 1, 4, 8, 8, 32
    for step in range(25):  # contexts grow past the ones captured, across block edges
        steps = decode_steps(seqs[: sizes[step % len(sizes)]])
        before = graphed.graphs.replays
        got, want = graphed.forward(steps), eager.forward(steps)
        assert graphed.graphs.replays == before + 1
        assert (got - want).abs().max().item() < 5e-3 * want.abs().max().item(), step


@needs_flashinfer
def test_prefills_and_batches_past_the_largest_bucket_run_eagerly(tiny_models):
    path = tiny_models("llama", HEAD_DIM)
    graphed = make_runner(path, block_size=8, backend="flashinfer")
    eager = make_runner(path, block_size=8, backend="flashinfer", cuda_graphs=False)
    alloc = BlockAllocator(graphed.num_blocks, seed=12)
    n = BATCH_BUCKETS[-1] + 1
    tables = [tuple(alloc.take(2)) for _ in range(n)]
    for t in tables:
        for r in (graphed, eager):
            r.forward([SequenceStep(t, 0, (5, 6, 7))])
    before = graphed.graphs.replays
    steps = [SequenceStep(t, 3, (9,)) for t in tables]
    got, want = graphed.forward(steps), eager.forward(steps)
    assert graphed.graphs.replays == before
    assert (got - want).abs().max().item() < 5e-3 * want.abs().max().item()

"""What a server start would choose, kernel by kernel, without loading the weights: the
attention backend and layer ops for a model and config, with every probe's verdict (for
``hermes-async kernels`` and ``make setup``'s warm-up of the verdict cache)."""

from __future__ import annotations

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.attention import ProbeSettings, select_backend
from hermes_async.model.cpu_features import current
from hermes_async.model.default_model import resolve_model_path
from hermes_async.model.dtype import resolve_dtype
from hermes_async.model.kernels.paths import LAYER_OP
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.kv_pool import derive_block_size
from hermes_async.model.loader import DTYPES
from hermes_async.model.runner import resolve_device
from hermes_async.model.spec import read_spec


def kernel_report(model: ModelConfig, cache: CacheConfig, *, fresh: bool = False) -> dict:
    """A JSON-able report: the CPU, the shapes probed, each verdict, and the choice."""
    if model.num_threads:
        torch.set_num_threads(model.num_threads)
    model_dir = resolve_model_path(model.path)
    spec = read_spec(model_dir)
    device = resolve_device(model.device)
    dtype_name, dtype_reason = resolve_dtype(model.dtype, device)
    derived = derive_block_size(spec.num_kv_heads, spec.head_dim)
    choice = select_backend(model.attention_backend, spec, cache.block_size or derived,
                            DTYPES[dtype_name], device,
                            block_size_configured=cache.block_size is not None,
                            probe=ProbeSettings(model.kernel_probe_timeout_s, fresh=fresh))
    parts = sorted(choice.layer_op_parts)
    features = current()
    shapes = ProbeShapes.from_spec(spec, choice.block_size, dtype_name, torch.get_num_threads())
    return {
        "cpu_kind": features.kind, "cpu_flags": features.summary(), "torch": torch.__version__,
        "model": f"{model_dir} ({spec.architecture}); dtype {dtype_reason}",
        "shapes": shapes.describe(),
        "verdicts": [{"kind": v.kind, "name": v.name, "ok": v.ok, "reason": v.reason,
                      "cached": v.cached, "seconds": v.seconds} for v in choice.verdicts],
        "attention": choice.reason,
        "layer_ops": "+".join(p for p in parts) or "torch",
        "layer_ops_refused": [v.name for v in choice.verdicts if v.kind == LAYER_OP and not v.ok],
    }

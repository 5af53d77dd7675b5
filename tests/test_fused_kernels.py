"""The fused RMSNorm and rotary-embedding Triton kernels against their torch twins
(TRITON_INTERPRET=1 on CPU), and the twins against the model's module path.
The kernels round float32 -> bfloat16 to nearest even on the bits, so the interpreter (whose
own cast truncates) rounds as a GPU does and a residual sum is bit-equal to torch's add.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from celeris.kernels import fused_kernels, rms_norm_reference, rope_qk_reference
from celeris.model.modeling import apply_rope, rope_tables

assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
from celeris.kernels.triton_norm_rope import rms_norm_triton, rope_qk_triton  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape, seed=0, dtype=torch.float32, device="cpu", scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def _same(got, want):
    """Equal up to the rounding of one float32 reduction order (one bf16 ulp in bfloat16)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=2 ** -8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (3, 5, 33), (17, 256), (2, 1000)])
def test_rms_norm_kernel_matches_twin(shape, dtype):
    x = _randn(*shape, seed=1, dtype=dtype, scale=3.0)
    w = _randn(shape[-1], seed=2, dtype=dtype) * 0.5 + 1
    y, total = rms_norm_triton(x, w, 1e-5)
    want, _ = rms_norm_reference(x, w, 1e-5)
    _same(y, want)
    assert total is x                                   # no residual: the input itself


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 9), (4, 3, 64), (11, 300)])
def test_rms_norm_with_residual_matches_twin_and_writes_the_sum(shape, dtype):
    x = _randn(*shape, seed=3, dtype=dtype, scale=2.0)
    r = _randn(*shape, seed=4, dtype=dtype, scale=5.0)
    w = _randn(shape[-1], seed=5, dtype=dtype) + 1
    y, total = rms_norm_triton(x, w, 1e-6, residual=r)
    want, want_total = rms_norm_reference(x, w, 1e-6, residual=r)
    assert torch.equal(total, want_total)               # the sum is rounded as torch's add
    _same(y, want)


def test_rms_norm_kernel_reads_strided_rows():
    base = _randn(6, 2, 40, seed=6)
    x = base[:, 1]                                      # rows 80 apart: a view, no copy
    w = torch.ones(40)
    _same(rms_norm_triton(x, w, 1e-5)[0], F.rms_norm(x, (40,), w, 1e-5))
    odd = base.transpose(0, 1)[..., ::2]                # inner stride 2: the launcher copies
    _same(rms_norm_triton(odd, w[:20], 1e-5)[0], F.rms_norm(odd, (20,), w[:20], 1e-5))


def _tables(lead, R, dtype, theta=10000.0):
    pos = torch.arange(lead[0] * lead[1]).view(*lead) * 3 + 1          # (B, L)
    return rope_tables(pos, R, theta, dtype)                            # (B, L, 1, R) each


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Hkv,D,R", [(4, 4, 16, 16), (6, 2, 10, 10), (3, 1, 24, 12),
                                       (5, 5, 34, 18)])
def test_rope_kernel_matches_twin(H, Hkv, D, R, dtype):
    B, L = 2, 7
    q = _randn(B, L, H, D, seed=7, dtype=dtype)
    k = _randn(B, L, Hkv, D, seed=8, dtype=dtype)
    cos, sin = _tables((B, L), R, dtype)
    gq, gk = rope_qk_triton(q, k, cos, sin)
    wq, wk = rope_qk_reference(q, k, cos, sin)
    _same(gq, wq)
    _same(gk, wk)
    if R < D:                                           # the tail passes unchanged
        assert torch.equal(gq[..., R:], q[..., R:]) and torch.equal(gk[..., R:], k[..., R:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_kernel_with_per_head_norm_matches_twin(dtype):
    N, H, Hkv, D = 13, 4, 2, 12                         # packed rows (N, heads, D)
    q, k = _randn(N, H, D, seed=9, dtype=dtype, scale=4), _randn(N, Hkv, D, seed=10, dtype=dtype)
    qw, kw = _randn(D, seed=11, dtype=dtype) + 1, _randn(D, seed=12, dtype=dtype) + 1
    pos = torch.arange(N)[None] + 5
    cos, sin = (t[0] for t in rope_tables(pos, D, 1e4, dtype))          # (N, 1, D)
    got = rope_qk_triton(q, k, cos, sin, qw, kw, eps=1e-6)
    want = rope_qk_reference(q, k, cos, sin, qw, kw, eps=1e-6)
    _same(got[0], want[0])
    _same(got[1], want[1])


def test_rope_kernel_reads_the_strided_heads_of_a_fused_projection():
    B, L, H, Hkv, D = 2, 5, 4, 2, 8
    qkv = _randn(B, L, H + 2 * Hkv, D, seed=13)
    q, k, _ = qkv.split([H, Hkv, Hkv], dim=-2)          # views with a token stride of 8 heads
    cos, sin = _tables((B, L), D, torch.float32)
    gq, gk = rope_qk_triton(q, k, cos, sin)
    assert gq.is_contiguous() and gk.is_contiguous()
    _same(gq, apply_rope(q, cos, sin))
    _same(gk, apply_rope(k, cos, sin))


@pytest.mark.parametrize("R", [16, 8])
def test_the_rope_twin_is_the_module_paths_rotation_in_float32(R):
    q, k = _randn(3, 4, 2, 16, seed=14), _randn(3, 4, 1, 16, seed=15)
    cos, sin = _tables((3, 4), R, torch.float32)
    wq, wk = rope_qk_reference(q, k, cos, sin)
    torch.testing.assert_close(wq, apply_rope(q, cos, sin), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(wk, apply_rope(k, cos, sin), atol=1e-6, rtol=1e-6)


def test_launchers_reject_bad_inputs():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm_triton(x, torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="residual must match"):
        rms_norm_triton(x, torch.ones(8), 1e-5, residual=torch.zeros(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float32/bfloat16"):
        rms_norm_triton(x.long(), torch.ones(8), 1e-5)
    q, k = torch.zeros(3, 2, 8), torch.zeros(3, 1, 8)
    cos = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="even last dim"):
        rope_qk_triton(q, k, cos[:, :7], cos[:, :7])
    with pytest.raises(ValueError, match="rows of positions"):
        rope_qk_triton(q, k, cos[:2], cos[:2])
    with pytest.raises(ValueError, match="both be given"):
        rope_qk_triton(q, k, cos, cos, q_weight=torch.ones(8))
    with pytest.raises(ValueError, match="share a"):
        rope_qk_triton(q, k.bfloat16(), cos, cos)


def test_fused_kernels_only_for_cuda_inference_unless_forced(monkeypatch):
    x = torch.zeros(2, 4)
    monkeypatch.delenv("CELERIS_KERNELS", raising=False)
    with torch.no_grad():
        assert not fused_kernels(x)                     # CPU: the torch path
    monkeypatch.setenv("CELERIS_KERNELS", "triton")
    with torch.no_grad():
        assert fused_kernels(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not fused_kernels(x)                 # mixed dtypes: the torch path
    assert not fused_kernels(x)                         # gradients: no backward in the kernels
    monkeypatch.setenv("CELERIS_KERNELS", "torch")
    with torch.no_grad():
        assert not fused_kernels(x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_kernels_match_twins_on_cuda(dtype):
    x = _randn(64, 4096, seed=16, dtype=dtype, device="cuda")
    r = _randn(64, 4096, seed=17, dtype=dtype, device="cuda")
    w = _randn(4096, seed=18, dtype=dtype, device="cuda") + 1
    got, want = rms_norm_triton(x, w, 1e-5, r), rms_norm_reference(x, w, 1e-5, r)
    assert torch.equal(got[1], want[1])
    _same(got[0], want[0])
    q = _randn(1, 32, 32, 128, seed=19, dtype=dtype, device="cuda")
    k = _randn(1, 32, 8, 128, seed=20, dtype=dtype, device="cuda")
    pos = torch.arange(512, 544, device="cuda")[None]
    cos, sin = rope_tables(pos, 128, 500000.0, dtype)
    for g, wnt in zip(rope_qk_triton(q, k, cos, sin), rope_qk_reference(q, k, cos, sin)):
        _same(g, wnt)
    from celeris.kernels import write_kv_reference
    from celeris.kernels.triton_kv_write import run_table, write_kv_triton
    ks, vs = (torch.zeros(4, 8, 1024, 128, dtype=dtype, device="cuda") for _ in range(2))
    ks2, vs2 = ks.clone(), vs.clone()
    kt, vt = k.transpose(1, 2), q[:, :, :8].transpose(1, 2)                 # (1, 8, 32, 128)
    runs = [(0, 1, 2, 544, 31)]
    write_kv_triton(kt, vt, ks, vs, run_table(runs, kt.device), 31)
    write_kv_reference(kt, vt, ks2, vs2, runs)
    assert torch.equal(ks, ks2) and torch.equal(vs, vs2)


AOT_CHECK = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import celeris.kernels.triton_kv_write as w
import celeris.kernels.triton_norm_rope as k

I32 = ("sq_t", "sq_h", "sk_t", "sk_h", "sqo_t", "sqo_h", "sko_t", "sko_h", "sc_t", "ss_t",
       "H", "D", "HALF")
for dt in ("bf16", "fp32", "fp16"):
    for flag in (True, False):
        sig = dict(x_ptr=f"*{dt}", stride_x="i64", r_ptr=f"*{dt}", stride_r="i64",
                   w_ptr=f"*{dt}", y_ptr=f"*{dt}", stride_y="i64", s_ptr=f"*{dt}",
                   stride_s="i64", C="i32", eps="fp32", HAS_RESIDUAL="constexpr",
                   BLOCK_C="constexpr")
        src = ASTSource(k._rms_norm_kernel, sig, dict(HAS_RESIDUAL=flag, BLOCK_C=4096))
        assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
        sig = {n: f"*{dt}" for n in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "cos_ptr",
                                     "sin_ptr", "qw_ptr", "kw_ptr")}
        sig.update({n: "i32" for n in I32}, eps="fp32", HAS_NORM="constexpr",
                   BLOCK_HALF="constexpr", BLOCK_TAIL="constexpr")
        src = ASTSource(k._rope_kernel, sig, dict(HAS_NORM=flag, BLOCK_HALF=32, BLOCK_TAIL=2))
        assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
    sig = dict(k_ptr=f"*{dt}", v_ptr=f"*{dt}", ks_ptr=f"*{dt}", vs_ptr=f"*{dt}",
               runs_ptr="*i64", **{n: "i64" for n in ("sk_b", "sk_h", "sk_w", "sv_b", "sv_h",
                                                       "sv_w", "st_s", "st_h", "st_l")},
               D="i32", BLOCK_W="constexpr", BLOCK_D="constexpr")
    src = ASTSource(w._kv_write_kernel, sig, dict(BLOCK_W=16, BLOCK_D=128))
    assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
print("compiled")
"""


def test_kernels_compile_for_a_hopper_gpu_without_one():
    """The interpreter does not type-check a kernel as the GPU compiler does: compile each to
    sm_90 machine code (Triton's bundled ptxas; no GPU needed) for each dtype and flag."""
    import subprocess
    import sys
    from pathlib import Path

    import triton
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip(f"this Triton build has no bundled ptxas ({ptxas})")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", AOT_CHECK], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "compiled", proc.stderr[-2000:]


def _window_and_cache(dtype, seed=21):
    B, Hkv, W, D, slots, L = 3, 2, 9, 6, 5, 24
    k = _randn(B, W, Hkv, D, seed=seed, dtype=dtype).transpose(1, 2)         # (B, Hkv, W, D)
    v = _randn(B, W, Hkv, D, seed=seed + 1, dtype=dtype).transpose(1, 2)
    stores = [_randn(slots, Hkv, L, D, seed=seed + 2 + i, dtype=dtype) for i in range(4)]
    return k, v, stores


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_write_kernel_matches_the_slice_copies(dtype):
    from celeris.kernels import write_kv_reference
    from celeris.kernels.triton_kv_write import run_table, write_kv_triton
    k, v, (ks, vs, ks2, vs2) = _window_and_cache(dtype)
    ks2.copy_(ks)
    vs2.copy_(vs)
    # row 0 -> slot 3 (a run of 7 after 2 query-only columns), row 2 -> slot 0 in two runs,
    # row 1 writes nothing
    runs = [(0, 2, 3, 10, 7), (2, 0, 0, 0, 4), (2, 4, 0, 17, 5)]
    write_kv_triton(k, v, ks, vs, run_table(runs, k.device), max(r[4] for r in runs))
    write_kv_reference(k, v, ks2, vs2, runs)
    assert torch.equal(ks, ks2) and torch.equal(vs, vs2)
    assert torch.equal(ks[3, :, 10:17], k[0, :, 2:9]) and torch.equal(vs[0, :, 17:22], v[2, :, 4:9])


def test_kv_write_kernel_covers_runs_longer_than_one_program():
    from celeris.kernels.triton_kv_write import BLOCK_W, run_table, write_kv_triton
    W = 2 * BLOCK_W + 3
    k, v = _randn(1, 2, W, 4, seed=30), _randn(1, 2, W, 4, seed=31)
    ks, vs = torch.zeros(2, 2, 64, 4), torch.zeros(2, 2, 64, 4)
    write_kv_triton(k, v, ks, vs, run_table([(0, 0, 1, 5, W)], k.device), W)
    assert torch.equal(ks[1, :, 5:5 + W], k[0]) and torch.equal(vs[1, :, 5:5 + W], v[0])
    assert ks[0].abs().sum() == 0 and ks[1, :, :5].abs().sum() == 0
    assert ks[1, :, 5 + W:].abs().sum() == 0


def test_slot_view_forced_fused_write_equals_the_torch_write(monkeypatch):
    """The cache's fused write (forced on CPU) leaves the slots as the slice copies do, and
    attention reads the same keys."""
    from celeris.cache import SlotKVCache
    from tests.engine_harness import write_runs
    k, v, _ = _window_and_cache(torch.float32, seed=40)
    writes = [(0, c, 1, 4 + c) for c in range(3, 9)] + [(1, c, 2, c) for c in range(9)]
    got = []
    for mode in ("triton", "torch"):
        monkeypatch.setenv("CELERIS_KERNELS", mode)
        kv = SlotKVCache(2, 2, 6, 32, torch.float32, torch.device("cpu"), slots=4, length=16)
        view = kv.bind([1, 2], [13, 9], write_runs(writes))
        with torch.no_grad():
            got.append((view.update(1, k[:2], v[:2]), kv.k[1].clone(), kv.v[1].clone()))
        assert view._fused == (mode == "triton")
    (a, ka, va), (b, kb, vb) = got
    assert torch.equal(ka, kb) and torch.equal(va, vb)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape == (2, 2, 13, 6)

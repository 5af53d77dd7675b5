"""The Triton block-statistics kernel against its torch twin (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import os

import pytest
import torch

from celeris.kernels import block_stats, block_stats_reference

assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
from celeris.kernels.triton_block_stats import block_stats_triton  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _close(a, b):
    assert torch.equal(a.x0.cpu(), b.x0.cpu())
    for name in ("p_x0", "margin", "negentropy"):
        torch.testing.assert_close(getattr(a, name).cpu(), getattr(b, name).cpu(),
                                   atol=2e-6, rtol=2e-5, msg=name)


def _logits(N, V, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, V, generator=g) * 3).to(device=device, dtype=dtype)


@pytest.mark.parametrize("V", [7, 100, 1000, 5000])   # not powers of two; >1 chunk at 5000
def test_kernel_matches_twin_greedy(V):
    logits = _logits(12, V, seed=V)
    _close(block_stats_triton(logits, block_v=1024), block_stats_reference(logits))


def test_kernel_matches_twin_with_ties_and_minus_inf():
    logits = _logits(6, 300, seed=1)
    logits[0, [5, 17, 250]] = 9.0              # three-way tie for the max: first index wins
    logits[1, :] = 0.0                         # all equal: token 0, margin 0, max entropy
    logits[2, ::2] = float("-inf")             # half the vocabulary forbidden
    logits[3, :-1] = float("-inf")             # one token left: p = 1
    logits[4, [3, 200]] = 12.0                 # tie split across chunks
    got, want = block_stats_triton(logits, block_v=128), block_stats_reference(logits)
    _close(got, want)
    assert got.x0[0].item() == 5 and got.x0[4].item() == 3
    assert got.margin[0].item() == 0.0 and got.margin[4].item() == 0.0
    assert got.p_x0[3].item() == pytest.approx(1.0)
    assert got.negentropy[1].item() == pytest.approx(-torch.log(torch.tensor(300.0)).item(),
                                                     abs=1e-5)


@pytest.mark.parametrize("V", [33, 2048, 3001])
def test_kernel_matches_twin_with_gumbel_noise(V):
    N = 10
    logits = _logits(N, V, seed=7)
    logits[:, 4] = float("-inf")
    uniform = torch.rand(N, V, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 0.7, 1.3, 0.1, 5.0, 1.0],
                               dtype=torch.float64)
    got = block_stats_triton(logits, temperature, uniform, block_v=512)
    want = block_stats_reference(logits, temperature, uniform)
    _close(got, want)
    assert torch.equal(got.x0[[0, 4]], logits[[0, 4]].argmax(-1))   # T = 0 rows are greedy
    assert not (got.x0 == 4).any()


def test_kernel_accepts_bf16_and_strided_logits():
    base = _logits(8, 640, seed=5)
    strided = base[:, ::2]                     # stride(1) == 2: the launcher copies
    _close(block_stats_triton(strided), block_stats_reference(strided))
    bf = base.to(torch.bfloat16)
    _close(block_stats_triton(bf), block_stats_reference(bf))


def test_launcher_rejects_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="2-D"):
        block_stats_triton(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="dtype"):
        block_stats_triton(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="uniform must be float64"):
        block_stats_triton(torch.zeros(2, 3), torch.ones(2), torch.rand(2, 3))


def test_the_kernel_runs_over_a_batch_of_units_as_the_twin_does():
    """The engine hands (B, W, V) logits and a (B, 1) temperature to ``block_stats``; on
    CUDA the kernel sees them as (B*W, V) rows and its statistics come back (B, W)."""
    from celeris.kernels import over_rows
    logits = _logits(12, 300, seed=4).view(3, 4, 300)
    uniform = torch.rand(3, 4, 300, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    temperature = torch.tensor([[0.0], [0.8], [1.5]], dtype=torch.float64)
    got = over_rows(block_stats_triton, logits, temperature, uniform)
    want = block_stats_reference(logits, temperature, uniform)
    assert got.x0.shape == (3, 4) and want.p_x0.shape == (3, 4)
    _close(got, want)
    assert torch.equal(got.x0[0], logits[0].argmax(-1))        # the T = 0 row is greedy
    assert not torch.equal(got.x0[2], logits[2].argmax(-1))    # T = 1.5 samples


def test_dispatch_uses_the_twin_on_cpu(monkeypatch):
    import celeris.kernels.triton_block_stats as k
    monkeypatch.setattr(k, "block_stats_triton", lambda *a, **kw: pytest.fail("Triton on CPU"))
    logits = _logits(3, 50)
    _close(block_stats(logits), block_stats_reference(logits))


@pytest.mark.gpu
@pytest.mark.parametrize("V", [126464, 2048])
def test_kernel_matches_twin_on_cuda(V):
    logits = _logits(64, V, seed=2, device="cuda", dtype=torch.bfloat16)
    uniform = torch.rand(64, V, dtype=torch.float64, device="cuda")
    temperature = torch.linspace(0, 1.5, 64, dtype=torch.float64, device="cuda")
    _close(block_stats_triton(logits), block_stats_reference(logits))
    _close(block_stats_triton(logits, temperature, uniform),
           block_stats_reference(logits, temperature, uniform))

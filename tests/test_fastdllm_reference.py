"""first_token="greedy" + threshold sub-blocks reproduce Fast-dLLM v2's published generate()
token for token at T=0, checked against a loop-by-loop transcription of that generate() (batch
1, no cache: the transcription recomputes every forward, which block-causal attention makes
equal to the upstream cached forwards)."""

from __future__ import annotations

import pytest
import torch

from celeris import CelerisConfig, CelerisForMaskedDiffusion, GenerationParams
from tests.engine_harness import bare_engine, run_requests

MASK, PAD, STOP, BS, SMALL = 3, 0, 2, 8, 4


def tiny_fastdllm(seed: int = 11) -> CelerisForMaskedDiffusion:
    """A tiny random model laid out as Fast-dLLM v2 (shifted logits, blocks of BS)."""
    torch.manual_seed(seed)
    cfg = CelerisConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, qkv_bias=True,
                        shift_logits=True, attention="block_causal", block_size=BS,
                        initializer_range=0.5, mask_token_id=MASK)
    return CelerisForMaskedDiffusion(cfg).eval()


@pytest.fixture(scope="module")
def model():
    m = tiny_fastdllm()
    with torch.no_grad():
        m.lm_head.weight[MASK] = 0.0          # upstream's argmax does not exclude [MASK]
        m.lm_head.weight[STOP] *= 0.3         # a stop token now and then, not at once
    return m


def _unshifted(model, seq: list[int]) -> torch.Tensor:
    """Upstream's model output: (L, V), position i's state through the head (no shift)."""
    model.config.shift_logits = False
    try:
        with torch.no_grad():
            return model(torch.tensor([seq])).logits[0]
    finally:
        model.config.shift_logits = True


def upstream_generate(model, prompt: list[int], max_new_tokens: int, threshold: float
                      ) -> list[int]:
    """Fast-dLLM v2's generate() for one sequence, written out loop by loop."""
    x = list(prompt)
    n_prompt = len(x)
    if len(x) > BS and len(x) % BS == 0:          # prefill; the prompt's last state -> token
        x.append(int(_unshifted(model, x)[-1].argmax()))

    def stopped(start: int) -> bool:
        tail = x[start:]
        if STOP not in tail:
            return False
        return MASK not in tail[:tail.index(STOP)]

    for _ in range(max_new_tokens // BS):
        if STOP in x[n_prompt:]:
            break
        start = len(x)
        x += [MASK] * (BS - start % BS)
        blk = len(x) - BS
        while True:
            if stopped(start):
                break
            if MASK not in x[blk:]:                    # block done: next token from its end
                x.append(int(_unshifted(model, x)[-1].argmax()))
                break
            for sb in range(BS // SMALL):
                lo, hi = blk + sb * SMALL, blk + (sb + 1) * SMALL
                while MASK in x[lo:hi] and not stopped(start):
                    out = _unshifted(model, x)[blk:blk + BS]
                    out = torch.cat([out[:1], out[:-1]])     # shift inside the block
                    probs = out[sb * SMALL:(sb + 1) * SMALL].softmax(-1)
                    p, tok = probs.max(-1)
                    masked = torch.tensor([t == MASK for t in x[lo:hi]])
                    p = torch.where(masked, p, float("-inf"))
                    commit = (p > threshold) & masked
                    commit[int(p.argmax())] = True
                    for i in range(SMALL):
                        if commit[i]:
                            x[lo + i] = int(tok[i])
    gen = x[n_prompt:]
    return gen[:gen.index(STOP) + 1] if STOP in gen else gen


def _celeris(model, prompt, cap, threshold, exact_cache):
    params = GenerationParams(gen_length=cap, block_length=SMALL, decoding="threshold",
                              threshold=threshold, first_token="greedy",
                              cache="prefix" if exact_cache else "none")
    outs = run_requests(bare_engine(model, MASK, PAD, (STOP,)), [("r", prompt, params, 0)])
    out = outs["r"][-1]
    return list(out.canvas), out.finish


@pytest.mark.parametrize("prompt_len,threshold", [(5, 0.9), (16, 0.9), (13, 0.3), (21, 0.3)])
@pytest.mark.parametrize("exact_cache", [True, False])
def test_greedy_first_token_threshold_sub_blocks_equal_upstream_generate(
        model, prompt_len, threshold, exact_cache):
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(4, 96, (prompt_len,), generator=g).tolist()
    ref = upstream_generate(model, prompt, 48, threshold)
    ended = bool(ref) and ref[-1] == STOP
    cap = 10 ** 3 if ended else len(ref)
    canvas, finish = _celeris(model, prompt, cap, threshold, exact_cache)
    if ended:
        assert finish == "stop"
        assert canvas[:len(ref)] == ref
    else:
        assert finish == "length" and canvas == ref
    assert len(ref) >= 3

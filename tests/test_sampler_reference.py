"""The vectorised sampler against a plain, loop-by-loop transcription of LLaDA's generate().

The transcription below follows the published algorithm (Nie et al. 2025, Alg. 4 and the
reference generate.py) step by step, with one documented Celeris convention: the Gumbel and
random-remasking noise of row j is drawn from row j's own generator over the active block
only, so that a request's noise does not depend on its batch. And ties in confidence (common:
a trained model gives many positions probability 1.0 in float32) go to the leftmost position;
torch.topk leaves their order unspecified and it differs between CPU and CUDA.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from celeris import CelerisConfig, CelerisForMaskedDiffusion, GenerationParams
from tests.engine_harness import bare_engine, run_requests

MASK, PAD, EOS = 3, 0, 2
V = 64
PROMPTS = [(5, 6, 7), (8, 9, 10, 11, 12), (13, 14, 15, 16, 17, 18, 19)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = CelerisConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, mask_token_id=MASK)
    return CelerisForMaskedDiffusion(cfg).eval()


def transcription(model, prompts, gen_length, block_length, steps, temperature, cfg_scale,
                  remasking, seeds):
    """Loop-by-loop LLaDA generate() over a left-padded batch."""
    B, P = len(prompts), max(len(p) for p in prompts)
    x = torch.full((B, P + gen_length), MASK, dtype=torch.long)
    am = torch.ones_like(x)
    for j, p in enumerate(prompts):
        x[j, :P - len(p)] = PAD
        am[j, :P - len(p)] = 0
        x[j, P - len(p):P] = torch.tensor(p)
    prompt_index = x != MASK
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for nb in range(num_blocks):
        s, e = P + nb * block_length, P + (nb + 1) * block_length
        num_transfer = []
        for j in range(B):   # linear schedule per row
            masked = int((x[j, s:e] == MASK).sum())
            base, rem = divmod(masked, steps_per_block)
            num_transfer.append([base + (1 if i < rem else 0) for i in range(steps_per_block)])
        for i in range(steps_per_block):
            mask_index = x == MASK
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = MASK
                both = model(torch.cat([x, un_x]), attention_mask=torch.cat([am, am])).logits
                cond, un = both[:B], both[B:]
                logits = un + (cfg_scale + 1) * (cond - un)
            else:
                logits = model(x, attention_mask=am).logits
            logits[:, :, MASK] = float("-inf")
            x0 = logits.argmax(-1)
            x0_p = torch.zeros(x.shape, dtype=torch.float64)
            for j in range(B):
                if temperature > 0:
                    u = torch.rand((e - s, V), generator=gens[j], dtype=torch.float64)
                    noisy = logits[j, s:e].double().exp() / (-torch.log(u)) ** temperature
                    x0[j, s:e] = noisy.argmax(-1)
                if remasking == "low_confidence":
                    p = logits[j].float().softmax(-1)
                    x0_p[j] = p.gather(-1, x0[j][:, None]).squeeze(-1).double()
                else:
                    x0_p[j, s:e] = torch.rand(e - s, generator=gens[j], dtype=torch.float64)
            x0_p[:, e:] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf"),
                                                                    dtype=torch.float64))
            for j in range(B):
                k = num_transfer[j][i]
                if k:
                    select = confidence[j].sort(descending=True, stable=True).indices[:k]
                    x[j, select] = x0[j, select]
    return [x[j, P:].tolist() for j in range(B)]


def celeris_run(model, prompts, params, seeds, cache="none"):
    outs = run_requests(bare_engine(model, MASK, PAD, (EOS,)),
                        [(f"r{j}", tuple(p), params.replace(cache=cache), seeds[j])
                         for j, p in enumerate(prompts)])
    return [outs[f"r{j}"][-1] for j in range(len(prompts))]


CASES = [  # (block_length, steps, temperature, cfg_scale, remasking)
    *[(bl, steps, 0.0, 0.0, "low_confidence") for bl, steps in
      [(8, 32), (8, 16), (8, 4), (16, 32), (16, 8), (32, 32), (32, 8)]],
    *[(bl, 16, 0.8, 0.0, "low_confidence") for bl in (8, 16, 32)],
    *[(bl, 16, 0.0, 1.5, "low_confidence") for bl in (8, 32)],
    (16, 16, 0.8, 1.5, "low_confidence"),
    *[(bl, 16, t, 0.0, "random") for bl, t in itertools.product((8, 32), (0.0, 0.8))],
]


@pytest.mark.parametrize("block_length,steps,temperature,cfg_scale,remasking", CASES)
def test_vectorised_sampler_matches_loop_transcription(model, block_length, steps, temperature,
                                                        cfg_scale, remasking):
    gen_length, seeds = 32, [11, 22, 33]
    params = GenerationParams(gen_length=gen_length, block_length=block_length, steps=steps,
                              temperature=temperature, cfg_scale=cfg_scale,
                              remasking=remasking, early_stop=False)
    with torch.inference_mode():
        want = transcription(model, PROMPTS, gen_length, block_length, steps, temperature,
                             cfg_scale, remasking, seeds)
        got = celeris_run(model, PROMPTS, params, seeds)
    assert [list(o.canvas) for o in got] == want
    assert all(o.nfe == steps * (2 if cfg_scale else 1) for o in got)


def test_a_request_gives_the_same_tokens_alone_and_in_a_batch(model):
    params = GenerationParams(gen_length=32, block_length=8, steps=16, temperature=0.9,
                              early_stop=False)
    with torch.inference_mode():
        batched = celeris_run(model, PROMPTS, params, [1, 2, 3])
        alone = [celeris_run(model, [p], params, [s])[0] for p, s in zip(PROMPTS, [1, 2, 3])]
    assert [o.canvas for o in batched] == [o.canvas for o in alone]


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_equals_no_cache(model, cache):
    """With one step per block every step is a refresh, so the cache is always exact."""
    params = GenerationParams(gen_length=32, block_length=8, steps=4, early_stop=False)
    with torch.inference_mode():
        exact = celeris_run(model, PROMPTS, params, [1, 2, 3])
        cached = celeris_run(model, PROMPTS, params.replace(cache=cache), [1, 2, 3], cache=cache)
    assert [o.canvas for o in cached] == [o.canvas for o in exact]

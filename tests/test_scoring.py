"""Scoring a text (echo + logprobs): each token's log p(x_i | x_<i) with i and what follows
it masked, checked against the definition computed one forward per token."""

import math

import pytest
import torch

from celeris.engine.scoring import can_score, score_tokens
from celeris.model import CelerisConfig, CelerisForMaskedDiffusion

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, mask_token_id=3, initializer_range=0.5)
MASK = 3


def _model(**kw) -> CelerisForMaskedDiffusion:
    torch.manual_seed(0)
    return CelerisForMaskedDiffusion(CelerisConfig(**TINY, **kw)).eval()


def _direct(model, ids: list[int], top: int) -> list:
    """The definition: for each i, the text up to i clean, position i and everything after
    it masked (up to the end of i's block for a block-causal model, up to the end of the
    text otherwise), the model's ordinary forward, log_softmax at i (mask excluded)."""
    cfg, L, out = model.config, len(ids), [None]
    for i in range(1, L):
        end = (i // cfg.block_size + 1) * cfg.block_size if cfg.block_causal else L
        row = ids[:i] + [MASK] * (min(end, L) - i)
        with torch.no_grad():
            logits = model(torch.tensor([row]), logits_index=torch.tensor([[i]])).logits[0, 0]
        logits[MASK] = float("-inf")
        logp = logits.log_softmax(-1)
        values, top_ids = logp.topk(top) if top else (torch.tensor([]), torch.tensor([]))
        out.append((float(logp[ids[i]]), top_ids.tolist(), values.tolist()))
    return out


@pytest.mark.parametrize("kw", [
    {},                                                          # full attention (LLaDA)
    {"shift_logits": True},                                      # full attention, shifted (Dream)
    {"attention": "block_causal", "block_size": 4},              # celeris-tiny-bd, SDAR
    {"attention": "block_causal", "block_size": 4, "shift_logits": True},   # Fast-dLLM v2
    {"attention": "block_causal", "block_size": 8},              # text shorter than two blocks
], ids=["full", "full-shift", "block", "block-shift", "block8"])
def test_scores_equal_the_definition(kw):
    model = _model(**kw)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 96, (13,), generator=g).tolist()
    got = score_tokens(model, ids, MASK, top=3)
    want = _direct(model, ids, 3)
    assert got[0] is None and len(got) == len(ids)
    for i in range(1, len(ids)):
        lp, top_ids, top_values = want[i]
        assert got[i].token == ids[i]
        assert got[i].logprob == pytest.approx(lp, abs=1e-4), i
        assert [t for t, _ in got[i].top] == top_ids
        assert [v for _, v in got[i].top] == pytest.approx(top_values, abs=1e-4)
        assert got[i].logprob <= got[i].top[0][1] + 1e-6


def test_scores_are_chunked_without_changing_them(monkeypatch):
    from celeris.engine import scoring
    model = _model(attention="block_causal", block_size=4)
    ids = list(range(4, 30))
    whole = score_tokens(model, ids, MASK)
    monkeypatch.setattr(scoring, "CHUNK_TOKENS", 1)          # one row per forward
    assert [t.logprob for t in score_tokens(model, ids, MASK)[1:]] == pytest.approx(
        [t.logprob for t in whole[1:]], abs=1e-5)
    assert all(math.isfinite(t.logprob) and t.top == () for t in whole[1:])


def test_a_model_that_cannot_be_scored_is_named():
    class Other(torch.nn.Module):
        config = None
    assert "Other" in can_score(Other())
    assert can_score(_model()) is None

"""Token editing (LLaDA2.1's token-to-token rule beside mask-to-token threshold decoding).

The engine with ``edit_threshold`` equals a loop-by-loop transcription of LLaDA2.1's block
decoding at T = 0 (batch 1, no cache: block-causal attention makes a recomputed forward equal
the upstream cached one), token for token, alone and among companions, with and without the
exact cache; the test checks that the transcription really edited tokens, so it cannot pass
by decoding without edits.
"""

from __future__ import annotations

import json

import pytest
import torch

from celeris import Engine, GenerationParams
from celeris.families import by_name
from celeris.outputs import StepEvent
from celeris.request_params import request_params
from tests.engine_harness import (EDIT_BLOCK, EDIT_MASK, EDIT_PAD, EDIT_STOP, bare_engine,
                                  editing_model)

MASK, PAD, STOP, BS = EDIT_MASK, EDIT_PAD, EDIT_STOP, EDIT_BLOCK


@pytest.fixture(scope="module")
def model():
    return editing_model()


def upstream_generate(model, prompt: list[int], gen_length: int, threshold: float,
                      edit_threshold: float | None, max_post: int, mask: int = MASK,
                      stops: tuple[int, ...] = (STOP,), bs: int = BS
                      ) -> tuple[list[int], int]:
    """LLaDA2.1's decoding for one sequence, loop by loop; (answer, number of edits).

    Per block: each forward takes the argmax x and its probability p at every position of
    the block; masked positions with p > threshold are committed (the most probable one if
    none is); answer tokens of the block that differ from x with p > edit_threshold are
    replaced. Once the block has no masks, each further forward counts as a post-edit step;
    the block ends when a forward changes nothing or after max_post such steps. The answer
    ends after the block in which a stop token appears."""
    P, MASK, BS = len(prompt), mask, bs
    x = list(prompt) + [MASK] * gen_length
    assert len(x) % BS == 0
    edits, edit_threshold = 0, 2.0 if edit_threshold is None else edit_threshold
    for blk in range(P // BS * BS, len(x), BS):
        post = 0
        while True:
            with torch.no_grad():
                logits = model(torch.tensor([x[:blk + BS]])).logits[0, blk:blk + BS]
            logits[:, MASK] = float("-inf")   # [MASK] is never a prediction (as upstream's)
            probs = logits.float().softmax(-1)
            p, tok = probs.max(-1)
            masked = torch.tensor([t == MASK for t in x[blk:blk + BS]])
            answer = torch.tensor([blk + i >= P for i in range(BS)])
            commit = torch.zeros(BS, dtype=torch.bool)
            if masked.any():
                commit = masked & (p > threshold)
                if not commit.any():
                    commit[int(torch.where(masked, p, -1.0).argmax())] = True
            else:
                post += 1
                if post > max_post:
                    break
            current = torch.tensor(x[blk:blk + BS])
            edit = ~masked & answer & (tok != current) & (p > edit_threshold)
            if not (commit | edit).any():
                break
            edits += int(edit.sum())
            for i in torch.nonzero(commit | edit).flatten().tolist():
                x[blk + i] = int(tok[i])
        if any(t in stops for t in x[P:blk + BS]):
            break
    answer = x[P:]
    ends = [i for i, t in enumerate(answer) if t in stops]
    if ends:
        answer = answer[:ends[0]]
    return [t for t in answer if t != MASK], edits


def _params(gen_length, threshold, edit_threshold, max_post, cache="prefix"):
    return GenerationParams(gen_length=gen_length, block_length=BS, decoding="threshold",
                            threshold=threshold, edit_threshold=edit_threshold,
                            max_post_edit_steps=max_post, cache=cache, temperature=0.0)


def _stream(engine, prompt, params):
    events, result = [], None
    for item in engine.stream(prompt, params):
        if isinstance(item, StepEvent):
            events.append(item)
        else:
            result = item
    return events, result


CASES = [(5, 0.6, 0.3, 16), (11, 0.6, 0.3, 2), (16, 0.8, 0.5, 16), (3, 0.5, 0.2, 0)]


@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_token_editing_equals_llada21_decoding_token_for_token(model, cache):
    engine = bare_engine(model, MASK, PAD, (STOP,))
    total_edits = 0
    for P, threshold, edit_threshold, max_post in CASES:
        prompt = torch.randint(4, 64, (P,), generator=torch.Generator().manual_seed(P)).tolist()
        gen_length = (P // BS + 4) * BS - P
        ref, edits = upstream_generate(model, prompt, gen_length, threshold, edit_threshold,
                                       max_post)
        total_edits += edits
        params = _params(gen_length, threshold, edit_threshold, max_post, cache)
        events, result = _stream(engine, prompt, params)
        assert list(result.token_ids) == ref, (P, threshold, edit_threshold)
        assert sum(len(e.edited) for e in events) == edits
        # the streamed text only ever grows: an edit never rewrites what was shown
        texts = [e.text for e in events] + [result.text]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
        # companions do not change it
        others = [torch.randint(4, 64, (n,), generator=torch.Generator().manual_seed(99 + n)
                                ).tolist() for n in (7, 12)]
        batch = engine.generate_batch([prompt, *others], [params, params.replace(
            edit_threshold=None), params.replace(temperature=0.7, seed=1)])
        assert list(batch[0].token_ids) == ref
    assert total_edits >= 3        # the transcription really edited tokens


def test_edit_threshold_of_one_is_off(model):
    engine = bare_engine(model, MASK, PAD, (STOP,))
    prompt = list(range(10, 21))
    off = engine.generate(prompt, _params(37, 0.6, None, 16))
    one = engine.generate(prompt, _params(37, 0.6, 1.0, 16))
    on = engine.generate(prompt, _params(37, 0.6, 0.3, 16))
    assert one.token_ids == off.token_ids and one.nfe == off.nfe
    assert on.nfe > off.nfe           # post-edit forwards at least


def test_edit_threshold_is_validated_naming_the_field():
    with pytest.raises(ValueError, match=r"edit_threshold must be in \(0.0, 1.0\]"):
        GenerationParams(edit_threshold=1.5)
    with pytest.raises(ValueError, match=r"max_post_edit_steps must be in \[0, 256\]"):
        GenerationParams(max_post_edit_steps=-1)
    with pytest.raises(ValueError, match="edit_threshold"):
        request_params({"edit_threshold": "high"}, GenerationParams())


def test_full_attention_models_refuse_token_editing():
    engine = Engine.from_pretrained("models/celeris-tiny")
    with pytest.raises(ValueError, match="edit_threshold: token editing needs a block-causal"):
        engine.generate("Once upon a time", engine.default_params().replace(edit_threshold=0.5))


def test_llada21_generation_config_turns_editing_on(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"threshold": 0.7, "editing_threshold": 0.5, "max_post_steps": 8}), encoding="utf-8")
    read_generation_defaults = by_name("llada2").generation_defaults
    defaults = read_generation_defaults(tmp_path)
    assert defaults == {"threshold": 0.7, "edit_threshold": 0.5, "max_post_edit_steps": 8}
    (tmp_path / "generation_config.json").write_text(json.dumps({"threshold": 0.95}))
    assert "edit_threshold" not in read_generation_defaults(tmp_path)


@pytest.mark.parametrize("edit_threshold", [None, 0.05])
def test_llada2_family_decodes_as_its_published_block_loop(tmp_path, edit_threshold):
    """A tiny llada2_moe checkpoint laid out as published (block 32): the engine with LLaDA2's
    threshold rule, with and without editing, equals the transcription."""
    from tests.test_families import write_family

    engine = Engine.from_pretrained(write_family(tmp_path / "llada2", "llada2"), device="cpu")
    assert engine.block_size == 32
    sp, vocab = engine.special, engine.model.config.vocab_size
    edits = 0
    for P in (5, 40):
        prompt = torch.randint(8, min(vocab, 300), (P,),
                               generator=torch.Generator().manual_seed(P)).tolist()
        gen_length = (P // 32 + 2) * 32 - P
        ref, n = upstream_generate(engine.model, prompt, gen_length, 0.02, edit_threshold, 4,
                                   sp.mask, tuple(sp.stop), 32)
        edits += n
        params = engine.default_params().replace(
            gen_length=gen_length, threshold=0.02, edit_threshold=edit_threshold,
            max_post_edit_steps=4, temperature=0.0)
        assert list(engine.generate(prompt, params).token_ids) == ref
    assert (edits > 0) == (edit_threshold is not None)

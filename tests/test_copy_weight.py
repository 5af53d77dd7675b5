"""Block-diffusion training options for what a request asks: the loss weight on its words
(``--copy-weight``) and the twin's causal loss beside the block loss (``--ar-weight``)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from celeris.train import blockdiff, copyweight
from celeris.train import tokenizer_train as tt
from celeris.train.data import IGNORE
from tests.tiny_model import tiny_block_batch, tiny_block_model

SHIPPED = "models/celeris-tiny-bd"


@pytest.fixture(scope="module")
def tok():
    return tt.load_raw(SHIPPED)


def _chat_encoder(tok):
    from transformers import PreTrainedTokenizerFast
    chat = PreTrainedTokenizerFast.from_pretrained(SHIPPED)

    def encode(text: str) -> list[int]:
        rendered = chat.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=False)
        return tok.encode(rendered, add_special_tokens=False).ids
    return encode


@pytest.fixture(scope="module")
def template(tok):
    return copyweight.template_tokens(_chat_encoder(tok), 8192, n=400)


def _ids(tok, word: str) -> int:
    (i,) = tok.encode(" " + word, add_special_tokens=False).ids
    return i


def test_template_tokens_hold_the_request_words_and_not_the_slot_values(tok, template):
    for word in ("story", "about", "a", "named"):
        assert template[_ids(tok, word)], word
    for word in ("brave", "fox", "Max", "forest", "kite"):
        assert not template[_ids(tok, word)], word
    assert template[tok.token_to_id("<|user|>")] and template[tok.token_to_id("<|eot|>")]


def _chat_row(tok, prompt: str, answer: str) -> tuple[torch.Tensor, torch.Tensor]:
    p = _chat_encoder(tok)(prompt)
    a = tok.encode(answer, add_special_tokens=False).ids
    ids = torch.tensor([p + a])
    scored = torch.zeros_like(ids, dtype=torch.bool)
    scored[0, len(p):] = True
    return ids, scored


def test_copy_targets_are_the_first_mentions_of_the_requested_words(tok, template):
    ids, scored = _chat_row(tok, "Write a long story about a brave fox named Max.",
                            "Once upon a time, there was a brave fox named Max. Max was "
                            "brave. The fox liked to run.")
    copy = copyweight.copy_targets(ids, scored, torch.ones_like(scored), template)
    words = [tok.id_to_token(int(i)).lstrip("Ġ") for i in ids[copy]]
    assert words == ["brave", "fox", "Max"]
    first = scored[0].nonzero()[0, 0]
    assert not copy[0, :first].any()                        # never in the prompt


def test_left_padding_is_not_read_as_prompt(tok, template):
    ids, scored = _chat_row(tok, "Tell me a story about a kind goat.",
                            "Once upon a time, there was a kind goat.")
    pad = torch.full((1, 3), _ids(tok, "kite"))             # padding holds a word of the answer?
    ids2 = torch.cat([pad, ids], 1)
    scored2 = torch.cat([torch.zeros(1, 3, dtype=torch.bool), scored], 1)
    real = torch.ones_like(scored2)
    real[0, :3] = False
    ids2[0, -2] = _ids(tok, "kite")                         # "kite" is in the answer only
    copy = copyweight.copy_targets(ids2, scored2, real, template)
    words = [tok.id_to_token(int(i)).lstrip("Ġ") for i in ids2[copy]]
    assert words == ["kind"]                                # "goat" was replaced by "kite"


def test_weights_only_for_request_sources_and_a_weight_above_one(tok, template):
    ids, scored = _chat_row(tok, "Write a story about a shy hen.", "There was a shy hen.")
    real = torch.ones_like(scored)
    w = copyweight.weights_for(ids, scored, real, "longreq", template, 4.0)
    assert sorted(set(w.flatten().tolist())) == [1.0, 4.0] and int((w == 4.0).sum()) == 2
    assert copyweight.weights_for(ids, scored, real, "task", template, 4.0) is None
    assert copyweight.weights_for(ids, scored, real, "longreq", template, 1.0) is None
    assert copyweight.weights_for(ids, scored, real, "longreq", None, 4.0) is None


def test_block_loss_is_the_weighted_mean_of_the_target_cross_entropies():
    model = tiny_block_model()
    batch = tiny_block_batch("longreq", unscored=3)
    ids = batch.input_ids
    inputs = blockdiff.block_inputs(batch, 4, 3, torch.Generator().manual_seed(2))
    assert inputs.weights is None
    weights = torch.ones_like(ids, dtype=torch.float)
    weights[0, 5] = weights[1, 7] = 10.0
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[:, 3:] = True                                    # every scored position masked
    weighted = blockdiff.masked_layout(batch, 4, 3, masked, weights)
    plain = dataclasses.replace(weighted, weights=None)
    with torch.no_grad():
        logits = model(weighted.ids, position_ids=weighted.positions, attn_mask=weighted.attn,
                       logits_index=weighted.index).logits.flatten(0, 1)
        ce = F.cross_entropy(logits, weighted.targets.flatten(), ignore_index=IGNORE,
                             reduction="none")
        w = weighted.weights.flatten() * (weighted.targets.flatten() != IGNORE)
        want = float((ce * w).sum() / w.sum())
        got = float(blockdiff.block_loss(model, weighted, "cpu"))
        unweighted = float(blockdiff.block_loss(model, plain, "cpu"))
    assert int((w == 10.0).sum()) == 2
    assert math.isclose(got, want, rel_tol=1e-5)
    assert not math.isclose(got, unweighted, rel_tol=1e-3)
    ones = dataclasses.replace(weighted, weights=torch.ones_like(weighted.weights))
    with torch.no_grad():
        assert math.isclose(float(blockdiff.block_loss(model, ones, "cpu")), unweighted,
                            rel_tol=1e-5)


@pytest.mark.parametrize("name, bad, allowed, good", [
    ("copy_weight", 0.5, r"\[1, 50\]", 3.0), ("ar_weight", -1, r"\[0, 10\]", 0.5),
    ("mask_floor", 1.5, r"\[0, 1\]", 0.5)])
def test_train_checks_the_block_options_by_name(tmp_path, name, bad, allowed, good):
    """Each block-diffusion option: out of range -> an error naming it and its range; on a
    twin (kind="ar") -> an error saying it is a block-diffusion setting."""
    from celeris.train import train
    with pytest.raises(ValueError, match=f"{name} must be in {allowed}"):
        train(tmp_path / "x", preset="micro", steps=1, kind="bd", progress=False, **{name: bad})
    with pytest.raises(ValueError, match=f"{name} is a block-diffusion"):
        train(tmp_path / "x", preset="micro", steps=1, kind="ar", progress=False,
              **{name: good})


def test_a_bd_run_with_a_copy_weight_trains_and_logs_it(tmp_path, monkeypatch):
    from celeris.train import train
    monkeypatch.setenv("CELERIS_THREADS", "1")
    train(tmp_path / "ar", preset="micro", seed=0, progress=False, steps=1, kind="ar")
    run = train(tmp_path / "bd", preset="micro", seed=0, progress=False, steps=2, kind="bd",
                init_from=tmp_path / "ar", copy_weight=5.0,
                mix="story=0,task=0,request=0,longreq=1")
    log = json.loads((tmp_path / "bd" / "train_log.json").read_text())
    assert log["train_config"]["copy_weight"] == 5.0
    assert len(run["losses"]) == 2 and all(0 < x < 100 for x in run["losses"])


# ----------------------------------------------------------------------------- --ar-weight
def test_causal_loss_of_the_twins_weights_is_the_twins_own_loss(monkeypatch):
    """The twin's weights copied into a block model: ``causal_loss`` on a batch equals the
    twin's next-token loss through transformers on the same batch (so the block model is read
    exactly causally: no position sees its own target or anything after it). Both in float32:
    the trainer's bf16 autocast (on CPUs with fast bf16) is switched off for the comparison."""
    import contextlib
    from pathlib import Path

    from celeris.train import trainer
    monkeypatch.setattr(trainer, "autocast_ctx", lambda device: contextlib.nullcontext())

    from transformers import AutoModelForCausalLM

    from celeris.train import stream as _stream
    from celeris.train.checkpoints import load_init_weights
    from celeris.train.data import Batcher
    from celeris.train.trainer import ar_step_loss, build_model, round_vocab
    twin_dir = Path("models/celeris-tiny-ar")
    tok = tt.load_raw(twin_dir)
    stream = _stream.Stream(seed=3, mix=_stream.Mix.from_weights("story=0,request=0,task=0.5,"
                                                                 "longreq=0.5"))
    batcher = Batcher(tok, stream, tokens_per_batch=1024, prefix_prob=0.25)
    block = build_model("bd", "tiny", round_vocab(tok.get_vocab_size()), 4).eval()
    load_init_weights(block, twin_dir)
    twin = AutoModelForCausalLM.from_pretrained(str(twin_dir)).eval()
    sources = set()
    for _ in range(3):
        batch = batcher.next()
        sources.add(batch.source)
        with torch.no_grad():
            mine = float(blockdiff.causal_loss(block, batch, "cpu"))
            theirs = float(ar_step_loss(twin, batch, "cpu"))
        assert math.isclose(mine, theirs, rel_tol=1e-4, abs_tol=1e-6), (batch.source, mine,
                                                                          theirs)
    assert sources == {"task", "longreq"}


def test_a_bd_run_with_an_ar_weight_trains_and_logs_it(tmp_path, monkeypatch):
    from celeris.train import train
    from celeris.train.card import _train_command
    monkeypatch.setenv("CELERIS_THREADS", "1")
    run = train(tmp_path / "bd", preset="micro", seed=0, progress=False, steps=2, kind="bd",
                ar_weight=0.5)
    log = json.loads((tmp_path / "bd" / "train_log.json").read_text())
    assert log["train_config"]["ar_weight"] == 0.5
    assert "--ar-weight 0.5" in _train_command(log)
    assert len(run["losses"]) == 2 and all(0 < x < 100 for x in run["losses"])


def test_blocks_of_one_with_every_target_masked_are_the_twins_objective():
    """--block-size 1 --mask-floor 1: every target is masked and read from the clean state
    before it, so the block loss is the causal next-token loss of the same weights."""
    model = tiny_block_model()
    batch = tiny_block_batch("longreq", unscored=3)
    inputs = blockdiff.block_inputs(batch, 1, 3, torch.Generator().manual_seed(0), eps=1.0)
    assert inputs.masked_frac == 1.0
    with torch.no_grad():
        block = float(blockdiff.block_loss(model, inputs, "cpu"))
        causal = float(blockdiff.causal_loss(model, batch, "cpu"))
        partial = blockdiff.block_inputs(batch, 1, 3, torch.Generator().manual_seed(0))
    assert math.isclose(block, causal, rel_tol=1e-5)
    assert partial.masked_frac < 1.0


def test_the_card_command_names_the_mask_floor():
    from celeris.train.card import _train_command
    log = {"kind": "bd", "out": "runs/b1", "steps": 300, "seed": 1, "threads": 1,
           "train_config": {"block_size": 1, "mask_floor": 1.0}}
    assert _train_command(log).endswith("--block-size 1 --mask-floor 1")

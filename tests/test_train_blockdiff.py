"""The block-diffusion training objective sees exactly what block diffusion decoding sees, and
a micro bd model trains from the AR twin, saves, and decodes in the engine."""

from __future__ import annotations

import json

import pytest
import torch

from celeris import CelerisConfig, CelerisForMaskedDiffusion
from celeris.train import blockdiff
from celeris.train.data import IGNORE, Batch

BS, MASK = 4, 3


def _model() -> CelerisForMaskedDiffusion:
    torch.manual_seed(0)
    cfg = CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, shift_logits=True, attention="block_causal",
                        block_size=BS, initializer_range=0.5, mask_token_id=MASK)
    return CelerisForMaskedDiffusion(cfg).eval()


def _batch(lead_pad: int = 0) -> Batch:
    g = torch.Generator().manual_seed(3)
    L = 15
    ids = torch.randint(5, 64, (1, L), generator=g)
    real = torch.ones(1, L, dtype=torch.bool)
    real[0, :lead_pad] = False
    ids[0, :lead_pad] = 0
    labels = torch.where(real, ids, IGNORE)
    labels[0, :lead_pad + 3] = IGNORE        # a 3-token prompt, never masked
    labels[0, -2:] = IGNORE                  # padding after the answer
    return Batch(ids, None if lead_pad == 0 else real.long(), real, labels, "task", L)


@pytest.mark.parametrize("lead_pad", [0, 2])
def test_training_logits_equal_block_diffusion_inference_logits(lead_pad):
    """For every masked target, the training forward's logits equal those of the inference
    forward over [clean earlier blocks, the noisy block] with shifted logits."""
    model, batch = _model(), _batch(lead_pad)
    inputs = blockdiff.block_inputs(batch, BS, MASK, torch.Generator().manual_seed(5))
    with torch.no_grad():
        train_logits = model(inputs.ids, position_ids=inputs.positions, attn_mask=inputs.attn,
                             logits_index=inputs.index).logits[0]               # (N, V)
    L = inputs.ids.shape[1] // 2      # trimmed after the last target's block, not inside it
    assert L == lead_pad + 16 - lead_pad % BS - (2 if lead_pad else 0) \
        and (L - lead_pad) % BS == 0
    noisy, clean = inputs.ids[0, :L], inputs.ids[0, L:]
    pos = inputs.positions[0, :L]
    checked = 0
    for n, (col, target) in enumerate(zip(inputs.index[0].tolist(), inputs.targets[0].tolist())):
        if target == IGNORE:
            continue
        j = col % L if col >= L else col                     # the target's position column
        b = int(pos[j]) // BS
        lo = lead_pad + b * BS                              # first column of its block
        hi = lo + BS                                        # the whole block, as decoding
        assert hi <= L
        window = torch.cat([clean[lead_pad:lo], noisy[lo:hi]])[None]
        with torch.no_grad():
            ref = model(window, position_ids=torch.arange(window.shape[1])[None]).logits[0]
        assert noisy[j] == MASK and clean[j] == target
        torch.testing.assert_close(train_logits[n], ref[j - lead_pad], rtol=1e-4, atol=1e-4)
        checked += 1
    assert checked >= 3


def test_prompt_stays_clean_and_positions_after_the_answer_are_always_masked():
    one = _batch()
    two = Batch(one.input_ids.repeat(2, 1), None, one.maskable.repeat(2, 1),
                one.labels.repeat(2, 1), "task", one.length)
    two.labels[1, -2:] = two.input_ids[1, -2:]      # row 1's answer is 2 tokens longer
    inputs = blockdiff.block_inputs(two, BS, MASK, torch.Generator().manual_seed(1))
    L = inputs.ids.shape[1] // 2
    W = two.input_ids.shape[1]
    assert L == W + 1              # nothing to trim: row 1 needs every column, and its last
    noisy = inputs.ids[:, :L]      # block (positions 12-15) one more, masked
    assert torch.equal(noisy[:, :3], two.input_ids[:, :3])     # the prompt stays clean
    assert (noisy[0, W - 2:] == MASK).all()          # row 0: after its answer, always masked
    assert (noisy[:, W:] == MASK).all()
    assert torch.equal(inputs.ids[:, L:L + W], two.input_ids)
    assert 0 < inputs.masked_frac <= 1
    short = blockdiff.trim_to_targets(one)
    assert short.input_ids.shape[1] == one.input_ids.shape[1] - 2


def _chat_rows(lens: list[tuple[int, int]], extra: int, seed: int) -> tuple[Batch, list]:
    """A chat batch as ``Batcher.chat_batch`` builds it: left-padded prompts, answers, EOS
    padding (``extra`` columns after the longest), labels on the answers; and the rows'
    (prompt ids, answer ids)."""
    g = torch.Generator().manual_seed(seed)
    rows = [(torch.randint(5, 64, (p,), generator=g).tolist(),
             torch.randint(5, 64, (a,), generator=g).tolist()) for p, a in lens]
    plen = max(len(p) for p, _ in rows)
    L = plen + max(len(a) for _, a in rows) + extra
    ids = torch.full((len(rows), L), 2)
    attn = torch.ones(len(rows), L, dtype=torch.long)
    labels = torch.full((len(rows), L), IGNORE)
    for r, (p, a) in enumerate(rows):
        off = plen - len(p)
        ids[r, :off], attn[r, :off] = 0, 0
        ids[r, off:plen] = torch.tensor(p)
        ids[r, plen:plen + len(a)] = torch.tensor(a)
        labels[r, plen:plen + len(a)] = ids[r, plen:plen + len(a)]
    return Batch(ids, attn, attn.bool(), labels, "request", L), rows


@pytest.mark.parametrize("masking", ["random", "suffix"])
@pytest.mark.parametrize("extra", [0, 1])
def test_training_logits_equal_the_engines_at_every_scored_position(masking, extra):
    """For every masked target of a left-padded chat batch, the training layout's logits equal
    those of the engine's forward for the same state: ``BlockLayout`` (blocks counted from the
    prompt's first token, the block always ``block_size`` wide, masks past the answer) builds
    the window, the model applies its own block-causal mask and token shift. Rows whose last
    block the batch cuts (the longest answer; a cropped one) included."""
    from celeris.families import BlockLayout
    from celeris.engine.request import Request
    from celeris.params import GenerationParams
    model = _model()
    layout = BlockLayout(model.config, MASK)
    # prompt lengths 3-6: the answers start at every place in a block; answers end at every
    # place too, the longest (row 0) inside a block
    batch, rows = _chat_rows([(5, 10), (3, 9), (6, 4), (4, 7)], extra, seed=7)
    cut = 0
    for seed in range(6):
        inputs = blockdiff.block_inputs(batch, BS, MASK, torch.Generator().manual_seed(seed),
                                        masking=masking)
        with torch.no_grad():
            train_logits = model(inputs.ids, position_ids=inputs.positions,
                                 attn_mask=inputs.attn, logits_index=inputs.index).logits
        L = inputs.ids.shape[1] // 2
        plen = max(len(p) for p, _ in rows)
        for r, (prompt, answer) in enumerate(rows):
            P, off = len(prompt), plen - len(prompt)
            noisy = inputs.ids[r, off + P:off + P + len(answer)].tolist()   # the answer's state
            targets = {}                                 # absolute position -> logits row
            for n, (col, t) in enumerate(zip(inputs.index[r].tolist(),
                                             inputs.targets[r].tolist())):
                if t != IGNORE:
                    targets[(col % L if col >= L else col) - off] = (n, t)
            for start in range(P // BS * BS, P + len(answer), BS):      # the engine's blocks
                here = [j for j in sorted(targets) if start <= j < start + BS]
                if not here:
                    continue
                req = Request("r", tuple(prompt), GenerationParams(
                    gen_length=len(answer), block_length=BS, cache="none"), seed=0)
                layout.start(req)
                # earlier blocks committed clean, this block as in the noisy half, masks after
                state = answer[:max(0, start - P)] + noisy[max(0, start - P):start + BS - P]
                req.seq = list(prompt) + state
                req.seq += [MASK] * (start + BS - len(req.seq))
                req.block_start = start
                tokens, first, query_only = layout.window(req)
                assert not query_only and len(tokens) == start + BS - first
                with torch.no_grad():
                    ref = model(torch.tensor([tokens]),
                                position_ids=first + torch.arange(len(tokens))[None],
                                logits_index=torch.tensor([[j - first for j in here]])).logits[0]
                for k, j in enumerate(here):
                    n, t = targets[j]
                    assert req.seq[j] == MASK and answer[j - P] == t
                    torch.testing.assert_close(train_logits[r, n], ref[k], rtol=1e-4, atol=1e-4)
                    cut += off + start + BS > batch.input_ids.shape[1] - extra
    assert cut >= 5          # targets in blocks the batch's own columns end inside


@pytest.mark.slow
def test_micro_bd_model_adapts_from_the_ar_twin_and_decodes_in_the_engine(tmp_path,
                                                                         monkeypatch):
    from celeris import Engine
    from celeris.train import train
    monkeypatch.setenv("CELERIS_THREADS", "1")
    train(tmp_path / "ar", preset="micro", seed=0, progress=False, steps=4, kind="ar")
    run = train(tmp_path / "bd", preset="micro", seed=0, progress=False, steps=6, kind="bd",
                init_from=tmp_path / "ar")
    again = train(tmp_path / "bd2", preset="micro", seed=0, progress=False, steps=6, kind="bd",
                  init_from=tmp_path / "ar")
    assert run["losses"] == again["losses"] and all(0 < x < 100 for x in run["losses"])
    cfg = json.loads((tmp_path / "bd" / "config.json").read_text())
    assert (cfg["attention"], cfg["block_size"], cfg["shift_logits"]) == ("block_causal", 4, True)
    engine = Engine.from_pretrained(tmp_path / "bd", device="cpu")
    params = engine.default_params()
    # left-to-right threshold at 0.85: the fastest rule that kept celeris-tiny-bd grammatical
    assert (params.decoding, params.threshold, params.cache, params.block_length) == (
        "ltr", 0.85, "prefix", 4)
    result = engine.generate("Once upon a time", params.replace(gen_length=10))
    assert result.usage.completion_tokens <= 10 and result.nfe >= 1

"""Block-diffusion training with ``masking="suffix"`` (``--masking suffix``): each block hides
its scored positions from a random place on, the states left-to-right decoding shows."""

from __future__ import annotations

import pytest
import torch

from celeris.train import blockdiff
from celeris.train.data import IGNORE, Batch
from tests.tiny_model import tiny_block_batch

BS, MASK = 4, 3


def _hidden(batch: Batch, seed: int) -> torch.Tensor:
    """(B, L) bool: the positions hidden in the noisy half of one suffix-masked draw."""
    inputs = blockdiff.block_inputs(batch, BS, MASK, torch.Generator().manual_seed(seed),
                                    masking="suffix")
    return inputs.ids[:, :batch.input_ids.shape[1]] == MASK


def test_each_block_hides_a_suffix_of_its_scored_positions_and_every_start_occurs():
    batch = tiny_block_batch("task", unscored=3)      # prompt 0-2; block 0 holds target 3
    scored = batch.labels != IGNORE
    starts = set()
    for seed in range(60):
        hidden = _hidden(batch, seed)
        assert not (hidden & ~scored).any()           # the prompt stays clean
        for row in range(2):
            for b in range(3):
                h = hidden[row, b * BS:(b + 1) * BS].tolist()
                if b == 0:
                    assert h[:3] == [False] * 3
                first = h.index(True) if True in h else BS
                assert h[first:] == [True] * (BS - first), (seed, row, b, h)
                if b > 0:
                    assert h[-1]                      # the last place is always hidden
                    starts.add(first)
    assert starts == {0, 1, 2, 3}


def test_suffix_targets_are_the_hidden_positions_read_from_their_left_neighbour():
    batch = tiny_block_batch("task", unscored=3)
    inputs = blockdiff.block_inputs(batch, BS, MASK, torch.Generator().manual_seed(4),
                                    masking="suffix")
    L = batch.input_ids.shape[1]
    hidden = inputs.ids[:, :L] == MASK
    for row in range(2):
        cols = hidden[row].nonzero().flatten().tolist()
        want = [batch.input_ids[row, c].item() for c in cols]
        got = [t for t in inputs.targets[row].tolist() if t != IGNORE]
        assert got == want
        # a block's first place is read from the clean half, every other from its noisy
        # left neighbour
        index = inputs.index[row, :len(cols)].tolist()
        assert index == [c + L if c % BS == 0 else c for c in cols]


def test_random_masking_is_unchanged_by_the_new_argument():
    batch = tiny_block_batch("task", unscored=3)
    a = blockdiff.block_inputs(batch, BS, MASK, torch.Generator().manual_seed(2))
    b = blockdiff.block_inputs(batch, BS, MASK, torch.Generator().manual_seed(2),
                               masking="random")
    assert torch.equal(a.ids, b.ids) and torch.equal(a.targets, b.targets)
    with pytest.raises(ValueError, match="masking must be one of random, suffix"):
        blockdiff.block_inputs(batch, BS, MASK, torch.Generator(), masking="left")


def test_train_checks_masking_by_name(tmp_path):
    from celeris.train import train
    with pytest.raises(ValueError, match="masking must be one of random, suffix, got 'ltr'"):
        train(tmp_path / "x", preset="micro", steps=1, kind="bd", progress=False,
              masking="ltr")
    with pytest.raises(ValueError, match="masking is a block-diffusion"):
        train(tmp_path / "x", preset="micro", steps=1, kind="ar", progress=False,
              masking="suffix")


def test_a_suffix_run_trains_and_logs_its_masking(tmp_path, monkeypatch):
    import json

    from celeris.train import train
    monkeypatch.setenv("CELERIS_THREADS", "1")
    train(tmp_path / "ar", preset="micro", seed=0, progress=False, steps=1, kind="ar")
    train(tmp_path / "bd", preset="micro", seed=0, progress=False, steps=2, kind="bd",
          init_from=tmp_path / "ar", masking="suffix")
    log = json.loads((tmp_path / "bd" / "train_log.json").read_text())
    assert log["train_config"]["masking"] == "suffix"

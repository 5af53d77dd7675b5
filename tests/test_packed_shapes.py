"""The packed CPU forward runs its products on a few bucketed row counts, whatever the traffic.

oneDNN (and ideep above it) compile and cache a kernel per distinct product shape, ~0.6 MB
each, in caches of 1024 entries; a step's row count is the number of real columns in its
batch of windows, so varied requests on a full-attention model visited hundreds of counts and
the server's memory grew by hundreds of MB per round of traffic before the caches filled.
``bucket_rows`` rounds the rows up (zero rows, dropped again), so the number of distinct
shapes is bounded by construction: 16 exact sizes, then 8 per doubling. These tests hold that
bound on a mixed workload through the engine and keep the logits those of the module path.
"""

from __future__ import annotations

import math

import pytest
import torch

from celeris import Engine
from celeris.model.packed import (EXACT_ROWS, ROWS_PER_OCTAVE, PackedWeights, PlainProducts,
                                  bucket_rows)
from tests.tiny_model import make_tiny_model_dir


class Recording(PlainProducts):
    """The plain products, noting the row count of every product."""

    rows: set[int] = set()

    @staticmethod
    def mm(x, w, bias=None):
        Recording.rows.add(x.shape[0])
        return PlainProducts.mm(x, w, bias)

    @staticmethod
    def mm_add(x, w, residual):
        Recording.rows.add(x.shape[0])
        return PlainProducts.mm_add(x, w, residual)


def bound(max_rows: int) -> int:
    """How many bucketed row counts cover 1..max_rows."""
    return EXACT_ROWS + ROWS_PER_OCTAVE * max(0, math.ceil(math.log2(max_rows / EXACT_ROWS)))


def test_bucketed_rows_pad_at_most_an_eighth_and_take_few_sizes():
    sizes = [bucket_rows(n) for n in range(1, 4097)]
    assert sizes[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))     # a decode step: exact
    assert all(n <= b <= n * (1 + 1 / ROWS_PER_OCTAVE) for n, b in enumerate(sizes, 1))
    assert sizes == sorted(sizes) and all(bucket_rows(b) == b for b in sizes)
    assert len(set(sizes)) == bound(4096) == 80                    # instead of 4096


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model_dir(
        tmp_path_factory.mktemp("full") / "m", max_position_embeddings=256,
        generation_defaults={"gen_length": 16, "temperature": 0.0, "decoding": "threshold",
                             "threshold": 0.9, "block_length": 8, "cache": "none"})
    return Engine.from_pretrained(path, device="cpu")


def test_varied_windows_reach_a_bounded_set_of_product_shapes(engine):
    """Forwards of 1-3 rows of 1-60 columns (a step's real columns take ~130 counts here, and
    thousands under a server's traffic): the products see at most ``bound`` row counts."""
    model = engine.model
    assert engine.packed
    counts = set()
    model._packed = PackedWeights(model, Recording)
    Recording.rows.clear()
    try:
        with torch.inference_mode():
            for batch in (1, 2, 3):
                for width in range(1, 61):
                    ids = torch.full((batch, width), 7)
                    model(ids, logits_index=torch.zeros(batch, 1, dtype=torch.long))
                    counts.add(batch * width)
    finally:
        model.pack_for_inference()
    seen = Recording.rows
    assert len(counts) > bound(max(counts))            # unbucketed, more shapes than the bound
    assert all(bucket_rows(n) == n for n in seen), sorted(seen)
    assert len(seen) <= bound(max(seen)), sorted(seen)
    assert max(seen) == bucket_rows(max(counts))


@pytest.mark.parametrize("batch,width", [(1, 17), (1, 45), (3, 7), (5, 29)])
def test_padded_rows_leave_the_logits_of_the_module_path(engine, batch, width):
    model = engine.model
    g = torch.Generator().manual_seed(width)
    ids = torch.randint(5, model.config.vocab_size, (batch, width), generator=g)
    index = torch.randint(0, width, (batch, 5), generator=g)
    assert bucket_rows(batch * width) > batch * width and bucket_rows(batch * 5) > batch * 5 \
        or batch * 5 <= EXACT_ROWS
    with torch.inference_mode():
        model.unpack_inference()
        ref, ref_idx = model(ids).logits, model(ids, logits_index=index).logits
        model._packed = PackedWeights(model, PlainProducts)
        try:
            got, got_idx = model(ids).logits, model(ids, logits_index=index).logits
        finally:
            model.pack_for_inference()
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got_idx, ref_idx, atol=2e-4, rtol=1e-4)

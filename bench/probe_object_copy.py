"""Can a block-diffusion model copy the object a story just found? ("found a green coin in the
sand. The ___" should be "coin".)

Session 10 found that celeris-tiny-bd's stories switch objects ("found a silver coin ... The
pumpkin was new") while its AR twin never does. This probe separates a decoding problem from a
model problem: for each prefix it reads the model's probability of the right object twice, in
the training layout of ``celeris.train.blockdiff`` (noisy block with the object and everything
after it masked, clean earlier blocks) and through the engine (left-to-right, threshold 1.0:
one token per forward, so parallel decoding plays no part). An AR twin is read with a plain
causal forward for comparison.

    python bench/probe_object_copy.py models/celeris-tiny-bd [runs/bd8 ...] --ar models/celeris-tiny-ar
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celeris import Engine  # noqa: E402
from celeris.train.blockdiff import masked_layout  # noqa: E402
from celeris.train.data import Batch  # noqa: E402

PREFIXES = (   # (story up to and including the object's second mention, the object)
    ("Once upon a time, there was a happy fish called Lucy. Lucy liked to play outside every "
     "day.\n\nOne day, Lucy found a green coin in the sand. The coin", "coin"),
    ("Once upon a time, there was a little mouse called Ivy. Ivy liked to sing.\n\nOne day, "
     "Ivy found a shiny bell near the river. The bell", "bell"),
    ("Once upon a time, there was a brave fox named Max. Max lived in the forest.\n\nOne day, "
     "Max found a red kite under a tree. The kite", "kite"),
    ("Once upon a time, there was a kind girl named Rosa. Rosa liked to draw.\n\nOne day, "
     "Rosa found a blue box by the road. The box was heavy and old. Rosa took the box", "box"),
)


def block_probability(engine: Engine, text: str) -> tuple[float, str]:
    """p(last token | the rest) in the block-diffusion training layout, and the top token."""
    model, tok = engine.model, engine.tokenizer
    ids = torch.tensor([tok.encode(text)])
    L = ids.shape[1]
    batch = Batch(ids, None, torch.ones_like(ids, dtype=torch.bool), ids.clone(), "probe", L)
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[0, -1] = True                                   # the object; nothing follows it
    x = masked_layout(batch, model.config.block_size, model.config.mask_token_id, masked)
    with torch.no_grad():
        logits = model(x.ids, position_ids=x.positions, attn_mask=x.attn,
                       logits_index=x.index).logits[0, 0]
    p = logits.float().softmax(-1)
    return float(p[ids[0, -1]]), tok.decode([int(p.argmax())]).strip()


def ar_probability(path: str, text: str) -> tuple[float, str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.tensor([tok.encode(text)])             # with BOS, as the twin was trained
    with torch.no_grad():
        p = model(ids[:, :-1]).logits[0, -1].float().softmax(-1)
    return float(p[ids[0, -1]]), tok.decode([int(p.argmax())]).strip()


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="block-diffusion model directories")
    ap.add_argument("--ar", default=None, help="the AR twin, read for comparison")
    args = ap.parse_args(argv)
    rows = []
    for path in args.models:
        engine = Engine.from_pretrained(path, device="cpu")
        params = engine.default_params().replace(gen_length=4, decoding="ltr", threshold=1.0)
        for text, obj in PREFIXES:
            p, top = block_probability(engine, text)
            prompt = text[: text.rindex(obj)].rstrip()
            said = engine.generate(prompt, params).text.split()[0]
            rows.append({"model": path, "object": obj, "p_train_layout": p, "top": top,
                         "engine_wrote": said})
    if args.ar:
        for text, obj in PREFIXES:
            p, top = ar_probability(args.ar, text)
            rows.append({"model": args.ar, "object": obj, "p_train_layout": p, "top": top,
                         "engine_wrote": "-"})
    print(f"{'model':32s} {'object':7s} {'p(object)':>9s} {'argmax':10s} engine wrote")
    for r in rows:
        print(f"{r['model']:32s} {r['object']:7s} {r['p_train_layout']:9.3f} {r['top']:10s} "
              f"{r['engine_wrote']}")
    return rows


if __name__ == "__main__":
    main()

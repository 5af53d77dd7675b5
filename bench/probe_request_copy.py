"""Does a model copy the adjective a story request asks for? ("Write a long story about a
strong goat." -> "Once upon a time, there was a ___" should be "strong".)

Session 15 found both shipped models telling one story whose hero is always "little", and the
block model learning to copy the requested adjective far more slowly than its twin on the same
batches. This probe reads, for the held-out story requests that ask for an adjective (9 of
the stories suite's 40: 10, less one that starts with a vowel), the probability of the
requested adjective right after that opening: for a block-diffusion model in the training
layout of ``celeris.train.blockdiff`` (the adjective masked, everything before it clean), for the AR
twin with a plain causal forward. It prints p(requested), p(little) and how often the
requested adjective is the argmax; a run can be probed while it trains (``celeris train
--snapshot``).

    python bench/probe_request_copy.py models/celeris-tiny-bd runs/bd8a-1000 \\
        --ar models/celeris-tiny-ar [--json runs/probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celeris import Engine  # noqa: E402
from celeris.train.blockdiff import masked_layout  # noqa: E402
from celeris.train.corpus import article, heldout_long_requests  # noqa: E402
from celeris.train.data import IGNORE, Batch  # noqa: E402

# (request text, the adjective it asks for): the held-out requests of the stories suite, less
# the one whose adjective starts with a vowel ("old": "there was an" leaves no other choice)
PAIRS = tuple((r.text, r.asks["adj"]) for r in heldout_long_requests(40)
              if "adj" in r.asks and r.asks["adj"][0] not in "aeiou")


def opening(adj: str) -> str:
    """The corpus's most common opening, up to and including the hero's adjective."""
    return f"Once upon a time, there was {article(adj)}"


def _ids(encode_chat, encode, text: str, adj: str) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids up to and including the adjective)."""
    prompt = encode_chat([{"role": "user", "content": text}])
    return prompt, encode(opening(adj))


def block_probabilities(engine: Engine, text: str, adj: str) -> torch.Tensor:
    """(V,) probabilities at the adjective's position, in the block-diffusion training layout."""
    tok, model = engine.tokenizer, engine.model
    prompt, answer = _ids(tok.encode_chat, lambda t: tok.encode(t, add_special_tokens=False),
                          text, adj)
    ids = torch.tensor([prompt + answer])                                      # (1, L)
    labels = torch.full_like(ids, IGNORE)
    labels[0, len(prompt):] = ids[0, len(prompt):]
    batch = Batch(ids, None, labels != IGNORE, labels, "probe", ids.shape[1])
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[0, -1] = True
    x = masked_layout(batch, model.config.block_size, model.config.mask_token_id, masked)
    with torch.no_grad():
        logits = model(x.ids, position_ids=x.positions, attn_mask=x.attn,
                       logits_index=x.index).logits[0, 0]
    return logits.float().softmax(-1)


def ar_probabilities(model, tok, text: str, adj: str) -> torch.Tensor:
    def encode_chat(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
    prompt, answer = _ids(encode_chat, lambda t: tok.encode(t, add_special_tokens=False),
                          text, adj)
    ids = torch.tensor([prompt + answer[:-1]])
    with torch.no_grad():
        return model(ids).logits[0, -1].float().softmax(-1)


def summarise(name: str, probs: list[tuple[str, torch.Tensor]], id_of) -> dict:
    rows = [{"adj": adj, "p": float(p[id_of(adj)]), "p_little": float(p[id_of("little")]),
             "argmax": bool(int(p.argmax()) == id_of(adj))} for adj, p in probs]
    n = len(rows)
    return {"model": name, "pairs": rows,
            "mean_p_requested": sum(r["p"] for r in rows) / n,
            "mean_p_little": sum(r["p_little"] for r in rows) / n,
            "argmax_requested": sum(r["argmax"] for r in rows) / n}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="block-diffusion model directories")
    ap.add_argument("--ar", action="append", default=[], help="an AR twin (repeatable)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    out = []
    for path in args.models:
        engine = Engine.from_pretrained(path, device="cpu")
        tok = engine.tokenizer

        def id_of(word, tok=tok):
            return tok.encode(opening(word), add_special_tokens=False)[-1]
        out.append(summarise(path, [(a, block_probabilities(engine, t, a)) for t, a in PAIRS],
                             id_of))
    for path in args.ar:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()

        def id_of(word, tok=tok):
            return tok.encode(opening(word), add_special_tokens=False)[-1]
        out.append(summarise(path, [(a, ar_probabilities(model, tok, t, a)) for t, a in PAIRS],
                             id_of))
    print(f"{'model':34s} {'p(requested)':>12s} {'p(little)':>9s} {'argmax=requested':>16s}")
    for r in out:
        print(f"{r['model']:34s} {r['mean_p_requested']:12.3f} {r['mean_p_little']:9.3f} "
              f"{r['argmax_requested']:16.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()

"""Does a model copy the adjective a story request asks for? ("Write a long story about a
strong goat." -> "Once upon a time, there was a ___" should be "strong".)

Session 15 found both shipped models telling one story whose hero is always "little", and the
block model learning to copy the requested adjective far more slowly than its twin on the same
batches. This probe reads, for the held-out story requests that ask for an adjective (9 of
the stories suite's 40: 10, less one that starts with a vowel), the probability of the
requested adjective right after that opening: for a block-diffusion model in the training
layout of ``celeris.train.blockdiff`` (the adjective masked, everything before it clean), for the AR
twin with a plain causal forward. It prints p(requested), p(little) and how often the
requested adjective is the argmax, and for a block model two checks of where it looks: how far
the adjective slot's distribution moves when the prompt asks for another adjective (max
|dp|; 0 = the slot ignores the prompt) and p(kind) after "... there was a little" (the hero's
kind, which the block models do copy from the prompt), and p(requested) with the block model's
weights read causally, as the twin reads them. ``--by-position`` adds p(requested) by the
adjective's place in its block. A run can be probed while it trains (``celeris train
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

# (request text, the adjective and the kind it asks for): the held-out requests of the stories
# suite, less the one whose adjective starts with a vowel ("old": "there was an" leaves no
# other choice)
PAIRS = tuple((r.text, r.asks["adj"], r.asks["kind"]) for r in heldout_long_requests(40)
              if "adj" in r.asks and r.asks["adj"][0] not in "aeiou")


def opening(adj: str) -> str:
    """The corpus's most common opening, up to and including the hero's adjective."""
    return f"Once upon a time, there was {article(adj)}"


def block_next(engine: Engine, request_text: str, answer: str) -> torch.Tensor:
    """(V,) probabilities of the last token of ``answer`` (the reply to ``request_text`` so
    far), read in the block-diffusion training layout: that token masked, the rest clean."""
    tok, model = engine.tokenizer, engine.model
    prompt = tok.encode_chat([{"role": "user", "content": request_text}])
    ids = torch.tensor([prompt + tok.encode(answer, add_special_tokens=False)])  # (1, L)
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


def causal_next(engine: Engine, request_text: str, answer: str) -> torch.Tensor:
    """(V,) probabilities of the last token of ``answer`` with the block model's weights read
    causally (each position sees only the ones before it: the twin's reading)."""
    tok, model = engine.tokenizer, engine.model
    prompt = tok.encode_chat([{"role": "user", "content": request_text}])
    ids = torch.tensor([prompt + tok.encode(answer, add_special_tokens=False)])  # (1, L)
    L = ids.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None, None]             # (1, 1, L, L)
    with torch.no_grad():
        logits = model(ids, position_ids=torch.arange(L)[None], attn_mask=causal,
                       logits_index=torch.tensor([[L - 1]])).logits[0, 0]
    return logits.float().softmax(-1)


# words put before a request to move its answer, and so the adjective, within the blocks
SHIFTS = ("", "Now ", "Now please ", "Now please, ", "Hello. Now please ", "Hello! Now, please ")


def by_block_position(engine: Engine) -> dict[int, float]:
    """Mean p(requested adjective) by the adjective's place in its block (0 = a block's first
    position, read from the clean previous block as the engine does; 1.. = read from the
    noisy left neighbour), each request shifted by the words of ``SHIFTS``."""
    tok, size = engine.tokenizer, engine.model.config.block_size
    seen: dict[int, list[float]] = {}
    for text, adj, _ in PAIRS:
        for shift in SHIFTS:
            prompt = tok.encode_chat([{"role": "user", "content": shift + text}])
            answer = tok.encode(opening(adj), add_special_tokens=False)
            place = (len(prompt) + len(answer) - 1) % size       # positions count from 0
            p = block_next(engine, shift + text, opening(adj))[answer[-1]]
            seen.setdefault(place, []).append(float(p))
    return {k: sum(v) / len(v) for k, v in sorted(seen.items())}


def block_checks(engine: Engine, text: str, adj: str, kind: str, other_adj: str) -> dict:
    """For one request: the adjective slot's probabilities, how far they move when the prompt
    asks for ``other_adj`` instead (max |dp|: 0 = the slot ignores the prompt), and p(kind)
    after "... there was a little" (the kind is copied from the prompt)."""
    p = block_next(engine, text, opening(adj))
    swapped = block_next(engine, text.replace(f" {adj} ", f" {other_adj} "), opening(adj))
    kind_p = block_next(engine, text, f"{opening('little')} {kind}")
    causal = causal_next(engine, text, opening(adj))
    kind_id = engine.tokenizer.encode(f"{opening('little')} {kind}", add_special_tokens=False)
    adj_id = engine.tokenizer.encode(opening(adj), add_special_tokens=False)[-1]
    return {"probs": p, "swap_shift": float((p - swapped).abs().max()),
            "p_kind": float(kind_p[kind_id[-1]]), "p_causal": float(causal[adj_id])}


def ar_probabilities(model, tok, text: str, adj: str) -> torch.Tensor:
    """(V,) the twin's next-token probabilities after the opening, before the adjective."""
    prompt = tok.apply_chat_template([{"role": "user", "content": text}],
                                     add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    answer = tok.encode(opening(adj), add_special_tokens=False)
    ids = torch.tensor([prompt + answer[:-1]])
    with torch.no_grad():
        return model(ids).logits[0, -1].float().softmax(-1)


def summarise(name: str, probs: list[tuple[str, torch.Tensor]], id_of,
              extra: list[dict] | None = None) -> dict:
    """The per-request rows of one model and their means; ``extra`` (block models) adds each
    request's prompt-swap shift and p(kind)."""
    rows = [{"adj": adj, "p": float(p[id_of(adj)]), "p_little": float(p[id_of("little")]),
             "argmax": bool(int(p.argmax()) == id_of(adj))} for adj, p in probs]
    for row, more in zip(rows, extra or []):
        row.update(more)
    n = len(rows)
    out = {"model": name, "pairs": rows,
           "mean_p_requested": sum(r["p"] for r in rows) / n,
           "mean_p_little": sum(r["p_little"] for r in rows) / n,
           "argmax_requested": sum(r["argmax"] for r in rows) / n}
    if extra:
        out["max_swap_shift"] = max(r["swap_shift"] for r in rows)
        out["mean_p_kind"] = sum(r["p_kind"] for r in rows) / n
        out["mean_p_requested_causal"] = sum(r["p_causal"] for r in rows) / n
    return out


def probe_block(path: str, positions: bool = False) -> dict:
    engine = Engine.from_pretrained(path, device="cpu")
    tok = engine.tokenizer

    def id_of(word):
        return tok.encode(opening(word), add_special_tokens=False)[-1]
    # each request's adjective swapped for the next request's (a different one) in the prompt
    others = [PAIRS[(i + 1) % len(PAIRS)][1] for i in range(len(PAIRS))]
    others = [o if o != a else "sleepy" for o, (_, a, _) in zip(others, PAIRS)]
    checks = [block_checks(engine, t, a, k, o) for (t, a, k), o in zip(PAIRS, others)]
    out = summarise(path, [(a, c.pop("probs")) for (_, a, _), c in zip(PAIRS, checks)], id_of,
                    checks)
    if positions:
        out["p_requested_by_block_position"] = by_block_position(engine)
    return out


def probe_ar(path: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()

    def id_of(word):
        return tok.encode(opening(word), add_special_tokens=False)[-1]
    return summarise(path, [(a, ar_probabilities(model, tok, t, a)) for t, a, _ in PAIRS], id_of)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="block-diffusion model directories")
    ap.add_argument("--ar", action="append", default=[], help="an AR twin (repeatable)")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--by-position", action="store_true",
                    help="block models: also p(requested) by the adjective's place in its "
                         "block (each request shifted by a few words)")
    args = ap.parse_args(argv)
    out = [probe_block(p, args.by_position) for p in args.models] + [probe_ar(p)
                                                                     for p in args.ar]
    print(f"{'model':26s} {'p(requested)':>12s} {'p(little)':>9s} {'argmax=req':>10s} "
          f"{'swap shift':>10s} {'p(kind)':>7s} {'causal p(req)':>13s}")
    for r in out:
        shift = f"{r['max_swap_shift']:10.1e}" if "max_swap_shift" in r else f"{'-':>10s}"
        kind = f"{r['mean_p_kind']:7.3f}" if "mean_p_kind" in r else f"{'-':>7s}"
        causal = (f"{r['mean_p_requested_causal']:13.3f}" if "mean_p_requested_causal" in r
                  else f"{'-':>13s}")
        print(f"{r['model']:26s} {r['mean_p_requested']:12.3f} {r['mean_p_little']:9.3f} "
              f"{r['argmax_requested']:10.0%} {shift} {kind} {causal}")
        if "p_requested_by_block_position" in r:
            places = r["p_requested_by_block_position"]
            print(f"{'':26s} p(requested) by place in block: " + ", ".join(
                f"{k}: {v:.3f}" for k, v in places.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()

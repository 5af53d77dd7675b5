"""Do the block model and its twin tell different stories to different requests?

The stories bench decodes greedily (the models' defaults), and at T = 0 a small model answers
every "tell me a story about X" with its one most likely story, the hero swapped in. That says
little about the distribution the model learned, which self-distillation on its own greedy
answers can narrow. This script answers the 40 held-out long-story requests by sampling at
``--temperature`` (the block model through the engine with its default decoding rule at that
temperature, the twin through ``generate(do_sample=True)``, top-k/top-p off) and reports, for
each model, the fraction of distinct sentences across all the answers
(``longcheck.distinct_sentences``; the corpus's own stories for those requests: 0.65) beside
the story checks of ``longcheck.long_score``.

    python bench/diversity.py --pair runs/bd4sd,runs/ar4sd --pair models/celeris-tiny-bd,models/celeris-tiny-ar \\
        --temperature 1.0 --json docs/diversity-t1.json

Counts, not timings: run it beside anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEYS = ("distinct_sentences", "grammatical", "hero_kept", "request_honoured",
        "objects_kept", "repeated_sentences")


def block_stories(model: str, requests, temperature: float, seed: int, batch: int = 8):
    from celeris import Engine
    engine = Engine.from_pretrained(model, device="cpu")
    params = engine.default_params().replace(gen_length=448, temperature=temperature, seed=seed)
    texts: list[str] = []
    for i in range(0, len(requests), batch):
        chunk = requests[i:i + batch]
        texts += [r.text for r in engine.generate_batch(
            [[{"role": "user", "content": q.text}] for q in chunk], params)]
    engine.stop()
    return texts


def twin_stories(model: str, requests, temperature: float, seed: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model).eval()
    torch.manual_seed(seed)
    sample = temperature > 0
    texts = []
    for q in requests:
        ids = tok.apply_chat_template([{"role": "user", "content": q.text}],
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        with torch.no_grad():
            out = lm.generate(**ids, max_new_tokens=448, do_sample=sample,
                              temperature=temperature if sample else None,
                              top_k=0 if sample else None, top_p=None)
        texts.append(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", action="append", required=True, metavar="BD,AR",
                    help="a block model and its twin, comma-separated (repeatable)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not 0.0 <= args.temperature <= 2.0:
        ap.error(f"--temperature must be in [0, 2], got {args.temperature}")
    if not 1 <= args.requests <= 200:
        ap.error(f"--requests must be in [1, 200], got {args.requests}")

    import torch
    from celeris.train.corpus import heldout_long_requests
    from celeris.train.longcheck import distinct_sentences, long_score
    torch.set_num_threads(args.threads)
    requests = heldout_long_requests(args.requests)
    report = {"temperature": args.temperature, "requests": args.requests, "seed": args.seed,
              "corpus_distinct_sentences": distinct_sentences([r.story for r in requests]),
              "rows": []}
    for pair in args.pair:
        bd, ar = pair.split(",")
        for kind, model, fn in (("block", bd, block_stories), ("twin", ar, twin_stories)):
            texts = fn(model, requests, args.temperature, args.seed)
            score = long_score(texts, requests)
            row = {"model": model, "kind": kind, **{k: score[k] for k in KEYS},
                   "sample": texts[0]}
            report["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "sample"}), flush=True)
    print(f"corpus: {report['corpus_distinct_sentences']:.3f} distinct sentences")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

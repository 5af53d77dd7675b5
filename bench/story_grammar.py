"""How grammatical are the shipped models' stories? (quality check, not a speed benchmark)

Prompts: the first four words of 20 held-out stories. Each model continues them greedily with
64 new tokens (celeris-tiny: steps 64 at its default block, 32 and 1, or ``--blocks``; the AR
twin: transformers ``generate``); celeris-tiny also fills one masked word in one sentence of
each of 40 held-out stories (``storycheck.measure_infill``), with the story before it as context
and alone. Every complete sentence of prompt + continuation (or filled sentence) is checked
with ``celeris.train.storycheck`` (is its word-category template one the story grammar
writes?).

    python bench/story_grammar.py [--n 20] [--infill-n 40] [--blocks 1,8,32] [--json out.json]

Measured on the 2-core Intel Xeon VM, 2026-11-30, shipped models of that date (celeris-tiny:
8000 adaptation steps + 1000 semi-autoregressive steps), float32, with
``--blocks 1,2,4,8,16,32`` (docs/BENCHMARKS.md also has the model before):

| model / decoding | grammatical sentences | sentences | unfinished tails |
|---|---|---|---|
| celeris-tiny, block 1 | 99.1% | 110 | 2 |
| celeris-tiny, block 8 | 70.0% | 50 | 0 |
| celeris-tiny, block 32 (default) | 65.0% | 40 | 0 |
| AR twin | 100.0% | 100 | 0 |
| celeris-tiny infill in story, 40 stories | 85.0% | 40 | 0 |
| celeris-tiny infill, the sentence alone | 62.5% | 40 | 0 |
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celeris.train import storycheck  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=storycheck.STORY_OPENINGS,
                    help="number of story prompts (1-200)")
    ap.add_argument("--infill-n", type=int, default=storycheck.INFILL_ITEMS,
                    help="number of held-out sentences with one word to infill (1-200)")
    ap.add_argument("--model", default="models/celeris-tiny")
    ap.add_argument("--ar-model", default="models/celeris-tiny-ar")
    ap.add_argument("--blocks", default="", metavar="LIST",
                    help="block lengths for the diffusion model, e.g. 1,2,4,8,16,32 "
                         "(default: its default block, 32 and 1)")
    ap.add_argument("--json", default="", help="also write the report here")
    args = ap.parse_args()
    try:
        blocks = tuple(int(b) for b in args.blocks.split(",") if b.strip()) or None
    except ValueError:
        ap.error(f"--blocks: expected comma-separated integers, got {args.blocks!r}")
    try:
        report = [{"model": m, **r} for m, kind in ((args.model, "diffusion"),
                                                     (args.ar_model, "ar"))
                  for r in storycheck.measure(m, kind, n=args.n,
                                              block_lengths=blocks if kind != "ar" else None)]
        for context in (True, False):
            report.append({"model": args.model,
                           "task": "infill in story" if context else "infill, sentence alone",
                           **storycheck.measure_infill(args.model, n=args.infill_n,
                                                       context=context)})
    except ValueError as exc:
        ap.error(str(exc))
    for r in report:
        what = "filled sentences" if "infill" in r.get("task", "") else "sentences"
        print(f"{r['model']} ({r.get('task', 'story')}; {r['decoding']}): "
              f"{r['grammatical']:.1%} of {r['sentences']} {what} ({r['unfinished']} "
              f"unfinished); e.g. not in the grammar: {r['examples_bad'][:2]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

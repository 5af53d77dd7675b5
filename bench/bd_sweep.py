"""Choose a block-diffusion model's block size and threshold by measurement.

A model trained with ``celeris train --kind bd --block-sizes 4,8,16`` has seen every one of
those block sizes; this sweep decodes held-out prompts with each (block size, threshold) pair
and reports, side by side: exact match on the checkable tasks, and on long-story requests the
story scores (``longcheck.long_score``) and tokens per forward. Speed is the bench's job
(``python -m celeris bench --suite ar,stories``); TPF here is what decides it.

    python bench/bd_sweep.py --model runs/bd --sizes 4,8,16 --thresholds 0.5,0.7,0.9 \\
        --tasks 10 --stories 12 --json runs/sweep.json

The block size is changed in a temporary copy of ``config.json`` (weights are symlinked).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def with_block_size(model: Path, size: int, root: Path) -> Path:
    """A folder that is ``model`` with ``block_size`` = size (symlinked files)."""
    out = root / f"bs{size}"
    out.mkdir()
    for f in model.iterdir():
        if f.is_file() and f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    cfg = json.loads((model / "config.json").read_text())
    cfg["block_size"] = size
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def measure(engine, params, task_examples, requests, batch: int) -> dict:
    from celeris.train import score
    from celeris.train.longcheck import fields_line, long_score

    t0 = time.perf_counter()
    res = []
    for i in range(0, len(task_examples), batch):
        chunk = task_examples[i:i + batch]
        res += engine.generate_batch([ex.messages() for ex in chunk], params)
    ok = [score(ex.task, r.text, ex.answer) for ex, r in zip(task_examples, res)]
    task_tokens = sum(r.usage.completion_tokens for r in res)
    task_nfe = sum(r.nfe for r in res)
    story = []
    sp = params.replace(gen_length=448)
    for i in range(0, len(requests), batch):
        chunk = requests[i:i + batch]
        story += engine.generate_batch([[{"role": "user", "content": r.text}] for r in chunk],
                                       sp)
    q = long_score([r.text for r in story], list(requests))
    st_tokens = sum(r.usage.completion_tokens for r in story)
    st_nfe = sum(r.nfe for r in story)
    return {"task_accuracy": sum(ok) / len(ok), "task_tpf": task_tokens / max(task_nfe, 1),
            "story_tpf": st_tokens / max(st_nfe, 1), "story_tokens": st_tokens,
            "grammatical": q["grammatical"], "hero_kept": q["hero_kept"],
            "request_honoured": q["request_honoured"],
            "request_by_field": fields_line(q["request_fields"]), "unfinished": q["unfinished"],
            "failures": q.get("examples_failed", [])[:3], "bad": q.get("examples_bad", [])[:3],
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--thresholds", default="0.5,0.7,0.9")
    ap.add_argument("--tasks", type=int, default=10, help="held-out problems per task")
    ap.add_argument("--stories", type=int, default=12, help="held-out long requests")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--decoding", default="ltr", help="threshold rule: ltr (default) or threshold")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    from celeris import Engine
    from celeris.train import TASKS, eval_examples
    from celeris.train.corpus import heldout_long_requests

    torch.set_num_threads(int(__import__("os").environ.get("CELERIS_THREADS", "2")))
    examples = [ex for t in TASKS for ex in eval_examples(t)[:args.tasks]]
    requests = heldout_long_requests(args.stories)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            engine = Engine.from_pretrained(with_block_size(Path(args.model), size, Path(tmp)),
                                            device="cpu")
            for th in (float(t) for t in args.thresholds.split(",")):
                params = engine.default_params().replace(threshold=th, decoding=args.decoding,
                                                         temperature=0.0, gen_length=64)
                row = {"block_size": size, "threshold": th, "decoding": args.decoding,
                       **measure(engine, params, examples, requests, args.batch)}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items()
                                  if k not in ("failures", "bad")}), flush=True)
            engine.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

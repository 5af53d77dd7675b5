"""Benchmark suites: ``python -m celeris bench --suite decode|ar|stories|lengths|serve|invariance|structured|scores|quant|gpu|all``.

All requested suites run in one process on one loaded model, so every ratio in the report is
measured side by side. The report records the machine, versions, dtype, model, lengths, batch
size and accuracy next to every speed (docs/DESIGN.md, "Numbers we publish").
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from typing import Any, Callable

from ..config import BIG_MODEL_FIELDS
from .common import BenchContext, SuiteSkipped, machine_info
from .decode import run_ar, run_decode
from .gpu import run_gpu
from .lengths import run_invariance, run_lengths
from .progress import clock
from .quant import run_quant
from .report import console, write_html, write_json
from .scores import run_scores
from .serve import run_serve
from .stories import run_stories
from .structured import run_structured

SUITES: dict[str, Callable[[BenchContext], dict[str, Any]]] = {
    "decode": run_decode, "ar": run_ar, "stories": run_stories, "lengths": run_lengths,
    "serve": run_serve, "invariance": run_invariance, "gpu": run_gpu,
    "structured": run_structured, "scores": run_scores, "quant": run_quant}
ALL_ORDER = ("decode", "ar", "stories", "lengths", "serve", "invariance", "structured", "scores",
             "quant", "gpu")


def suite_names(spec: str | None) -> list[str]:
    """"all", one name, or a comma-separated list, in the canonical order."""
    names = ["all"] if not spec else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n != "all" and n not in SUITES]
    if unknown:
        raise ValueError(f"--suite must be one of {', '.join(ALL_ORDER)}, all (or a comma "
                         f"list); got {', '.join(unknown)}")
    return list(ALL_ORDER) if "all" in names else [n for n in ALL_ORDER if n in names]


def _levels(spec: Any) -> tuple[int, ...]:
    if spec is None:
        return BenchContext.concurrency
    if isinstance(spec, str):
        spec = [s for s in spec.split(",") if s.strip()]
    try:
        levels = tuple(int(s) for s in spec)
    except ValueError:
        raise ValueError(f"--concurrency must be integers like 1,4,8; got {spec!r}") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency levels must be >= 1; got {spec!r}")
    return levels


def context_from_args(args: argparse.Namespace) -> BenchContext:
    def get(name: str, default: Any = None) -> Any:
        value = getattr(args, name, None)
        return default if value is None else value

    ctx = BenchContext(model=get("model"), ar_model=get("ar_model"),
                       canvas_model=get("canvas_model"),
                       device=get("device", "auto"), dtype=get("dtype", "auto"),
                       n=get("n", 5), gen_length=get("gen_length", 256),
                       block_length=get("block_length", 32), batch=get("batch", 1),
                       repeats=get("repeats", 5), concurrency=_levels(get("concurrency")),
                       url=get("url"), api_key=get("api_key"), tiny=bool(get("tiny", False)),
                       max_running=get("max_running"), serve_requests=get("requests"),
                       progress=not get("no_progress", False),
                       load_options={k: v for k in BIG_MODEL_FIELDS
                                     if (v := get(k)) is not None})
    if ctx.serve_requests is not None and ctx.serve_requests < 1:
        raise ValueError(f"--requests must be a positive integer, got {ctx.serve_requests}")
    for name in ("n", "gen_length", "block_length", "batch", "repeats"):
        value = getattr(ctx, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                             f"got {value!r}")
    return ctx


def run(ctx: BenchContext, names: list[str]) -> dict[str, Any]:
    """Run the suites in order; a failing or skipped suite is recorded, the rest still run."""
    report: dict[str, Any] = {"created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                              "command": " ".join(["python -m celeris bench", *sys.argv[2:]])
                              if sys.argv[1:2] == ["bench"] else "celeris.bench.run",
                              "machine": machine_info(), "suites": {}}
    for k, name in enumerate(names, 1):
        start = time.perf_counter()
        ctx.suite = name
        ctx.say(f"started (suite {k} of {len(names)})")
        try:
            sec = SUITES[name](ctx)
        except SuiteSkipped as exc:
            sec = {"suite": name, "status": "skipped", "reason": str(exc)}
        except Exception as exc:  # one broken suite must not hide the others' numbers
            traceback.print_exc(file=sys.stderr)
            sec = {"suite": name, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}
        sec["seconds"] = round(time.perf_counter() - start, 2)
        ctx.say(f"{sec['status']} in {clock(sec['seconds'])}")
        report["suites"][name] = ctx.results[name] = sec
    return report


def main(args: argparse.Namespace) -> int:
    names = suite_names(getattr(args, "suite", None))
    ctx = context_from_args(args)
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be a positive integer, got {threads}")
        import torch
        torch.set_num_threads(threads)
    report = run(ctx, names)
    print(console(report))
    if getattr(args, "json", None):
        write_json(report, args.json)
        print(f"\nJSON report: {args.json}")
    if getattr(args, "html", None):
        n = write_html(report, args.html)
        print(f"HTML report: {args.html} ({n} charts)")
    statuses = [s["status"] for s in report["suites"].values()]
    if "error" in statuses:
        return 1
    explicit = getattr(args, "suite", None) not in (None, "all")
    return 1 if explicit and "skipped" in statuses else 0


__all__ = ["main", "run", "SUITES", "BenchContext", "suite_names", "context_from_args"]

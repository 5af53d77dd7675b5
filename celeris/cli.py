"""Command line interface: ``python -m celeris <command>`` (the only argparse in Celeris).

Commands: generate | eval | train | serve | bench | batch | space. Every handler imports the engine
lazily, so ``import celeris.cli`` (and ``--help``) works without torch or a model.
Generation options default to None and only the given ones override the model's defaults;
``GenerationParams`` validates them, so messages match the server and the UI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import BIG_MODEL_FIELDS, QUANTIZE_MODES
from .hints import missing_model_dir, port_problem

# (flag, GenerationParams field, type, help). --stop is added separately (repeatable).
_GENERATION_OPTIONS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--gen-length", "gen_length", int, "answer canvas length in tokens"),
    ("--steps", "steps", int,
     "denoising steps over the whole answer: 0 = one token a step, else a multiple of "
     "the number of blocks"),
    ("--block-length", "block_length", int, "semi-autoregressive block size"),
    ("--temperature", "temperature", float,
     "0 = greedy; > 0 (at most 2) samples with Gumbel noise"),
    ("--top-p", "top_p", float, "nucleus filtering (1.0 = off)"),
    ("--top-k", "top_k", int, "top-k filtering (0 = off)"),
    ("--remasking", "remasking", str,
     "confidence that orders commits: low_confidence, margin, entropy, random (Dream's "
     "names maskgit_plus, topk_margin, origin are accepted too)"),
    ("--decoding", "decoding", str, "unmask schedule: fixed, threshold, factor, ltr (left to "
     "right threshold), dynamic (SDAR: above the threshold, at least the --steps schedule)"),
    ("--threshold", "threshold", float,
     "confidence threshold for --decoding threshold|ltr|dynamic"),
    ("--factor", "factor", float, "factor for --decoding factor"),
    ("--cache", "cache", str, "block KV cache: none, prefix, dual"),
    ("--cfg-scale", "cfg_scale", float, "classifier-free guidance scale (0 = off)"),
    ("--edit-threshold", "edit_threshold", float, "block-causal models: token editing "
     "(LLaDA2.1), replace a committed token of the current block when the model's choice "
     "there differs with probability above this (off unless the model's config sets it)"),
    ("--confidence-dtype", "confidence_dtype", str, "float32 (default) or model: "
     "confidences in the model's dtype, as the upstream samplers take them in bfloat16"),
    ("--seed", "seed", int, "noise seed (default: random, reported in --json)"),
)
_STOP_FIELD = "stop"


# ----------------------------------------------------------------------- shared helpers
def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """Add the generation knobs; all default to None (= the model's default)."""
    group = parser.add_argument_group("generation options (default: the model's defaults)")
    for flag, dest, kind, text in _GENERATION_OPTIONS:
        group.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    group.add_argument("--stop", dest=_STOP_FIELD, action="append", default=None,
                       metavar="S", help="stop string (repeatable)")


def generation_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The generation options given on the command line, as GenerationParams fields."""
    names = [dest for _, dest, _, _ in _GENERATION_OPTIONS] + [_STOP_FIELD]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def add_device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto",
                        choices=("auto", "float32", "bfloat16", "float16"))


def add_big_model_options(parser: argparse.ArgumentParser) -> None:
    """--device-map auto and its budgets: a model that does not fit one device."""
    group = parser.add_argument_group("big checkpoints (accelerate)")
    group.add_argument("--device-map", default=None, choices=("auto",),
                       help="auto: spread whole layers over the GPUs, then CPU memory, then "
                            "disk (leave --device at auto); each step then pays for the "
                            "hops and the weights copied in (docs/BENCHMARKS.md)")
    group.add_argument("--max-memory", default=None, metavar="SPEC",
                       help="--device-map auto: per-device caps, e.g. 0=20GiB,1=20GiB,cpu=60GiB "
                            "(default: the free memory of each)")
    group.add_argument("--offload-folder", default=None, metavar="DIR",
                       help="--device-map auto: where layers that fit nowhere else go (disk)")


def add_quantize_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantize", default=None, choices=QUANTIZE_MODES,
                        help="weight-only quantization of the layers' linear weights after "
                             "loading (torchao: pip install -r requirements-quant.txt): int8 "
                             "and int4 on the CPU and CUDA, fp8 on CUDA GPUs of compute "
                             "capability >= 8.9; the embedding and output head stay as loaded")


def big_model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The --device-map options given, as EngineConfig fields."""
    return {k: v for k in BIG_MODEL_FIELDS if (v := getattr(args, k, None)) is not None}


def add_compile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true",
                        help="run the model forward under torch.compile (CUDA graphs on CUDA); "
                             "eager with a warning where compiling fails")


def error(message: object) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's input, reported as ``error: ...`` with exit code 2."""
    import celeris

    return (ValueError, FileNotFoundError, getattr(celeris, "CelerisError", ValueError))


def _format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------- generate
def cmd_generate(args: argparse.Namespace) -> int:
    from celeris import Engine
    from celeris.request_params import request_params

    try:
        options = {"compile": True} if args.compile else {}
        options.update(big_model_options(args))
        engine = Engine.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                        **options)
        params = request_params(generation_overrides(args), engine.default_params())
        prompt: Any = args.prompt
        if args.chat:
            prompt = [{"role": "user", "content": args.prompt}]
        result = engine.generate(prompt, params)
    except user_errors() as exc:
        return error(exc)
    print(json.dumps(result.to_dict()) if args.json else result.text)
    return 0


# ----------------------------------------------------------------------- train / eval
def cmd_recipe(args: argparse.Namespace) -> int:
    """``train --recipe``: every stage of a shipped model's recipe, then its card."""
    from celeris.pipeline import run_recipe
    try:
        info = run_recipe(args.recipe, args.out, from_stage=args.from_stage,
                          steps_scale=args.steps_scale, smoke=args.smoke)
    except user_errors() as exc:
        return error(exc)
    card = f", card {info['card']}" if info["card"] else ""
    print(f"recipe {info['recipe']}: {info['stages']} stages -> {info['model']}{card}")
    return 0


def _asks(text: str | None) -> dict | None:
    """``--asks SHARE:FIELDS`` as the training setting (checked by the trainer)."""
    if text is None:
        return None
    share, sep, fields = text.partition(":")
    try:
        value = float(share)
    except ValueError:
        value = share
    if not sep:
        raise ValueError(f"--asks: expected SHARE:FIELDS such as 0.5:adj,place,obj, got {text!r}")
    return {"share": value, "fields": [f.strip() for f in fields.split(",") if f.strip()]}


def cmd_train(args: argparse.Namespace) -> int:
    if args.recipe:
        return cmd_recipe(args)
    if args.out is None or args.steps is None:
        return error("train needs --out DIR and --steps N (or --recipe FILE)")
    from celeris.train import train
    try:
        summary = train(out=args.out, steps=args.steps,
                        device=args.device, resume=args.resume, seed=args.seed,
                        kind=args.kind, preset=args.preset, init_from=args.init_from,
                        **{k: v for k, v in (("lr", args.lr), ("mix", args.mix),
                                             ("semi_ar_prob", args.semi_ar_prob),
                                             ("block_size", args.block_size),
                                             ("tokens_per_batch", args.tokens_per_batch),
                                             ("certainty", args.certainty),
                                             ("masking", args.masking),
                                             ("selfgen", args.selfgen),
                                             ("selfgen_prob", args.selfgen_prob),
                                             ("asks", _asks(args.asks)),
                                             ("free", args.free))
                           if v is not None})
    except user_errors() as exc:
        return error(exc)
    items = ", ".join(f"{k}={_format_value(v)}" for k, v in (summary or {}).items()
                      if isinstance(v, (str, int, float, bool)) or v is None)
    print(f"trained {args.kind} model -> {args.out}: {items}")
    return 0


def cmd_distill_data(args: argparse.Namespace) -> int:
    from celeris.train.selfgen import distill_data

    try:
        summary = distill_data(args.model, args.out, requests=args.requests, tasks=args.tasks,
                               batch=args.batch, seed=args.seed, resume=args.resume,
                               minutes=args.minutes, relabel_requests=not args.no_relabel,
                               correct_requests=not args.no_correct, min_arcs=args.min_arcs,
                               temperature=args.temperature, free=args.free)
    except (FileExistsError, *user_errors()) as exc:
        return error(exc)
    print(json.dumps(summary))
    return 0


def _block_causal(model: str) -> bool:
    """Whether a local model directory's config.json declares block-causal attention."""
    config = Path(model) / "config.json"
    try:
        return json.loads(config.read_text()).get("attention") == "block_causal"
    except (OSError, ValueError):
        return False


def cmd_eval(args: argparse.Namespace) -> int:
    from celeris.evals.evaluate import evaluate

    try:
        if args.card and args.second_sample:
            raise ValueError("--card quotes the fixed eval set; drop --second-sample")
        if args.card and args.model and _block_causal(args.model):
            raise ValueError(f"--card writes a full-canvas model's card (stories at blocks up "
                             f"to 32, infilling); {args.model} is a block-diffusion model, "
                             f"whose card is kept by hand (models/celeris-tiny-bd/README.md): "
                             f"drop --card and quote the --json report")
        model: Any = args.model
        if getattr(args, "quantize", None):
            if args.kind != "diffusion" or args.card:
                raise ValueError("--quantize applies to --kind diffusion without --card (the "
                                 "AR twin runs through transformers; a card quotes the model "
                                 "as shipped)")
            from celeris import Engine
            model = Engine.from_pretrained(args.model, device=args.device,
                                           quantize=args.quantize)
        report = evaluate(model=model, kind=args.kind,
                          overrides=generation_overrides(args), limit=args.limit,
                          device=args.device, second_sample=args.second_sample)
        if args.card and not args.model:
            raise ValueError("--card needs --model (the directory to write the card into)")
        if args.card:
            from celeris.evals.card import add_card_figures, card_samples, write_card
            report = add_card_figures(report, args.model, args.kind)
            path = write_card(args.model, report, card_samples(args.model, args.kind, report))
            print(f"wrote {path}", file=sys.stderr)
    except user_errors() as exc:
        return error(exc)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def format_report(report: dict[str, Any]) -> str:
    """A table of the tasks (task, n, accuracy, seconds), their mean, then the masked loss."""
    rows = [_task_row(report, name, value) for name, value in (report.get("tasks") or {}).items()]
    rows.append(_mean_row(report, rows))
    table = [("task", "n", "accuracy", "time")] + rows
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))) for row in table]
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    if report.get("masked_loss") is not None:
        lines.append(f"masked_loss: {_format_value(report['masked_loss'])}")
    return "\n".join(lines)


def _task_row(report: dict[str, Any], name: str, value: Any) -> tuple[str, str, str, str]:
    accuracy = value.get("accuracy") if isinstance(value, dict) else value
    n = (report.get("n") or {}).get(name, report.get("n_per_task"))
    seconds = (report.get("task_seconds") or {}).get(name)
    return (str(name), "-" if n is None else str(n), _accuracy(accuracy), _seconds(seconds))


def _mean_row(report: dict[str, Any], rows: list[tuple[str, str, str, str]]
              ) -> tuple[str, str, str, str]:
    mean = report.get("mean_accuracy")
    if mean is None:
        values = [float(r[2]) for r in rows if r[2] != "-"]
        mean = sum(values) / len(values) if values else None
    counts = [int(r[1]) for r in rows if r[1].isdigit()]
    seconds = report.get("generation_s", report.get("elapsed_s"))
    return ("mean", str(sum(counts)) if counts else "-", _accuracy(mean), _seconds(seconds))


def _accuracy(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f}"


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f} s"


# ----------------------------------------------------------------------- serve / bench / batch
def _run(module: str, args: argparse.Namespace) -> int:
    """``module.main(args)``, with the user's mistakes reported as ``error: ...`` (exit 2)."""
    import importlib

    entry = importlib.import_module(module).main
    try:
        code = entry(args)
    except user_errors() as exc:
        return error(exc)
    return int(code or 0)


def cmd_serve(args: argparse.Namespace) -> int:
    return _run("celeris.server", args)


def cmd_bench(args: argparse.Namespace) -> int:
    return _run("celeris.bench", args)


def cmd_batch(args: argparse.Namespace) -> int:
    return _run("celeris.batch", args)


def cmd_space(args: argparse.Namespace) -> int:
    return _run("celeris.space", args)


# ----------------------------------------------------------------------- parser
MODEL_HELP = ("model directory or hub id (default: models/celeris-tiny-bd, the shipped "
              "block-diffusion model; models/celeris-tiny is the full-canvas one)")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate one answer and print it")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    add_device_options(p)
    add_big_model_options(p)
    add_quantize_option(p)
    add_compile_option(p)
    add_generation_options(p)
    p.set_defaults(func=cmd_generate)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a tiny model, or rebuild one from its recipe")
    p.add_argument("--recipe", default=None, metavar="FILE",
                   help="run every stage of a recipe (e.g. models/celeris-tiny-bd/recipe.toml) "
                        "into --out (default runs/<model>)/stage-NN, skipping finished stages "
                        "and resuming an interrupted one, then regenerate the model card")
    p.add_argument("--from-stage", type=int, default=0, metavar="N",
                   help="--recipe: start at stage N (the earlier ones must be finished in --out)")
    p.add_argument("--steps-scale", type=float, default=1.0, metavar="X",
                   help="--recipe: scale every stage's steps and distill-data prompts by X "
                        "(0 < X <= 1; a smoke run)")
    p.add_argument("--smoke", action="store_true",
                   help="--recipe: train the micro model preset instead of the shipped size, "
                        "and score its card on a few problems (with --steps-scale 0.01: "
                        "every stage in about a minute)")
    p.add_argument("--out", default=None, help="output model directory")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", default="diffusion", choices=("diffusion", "ar", "bd"),
                   help="diffusion (full attention), ar (the twin) or bd (block diffusion)")
    p.add_argument("--block-size", type=int, default=None, metavar="N",
                   help="bd: the model's block size (default 8)")
    p.add_argument("--preset", default=None, help="model/data preset name")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: the preset's)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from this trained model's weights and tokenizer (diffusion/bd: "
                        "the AR twin, AR-to-diffusion adaptation; ar: continued training)")
    p.add_argument("--mix", default=None, metavar="WEIGHTS",
                   help="source weights, e.g. task=0.45,long=0.25,longreq=0.3 (sources: story, "
                        "task, request, long, longreq, reqhead; default story=0.2,task=0.65,"
                        "request=0.15)")
    p.add_argument("--tokens-per-batch", type=int, default=None, metavar="N",
                   help="tokens per optimizer step, padding included (default: the preset's)")
    p.add_argument("--certainty", type=float, default=None, metavar="W",
                   help="bd: weight of the entropy of right predictions (dParallel / CAP "
                        "certainty term; default 0)")
    p.add_argument("--masking", choices=("random", "suffix"), default=None,
                   help="bd: which targets of a block are hidden: random (each at the block's "
                        "rate; default) or suffix (a clean prefix and a hidden rest, the states "
                        "left-to-right decoding shows the model)")
    p.add_argument("--selfgen", default=None, metavar="JSONL",
                   help="self-distillation: a `celeris distill-data` file whose answers the "
                        "model wrote itself")
    p.add_argument("--selfgen-prob", type=float, default=None, metavar="P",
                   help="probability that a task / long-request item comes from --selfgen")
    p.add_argument("--asks", default=None, metavar="SHARE:FIELDS",
                   help="e.g. 0.5:adj,place,obj: that share of the long-story requests ask for "
                        "at least one of the fields (kind, adj, name, place, obj); default: the "
                        "corpus's own request forms")
    p.add_argument("--free", type=float, default=None, metavar="SHARE",
                   help="share in [0, 1] of long story requests phrased freely "
                        "(the free-phrasing grammar's training parts; default 0)")
    p.add_argument("--semi-ar-prob", type=float, default=None, metavar="P",
                   help="fraction of story and story-request rows trained in the "
                        "semi-autoregressive state (clean prefix, one masked block, later "
                        "blocks all [MASK]); default 0")
    p.set_defaults(func=cmd_train)


def cmd_average(args: argparse.Namespace) -> int:
    from celeris.train.average import average
    try:
        info = average(args.models, args.out)
    except user_errors() as exc:
        return error(exc)
    print(f"averaged {len(info['sources'])} models -> {args.out}")
    return 0


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the weights of runs of one architecture "
                                       "(a model soup)")
    p.add_argument("models", nargs="+", help="two or more model directories")
    p.add_argument("--out", required=True, help="model directory to write")
    p.set_defaults(func=cmd_average)


def _add_distill_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill-data", help="a block-diffusion model answers training prompts "
                                            "itself (self-distillation data, JSONL)")
    p.add_argument("--model", required=True, help="block-diffusion model directory")
    p.add_argument("--out", required=True, help="JSONL file to write (appended with --resume)")
    p.add_argument("--requests", type=int, default=600, help="long-story requests (600)")
    p.add_argument("--tasks", type=int, default=600, help="checkable-task prompts (600)")
    p.add_argument("--batch", type=int, default=16, help="prompts per engine batch (16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=None, help="stop after this long")
    p.add_argument("--resume", action="store_true", help="continue an existing file")
    p.add_argument("--min-arcs", type=int, default=0, metavar="N",
                   help="lengthen every kept story to N plot arcs (1-4; default 0, off): the "
                        "missing arcs' paragraphs in the corpus's sentences, before the closing "
                        "one, checked again (hindsight lengthening)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sample each answer at T (0-2; default 0, greedy): a greedy pool is the "
                        "model's mode, and training on it narrows what the model writes")
    p.add_argument("--free", type=float, default=0.0, metavar="SHARE",
                   help="share in [0, 1] of the requests phrased freely (the free-phrasing "
                        "grammar's training parts; default 0: the corpus's request sentences)")
    p.add_argument("--no-relabel", action="store_true",
                   help="drop a good story that ignores its request instead of keeping it "
                        "under the request it honours (hindsight relabelling)")
    p.add_argument("--no-correct", action="store_true",
                   help="do not edit a good story that ignores its request into one that "
                        "honours it (hindsight correction: adjective, object, place or name "
                        "swapped in, checked again); relabel it instead")
    p.set_defaults(func=cmd_distill_data)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="score a model on the checkable tasks")
    p.add_argument("--model", default=None,
                   help="model directory (default: models/celeris-tiny-bd, or "
                        "models/celeris-tiny-ar with --kind ar)")
    p.add_argument("--kind", default="diffusion", choices=("diffusion", "ar"),
                   help="diffusion (any diffusion model, block-causal too) or ar (the twin)")
    p.add_argument("--limit", type=int, default=None, help="examples per task")
    p.add_argument("--second-sample", action="store_true",
                   help="score a second held-out sample, disjoint from the fixed eval set "
                        "(to confirm a choice made by looking at the fixed one)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--card", action="store_true",
                   help="also write README.md (model card) and eval.json into --model")
    add_quantize_option(p)
    add_generation_options(p)
    p.set_defaults(func=cmd_eval)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible API server")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="TCP port, 1-65535 (8000)")
    p.add_argument("--api-key", default=None,
                   help="require this bearer key on /v1 (default: env CELERIS_API_KEY, which "
                        "unlike the flag is not visible in ps)")
    p.add_argument("--max-running", type=int, default=None,
                   help="requests denoised together in one batch (32)")
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests waiting for a slot before new ones get 429 (64)")
    p.add_argument("--request-timeout", type=float, default=None, metavar="S",
                   help="abort a request (504) that has not finished after S seconds (600)")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="S",
                   help="on SIGTERM/Ctrl+C, let running requests finish for up to S seconds "
                        "(30); a second signal exits at once")
    ray = p.add_argument_group("Ray Serve (pip install -r requirements-ray.txt)")
    ray.add_argument("--ray", action="store_true",
                     help="serve the same API from Ray Serve replicas, one engine each")
    ray.add_argument("--address", default=None,
                     help="Ray cluster address (default: start a local Ray)")
    ray.add_argument("--replicas", type=int, default=None, help="fixed replica count (2)")
    ray.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                     help="let Ray Serve's autoscaler choose between MIN and MAX replicas")
    ray.add_argument("--gpus-per-replica", type=float, default=None, metavar="G",
                     help="GPUs each replica reserves (0)")
    ray.add_argument("--cpus-per-replica", type=float, default=None, metavar="C",
                     help="CPUs each replica reserves (1)")
    add_device_options(p)
    add_big_model_options(p)
    add_quantize_option(p)
    add_compile_option(p)
    p.set_defaults(func=cmd_serve)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark suite")
    p.add_argument("--suite", default=None,
                   help="decode, ar, stories, lengths, serve, invariance, structured, "
                        "scores, quant, gpu, all (default) or a comma list")
    p.add_argument("--json", default=None, metavar="PATH", help="write the JSON report here")
    p.add_argument("--html", default=None, metavar="PATH", help="write the HTML report here")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--ar-model", default=None, metavar="PATH",
                   help="autoregressive twin (default: models/celeris-tiny-ar)")
    p.add_argument("--canvas-model", default=None, metavar="PATH",
                   help="stories: the full-attention model measured at its own defaults "
                        "beside a block-diffusion one (default: models/celeris-tiny)")
    p.add_argument("--n", type=int, default=None, help="prompts per checkable task (5)")
    p.add_argument("--gen-length", type=int, default=None, help="answer canvas length (256)")
    p.add_argument("--block-length", type=int, default=None,
                   help="block length (32); a block-causal model runs at its own block size "
                        "unless this divides it")
    p.add_argument("--batch", type=int, default=None, help="batch size for decode (1)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per length (5)")
    p.add_argument("--concurrency", default=None, metavar="LIST",
                   help="serve: concurrency levels (1,16)")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="serve: requests per concurrency level (twice the highest level)")
    p.add_argument("--max-running", type=int, default=None, metavar="N",
                   help="requests the engine denoises together (the engine's default)")
    p.add_argument("--url", default=None, help="serve: a running server's base URL")
    p.add_argument("--api-key", default=None, help="serve: API key for --url")
    p.add_argument("--tiny", action="store_true", help="gpu: a tiny random config (CPU smoke)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress lines on stderr (by default a line every few seconds: "
                        "suite, what it measures, item k of n, elapsed and time left)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; recorded in the report)")
    add_device_options(p)
    add_big_model_options(p)
    add_quantize_option(p)
    p.set_defaults(func=cmd_bench)


def _add_batch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch", help="run a JSONL batch job (OpenAI batch format)")
    p.add_argument("input", metavar="INPUT", help="input .jsonl")
    p.add_argument("--output", default=None, metavar="OUT")
    p.add_argument("--errors", default=None, metavar="ERR")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--url", default=None, help="remote server base URL (default: in-process)")
    p.add_argument("--api-key", default=None,
                   help="--url: bearer key (default: env CELERIS_API_KEY)")
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--skip-invalid", action="store_true",
                   help="send invalid lines to the error file instead of stopping")
    p.add_argument("--restart", action="store_true", help="ignore earlier progress")
    p.add_argument("--log", default=None, metavar="PATH", help="log file (default: OUT + .log)")
    p.add_argument("--max-retries", type=int, default=None,
                   help="--url: retries on 429/5xx/timeouts (6)")
    ray = p.add_argument_group("Ray Data (pip install -r requirements-ray.txt)")
    ray.add_argument("--ray", action="store_true",
                     help="run on Ray Data actors, one engine per replica")
    ray.add_argument("--address", default=None,
                     help="Ray cluster address (default: a local Ray started for this job)")
    ray.add_argument("--replicas", type=int, default=None, help="engine actors (2)")
    ray.add_argument("--gpus-per-replica", type=float, default=None, metavar="G",
                     help="GPUs each actor reserves (0)")
    ray.add_argument("--cpus-per-replica", type=float, default=None, metavar="C",
                     help="CPUs each actor reserves (1)")
    add_device_options(p)
    p.set_defaults(func=cmd_batch)


def _add_space(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("space", help="assemble (and push) a Hugging Face Space folder")
    p.add_argument("dir", metavar="DIR", help="folder to write the Space into")
    p.add_argument("--push", default=None, metavar="REPO_ID",
                   help="then upload it to this Space (user/name) with huggingface_hub")
    p.add_argument("--private", action="store_true", help="create the Space as private")
    p.set_defaults(func=cmd_space)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celeris",
                                     description="Celeris: masked-diffusion LLM inference")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_generate, _add_eval, _add_train, _add_average, _add_distill_data,
                _add_serve, _add_bench, _add_batch, _add_space):
        add(sub)
    return parser


def url_problem(url: str) -> str | None:
    """Why ``--url`` is not a server's base URL (http(s), a host, a port in 1-65535), or None."""
    from urllib.parse import urlsplit

    expected = f"--url must be http(s)://HOST[:PORT], e.g. http://127.0.0.1:8000; got {url!r}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:         # a port that is not a number, an unclosed [IPv6
        return f"{expected} ({str(exc)[0].lower()}{str(exc)[1:]})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return expected
    if port == 0:
        return f"{expected} (the port must be in 1-65535)"
    return None


def before_loading(args: argparse.Namespace) -> str | None:
    """What fails a command before it loads anything: serve's --port outside [1, 65535], a
    --url that is no http(s) base URL, or a --model that is a local path with no directory
    there (such a path is never a hub id to download; bench skips its AR suites, with the
    reason, when --ar-model holds no model)."""
    if args.command == "serve" and (why := port_problem(args.port)):
        return why
    if getattr(args, "url", None) is not None and (why := url_problem(args.url)):
        return why
    model = getattr(args, "model", None)
    return missing_model_dir(model) if isinstance(model, str) else None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if why := before_loading(args):
        return error(why)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

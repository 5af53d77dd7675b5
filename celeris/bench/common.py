"""What every suite shares: the run context, machine facts, prompts, timing and statistics.

A suite is a function ``run(ctx) -> dict`` returning a plain JSON-able section: ``rows`` (one
dict per measured configuration), ``columns`` (which row keys the console table shows),
``settings`` and ``notes``. Counting follows docs/DESIGN.md ("tokens/s") everywhere: completion
tokens before the first EOS (``GenerationResult.usage.completion_tokens``) over the wall time
around the call.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .progress import Progress, say

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_AR_MODEL = REPO_ROOT / "models" / "celeris-tiny-ar"
DEFAULT_CANVAS_MODEL = REPO_ROOT / "models" / "celeris-tiny"   # the full-attention sibling
Column = tuple[str, str, str]          # (row key, header, format spec)


class SuiteSkipped(Exception):
    """A suite cannot run here (no AR model, no GPU...); the reason goes into the report."""


@dataclass
class BenchContext:
    """Options of one bench run plus the models it loads once and shares between suites."""

    model: str | None = None
    ar_model: str | None = None
    canvas_model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    n: int = 5                     # prompts per checkable task
    gen_length: int = 256
    block_length: int = 32
    batch: int = 1
    repeats: int = 5
    concurrency: tuple[int, ...] = (1, 16)
    serve_requests: int | None = None   # per concurrency level (None: 2 x the highest)
    url: str | None = None
    api_key: str | None = None
    tiny: bool = False
    progress: bool = True               # progress lines on stderr (--no-progress: none)
    suite: str = ""                     # the suite running now (named in progress lines)
    max_running: int | None = None      # the engine's batch cap (None: EngineConfig's)
    load_options: dict[str, Any] = field(default_factory=dict)   # device_map, max_memory...
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    _engine: Any = None
    _ar: Any = None
    _ar_engine: Any = None
    _canvas: Any = None

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from celeris import Engine
            extra = {} if self.max_running is None else {"max_running": self.max_running}
            extra.update(self.load_options)
            self._engine = Engine.from_pretrained(self.model, device=self.device,
                                                  dtype=self.dtype, **extra)
        return self._engine

    def ar_path(self) -> Path:
        return Path(self.ar_model) if self.ar_model else DEFAULT_AR_MODEL

    @property
    def ar(self) -> Any:
        if self._ar is None:
            from celeris import ARBaseline
            path = self.ar_path()
            if not (path / "config.json").is_file():
                raise SuiteSkipped(f"no autoregressive twin at {path} (pass --ar-model)")
            self._ar = ARBaseline.from_pretrained(path, device=str(self.engine.device))
        return self._ar

    @property
    def ar_engine(self) -> Any:
        """The AR twin's weights in Celeris's own engine, as a block-causal model with blocks
        of one position (greedy autoregressive decoding with the same kernels, KV cache and
        host loop as the diffusion model): the same-engine control beside ``transformers``'
        ``generate()``. None when the twin is not a checkpoint Celeris reads that way."""
        if self._ar_engine is None:
            from celeris import Engine, ModelLoadError
            try:
                engine = Engine.from_pretrained(self.ar_path(), device=self.device,
                                                dtype=self.dtype)
            except (ModelLoadError, ValueError):
                engine = None
            self._ar_engine = engine if engine is not None and engine.block_size == 1 else False
        return self._ar_engine or None

    @property
    def canvas(self) -> Any:
        """The full-attention model the playground runs beside a block-diffusion one (the
        Infill tab, the Race's canvas column): ``--canvas-model``, or models/celeris-tiny
        when the benchmarked model sits beside it in models/. None when the benchmarked
        model is itself full-attention or has no such sibling; a ``--canvas-model`` that
        holds no model is an error."""
        if self._canvas is None:
            from celeris import Engine
            path = Path(self.canvas_model) if self.canvas_model else DEFAULT_CANVAS_MODEL
            there = (path / "config.json").is_file()
            if self.canvas_model and not there:
                raise ValueError(f"--canvas-model: no model (config.json) at {path}")
            beside = Path(self.engine.info()["path"]).resolve().parent == path.resolve().parent
            found = self.block_causal and there and (bool(self.canvas_model) or beside)
            self._canvas = (Engine.from_pretrained(path, device=self.device, dtype=self.dtype)
                            if found else False)
        return self._canvas or None

    def ar_engine_params(self, max_new_tokens: int) -> Any:
        """Greedy, one position a step, up to ``max_new_tokens``, as the twin runs."""
        return self.ar_engine.default_params().replace(
            gen_length=max_new_tokens, block_length=1, steps=None, decoding="fixed",
            temperature=0.0, seed=0, stop=())

    def bar(self, total: int, desc: str) -> Progress:
        """Progress lines on stderr for ``total`` items of the running suite: item k of n,
        the system that ran last, elapsed and time left (none with --no-progress)."""
        return Progress(self.suite, desc, total, enabled=self.progress)

    def say(self, text: str) -> None:
        """One progress line for a step outside a measured loop (warm-up, untimed runs)."""
        say(self.suite, text, self.progress)

    def base_params(self, remote: bool = False, **changes: Any) -> Any:
        """The model's defaults (remote: the library defaults) with this run's lengths,
        greedy, no stop strings."""
        from celeris import GenerationParams

        base = GenerationParams() if remote else self.engine.default_params()
        params = base.replace(
            gen_length=self.gen_length, block_length=self.block_length_for_model(), steps=None,
            temperature=0.0, seed=0, stop=())
        return params.replace(**changes)

    @property
    def block_causal(self) -> bool:
        return bool(getattr(self.engine, "block_causal", False))

    def block_length_for_model(self) -> int:
        """--block-length, except that a block-causal model needs a divisor of its own block
        size: then its block size (its generation defaults) unless --block-length divides it."""
        if not self.block_causal:
            return self.block_length
        size = self.engine.model.config.block_size
        return self.block_length if size % self.block_length == 0 else size


# ---------------------------------------------------------------------- machine facts
def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cpu_cores": os.cpu_count(), "torch_threads":
            torch.get_num_threads(), "gpu": gpu, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "triton": _version("triton"), "transformers": _version("transformers"),
            "torchao": _version("torchao"), "compressed_tensors": _version("compressed-tensors"),
            "celeris": _version("celeris") or __import__("celeris").__version__}


# ---------------------------------------------------------------------- prompts
def task_examples(n_per_task: int) -> list[Any]:
    """The first ``n_per_task`` problems of each task's fixed held-out eval set."""
    from celeris.synthetic.tasks import TASKS, eval_examples
    return [ex for task in TASKS for ex in eval_examples(task, n_per_task)]


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def story_prompt(seed: int = 0) -> str:
    import random

    from celeris.synthetic.corpus import story_request
    return story_request(random.Random(f"celeris-bench:{seed}"), split="eval")[0]


def accuracy(examples: Sequence[Any], texts: Sequence[str]) -> tuple[float, dict[str, float]]:
    """Overall exact-match accuracy and per task."""
    from celeris.synthetic.tasks import score

    per: dict[str, list[bool]] = {}
    for ex, text in zip(examples, texts):
        per.setdefault(ex.task, []).append(score(ex.task, text, ex.answer))
    flat = [ok for oks in per.values() for ok in oks]
    return (sum(flat) / len(flat) if flat else 0.0,
            {t: round(sum(v) / len(v), 4) for t, v in per.items()})


# ---------------------------------------------------------------------- timing
def timed_batches(run: Callable[[list[Any]], list[Any]], items: Sequence[Any], batch: int,
                  bar: Any = None) -> tuple[list[Any], list[float]]:
    """Call ``run`` on consecutive chunks of ``batch`` items; (results, wall time per chunk)."""
    return timed_side_by_side({"run": run}, items, batch, bar)["run"]


def timed_side_by_side(runs: dict[str, Callable[[list[Any]], list[Any]]],
                       items: Sequence[Any], batch: int, bar: Any = None
                       ) -> dict[str, tuple[list[Any], list[float]]]:
    """``timed_batches`` for several systems at once, chunk by chunk: each chunk of ``batch``
    items is run by every system in turn before the next chunk, the order rotated from chunk
    to chunk. On a shared machine whose speed drifts (this project's 2-core VM has moved a
    system's tokens/s by 30% between two runs) a slow spell then falls on every system alike
    instead of on whichever ran then, so the ratios between them hold. Returns each system's
    (results in item order, wall time per chunk)."""
    names = list(runs)
    out: dict[str, tuple[list[Any], list[float]]] = {n: ([], []) for n in names}
    for k, i in enumerate(range(0, len(items), batch)):
        chunk = list(items[i:i + batch])
        shift = k % len(names)
        for name in names[shift:] + names[:shift]:
            results, walls = out[name]
            start = time.perf_counter()
            results.extend(runs[name](chunk))
            walls.append(time.perf_counter() - start)
            if bar is not None:
                bar.update(len(chunk), system=name)
    return out


def ar_params(max_new_tokens: int) -> dict[str, Any]:
    """How the AR twin decodes in every suite (recorded in its rows)."""
    return {"max_new_tokens": max_new_tokens, "decoding": "greedy", "kv_cache": True}


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """Median and spread (min, max, relative standard deviation) of repeated measurements."""
    if not values:
        return {"median": None, "min": None, "max": None, "rel_stdev": None}
    med = statistics.median(values)
    rel = statistics.stdev(values) / med if len(values) > 1 and med else 0.0
    return {"median": med, "min": min(values), "max": max(values), "rel_stdev": rel}


def section(suite: str, title: str, columns: Sequence[Column], rows: list[dict[str, Any]],
            settings: dict[str, Any], notes: Sequence[str] = ()) -> dict[str, Any]:
    return {"suite": suite, "title": title, "status": "ok", "settings": settings,
            "columns": [list(c) for c in columns], "rows": rows, "notes": list(notes)}

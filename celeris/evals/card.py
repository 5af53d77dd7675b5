"""Model cards written from the training log and a fresh evaluation, never by hand.

``write_card(model_dir, report)`` renders README.md (Hugging Face model-card front matter, then
architecture, corpus, training run, loss curve summary, held-out accuracy, real samples,
licence, limitations) and stores the evaluation as ``eval.json`` next to it; the shipped-model
test reads its thresholds from that file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from celeris.evals.stories import fill_item, infill_items, story_blocks
from celeris.synthetic.storycheck import sentences
from celeris.synthetic.tasks import ADD_DIGITS, ITEM_MAX, LIST_MAX, LIST_MIN
from celeris.train.stream import describe

LIMITATIONS = (
    "A few-million-parameter model trained on a 2-core CPU for the time stated under Training: "
    "it knows only its story grammar and the checkable tasks, and it makes mistakes on both.",
    "No safety tuning; not for any use beyond demonstrating and benchmarking the engine.",
    "Context is short (see `max_position_embeddings`); the tokenizer covers the training "
    "grammar well and other text poorly.",
)
DIFFUSION_LIMITATIONS = (
    "Stories are grammatical when decoded left to right (`block_length` 1, see the story "
    "grammar scores above) but wide blocks, the default 32 included, often lose a noun "
    "(`a strong old named Milo` for `a strong old man named Milo`): the model commits a word "
    "several positions ahead (`named`) before the words in between, and then fills the gap "
    "with too few words. For stories, use `--block-length 1` (the playground's `story` preset) "
    "and keep the default for the tasks, which score a little lower at block 1 (sums slip "
    "more).",
    "Infilling puts the right kind of word in most sentences (the infill score above) but the "
    "words right of the gap weigh too little: `a strong [MASK] called Toby` gets `old`, the "
    "most frequent single token after an adjective (it starts `old man` and `old woman`), which "
    "fits after `strong` but not before `called`. This is also how wide blocks drop nouns. A "
    "sentence given without the story before it is filled worse (the second infill score). "
    "Each [MASK] becomes exactly `span` tokens, so a span longer than the missing word is "
    "filled with extra words.",
    "The story grammar score checks sentence shapes, not sense: stories switch names midway "
    "(`a happy mouse named Pip ... That night, Milo had sweet dreams`), repeat words (`heavy "
    "and heavy`) and a story request does not always get the animal asked for.",
)


def _run_lines(log: dict[str, Any]) -> list[str]:
    """The Training section of a model not made by a recipe."""
    start = f"started from `{log['init_from']}`" if log.get("init_from") else "trained from scratch"
    return [f"- {start}; every setting is in `train_log.json` beside these weights"]


def _objective_lines(log: dict[str, Any]) -> list[str]:
    tc = log.get("train_config") or {}
    lines = []
    if log.get("kind") == "diffusion" and tc.get("semi_ar_prob"):
        lines.append(f"- semi-autoregressive rows: {tc['semi_ar_prob']:.0%} of story and "
                     "story-request rows keep a clean beginning, mask one block of 1-32 tokens "
                     "at the row's rate t and hide everything after it (masked, not scored): "
                     "the state semi-autoregressive decoding puts the model in")
    if tc.get("mix"):
        lines.append("- source weights of this run: " + ", ".join(
            f"{k} {v:g}" for k, v in tc["mix"].items()) + " (the corpus JSON above)")
    return lines


def _curve_summary(log: dict[str, Any]) -> list[str]:
    curve = log.get("curve") or []
    if not curve:
        return ["(no loss curve recorded)"]
    picks = sorted({int(f * (len(curve) - 1)) for f in (0, 0.1, 0.25, 0.5, 0.75, 1.0)})
    rows = ["| step | tokens seen | training loss (running) | learning rate |",
            "|---|---|---|---|"]
    for i in picks:
        c = curve[i]
        rows.append(f"| {c['step']} | {c.get('tokens', 0):,} | {c['loss']:.3f} | "
                    f"{c.get('lr', 0):.2e} |")
    return rows


def _arch(config: dict[str, Any], n_params: int | None) -> list[str]:
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings",
            "shift_logits", "rope_theta")
    rows = ["| field | value |", "|---|---|"]
    rows += [f"| {k} | {config[k]} |" for k in keys if k in config]
    if n_params:
        rows.append(f"| parameters | {n_params:,} |")
    return rows


def _accuracy(report: dict[str, Any]) -> list[str]:
    rows = ["| task | exact match |", "|---|---|"]
    rows += [f"| {name} | {acc:.1%} |" for name, acc in report["tasks"].items()]
    rows.append(f"| **mean** | **{report['mean_accuracy']:.1%}** |")
    return rows


def _samples(samples: list[dict[str, Any]]) -> list[str]:
    out = []
    for s in samples:
        how = f" ({s['decoding']})" if s.get("decoding") else ""
        out.append(f"- prompt `{s['prompt']}`{how} → `{s['output']}`"
                   + (f" (expected `{s['answer']}`)" if s.get("answer") else "")
                   + (f" (the story had `{s['hidden']}`)" if s.get("hidden") else ""))
    return out


def _story_grammar_lines(results: list[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [f"Story grammar (`celeris.evals.stories`): continuations of "
             f"{results[0]['prompts']} held-out story openings, the share of complete "
             "sentences whose word-category shape the story grammar writes:", ""]
    for r in results:
        lines.append(f"- {r['decoding']}: {r['grammatical']:.1%} of {r['sentences']} sentences"
                     + (f" ({r['unfinished']} cut off unfinished)" if r["unfinished"] else "")
                     + (f"; e.g. `{r['examples_bad'][0]}`" if r["examples_bad"] else ""))
    return lines + [""]


def _infill_lines(result: dict[str, Any] | None,
                  alone: dict[str, Any] | None = None) -> list[str]:
    """The infill scores: with the story before the sentence as context (the main figure)
    and, when measured, the sentence alone."""
    if not result:
        return []
    bad = result["examples_bad"]
    line = (f"Infill grammar (`celeris.evals.stories.measure_infill`): one lexicon word "
            f"(name, kind, adjective, object, place or activity) masked in one sentence of "
            f"each of {result['items']} held-out stories and filled ({result['decoding']}), "
            f"the story before that sentence pinned as context: "
            f"{result['grammatical']:.1%} of the filled sentences have a shape the grammar "
            f"writes; {result['exact']:.1%} restore the hidden word exactly (a floor: other "
            "words are as right)" + (f"; e.g. not in the grammar: `{bad[0]}`" if bad else ""))
    if alone:
        line += (". The same sentences alone, with no story before them (a sentence that "
                 "starts mid-story, such as `That night, [MASK] had sweet dreams.`, is "
                 f"unlike anything the model was trained on): {alone['grammatical']:.1%}")
    return [line + ".", ""]


def _recipe_lines(recipe: Path) -> list[str]:
    """The Training section's account of a model made by a recipe: the one command and a
    table of its stages (the recipe file beside the weights holds every setting)."""
    from celeris.train.recipe import load_recipe

    r = load_recipe(recipe)
    rows = [f"Made by `python -m celeris train --recipe models/{r.model}/recipe.toml` (the "
            "stages below; every setting is in `recipe.toml` beside these weights):", "",
            "| stage | run | kind | steps | self-distillation |", "|---|---|---|---|---|"]
    for st in r.stages:
        if st.same_as is not None:
            rows.append(f"| {st.index} | {st.name} | stage {st.same_as.stage} of "
                        f"`{st.same_as.recipe.parent.name}` | | |")
            continue
        distill = ("its own answers" if st.distill else
                   f"stage {st.selfgen.stage}'s answers" if st.selfgen else "")
        runs = f" x {len(st.runs)} (averaged)" if st.runs else ""
        rows.append(f"| {st.index} | {st.name} | {st.kind} | {st.steps}{runs} | {distill} |")
    return rows + [""]


def _header(name: str, kind: str, config: dict[str, Any], log: dict[str, Any],
            report: dict[str, Any]) -> list[str]:
    """Front matter, what the model is, its architecture and its corpus."""
    return [
        "---", "license: apache-2.0", "language: en",
        f"pipeline_tag: {'text-generation'}", "tags: [celeris, "
        + ("masked-diffusion" if kind == "diffusion" else "autoregressive") + ", tiny]", "---",
        "", f"# {name}", "",
        ("A tiny masked diffusion language model (LLaDA-style, bidirectional, Dream-style shifted "
         "logits) trained by Celeris itself, offline, on generated data. It is Celeris's "
         "full-attention model: it denoises one canvas and can infill (`--model "
         "models/celeris-tiny`; the Infill tab uses it). The default model is the "
         "block-diffusion `celeris-tiny-bd`." if kind == "diffusion" else
         "The autoregressive twin of the default model `celeris-tiny-bd`: same size, "
         "tokenizer and corpus, next-token objective. `celeris-tiny-bd` is adapted from the "
         "last stage of the recipe below (and `celeris-tiny` from an early one); the bench and "
         "the Race tab race it against them. A plain `LlamaForCausalLM`: "
         "`transformers.AutoModelForCausalLM.from_pretrained` loads it with no Celeris code."),
        "", "## Architecture", "", *_arch(config, log.get("n_params") or report.get("n_params")),
        "", "## Corpus", "",
        "Generated by `celeris/synthetic/corpus.py` and `celeris/synthetic/tasks.py` from a "
        "fixed seed (no downloaded text; rerunning the training command regenerates it): short "
        "English stories from a grammar of a few hundred words, chat requests for stories, and "
        "checkable tasks with exact answers in the chat template (copy, reverse and sort a list of "
        f"{LIST_MIN}-{LIST_MAX} numbers in 0-{ITEM_MAX}, its max and its count; add two numbers of "
        f"1-{ADD_DIGITS} digits, e.g. `sort: 4 1 9 2` → `1 2 4 9`, `add: 47 + 85` → `132`). "
        "Held-out problems and stories are chosen by a stable hash and never appear in "
        "training.", "",
        "```json", json.dumps(log.get("data") or describe(), indent=1), "```", ""]


def _training(log: dict[str, Any], recipe: Path | None) -> list[str]:
    machine = log.get("machine", {})
    return [
        "## Training", "",
        *(_recipe_lines(recipe) if recipe else _run_lines(log)), *_objective_lines(log),
        f"- steps: {log.get('steps')}, tokens seen: {log.get('tokens_seen', 0):,}, "
        f"wall time: {log.get('wall_time_s', 0) / 60:.1f} min, "
        f"throughput: {log.get('tokens_per_s', 0):,.0f} tokens/s",
        f"- machine: {machine.get('cpu', machine)}; torch threads: {log.get('threads')}; "
        f"device: {log.get('device')}",
        f"- seed: {log.get('seed')}; final training loss: {float(log.get('final_loss') or 0):.3f}; "
        "wall time depends on the load of the shared 2-core VM and varies between runs, so it "
        "is not a clean throughput figure (same seed, thread count and CPU -> the same loss "
        "curve)", "",
        *_curve_summary(log), ""]


def _evaluation(name: str, kind: str, report: dict[str, Any]) -> list[str]:
    params = report.get("params", {})
    lines = [
        "## Evaluation (held-out)", "",
        f"Command: `python -m celeris eval --model models/{name}"
        + (" --kind ar" if kind == "ar" else "") + "`"
        + (f" — {report.get('n_per_task')} problems per task" if report.get("n_per_task") else "")
        + (f"; decoding: {params.get('decoding')}, gen_length {params.get('gen_length')}, "
           f"block {params.get('block_length')}, steps {params.get('steps')}, "
           f"temperature {params.get('temperature')}" if kind == "diffusion" and params else "")
        + ".", "", *_accuracy(report), ""]
    if report.get("masked_loss") is not None:
        lines += [f"Masked-token cross-entropy on held-out stories (masking ratios 0.15/0.5/0.85):"
                  f" {report['masked_loss']:.3f}.", ""]
    return (lines + _story_grammar_lines(report.get("story_grammar") or [])
            + _infill_lines(report.get("infill_grammar"), report.get("infill_grammar_alone")))


def write_card(model_dir: str | Path, report: dict[str, Any],
               samples: list[dict[str, Any]] | None = None, *,
               recipe: Path | None = None) -> Path:
    """README.md and eval.json in ``model_dir``; ``recipe`` (default: ``recipe.toml`` beside
    the weights, when there is one) is quoted in the Training section."""
    model_dir = Path(model_dir)
    if recipe is None and (model_dir / "recipe.toml").is_file():
        recipe = model_dir / "recipe.toml"
    log = json.loads((model_dir / "train_log.json").read_text())
    config = json.loads((model_dir / "config.json").read_text())
    kind, name = log.get("kind", "diffusion"), model_dir.name
    lines = (_header(name, kind, config, log, report) + _training(log, recipe)
             + _evaluation(name, kind, report))
    if samples:
        lines += ["## Real outputs", "", "Produced by the command above and "
                  "`python -m celeris generate` (greedy); not edited."
                  + (" Stories and infills: gen length 64, steps 64, the block length or infill "
                     "span named in parentheses." if kind == "diffusion" else ""),
                  "", *_samples(samples), ""]
    lines += ["## Licence", "", "Apache-2.0, like the Celeris code. The training data is "
              "generated by the project's own code, so there is no third-party text in it.", "",
              "## Limitations", "",
              *[f"- {x}" for x in LIMITATIONS + (DIFFUSION_LIMITATIONS if kind == "diffusion"
                                                 else ())], ""]
    (model_dir / "README.md").write_text("\n".join(lines), encoding="utf-8")
    slim = {k: v for k, v in report.items() if k != "samples"}
    (model_dir / "eval.json").write_text(json.dumps(slim, indent=1) + "\n", encoding="utf-8")
    return model_dir / "README.md"


STORY_PROMPTS = ("Once upon a time", "One day, a little fox")
CHAT_PROMPTS = ("Tell me a story about a cat.",)
INFILL_CARD_ITEMS = 4          # the first measured infill items, shown whatever they score
INFILL_TEXTS = ("Once upon a time, a [MASK] lived in a [MASK] near the sea.",
                "Once upon a time, there was a happy old [MASK].",
                "One day, the little [MASK] went to the park.")


def card_samples(model_dir: str | Path, kind: str, report: dict[str, Any]) -> list[dict]:
    """Real outputs for the card: the first evaluated task problems, story continuations and
    (diffusion only) the same at each of ``story_blocks``, a story request, the first measured
    infill items (in their stories) and free-form infills at span 1 and 2 (the model's default
    block length)."""
    from celeris import ARBaseline, Engine
    out = [{"prompt": s["prompt"], "output": s["prediction"], "answer": s["answer"]}
           for s in report.get("samples", [])[:6]]
    if kind == "ar":
        ar = ARBaseline.from_pretrained(str(model_dir), device="cpu")
        for p in STORY_PROMPTS:
            out.append({"prompt": p, "output": ar.generate_batch([p], 64)[0]["text"]})
        return out
    engine = Engine.from_pretrained(model_dir, device="cpu")
    params = engine.default_params().replace(gen_length=64, steps=64)
    for p in STORY_PROMPTS:
        for block in story_blocks(params.block_length):
            out.append({"prompt": p, "decoding": f"block {block}",
                        "output": engine.generate(p, params.replace(block_length=block)).text})
    for p in CHAT_PROMPTS:
        msg = [{"role": "user", "content": p}]
        out.append({"prompt": p, "decoding": f"block {params.block_length}",
                    "output": engine.generate(msg, params).text})
    for item in infill_items(INFILL_CARD_ITEMS):
        before = len(sentences(item.context)[0])
        where = ("the story's first sentence" if not before else
                 "after the story's first sentence, pinned" if before == 1 else
                 f"after the story's first {before} sentences, pinned")
        out.append({"prompt": item.text, "decoding": where,
                    "output": fill_item(engine, item, params), "hidden": item.word})
    # One token per [MASK] (the story grammar's words are one token each), then the first text
    # again with two tokens per span.
    for text, span in [(t, 1) for t in INFILL_TEXTS] + [(INFILL_TEXTS[0], 2)]:
        out.append({"prompt": text, "decoding": f"{span} token{'s' * (span > 1)} per span",
                    "output": engine.infill_text(text, params, span=span)})
    return out


def add_card_figures(report: dict[str, Any], model_dir: str | Path, kind: str,
                     openings: int | None = None) -> dict[str, Any]:
    """``report`` (an ``evaluate`` report) with the card's story grammar and, for a diffusion
    model, its infill scores (``openings``: how many stories each; default the checks' own)."""
    from celeris.evals import stories
    n = {} if openings is None else {"n": openings}
    report["story_grammar"] = stories.measure(str(model_dir), kind, **n)
    if kind == "diffusion":
        report["infill_grammar"] = stories.measure_infill(str(model_dir), **n)
        report["infill_grammar_alone"] = stories.measure_infill(str(model_dir),
                                                                context=False, **n)
    return report


def regenerate_card(model_dir: str | Path, kind: str, *, limit: int | None = None,
                    openings: int | None = None, recipe: Path | None = None) -> Path:
    """What ``celeris eval --card`` does: evaluate, measure, write README.md and eval.json
    (``limit`` problems per task; ``recipe`` quoted in the Training section)."""
    from celeris.evals.evaluate import evaluate
    kind = "ar" if kind == "ar" else "diffusion"
    report = add_card_figures(evaluate(model=str(model_dir), kind=kind, limit=limit),
                              model_dir, kind, openings)
    return write_card(model_dir, report, card_samples(model_dir, kind, report), recipe=recipe)

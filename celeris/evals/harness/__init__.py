"""lm-evaluation-harness tasks built from the checkable tasks, to run against ``celeris serve``.

Two tasks over the fixed held-out problems (``synthetic.tasks.eval_examples``):

- ``celeris_gen`` (generate_until, through ``local-chat-completions``): every task's problems
  as one user message, the answer by exact match (whitespace stripped, as ``celeris eval``
  scores it), the engine's default length (256 tokens) so the two runs decode alike;
- ``celeris_mc`` (multiple_choice, through ``local-completions``: loglikelihood, i.e. ``echo``
  with ``logprobs``): the ``max`` and ``count`` problems, whose answers are one digit, ranked
  over the ten digits after the chat-rendered prompt.

``write_tasks(dir)`` writes the two YAML files and the problems (JSONL) they read; the copies in
this folder are its output for the shipped model's chat template (a test keeps them equal).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...synthetic.tasks import EVAL_N, TASKS, eval_examples

HERE = Path(__file__).resolve().parent
DATA = "celeris_tasks.jsonl"
MC_TASKS = ("max", "count")
DIGITS = [str(d) for d in range(10)]
GEN_TOKENS = 256


def problems(render: Any, limit: int = EVAL_N) -> list[dict[str, Any]]:
    """The held-out problems as harness documents; ``render(messages)`` is the chat template
    (a string ending where the assistant's answer starts)."""
    docs = []
    for task in TASKS:
        for ex in eval_examples(task, limit):
            doc = {"task": task, "prompt": ex.prompt, "answer": ex.answer,
                   "context": render(ex.messages())}
            if task in MC_TASKS:
                doc["label"] = int(ex.answer)
            docs.append(doc)
    return docs


def task_files(data: str) -> dict[str, str]:
    """The two task YAMLs, reading the problems from ``data`` (a path: relative ones are read
    from the directory lm_eval runs in)."""
    head = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n" \
           f"test_split: test\n"
    gen = (f"task: celeris_gen\n{head}output_type: generate_until\n"
           "doc_to_text: \"{{prompt}}\"\ndoc_to_target: \"{{answer}}\"\n"
           f"generation_kwargs:\n  until: []\n  max_gen_toks: {GEN_TOKENS}\n"
           "  do_sample: false\n  temperature: 0\n"
           "metric_list:\n  - metric: exact_match\n    aggregation: mean\n"
           "    higher_is_better: true\n    regexes_to_ignore:\n      - \"^\\\\s+\"\n"
           "      - \"\\\\s+$\"\nmetadata:\n  version: 1.0\n")
    choices = ", ".join(f'"{d}"' for d in DIGITS)
    mc = (f"task: celeris_mc\n{head}output_type: multiple_choice\n"
          f"process_docs: !function utils.only_mc\n"
          "doc_to_text: \"{{context}}\"\ndoc_to_target: label\n"
          f"doc_to_choice: [{choices}]\ntarget_delimiter: \"\"\n"
          "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
          "metadata:\n  version: 1.0\n")
    return {"celeris_gen.yaml": gen, "celeris_mc.yaml": mc}


def write_tasks(out: Path, render: Any, limit: int = EVAL_N, data: str | None = None) -> Path:
    """Write the problems and the two task files into ``out`` (``--include_path`` it)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / DATA
    path.write_text("".join(json.dumps(d) + "\n" for d in problems(render, limit)),
                    encoding="utf-8")
    for name, text in task_files(data or str(path)).items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "utils.py").write_text(UTILS, encoding="utf-8")
    return out


UTILS = '''"""Document filters of the celeris harness tasks (lm_eval's ``!function``)."""


def only_mc(dataset):
    """The problems whose answer is one digit: the multiple-choice task's."""
    return dataset.filter(lambda doc: doc["task"] in ("max", "count"))
'''

"""Self-distillation data (``celeris distill-data``): a block-diffusion model answers
training-split prompts itself, and the answers worth imitating are kept.

dParallel (certainty-forcing distillation) and LLaDA2.0 train a diffusion LM on its own
decoded answers: a model that learns to reproduce its own greedy answers commits them with
more confidence, so more positions pass the threshold in one forward.

Prompts are training-split long-story requests and checkable tasks drawn from a seeded RNG;
answers are the model's greedy output at its own default decoding. A task answer is kept when
it is right; a story (its repeated sentences dropped) when it passes every ``longcheck``
check. A good story that ignores its request is edited to honour it (``correct``, hindsight
correction) or else kept under the request it does honour (``relabel``, hindsight
relabelling); with ``min_arcs`` a kept story gets the missing plot arcs' paragraphs
(``lengthen``). The file is JSONL, one record per kept answer plus ``{"done": N}`` after each
batch, so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

from celeris.synthetic import corpus as _corpus
from celeris.synthetic import longcheck
from celeris.synthetic.phrasing import free_request
from celeris.synthetic import tasks as _tasks
from celeris.train import stream as _stream

TEACHER = {"temperature": 0.0, "cache": "prefix"}    # over the model's default decoding
MAX_NEW_TOKENS = 448


def prompts(requests: int, tasks: int, seed: int = 0,
            free: float = 0.0) -> list[tuple[str, str, Any]]:
    """(source, user text, what a good answer must satisfy) for the training split:
    long requests carry their ``StoryRequest``; tasks their ``Example``. ``free`` of the
    requests are phrased freely (``phrasing.free_request``, training parts)."""
    rng = random.Random(f"celeris-selfgen:{seed}")
    names, weights = zip(*_stream.Mix().task_weights)
    out: list[tuple[str, str, Any]] = []
    for i in range(max(requests, tasks)):
        if i < requests:
            free_one = bool(free) and rng.random() < free
            r = (free_request if free_one else _corpus.long_request)(rng, "train")
            out.append(("longreq", r.text, r))
        if i < tasks:
            ex = _tasks.random_example(rng.choices(names, weights)[0], rng, "train")
            out.append(("task", ex.prompt, ex))
    return out


def _story_checks(answer: str, spec: Any) -> tuple[str, bool, bool]:
    """(the story without its repeated sentences, whether it is a good story apart from the
    request, whether it honours ``spec``'s request)."""
    answer = longcheck.without_repeats(answer)
    s = longcheck.long_score([answer], [spec])
    good = (s["grammatical"] == 1.0 and s["hero_kept"] == 1.0 and s["objects_kept"] == 1.0
            and s["repeated_sentences"] == 0.0 and not s["unfinished"])
    return answer, good, s["request_honoured"] == 1.0


_LONG_FORMS = frozenset(form for _, form in _corpus.LONG_REQUEST_FORMS)


def relabel(story: str, spec: Any) -> "_corpus.StoryRequest | None":
    """The request ``story`` honours, in the template of the one it was written for
    (hindsight relabelling): asked for "a brave fox named Max", a story about a brave cat
    named Max is kept under "a brave cat named Max". The hero comes from its introduction,
    the place is the first corpus place it names, the object the first one it finds. None
    when the story lacks such a field, the request has no template of the corpus's
    (``spec.form``; a freely phrased request's form names its parts, not a sentence) or the
    new text is a held-out one (``corpus.request_split``)."""
    if getattr(spec, "form", "") not in _LONG_FORMS:
        return None
    need, values = set(spec.asks), {}
    if need & {"kind", "adj", "name"}:
        hero = longcheck.hero_of(story)
        if hero is None or ("adj" in need and hero.adj is None):
            return None
        values.update(kind=hero.kind, adj=hero.adj, name=hero.name)
    low = story.lower()
    if "place" in need:
        places = [(low.find(p), p) for p in _corpus.PLACES if p in low]
        if not places:
            return None
        values["place"] = min(places)[1]
    if "obj" in need:
        obj = longcheck.first_found_object(story)
        if obj is None:
            return None
        values["obj"] = obj
    text, asks = _corpus.request_text(spec.form, values)
    if not longcheck.request_honoured(story, asks)[0] or _corpus.request_split(text) != "train":
        return None                  # a held-out request's text is never a training prompt
    return _corpus.StoryRequest(text, asks, spec.story, spec.form)


OPENING = "Once upon a time, there was "


def _words(word: str) -> str:
    return rf"(?<![A-Za-z]){re.escape(word)}(?![A-Za-z])"


def _articles_before(text: str, word: str) -> str:
    """Fix "a"/"an" right before ``word`` (after a word was swapped in)."""
    def fix(m: re.Match) -> str:
        art = _corpus.article(word).split(" ", 1)[0]
        return (art[0].upper() + art[1:] if m.group(1)[0].isupper() else art) + " "
    return re.sub(rf"(?<![A-Za-z])(an?|An?) (?={re.escape(word)}(?![A-Za-z]))", fix, text)


def correct(story: str, spec: Any) -> tuple[str, list[str]] | None:
    """The story edited to give what its request asks for (hindsight correction), and the
    fields edited; None when a miss is not one the grammar allows editing: the hero's
    adjective before its kind, the first found object, a place put into the opening (the
    corpus's ``once upon a time, PLACE, there lived ...``), the hero's name for one of the
    same pronoun. The caller checks the edited story again before keeping it."""
    asks, fields = spec.asks, []
    hero = longcheck.hero_of(story)
    if {"kind", "adj", "name"} & set(asks) and hero is None:
        return None
    if "kind" in asks and hero.kind != asks["kind"]:
        return None                       # another animal's story: not an edit of words
    if "name" in asks and hero.name != asks["name"]:
        same = [names for names in (_corpus.NAMES_HE, _corpus.NAMES_SHE)
                if hero.name in names and asks["name"] in names]
        if not same or re.search(_words(asks["name"]), story):
            return None
        story = re.sub(_words(hero.name), asks["name"], story)
        fields.append("name")
    if "adj" in asks and hero.adj != asks["adj"]:
        if hero.adj is None:
            return None
        old, new = f"{hero.adj} {hero.kind}", f"{asks['adj']} {hero.kind}"
        story = _articles_before(re.sub(_words(old), new, story), asks["adj"])
        fields.append("adj")
    if "obj" in asks and not re.search(_words(asks["obj"]), story, re.IGNORECASE):
        found = longcheck.first_found_object(story)
        if found is None:
            return None
        story = _articles_before(re.sub(_words(found), asks["obj"], story), asks["obj"])
        fields.append("obj")
    if "place" in asks and asks["place"].lower() not in story.lower():
        if not story.startswith(OPENING):
            return None
        story = f"Once upon a time, {asks['place']}, there lived " + story[len(OPENING):]
        fields.append("place")
    return (story, fields) if fields else None


def kept_record(source: str, prompt: str, answer: str, spec: Any,
                relabel_requests: bool = True, correct_requests: bool = True,
                min_arcs: int = 0) -> dict | None:
    """The distill-data record for one answer, or None when it is not one to imitate: a
    good story that ignores its request is corrected (the record's "corrected" lists the
    fields), else relabelled (its "asked" is the original prompt); with ``min_arcs`` > 0 a
    story is lengthened to that many plot arcs (its "lengthened" lists them) or dropped."""
    return _kept(source, prompt, answer, spec, relabel_requests, correct_requests, min_arcs)[0]


def _kept(source: str, prompt: str, answer: str, spec: Any, relabel_requests: bool,
          correct_requests: bool, min_arcs: int) -> tuple[dict | None, bool]:
    """(``kept_record``'s record, whether a good story was dropped for not lengthening)."""
    rec, asked = _record_and_request(source, prompt, answer, spec, relabel_requests,
                                     correct_requests)
    if rec is None or not min_arcs or source == "task":
        return rec, False
    longer = lengthen(rec, asked, min_arcs)
    return longer, longer is None


def _record_and_request(source: str, prompt: str, answer: str, spec: Any,
                        relabel_requests: bool, correct_requests: bool) -> tuple[dict | None, Any]:
    """The record before lengthening, and the request its story answers (the relabelled
    one when it was relabelled, else ``spec``)."""
    if source == "task":
        right = _tasks.score(spec.task, answer, spec.answer)
        return ({"source": source, "prompt": prompt, "answer": answer} if right else None), spec
    story, good, honoured = _story_checks(answer, spec)
    if not good:
        return None, spec
    if honoured:
        return {"source": source, "prompt": prompt, "answer": story}, spec
    edit = correct(story, spec) if correct_requests else None
    if edit is not None:
        fixed, ok, now_honoured = _story_checks(edit[0], spec)
        if ok and now_honoured and fixed == edit[0]:
            return ({"source": source, "prompt": prompt, "answer": fixed,
                     "corrected": edit[1]}, spec)
    new = relabel(story, spec) if relabel_requests else None
    if new is None:
        return None, spec
    return {"source": source, "prompt": new.text, "answer": story, "asked": prompt}, new


def lengthen(rec: dict, spec: Any, arcs: int) -> dict | None:
    """``rec`` with its story lengthened to show ``arcs`` plot arcs (``corpus.lengthen_story``,
    hindsight lengthening: greedy stories stop after as few arcs as the corpus allows),
    checked again like any kept story; ``rec`` itself when it shows that many; None when it
    cannot be lengthened into a story that passes. The new paragraphs are drawn from a
    generator seeded with the record, so the result is fixed."""
    story = rec["answer"]
    if len(_corpus.plot_arcs(story)) >= arcs:
        return rec
    hero = longcheck.hero_of(story)
    if hero is None:
        return None
    rng = random.Random(f"celeris-lengthen:{rec['prompt']}:{story}")
    out = _corpus.lengthen_story(story, rng, kind=hero.kind, adj=hero.adj, name=hero.name,
                                 arcs=arcs)
    if out is None:
        return None
    longer, ok, honoured = _story_checks(out[0], spec)
    if not (ok and honoured and longer == out[0]
            and len(longer.split()) <= _corpus.LONG_WORDS[1]):
        return None
    return {**rec, "answer": longer, "lengthened": out[1]}


def _done_count(path: Path) -> int:
    done = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        done = max(done, int(rec.get("done", 0)))
    return done


def distill_data(model: str | Path, out: str | Path, *, requests: int = 600,
                 tasks: int = 600, batch: int = 16, seed: int = 0, resume: bool = False,
                 minutes: float | None = None, progress: bool = True,
                 relabel_requests: bool = True, correct_requests: bool = True,
                 min_arcs: int = 0, temperature: float = 0.0,
                 free: float = 0.0) -> dict[str, Any]:
    """Answer the prompts with ``model`` at its own default decoding and append the kept
    answers (``kept_record``) to ``out``. ``temperature`` 0 answers greedily (the model's
    mode: each round of training on it narrows what the model writes); above 0 each prompt
    is sampled with its own seed (from ``seed`` and its index in the prompt list, so a
    resumed file draws the same answers), which keeps the pool as varied as the model."""
    from celeris import Engine

    for name, v in (("requests", requests), ("tasks", tasks)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    if not isinstance(batch, int) or not 1 <= batch <= 256:
        raise ValueError(f"batch must be an integer in [1, 256], got {batch!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not 0.0 <= temperature <= 2.0:
        raise ValueError(f"temperature must be in [0, 2], got {temperature!r}")
    arcs = len(_corpus.LONG_PLOT_ARCS)
    if not isinstance(min_arcs, int) or isinstance(min_arcs, bool) or not 0 <= min_arcs <= arcs:
        raise ValueError(f"min_arcs must be an integer in [0, {arcs}], got {min_arcs!r}")
    out = Path(out)
    if out.exists() and not resume:
        raise FileExistsError(f"{out} exists; pass --resume to continue it or remove it")
    free = _stream.check_free(free)
    todo = prompts(requests, tasks, seed, free)
    done = _done_count(out) if out.exists() else 0
    engine = Engine.from_pretrained(str(model), device="cpu")
    if not engine.block_causal:
        raise ValueError(f"{model} is not a block-diffusion model (config attention "
                         f"'block_causal'); distill-data writes a block model's own answers")
    params = engine.default_params().replace(gen_length=MAX_NEW_TOKENS,
                                             **{**TEACHER, "temperature": float(temperature)})
    teacher = {"decoding": params.decoding, "threshold": params.threshold, **TEACHER,
               "temperature": float(temperature)}
    out.parent.mkdir(parents=True, exist_ok=True)
    t0, kept, tokens, nfe = time.time(), {"task": 0, "longreq": 0}, 0, 0
    seen, relabelled, corrected = {"task": 0, "longreq": 0}, 0, 0
    lengthened = not_lengthened = 0
    with out.open("a") as f:
        for i in range(done, len(todo), batch):
            chunk = todo[i:i + batch]
            plist = [params.replace(seed=seed * 1_000_003 + i + j) for j in range(len(chunk))]
            results = engine.generate_batch([[{"role": "user", "content": text}]
                                             for _, text, _ in chunk], plist)
            for (source, text, spec), r in zip(chunk, results):
                seen[source] += 1
                tokens += len(r.token_ids)
                nfe += r.nfe
                rec, dropped = _kept(source, text, r.text, spec, relabel_requests,
                                     correct_requests, min_arcs)
                not_lengthened += dropped
                if rec is not None:
                    kept[source] += 1
                    lengthened += "lengthened" in rec
                    relabelled += "asked" in rec
                    corrected += "corrected" in rec
                    f.write(json.dumps(rec) + "\n")
            f.write(json.dumps({"done": i + len(chunk)}) + "\n")
            f.flush()
            if progress:
                print(f"distill-data: {i + len(chunk)}/{len(todo)} prompts, kept {kept} "
                      f"({corrected} stories corrected, {relabelled} relabelled, "
                      f"{lengthened} lengthened), "
                      f"{tokens / max(time.time() - t0, 1e-9):.0f} tok/s", flush=True)
            if minutes is not None and time.time() - t0 > minutes * 60:
                break
    return {"out": str(out), "answered": seen, "kept": kept, "relabelled": relabelled,
            "corrected": corrected, "lengthened": lengthened,
            "not_lengthened": not_lengthened, "tokens": tokens,
            "tokens_per_forward": tokens / nfe if nfe else 0.0,
            "wall_time_s": round(time.time() - t0, 1), "teacher": teacher}

"""The long-story corpus, the certainty term and the self-distillation data (issue 16)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path

import pytest
import torch

from celeris.train import blockdiff
from celeris.synthetic import corpus
from celeris.train.data import IGNORE
from celeris.train.stream import Mix, Stream, load_pool

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- corpus
def test_long_stories_are_150_to_400_tokens_with_the_shipped_tokenizer():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(ROOT / "models" / "celeris-tiny" / "tokenizer.json"))
    rng = random.Random(1)
    stories = [corpus.long_story(rng) for _ in range(150)]
    lengths = [len(tok.encode(s).ids) for s in stories]
    assert 150 <= min(lengths) and max(lengths) <= 400
    assert all(3 <= s.count("\n\n") + 1 <= 7 for s in stories)      # several paragraphs
    assert len(set(stories)) == len(stories)


def test_long_story_keeps_the_constrained_hero_to_the_end():
    rng = random.Random(2)
    for _ in range(30):
        s = corpus.long_story(rng, kind="fox", name="Pip", adj="brave")
        first, last = s.split("\n\n")[0], s.split("\n\n")[-1]
        assert "fox" in first and "Pip" in first and "brave" in first
        assert "Pip" in last


def test_heldout_long_requests_are_fixed_and_disjoint_from_training_stories():
    held = corpus.heldout_long_requests(20)
    assert [r.text for r in held] == [r.text for r in corpus.heldout_long_requests(20)]
    assert all(corpus.story_split(r.story) == "eval" for r in held)
    rng = random.Random(3)
    train = {corpus.long_request(rng).story for _ in range(200)}
    assert not train & {r.story for r in held}
    assert all(corpus.story_split(s) == "train" for s in train)


def test_heldout_request_texts_are_never_a_training_prompt():
    """Issue 33: the held-out requests the stories bench scores share no text with any prompt
    a training stream (requests, long requests, request openings, the asks setting) or a
    distillation pass can draw."""
    from dataclasses import replace
    from celeris.synthetic import longcheck
    from celeris.train.selfgen import prompts as distill_prompts, relabel
    held = corpus.heldout_long_requests(200)
    texts = {r.text for r in held}
    assert all(corpus.request_split(t) == "eval" for t in texts)
    for field in ("kind", "adj", "name", "place", "obj"):     # every field is held out too
        assert sum(field in r.asks for r in held) >= 10, field
    mix = replace(Mix.from_weights("story=0,task=0,request=1,longreq=1,reqhead=1"),
                  ask_share=0.5, ask_fields=("place", "obj", "adj"))
    stream, prompts = Stream(seed=5, mix=mix), set()
    for _ in range(4000):
        prompts.add(stream.item(stream.pick_source()).messages[0][1])
    prompts |= {text for _, text, _ in distill_prompts(2000, 0, seed=1)}
    assert len(prompts) > 1500 and not prompts & texts
    assert all(corpus.request_split(p) == "train" for p in prompts)
    short = {corpus.story_request(random.Random(i), "eval")[0] for i in range(50)}
    assert all(corpus.request_split(t) == "eval" for t in short)
    # hindsight relabelling never files a story under a held-out text: a training request of
    # a held-out one's template, answered with the held-out story, is dropped, not relabelled
    rng, tried = random.Random(9), 0
    for r in held[:40]:
        spec = next(s for s in iter(lambda: corpus.long_request(rng), None)
                    if s.form == r.form)
        if spec.text != r.text and longcheck.request_honoured(r.story, r.asks)[0]:
            tried += 1
            assert relabel(r.story, spec) is None
    assert tried >= 20


def test_a_requested_place_opens_the_story_and_a_requested_object_is_found_first():
    """Following the request is the likeliest path through the corpus (issue 33): an asked
    place is named by the first sentence, an asked object found at the start of the first
    plot paragraph; unconstrained long stories keep every opening."""
    rng, seen = random.Random(6), {"place": 0, "obj": 0}
    for _ in range(400):
        r = corpus.long_request(rng)
        paras = corpus.paragraphs(r.story)
        if "place" in r.asks:
            seen["place"] += 1
            assert r.asks["place"] in paras[0].split(". ")[0].lower(), r.story
        if "obj" in r.asks:
            seen["obj"] += 1
            first = paras[1].split(". ")[0]
            assert re.search(rf"found an? (\w+ )?{r.asks['obj']}\b", first), r.story
    assert min(seen.values()) >= 25
    openings = {corpus.long_story(random.Random(i)).split(",")[0].split()[0] for i in range(60)}
    assert {"Once", "There"} <= openings


def test_long_request_asks_only_for_what_its_text_names():
    rng = random.Random(4)
    for _ in range(100):
        r = corpus.long_request(rng)
        for field, value in r.asks.items():
            assert value in r.text, (field, value, r.text)
        if "name" in r.asks:
            assert r.story.count(r.asks["name"]) >= 2


def test_zero_weight_long_sources_leave_the_old_stream_unchanged():
    """celeris-tiny's recipe (the default Mix) must draw exactly the sources it drew before
    the long sources existed."""
    stream = Stream(seed=0)
    rng = random.Random("celeris-stream:0")
    old = [rng.choices(("story", "task", "request"), (0.20, 0.65, 0.15))[0]
           for _ in range(300)]
    assert [stream.pick_source() for _ in range(300)] == old


def test_mix_accepts_the_long_sources_and_names_them_in_errors():
    mix = Mix.from_weights("story=0,request=0,task=0.45,long=0.25,longreq=0.3")
    assert dict(mix.sources())["longreq"] == 0.3
    with pytest.raises(ValueError, match="longreq"):
        Mix.from_weights("novel=1")
    stream = Stream(seed=0, mix=mix)
    assert {stream.pick_source() for _ in range(200)} == {"task", "long", "longreq"}
    item = stream.item("longreq")
    assert item.messages[0][0] == "user" and len(item.answer.split()) >= 125


def test_reqhead_rows_are_request_prompts_and_the_first_canvas_tokens_of_their_story():
    """reqhead: a long request answered by its story cropped to the canvas, every answer
    position scored, no end of turn (a beginning, not an end), nothing after it; block
    diffusion scores the same positions."""
    from celeris.train.data import BUCKETS, Batcher
    from celeris.synthetic.longcheck import hero_of
    from celeris.train.tokenizer_train import load_raw

    tok = load_raw(ROOT / "models" / "celeris-tiny-bd")
    stream = Stream(seed=4, mix=Mix.from_weights("story=0,task=0,request=0,reqhead=1"))
    batcher = Batcher(tok, stream, tokens_per_batch=1024)
    canvases = set()
    for _ in range(4):
        b = batcher.next()
        assert b.source == "reqhead" and b.length in dict(BUCKETS["reqhead"])
        canvases.add(b.length)
        prompt_len = b.input_ids.shape[1] - b.length
        scored = b.labels != IGNORE
        assert scored[:, prompt_len:].all() and not scored[:, :prompt_len].any()
        assert b.maskable[:, prompt_len:].all() and not b.maskable[:, :prompt_len].any()
        eot = batcher.eot
        assert not (b.input_ids[:, prompt_len:] == eot).any()        # cropped: no end of turn
        for row in b.input_ids:
            text = tok.decode(row.tolist(), skip_special_tokens=False)
            prompt, _, answer = text.partition("<|assistant|>")
            hero = hero_of(answer)            # the opening sentence fits the shortest canvas
            assert hero is not None, answer
            asked = [k for k in corpus.KINDS if re.search(rf"\b{k}\b", prompt)]
            if asked:                          # the hero is the kind the request asks for
                assert hero.kind in asked, (prompt, answer)
        inputs = blockdiff.block_inputs(b, 8, 3, torch.Generator().manual_seed(0))
        assert int((inputs.targets != IGNORE).sum()) > 0
    assert len(canvases) >= 1
    # the story behind a row honours its request: the stream's item is a long request
    item = Stream(seed=4, mix=stream.mix).item("reqhead")
    assert item.source == "reqhead" and len(item.answer.split()) >= 125


# ----------------------------------------------------------------------------- self-generated pool
def _write_pool(path: Path, lines: list) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_pool_items_replace_generated_ones_with_the_given_probability(tmp_path):
    pool = load_pool(_write_pool(tmp_path / "p.jsonl", [
        {"source": "task", "prompt": "Copy: 1 2", "answer": "1 2"}, {"done": 1},
        {"source": "longreq", "prompt": "Tell me a story.", "answer": "Once."}, {"done": 2}]))
    assert {k: len(v) for k, v in pool.items()} == {"task": 1, "longreq": 1}
    always = Stream(seed=0, pool=pool, pool_prob=1.0)
    assert always.item("task").answer == "1 2" and always.item("longreq").answer == "Once."
    assert always.item("story").source == "story"         # no pool for plain stories
    never = Stream(seed=0, pool=pool, pool_prob=0.0)
    assert all(never.item("task") is not pool["task"][0] for _ in range(50))
    half = Stream(seed=5, pool=pool, pool_prob=0.5)
    share = sum(half.item("task").answer == "1 2" for _ in range(400)) / 400
    assert 0.4 < share < 0.6


def test_pool_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_pool(tmp_path / "missing.jsonl")
    bad = _write_pool(tmp_path / "bad.jsonl", [{"source": "task", "prompt": "x", "answer": "y"},
                                               {"prompt": "no source"}])
    with pytest.raises(ValueError, match=r"line 2"):
        load_pool(bad)
    with pytest.raises(ValueError, match="no records"):
        load_pool(_write_pool(tmp_path / "empty.jsonl", [{"done": 0}]))
    with pytest.raises(ValueError, match="selfgen_prob"):
        Stream(pool={"task": []}, pool_prob=1.5)


# ----------------------------------------------------------------------------- certainty term
def test_right_entropy_averages_only_the_right_predictions():
    logits = torch.tensor([[2.0, 0.0, 0.0],      # argmax 0, target 0: right
                           [0.0, 3.0, 0.0],      # argmax 1, target 2: wrong
                           [0.0, 0.0, 1.0],      # right, but its target is ignored
                           [1.0, 1.0, 5.0]])     # right
    targets = torch.tensor([0, 2, IGNORE, 2])

    def entropy(row):
        p = torch.softmax(row, -1)
        return float(-(p * p.log()).sum())
    want = (entropy(logits[0]) + entropy(logits[3])) / 2
    assert math.isclose(float(blockdiff.right_entropy(logits, targets)), want, rel_tol=1e-6)
    none = blockdiff.right_entropy(logits, torch.tensor([1, 0, 0, 0]))
    assert float(none) == 0.0


def test_certainty_adds_its_weight_times_the_right_entropy():
    from tests.tiny_model import tiny_block_batch, tiny_block_model
    model = tiny_block_model()
    batch = tiny_block_batch("story", unscored=2)
    inputs = blockdiff.block_inputs(batch, 4, 3, torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(inputs.ids, position_ids=inputs.positions, attn_mask=inputs.attn,
                       logits_index=inputs.index).logits
        # make every other scored target the model's own argmax, so some predictions are right
        targets = inputs.targets.clone()
        own = logits.argmax(-1)
        pick = (targets != IGNORE) & (torch.arange(targets.shape[1]) % 2 == 0)
        targets[pick] = own[pick]
        inputs = dataclasses.replace(inputs, targets=targets)
        plain = float(blockdiff.block_loss(model, inputs, "cpu"))
        sharp = float(blockdiff.block_loss(model, inputs, "cpu", certainty=0.5))
        ent = float(blockdiff.right_entropy(logits.flatten(0, 1), targets.flatten()))
    assert int(pick.sum()) >= 2 and ent > 0
    assert math.isclose(sharp - plain, 0.5 * ent, rel_tol=1e-4)


def test_train_refuses_bad_certainty_and_selfgen(tmp_path):
    from celeris.train import train
    with pytest.raises(ValueError, match=r"certainty must be in \[0, 10\]"):
        train(tmp_path / "x", preset="micro", steps=1, kind="bd", certainty=-1, progress=False)
    with pytest.raises(ValueError, match="kind='bd'"):
        train(tmp_path / "x", preset="micro", steps=1, kind="ar", certainty=0.5,
              progress=False)
    with pytest.raises(FileNotFoundError, match="no such file"):
        train(tmp_path / "x", preset="micro", steps=1, kind="bd",
              selfgen=str(tmp_path / "none.jsonl"), progress=False)


def _micro_pair(tmp_path: Path, monkeypatch) -> None:
    """A 2-step micro AR model in tmp_path/ar and a block model adapted from it in tmp_path/bd."""
    from celeris.train import train
    monkeypatch.setenv("CELERIS_THREADS", "1")
    train(tmp_path / "ar", preset="micro", seed=0, progress=False, steps=2, kind="ar")
    train(tmp_path / "bd", preset="micro", seed=0, progress=False, steps=2, kind="bd",
          init_from=tmp_path / "ar")


@pytest.mark.slow
def test_distill_data_writes_resumable_records_and_a_bd_run_trains_on_them(tmp_path,
                                                                          monkeypatch):
    from celeris.train import train
    from celeris.train.selfgen import distill_data, prompts
    _micro_pair(tmp_path, monkeypatch)
    out = tmp_path / "self.jsonl"
    first = distill_data(tmp_path / "bd", out, requests=1, tasks=1, batch=2, progress=False)
    assert sum(first["answered"].values()) == 2
    with pytest.raises(FileExistsError):
        distill_data(tmp_path / "bd", out, requests=1, tasks=1, progress=False)
    again = distill_data(tmp_path / "bd", out, requests=2, tasks=2, batch=2, resume=True,
                         progress=False)
    assert sum(again["answered"].values()) == 2          # only the two new prompts
    marks = [json.loads(x)["done"] for x in out.read_text().splitlines()
             if "done" in json.loads(x)]
    assert marks == [2, 4]
    assert [p[0] for p in prompts(2, 2)] == ["longreq", "task", "longreq", "task"]
    # an untrained model's answers are rarely kept; train on a pool with a known record
    with out.open("a") as f:
        f.write(json.dumps({"source": "task", "prompt": "Copy: 1 2", "answer": "1 2"}) + "\n")
    run = train(tmp_path / "bd2", preset="micro", seed=0, progress=False, steps=2, kind="bd",
                init_from=tmp_path / "ar", selfgen=str(out), selfgen_prob=1.0, certainty=0.5)
    log = json.loads((tmp_path / "bd2" / "train_log.json").read_text())
    assert log["train_config"]["certainty"] == 0.5
    assert log["train_config"]["selfgen"] == str(out)
    assert len(run["losses"]) == 2 and all(0 < x < 100 for x in run["losses"])


def test_without_repeats_drops_repeated_sentences_and_keeps_spacing_and_paragraphs():
    from celeris.synthetic.longcheck import repeated_sentences, without_repeats
    story = ('Once upon a time, there was a kind fox named Pip. Pip liked to play every day. '
             'Pip liked to play every day.\n\nOne day, Pip found a red coin. "Look!" said Pip. '
             'Pip liked to play  every DAY.\n\nPip liked to play every day.\n\nThe end.')
    assert repeated_sentences(story) == (3, 9)      # "Look!" and " said Pip." count apart
    out = without_repeats(story)
    assert out == ('Once upon a time, there was a kind fox named Pip. Pip liked to play every '
                   'day.\n\nOne day, Pip found a red coin. "Look!" said Pip.\n\nThe end.')
    assert repeated_sentences(out) == (0, 6)
    assert without_repeats(out) == out                    # nothing left to drop


def test_a_looping_but_otherwise_good_story_is_kept_without_its_repeats():
    import random

    from celeris.synthetic import corpus as C
    from celeris.synthetic.longcheck import repeated_sentences
    from celeris.train.selfgen import kept_record, prompts

    def imitable(source, answer, spec):
        rec = kept_record(source, "p", answer, spec, relabel_requests=False,
                          correct_requests=False)
        return None if rec is None else rec["answer"]

    request = C.long_request(random.Random(3), "train")
    story = request.story
    first = story.split(". ")[0] + "."
    looping = story.replace(first, first + " " + first, 1)        # one sentence said twice
    assert repeated_sentences(looping)[0] >= 1
    kept = imitable("longreq", looping, request)
    assert kept is not None and repeated_sentences(kept)[0] == 0
    assert imitable("longreq", "Once upon a time.", request) is None     # no hero: dropped
    task = next(spec for source, _, spec in prompts(0, 1) if source == "task")
    assert imitable("task", task.answer, task) == task.answer
    assert imitable("task", task.answer + " 9", task) is None


def test_request_text_rebuilds_every_long_request_from_its_template():
    rng = random.Random(5)
    for _ in range(200):
        r = corpus.long_request(rng)
        assert r.form and corpus.request_text(r.form, dict(r.asks)) == (r.text, r.asks)


def test_a_good_story_that_ignores_its_request_is_kept_under_the_request_it_honours():
    from celeris.synthetic.longcheck import request_honoured, without_repeats
    from celeris.train.selfgen import kept_record, relabel
    pairs = [(corpus.long_request(random.Random(i)), corpus.long_request(random.Random(500 + i)))
             for i in range(400)]
    pairs = [(asked, wrote) for asked, wrote in pairs
             if asked.form == wrote.form and asked.asks and asked.text != wrote.text
             and without_repeats(wrote.story) == wrote.story]
    assert len(pairs) >= 20
    for asked, wrote in pairs:
        # the corpus story written for `wrote` honours exactly `wrote`'s request
        assert not request_honoured(wrote.story, asked.asks)[0] or asked.asks == wrote.asks
        rec = kept_record("longreq", asked.text, wrote.story, asked, correct_requests=False)
        new = relabel(wrote.story, asked)
        if new is None:      # the request it honours has a held-out text: dropped
            assert "obj" in asked.asks and rec is None
            continue
        assert rec == {"source": "longreq", "prompt": new.text, "answer": wrote.story,
                       "asked": asked.text}
        assert new.form == asked.form and request_honoured(wrote.story, new.asks)[0]
        if "obj" not in asked.asks:        # a story may find other objects than the asked one
            assert (new.text, new.asks) == (wrote.text, wrote.asks)
        assert kept_record("longreq", asked.text, wrote.story, asked,
                           relabel_requests=False, correct_requests=False) is None
    asked, _ = pairs[0]
    # an honoured request keeps its prompt; a request without a template is not relabelled
    assert kept_record("longreq", asked.text, asked.story, asked) == {
        "source": "longreq", "prompt": asked.text, "answer": asked.story}
    bare = dataclasses.replace(asked, form="")
    assert relabel(pairs[1][1].story, bare) is None
    # a story that introduces no named hero cannot answer a request for a hero's name
    named = next(r for r, _ in pairs if "name" in r.asks)
    nameless = "Once upon a time, there was a little girl.\n\nShe was happy.\n\nThe end."
    assert relabel(nameless, named) is None
    assert kept_record("longreq", named.text, nameless, named) is None


# the shipped block model's greedy answer to "Write a long story about a little goat."
MODEL_STORY = (
    "Once upon a time, there was a little goat named Zoe. Zoe liked to play every day.\n\n"
    "One day, Zoe found a yellow shoe in the sand. The shoe was heavy and heavy. Zoe took the "
    "shoe home. Zoe felt proud.\n\nZoe wanted to build a tall tower, but she was too small. "
    "She tried again and again. At last, she did it, and she was very proud.\n\nZoe met a "
    "cheerful old woman. \"Will you be my friend?\" asked Zoe. They played all day long. Zoe "
    "was very tired that day.\n\nZoe was very proud that day. Zoe was happy to have the shoe.")


def _request(form: str, **values) -> "corpus.StoryRequest":
    text, asks = corpus.request_text(form, values)
    return corpus.StoryRequest(text, asks, "", form)


@pytest.mark.parametrize("form,values,fields,expect", [
    ("Write a long story about {a_adj_kind}.", dict(kind="goat", adj="strong"), ["adj"],
     ["there was a strong goat named Zoe"]),
    ("Write a long story about {a_adj_kind}.", dict(kind="goat", adj="old"), ["adj"],
     ["there was an old goat named Zoe"]),
    ("Tell me a story about {a_kind} and {a_obj}.", dict(kind="goat", obj="apple"), ["obj"],
     ["found a yellow apple in the sand", "The apple was heavy", "to have the apple."]),
    ("Tell me a story about {a_kind} who lives {place}.", dict(kind="goat", place="in a castle"),
     ["place"], ["Once upon a time, in a castle, there lived a little goat named Zoe."]),
    ("Tell me a story about {a_adj_kind} called {name}.",
     dict(kind="goat", adj="clever", name="Lily"), ["name", "adj"],
     ["there was a clever goat named Lily", "Lily found a yellow shoe"]),
])
def test_a_good_story_that_ignores_its_request_is_corrected_to_honour_it(form, values,
                                                                          fields, expect):
    """Hindsight correction: the model's own story with the asked adjective, object, place or
    name swapped in keeps the original prompt (relabelling would teach "little" forever)."""
    from celeris.synthetic.longcheck import long_score, request_honoured
    from celeris.train.selfgen import correct, kept_record
    spec = _request(form, **values)
    assert not request_honoured(MODEL_STORY, spec.asks)[0]
    rec = kept_record("longreq", spec.text, MODEL_STORY, spec)
    assert rec["prompt"] == spec.text and rec["corrected"] == fields and "asked" not in rec
    assert correct(MODEL_STORY, spec) == (rec["answer"], fields)
    for piece in expect:
        assert piece in rec["answer"]
    assert request_honoured(rec["answer"], spec.asks) == (True, "")
    score = long_score([rec["answer"]], [spec])
    assert score["grammatical"] == 1.0 and score["hero_kept"] == 1.0
    assert score["objects_kept"] == 1.0
    # without correction it is relabelled under the request it honours (it names no place:
    # then there is none, and it is dropped)
    old = kept_record("longreq", spec.text, MODEL_STORY, spec, correct_requests=False)
    if "place" in spec.asks:
        assert old is None
    elif old is None:        # the request the story honours has a held-out text: dropped
        honoured = {**values, "adj": "little", "name": "Zoe", "obj": "shoe"}
        assert corpus.request_split(corpus.request_text(form, honoured)[0]) == "eval"
    else:
        assert old["asked"] == spec.text and old["prompt"] != spec.text


def test_a_miss_that_is_not_a_word_edit_is_relabelled_or_dropped():
    from celeris.train.selfgen import correct, kept_record
    other_kind = _request("Tell me a story about {a_kind} named {name}.", kind="horse",
                          name="Zoe")
    assert correct(MODEL_STORY, other_kind) is None            # a goat is not a horse
    assert "asked" in kept_record("longreq", other_kind.text, MODEL_STORY, other_kind)
    he_name = _request("Write a story about {name} the {kind}.", kind="goat", name="Max")
    assert correct(MODEL_STORY, he_name) is None               # Zoe's "she" stays
    no_opening = MODEL_STORY.replace("Once upon a time, there was", "Long ago, there was")
    place = _request("Tell me a story about {a_kind} who lives {place}.", kind="goat",
                     place="by the sea")
    assert correct(no_opening, place) is None
    assert kept_record("longreq", place.text, no_opening, place, relabel_requests=False,
                       correct_requests=True) is None


def test_plot_arcs_reads_the_corpus_stories_arcs():
    """Every corpus long story shows 2-4 plot arcs, and its closing paragraph none."""
    rng = random.Random(11)
    counts = set()
    for _ in range(200):
        story = corpus.long_story(rng)
        arcs = corpus.plot_arcs(story)
        counts.add(len(arcs))
        assert 2 <= len(arcs) <= 4
        assert corpus.plot_arcs(story.rsplit("\n\n", 1)[-1]) == []
    assert counts == {2, 3, 4}
    assert corpus.plot_arcs(MODEL_STORY) == ["find", "meet", "goal"]


def test_lengthen_story_adds_the_missing_arcs_before_the_closing_paragraph():
    from celeris.synthetic.longcheck import hero_of, long_score, paragraphs
    hero = hero_of(MODEL_STORY)
    added_seen = set()
    for seed in range(30):
        longer, added = corpus.lengthen_story(MODEL_STORY, random.Random(seed), kind=hero.kind,
                                              adj=hero.adj, name=hero.name)
        assert added == ["lose"]
        added_seen.add(longer)
        old, new = paragraphs(MODEL_STORY), paragraphs(longer)
        assert new[:-2] == old[:-1] and new[-1] == old[-1] and len(new) == len(old) + 1
        assert corpus.plot_arcs(new[-2]) == ["lose"]
        assert "shoe" not in new[-2]            # a new object, not the one already found
        s = long_score([longer])
        assert (s["grammatical"], s["hero_kept"], s["objects_kept"]) == (1.0, 1.0, 1.0)
        assert s["repeated_sentences"] == 0.0
    assert len(added_seen) > 10                 # the new paragraphs vary with the generator
    # two arcs asked from a story with two: nothing to add; bad arc counts are refused
    two = corpus.lengthen_story(MODEL_STORY, random.Random(0), kind="goat", adj="little",
                                name="Zoe", arcs=3)
    assert two is None
    with pytest.raises(ValueError, match=r"arcs must be in \[1, 4\]"):
        corpus.lengthen_story(MODEL_STORY, random.Random(0), kind="goat", adj="little",
                              name="Zoe", arcs=5)
    # a story whose last paragraph is a plot paragraph has no closing paragraph to keep last
    cut = MODEL_STORY.rsplit("\n\n", 1)[0]
    assert corpus.lengthen_story(cut, random.Random(0), kind="goat", adj="little",
                                 name="Zoe") is None


def test_kept_records_are_lengthened_to_min_arcs_and_keep_their_request():
    from celeris.synthetic.longcheck import request_honoured
    from celeris.train.selfgen import kept_record
    spec = _request("Write a long story about {a_adj_kind}.", kind="goat", adj="strong")
    plain = kept_record("longreq", spec.text, MODEL_STORY, spec)
    rec = kept_record("longreq", spec.text, MODEL_STORY, spec, min_arcs=4)
    assert rec == kept_record("longreq", spec.text, MODEL_STORY, spec, min_arcs=4)  # seeded
    assert rec["corrected"] == ["adj"] and rec["lengthened"] == ["lose"]
    assert rec["prompt"] == plain["prompt"] == spec.text
    assert rec["answer"].startswith(plain["answer"].rsplit("\n\n", 1)[0])
    assert len(rec["answer"]) > len(plain["answer"])
    assert request_honoured(rec["answer"], spec.asks) == (True, "")
    # a story that already shows the arcs is kept as it is; min_arcs 3 leaves this one alone
    assert kept_record("longreq", spec.text, MODEL_STORY, spec, min_arcs=3) == plain
    # relabelled records are lengthened under their new request
    horse = _request("Tell me a story about {a_kind} named {name}.", kind="horse", name="Zoe")
    rel = kept_record("longreq", horse.text, MODEL_STORY, horse, min_arcs=4)
    assert rel["asked"] == horse.text and rel["lengthened"] == ["lose"]
    assert "a little goat named Zoe" in rel["answer"] and "goat" in rel["prompt"]


def test_distill_data_min_arcs_lengthens_the_pool_and_refuses_bad_values(tmp_path,
                                                                       monkeypatch):
    from celeris import Engine
    from celeris.train.selfgen import distill_data
    model = "models/celeris-tiny-bd"
    # the shipped model already writes four arcs (it was trained on a lengthened pool): its
    # answers lose their "lose" paragraph here, as the model before it wrote them
    real = Engine.generate_batch

    def three_arcs(self, prompts, params=None, request_ids=None):
        out = real(self, prompts, params, request_ids)
        cut = lambda t: "\n\n".join(p for p in t.split("\n\n")
                                      if corpus.plot_arcs(p) != ["lose"])
        return [dataclasses.replace(r, text=cut(r.text)) for r in out]
    monkeypatch.setattr(Engine, "generate_batch", three_arcs)
    for bad in (-1, 5, 2.0, True):
        with pytest.raises(ValueError, match=r"min_arcs must be an integer in \[0, 4\]"):
            distill_data(model, tmp_path / "x.jsonl", requests=1, tasks=0, min_arcs=bad,
                         progress=False)
    assert not (tmp_path / "x.jsonl").exists()
    plain = distill_data(model, tmp_path / "p.jsonl", requests=3, tasks=1, batch=4,
                         progress=False)
    longer = distill_data(model, tmp_path / "l.jsonl", requests=3, tasks=1, batch=4,
                          progress=False, min_arcs=4)
    assert plain["lengthened"] == plain["not_lengthened"] == 0
    assert longer["kept"]["task"] == plain["kept"]["task"]
    assert longer["kept"]["longreq"] + longer["not_lengthened"] == plain["kept"]["longreq"]
    assert longer["lengthened"] >= 2
    read = lambda name: {r["prompt"]: r for r in (json.loads(x) for x in
                         (tmp_path / name).read_text().splitlines() if '"source"' in x)}
    kept = read("l.jsonl")
    assert len(kept) == sum(longer["kept"].values())
    for prompt, lr in kept.items():
        p = read("p.jsonl")[prompt]
        assert p["source"] == lr["source"]
        if lr["source"] == "task":
            assert p == lr
        else:
            assert len(corpus.plot_arcs(lr["answer"])) == 4
            assert ("lengthened" in lr) == (len(corpus.plot_arcs(p["answer"])) < 4)


def test_distill_data_samples_at_a_temperature_reproducibly_and_refuses_bad_values(
        tmp_path, monkeypatch):
    from celeris import Engine
    from celeris.train.selfgen import distill_data
    model = "models/celeris-tiny-bd"
    for bad in (-0.1, 2.5, True, "hot"):
        with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
            distill_data(model, tmp_path / "x.jsonl", requests=1, tasks=0, temperature=bad,
                         progress=False)
    assert not (tmp_path / "x.jsonl").exists()
    seen: list[tuple[str, float, int]] = []
    real = Engine.generate_batch

    def spy(self, prompts, params=None, request_ids=None):
        seen.extend((m[0]["content"], p.temperature, p.seed) for m, p in zip(prompts, params))
        return real(self, prompts, params, request_ids)
    monkeypatch.setattr(Engine, "generate_batch", spy)
    summary = distill_data(model, tmp_path / "hot.jsonl", requests=4, tasks=2, batch=4,
                           progress=False, temperature=1.0)
    assert summary["teacher"]["temperature"] == 1.0
    hot = list(seen)
    assert [t for _, t, _ in hot] == [1.0] * 6
    assert len({s for _, _, s in hot}) == 6          # every prompt its own seed
    seen.clear()                                     # a resumed file: the same seeds
    distill_data(model, tmp_path / "r.jsonl", requests=2, tasks=1, batch=2, progress=False,
                 temperature=1.0)
    distill_data(model, tmp_path / "r.jsonl", requests=4, tasks=2, batch=2, progress=False,
                 temperature=1.0, resume=True)
    assert seen == hot
    assert (tmp_path / "r.jsonl").read_text().count('"source"') == \
        (tmp_path / "hot.jsonl").read_text().count('"source"')
    seen.clear()
    assert distill_data(model, tmp_path / "g.jsonl", requests=1, tasks=0, progress=False
                        )["teacher"]["temperature"] == 0.0
    assert [t for _, t, _ in seen] == [0.0]

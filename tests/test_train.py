"""celeris.train: tasks, corpus, tokenizer, masking objective, deterministic/resumable training.

The training runs use the "micro" preset (a ~50k-parameter model) for 20 steps on one thread;
the whole file takes well under a minute on a 2-core CPU.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from celeris.synthetic import corpus, tasks
from celeris.train import tokenizer_train as tt
from celeris.train.data import IGNORE, Batcher
from celeris.train.objective import diffusion_loss, mask_batch
from celeris.train.stream import Mix, Stream, tokenizer_corpus
from celeris.train.checkpoints import load_init_weights
from celeris.train.trainer import (TRAIN_PRESETS, build_model, make_schedule,
                                   round_vocab)

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- tasks
def test_task_answers_are_exact():
    assert tasks.solve("copy", "copy: 41 7 93 2") == "41 7 93 2"
    assert tasks.solve("reverse", "reverse: 41 7 93 2") == "2 93 7 41"
    assert tasks.solve("sort", "sort: 41 7 93 2") == "2 7 41 93"
    assert tasks.solve("add", "add: 417 + 93") == "510"
    assert tasks.solve("max", "max: 41 7 93 2") == "93"
    assert tasks.solve("count", "count: 41 7 93 2") == "4"
    for task in tasks.TASKS:
        for ex in tasks.make_examples(task, 50, seed=3):
            assert ex.task == task and ex.prompt.startswith(f"{task}: ")
            assert tasks.solve(task, ex.prompt) == ex.answer
            assert tasks.score(task, f"  {ex.answer}\n", ex.answer)
            assert not tasks.score(task, ex.answer + " 1", ex.answer)
            if task in ("copy", "reverse", "sort"):
                items = ex.answer.split()
                assert tasks.LIST_MIN <= len(items) <= tasks.LIST_MAX
                assert all(0 <= int(x) <= tasks.ITEM_MAX for x in items)
            if task == "add":
                addends = [int(x) for x in ex.prompt.split(":")[1].split("+")]
                assert all(0 <= a < 10 ** tasks.ADD_DIGITS for a in addends)
    # the sizes the tiny models are trained for: single-digit items, two-digit addends
    assert (tasks.ITEM_MAX, tasks.ADD_DIGITS) == (9, 2)
    sizes = {len(e.prompt.split(":")[1].split("+")[0].strip())
             for e in tasks.make_examples("add", 200, seed=1)}
    assert sizes == {1, 2}
    with pytest.raises(ValueError):
        tasks.make_examples("divide", 1)


def test_eval_split_is_fixed_and_disjoint_from_training():
    for task in tasks.TASKS:
        ev = tasks.eval_examples(task)
        assert len(ev) == tasks.EVAL_N == len({e.prompt for e in ev})
        assert ev == tasks.eval_examples(task)                      # fixed by seed
        assert all(tasks.split_of(e.prompt) == "eval" for e in ev)
        train = tasks.make_examples(task, 3000, seed=0, split="train")
        assert all(tasks.split_of(e.prompt) == "train" for e in train)
        assert not {e.prompt for e in ev} & {e.prompt for e in train}
    # the training stream never yields an eval problem
    stream = Stream(seed=0)
    for _ in range(500):
        item = stream.item("task")
        assert tasks.split_of(item.messages[0][1]) == "train"


# --------------------------------------------------------------------------- corpus
def test_corpus_is_deterministic_and_varied():
    a, b, c = corpus.stories(30, seed=0), corpus.stories(30, seed=0), corpus.stories(30, seed=1)
    assert a == b and a != c
    assert len(set(a)) > 25
    for s in a:
        assert s[0].isupper() and s.rstrip()[-1] in '."!?'
        assert corpus.story_split(s) == "train"
    held = corpus.heldout_stories(50)
    assert held == corpus.heldout_stories(50) and len(set(held)) == 50
    assert all(corpus.story_split(s) == "eval" for s in held)
    assert not set(held) & set(corpus.stories(500, seed=0))
    rng = random.Random(0)
    text, story = corpus.story_request(rng)
    assert isinstance(text, str) and len(story.split(". ")) >= 1
    for _ in range(50):
        s = corpus.story(rng, kind="dragon")
        assert "dragon" in s


# --------------------------------------------------------------------------- tokenizer
@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tok = tt.train_tokenizer(tokenizer_corpus(600, seed=0), vocab_size=512)
    tt.save_tokenizer(tok, d)
    return d


def test_tokenizer_special_ids_chat_template_and_round_trip(tok_dir):
    raw = tt.load_raw(tok_dir)
    for i, t in enumerate(tt.SPECIAL_TOKENS):
        assert raw.token_to_id(t) == i
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id, hf.mask_token_id) == (0, 1, 2, 3)
    assert hf.convert_tokens_to_ids("<|eot|>") == 7
    msgs = [{"role": "user", "content": "sort: 3 1 2"}]
    rendered = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|user|>\nsort: 3 1 2<|eot|><|assistant|>\n"
    assert hf.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False) == \
        "<|user|>\nsort: 3 1 2<|eot|>"
    for text in ("reverse: 41 7 93 2", "2 93 7 41", "add: 417 + 93", "Once upon a time, a cat.",
                 "x  y\n\n 1234 zebra!", corpus.stories(1, seed=5)[0]):
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert hf.decode(ids) == text
    # every digit is its own token; a space before a digit travels with it
    pieces = [p for p, _ in raw.pre_tokenizer.pre_tokenize_str("add: 12 + 907=19")]
    assert pieces == ["add", ":", "Ġ1", "2", "Ġ+", "Ġ9", "0", "7", "=", "1", "9"]
    for text in ("12345 907", " 5 42 100"):
        toks = [raw.id_to_token(i) for i in raw.encode(text, add_special_tokens=False).ids]
        assert max(sum(c.isdigit() for c in t) for t in toks) <= 1
        assert "".join(toks).replace("Ġ", " ") == text
    assert hf("Once")["input_ids"][0] == 1            # a plain prompt starts with BOS
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == tt.CHAT_TEMPLATE
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"


# --------------------------------------------------------------------------- objective
def test_training_chats_render_through_the_shipped_template_unchanged():
    """Batcher prompts come from apply_chat_template and equal what the hand-written copy of
    the template rendered (role line, content, <|eot|>; then the opened assistant turn)."""
    shipped = ROOT / "models" / "celeris-tiny"
    batcher = Batcher(tt.load_raw(shipped), Stream(seed=0))
    hf = AutoTokenizer.from_pretrained(str(shipped))
    chats = [[{"role": "user", "content": "sort: 3 1 2"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"},
              {"role": "assistant", "content": "ok"}, {"role": "user", "content": "add: 4 + 5"}]]
    for chat in chats:
        by_hand = "".join(f"<|{m['role']}|>\n{m['content']}<|eot|>" for m in chat)
        rendered = batcher.render_chat(chat)
        assert rendered == by_hand + "<|assistant|>\n"
        assert rendered == hf.apply_chat_template(chat, add_generation_prompt=True,
                                                  tokenize=False)
    prompt, answer = batcher.chat_example("task", 64)
    assert prompt[:1] == [tt.SPECIAL_IDS["user"]] and answer[-1] == tt.SPECIAL_IDS["eot"]


def test_learning_rate_warms_up_then_follows_a_cosine_to_the_floor():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_schedule(opt, warmup=10, total=110, min_ratio=0.1)
    lrs = []
    for _ in range(111):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55)               # halfway: (1 + 0.1) / 2
    assert lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_masking_touches_only_maskable_positions(tok_dir):
    raw = tt.load_raw(tok_dir)
    batcher = Batcher(raw, Stream(seed=0), tokens_per_batch=512)
    gen = torch.Generator().manual_seed(0)
    b = batcher.chat_batch("task", 32)
    assert b.input_ids.shape[1] == int((~b.maskable).sum(1).max()) + 32
    for _ in range(20):
        noisy, masked, t = mask_batch(b.input_ids, b.maskable, 3, gen)
        assert bool((masked <= b.maskable).all())                   # prompt never masked
        assert bool((noisy[~masked] == b.input_ids[~masked]).all())
        assert bool((noisy[masked] == 3).all())
        assert bool(masked.any(1).all())                            # every row scores a token
        assert bool(((t >= 1e-3) & (t <= 1)).all())
    # prompt rows: the chat template, untouched; labels only on answer + EoT
    for r in range(b.input_ids.shape[0]):
        row = b.input_ids[r][~b.maskable[r]].tolist()
        real = [i for i in row if i != 0]
        assert real[0] == 4 and real[-2:] == [5, raw.token_to_id("Ċ")]
        lab = b.labels[r][b.labels[r] != IGNORE].tolist()
        assert lab[-1] == 7 and 2 not in lab
    s = batcher.story_batch(128)
    assert bool((s.input_ids[:, 0] == 1).all()) and not bool(s.maskable[:, 0].any())
    # the loss sees only masked positions: logits for unmasked rows are never requested
    noisy, masked, t = mask_batch(s.input_ids, s.maskable, 3, gen)
    logits = torch.zeros(int(masked.sum()), 600, requires_grad=True)
    loss = diffusion_loss(logits, s.input_ids, masked, s.maskable, t)
    loss.backward()
    assert torch.isfinite(loss) and logits.grad.shape == logits.shape


def _runs(row: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of the runs of True in a 1-D bool tensor."""
    out, start = [], None
    for i, v in enumerate(row.tolist() + [False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i))
            start = None
    return out


def test_semi_autoregressive_rows_keep_a_clean_prefix_one_block_and_a_masked_rest(tok_dir):
    raw = tt.load_raw(tok_dir)
    mix = Mix.from_weights("story=1,task=0,request=1")
    batcher = Batcher(raw, Stream(seed=3, mix=mix), tokens_per_batch=512,
                      prefix_prob=0.0, semi_ar_prob=1.0)
    gen = torch.Generator().manual_seed(0)
    blocks, sources = set(), set()
    for _ in range(12):
        b = batcher.next()
        sources.add(b.source)
        assert b.forced is not None
        assert not bool((b.forced & b.maskable).any())
        for r in range(b.input_ids.shape[0]):
            runs = _runs(b.maskable[r])
            assert len(runs) == 1                    # one block ...
            start, end = runs[0]
            assert bool(b.forced[r, end:].all())     # ... then everything after it is hidden
            assert not bool(b.forced[r, :end].any())
            if b.source == "story":
                assert start >= 2                    # BOS and at least one story token clean
            else:
                assert b.labels[r, start] != IGNORE  # the cut is inside the answer
            blocks.add(end - start)
        noisy, masked, t = mask_batch(b.input_ids, b.maskable, 3, gen, forced=b.forced)
        assert bool((noisy[b.forced] == 3).all())    # hidden ...
        assert not bool((masked & b.forced).any())   # ... but never scored
        assert bool((masked <= b.maskable).all()) and bool(masked.any(1).all())
        clean = ~(masked | b.forced)
        assert bool((noisy[clean] == b.input_ids[clean]).all())
    assert sources == {"story", "request"}
    assert blocks <= set(range(1, 33)) and len(blocks) >= 4


def test_row_mean_scores_short_blocks_by_their_plain_mean():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    maskable = torch.tensor([[False, True, True, True], [False, False, True, False]])
    masked = torch.tensor([[False, True, False, True], [False, False, True, False]])
    t = torch.tensor([0.5, 0.001])                   # row 1: one position, t near eps
    logits = torch.randn(3, 10)
    ce = torch.nn.functional.cross_entropy(logits, ids[masked], reduction="none")
    plain = diffusion_loss(logits, ids, masked, maskable, t)
    assert torch.isclose(plain, ((ce[0] + ce[1]) / (0.5 * 3) + ce[2] / 0.001) / 2)
    mean = diffusion_loss(logits, ids, masked, maskable, t, torch.tensor([False, True]))
    assert torch.isclose(mean, ((ce[0] + ce[1]) / (0.5 * 3) + ce[2]) / 2)   # no 1000x weight


def test_semi_autoregressive_rows_off_leave_the_stream_and_the_masks_unchanged(tok_dir):
    raw = tt.load_raw(tok_dir)
    old = Batcher(raw, Stream(seed=1), tokens_per_batch=512)
    new = Batcher(raw, Stream(seed=1), tokens_per_batch=512, semi_ar_prob=0.0)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(10):
        a, b = old.next(), new.next()
        assert a.source == b.source and b.forced is None
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.maskable, b.maskable)
        na, ma, ta = mask_batch(a.input_ids, a.maskable, 3, g1)
        nb, mb, tb = mask_batch(b.input_ids, b.maskable, 3, g2, forced=b.forced)
        assert torch.equal(na, nb) and torch.equal(ma, mb) and torch.equal(ta, tb)
    assert old.stream.state() == new.stream.state()
    with pytest.raises(ValueError, match="semi_ar_prob"):
        Batcher(raw, Stream(seed=1), semi_ar_prob=1.5)
    with pytest.raises(ValueError, match="prefix_prob \\+ semi_ar_prob"):
        Batcher(raw, Stream(seed=1), prefix_prob=0.5, semi_ar_prob=0.6)


def test_mix_from_weights_parses_text_and_names_bad_fields():
    mix = Mix.from_weights("story=0.4, task=0.45")
    assert mix.sources() == (("story", 0.4), ("task", 0.45), ("request", 0.15),
                             ("long", 0.0), ("longreq", 0.0), ("reqhead", 0.0))
    assert Mix.from_weights({"request": 0}).request == 0.0
    assert Mix.from_weights(None) == Mix()
    stream = Stream(seed=0, mix=Mix.from_weights("story=0,task=1,request=0"))
    assert {stream.pick_source() for _ in range(50)} == {"task"}
    for bad, match in (("story=-1", "story must be a finite weight >= 0"),
                       ("story=nan", "story must be a finite weight"),
                       ("stories=1", "unknown source.*stories.*known: story, task, request, long"),
                       ("story", "NAME=WEIGHT"), ("story=x", "NAME=WEIGHT"),
                       ("story=0,task=0,request=0", "at least one")):
        with pytest.raises(ValueError, match=match):
            Mix.from_weights(bad)


def test_asks_makes_that_share_of_long_requests_ask_a_field_and_off_leaves_the_stream():
    from dataclasses import replace
    base = Mix.from_weights("story=0,task=0,request=0,longreq=1,reqhead=1")
    default = Stream(seed=3, mix=base)
    again = Stream(seed=3, mix=replace(base, ask_share=0.0, ask_fields=("obj",)))
    assert [default.item("longreq") for _ in range(40)] == [again.item("longreq")
                                                           for _ in range(40)]

    def share(mix, source, n=300):
        stream = Stream(seed=1, mix=mix)
        msgs = [stream.item(source).messages[0][1] for _ in range(n)]
        return sum(("lives" in m or " and a" in m or " and an" in m or " with a" in m)
                   for m in msgs) / n      # the place and object forms

    every = replace(base, ask_share=1.0, ask_fields=("place", "obj"))
    assert share(every, "longreq") == 1.0 and share(every, "reqhead") == 1.0
    assert share(base, "longreq") < 0.4                # the corpus's own forms: ~26%
    half = share(replace(base, ask_share=0.5, ask_fields=("place", "obj")), "longreq", 600)
    assert 0.55 < half < 0.75                          # 0.5 + 0.5 x the corpus's ~26%


@pytest.mark.parametrize("asks,match", [
    ({"share": 0, "fields": ["adj"]}, r"asks.share must be in \(0, 1\], got 0"),
    ({"share": 1.5, "fields": ["adj"]}, r"asks.share must be in \(0, 1\], got 1.5"),
    ({"share": 0.5, "fields": ["colour"]}, "asks.fields must list some of kind, adj, name"),
    ({"share": 0.5, "fields": []}, "asks.fields must list some of"),
    ({"share": 0.5}, r"asks must be \{share = P, fields"),
])
def test_bad_asks_setting_is_refused_naming_the_field(asks, match):
    from celeris.train.trainer import check_settings
    with pytest.raises(ValueError, match=match):
        check_settings("ar", "tiny", {"asks": asks})
    ok = check_settings("bd", "tiny", {"asks": {"share": 1, "fields": ["adj", "adj", "obj"]}})
    assert ok["asks"] == {"share": 1.0, "fields": ["adj", "obj"]}


# --------------------------------------------------------------------------- training
@pytest.fixture
def one_thread(monkeypatch):
    """One torch thread: on a shared 2-core machine two OpenMP threads competing with another
    busy process make small ops orders of magnitude slower."""
    before = torch.get_num_threads()
    monkeypatch.setenv("CELERIS_THREADS", "1")
    yield
    torch.set_num_threads(before)


def _train(out, **kw):
    from celeris.train import train
    return train(out, preset="micro", seed=0, progress=False, **kw)


@pytest.mark.slow
def test_micro_training_is_deterministic_and_resumable(tmp_path, one_thread):
    a = _train(tmp_path / "a", steps=20)
    b = _train(tmp_path / "b", steps=20)
    assert len(a["losses"]) == 20 and a["losses"] == b["losses"]
    assert all(x == x and x > 0 for x in a["losses"])              # finite, positive
    c1 = _train(tmp_path / "c", steps=20, stop_at=10)
    assert c1["steps"] == 10 and c1["losses"] == a["losses"][:10]
    c2 = _train(tmp_path / "c", steps=20, resume=True)
    assert c2["steps"] == 20 and c2["losses"] == a["losses"]
    log = json.loads((tmp_path / "c" / "train_log.json").read_text())
    assert log["steps"] == 20 and log["seed"] == 0 and log["eval"]["masked_loss"] > 0
    assert log["tokens_seen"] == a["tokens_seen"]
    with pytest.raises(ValueError):
        _train(tmp_path / "c", steps=20, resume=True, kind="ar")


@pytest.mark.slow
def test_training_takes_a_mix_and_semi_autoregressive_rows(tmp_path, one_thread):
    with pytest.raises(ValueError, match="semi_ar_prob must be in \\[0, 0.75\\]"):
        _train(tmp_path / "x", steps=2, semi_ar_prob=0.9)
    with pytest.raises(ValueError, match="mix: unknown source"):
        _train(tmp_path / "x", steps=2, mix="code=1")
    assert not (tmp_path / "x" / "tokenizer.json").exists()    # refused before any work
    plain = _train(tmp_path / "a", steps=4)
    run = _train(tmp_path / "b", steps=4, mix="story=1,task=0,request=1", semi_ar_prob=0.5)
    assert run["losses"] != plain["losses"] and all(x == x and x > 0 for x in run["losses"])
    log = json.loads((tmp_path / "b" / "train_log.json").read_text())
    assert log["train_config"]["mix"] == {"story": 1.0, "task": 0.0, "request": 1.0,
                                          "long": 0.0, "longreq": 0.0, "reqhead": 0.0}
    assert log["train_config"]["semi_ar_prob"] == 0.5
    assert log["data"]["sources"]["task"] == 0.0
    again = _train(tmp_path / "c", steps=4, mix="story=1,task=0,request=1", semi_ar_prob=0.5)
    assert again["losses"] == run["losses"]                      # still deterministic
    heads = _train(tmp_path / "d", steps=3, mix="story=0,task=1,reqhead=1")
    asked = _train(tmp_path / "e", steps=3, mix="story=0,task=1,reqhead=1",
                   asks={"share": 1.0, "fields": ["place", "obj"]})
    assert asked["losses"] != heads["losses"]
    log = json.loads((tmp_path / "e" / "train_log.json").read_text())
    assert log["train_config"]["asks"] == {"share": 1.0, "fields": ["place", "obj"]}


@pytest.fixture(scope="module")
def micro_models(tmp_path_factory):
    import os
    before = torch.get_num_threads()
    old = os.environ.get("CELERIS_THREADS")
    os.environ["CELERIS_THREADS"] = "1"
    try:
        d = tmp_path_factory.mktemp("micro")
        _train(d / "dlm", steps=6)
        _train(d / "ar", steps=6, kind="ar")
    finally:
        if old is None:
            os.environ.pop("CELERIS_THREADS", None)
        else:
            os.environ["CELERIS_THREADS"] = old
        torch.set_num_threads(before)
    return d


@pytest.mark.slow
def test_saved_diffusion_model_loads_and_runs_in_the_engine(micro_models, one_thread):
    torch.set_num_threads(1)
    from celeris import CelerisForMaskedDiffusion, Engine, GenerationParams
    from celeris.evals.evaluate import evaluate

    d = micro_models / "dlm"
    for f in ("config.json", "model.safetensors", "generation_config.json", "train_log.json",
              *tt.TOKENIZER_FILES):
        assert (d / f).is_file(), f
    gen_cfg = json.loads((d / "generation_config.json").read_text())
    fields = set(GenerationParams.field_names())
    assert {"gen_length", "block_length", "steps"} <= set(gen_cfg)
    assert set(gen_cfg) - fields == {"eos_token_id", "pad_token_id", "mask_token_id"}
    model = CelerisForMaskedDiffusion.from_pretrained(str(d))
    assert model.config.mask_token_id == 3 and model.config.eot_token_id == 7
    assert next(model.parameters()).dtype == torch.float32
    engine = Engine.from_pretrained(str(d), device="cpu")
    params = engine.default_params().replace(gen_length=32, block_length=32, steps=32)
    out = engine.generate_batch([[{"role": "user", "content": "sort: 3 1 2"}], "Once upon"],
                                params)
    assert len(out) == 2 and all(isinstance(r.text, str) for r in out)
    report = evaluate(str(d), limit=2, overrides={"gen_length": 32, "steps": 32})
    assert set(report["tasks"]) == set(tasks.TASKS) and report["n_per_task"] == 2
    assert 0.0 <= report["mean_accuracy"] <= 1.0 and report["masked_loss"] > 0
    assert report["samples"] and {"prompt", "prediction", "answer"} <= set(report["samples"][0])


@pytest.mark.slow
def test_saved_ar_twin_loads_with_plain_transformers(micro_models, one_thread):
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, GenerationConfig

    from celeris.evals.evaluate import evaluate

    d = micro_models / "ar"
    model = AutoModelForCausalLM.from_pretrained(str(d))
    assert model.config.model_type == "llama"
    assert GenerationConfig.from_pretrained(str(d)).eos_token_id == [2, 7]
    dlm = json.loads((micro_models / "dlm" / "config.json").read_text())
    assert model.config.vocab_size == dlm["vocab_size"]
    assert model.config.hidden_size == dlm["hidden_size"]
    report = evaluate(str(d), kind="ar", limit=2, overrides={"gen_length": 8})
    assert report["kind"] == "ar" and set(report["tasks"]) == set(tasks.TASKS)


def test_diffusion_training_can_start_from_the_ar_twin(micro_models, tmp_path, one_thread):
    """AR-to-diffusion adaptation: weights and tokenizer come from the AR twin, the run is
    recorded in the log, resuming checks the source, and bad sources are refused by name."""
    from safetensors.torch import load_file

    src = micro_models / "ar"
    out = tmp_path / "adapted"
    ar = load_file(str(src / "model.safetensors"))
    vocab = round_vocab(tt.load_raw(src).get_vocab_size())
    model = build_model("diffusion", "micro", vocab)
    info = load_init_weights(model, src)
    assert info["kind"] == "ar" and info["steps"] == 6
    for name, t in model.state_dict().items():
        assert torch.equal(t, ar[name]), name
    other = build_model("diffusion", "micro", vocab + 64)
    with pytest.raises(ValueError, match="embed_tokens.weight has shape"):
        load_init_weights(other, src)
    _train(out, steps=4, stop_at=2, init_from=src)
    assert (out / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    done = _train(out, steps=4, resume=True, init_from=src)
    assert done["steps"] == 4
    log = json.loads((out / "train_log.json").read_text())
    assert log["init_from"] == str(src) and log["init_info"]["kind"] == "ar"
    assert log["init_info"]["steps"] == 6
    with pytest.raises(ValueError, match="init_from"):
        _train(out, steps=4, resume=True)                   # resumed without its source
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        _train(tmp_path / "x", steps=2, init_from=tmp_path / "nowhere")
    again = _train(tmp_path / "y", steps=2, kind="ar", init_from=src)   # continued training
    assert again["steps"] == 2
    cont = json.loads((tmp_path / "y" / "train_log.json").read_text())
    assert cont["init_info"]["kind"] == "ar" and cont["init_info"]["steps"] == 6


def test_tiny_preset_tokenizer_spells_list_items_as_one_or_two_tokens():
    """The shipped recipe's tokenizer: " 7" is one token, " 41" two (" 4" "1"), no space tokens."""
    tp = TRAIN_PRESETS["tiny"]
    tok = tt.train_tokenizer(tokenizer_corpus(tp["tokenizer_texts"], seed=0),
                             vocab_size=tp["vocab_size"])
    for d in range(10):
        assert len(tok.encode(f" {d}", add_special_tokens=False).ids) == 1
    assert [tok.id_to_token(i) for i in tok.encode("copy: 41 7 93", add_special_tokens=False).ids] \
        == ["copy", ":", "Ġ4", "1", "Ġ7", "Ġ9", "3"]


def test_a_card_quotes_the_recipe_beside_the_weights_else_where_the_run_started(tmp_path):
    from celeris.evals.card import write_card

    (tmp_path / "train_log.json").write_text(json.dumps({"kind": "ar", "init_from": "runs/x"}))
    (tmp_path / "config.json").write_text("{}")
    report = {"tasks": {"copy": 1.0}, "mean_accuracy": 1.0}
    card = write_card(tmp_path, report).read_text()
    assert "- started from `runs/x`; every setting is in `train_log.json`" in card
    (tmp_path / "recipe.toml").write_text('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\n'
                                          'steps = 5\n')
    card = write_card(tmp_path, report).read_text()
    assert "`python -m celeris train --recipe models/m/recipe.toml`" in card
    assert "| 0 | a | ar | 5 |  |" in card and "started from" not in card


def test_model_card_samples_name_their_decoding_and_expected_answer():
    from celeris.evals.card import _samples

    lines = _samples([
        {"prompt": "sort: 3 1 2", "output": "1 2 3", "answer": "1 2 3"},
        {"prompt": "Once upon a time", "decoding": "block 1", "output": ", there was a fox."},
        {"prompt": "Tom met a [MASK].", "decoding": "in story", "output": "Tom met a dog.",
         "hidden": "cat"},
    ])
    assert lines == ["- prompt `sort: 3 1 2` → `1 2 3` (expected `1 2 3`)",
                     "- prompt `Once upon a time` (block 1) → `, there was a fox.`",
                     "- prompt `Tom met a [MASK].` (in story) → `Tom met a dog.` "
                     "(the story had `cat`)"]

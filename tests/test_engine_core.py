"""The engine's shape: one place ends a request, mixed knobs share a forward, seats are reused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import celeris
from celeris import FinishReason
from tests.engine_harness import bare_engine, finish, run_requests, submit
from tests.tiny_model import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [(5, 6, 7), (8, 9, 10, 11, 12), (13, 14, 15, 16, 17, 18, 19), (20, 21)]


def _finish_writes(path: Path) -> list[str]:
    """Places in a source file that set a finish reason: an assignment to ``.finish`` or
    ``.finish_reason``, or a ``finish_reason=`` keyword."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Attribute) and leaf.attr in ("finish", "finish_reason"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if isinstance(node, ast.keyword) and node.arg == "finish_reason":
            found.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
    return found


def test_one_place_sets_a_finish_reason():
    """Request.check_finish decides every finish; the result copies it (one keyword)."""
    places = [p for f in sorted((ROOT / "celeris").rglob("*.py")) for p in _finish_writes(f)]
    request = ROOT / "celeris" / "engine" / "request.py"
    source = request.read_text(encoding="utf-8").splitlines()
    check = next(i for i, line in enumerate(source, 1) if "def check_finish" in line)
    end = next(i for i, line in enumerate(source, 1) if i > check and
               line.startswith("    def "))
    inside = [p for p in places if p.startswith("celeris/engine/request.py:")
              and check < int(p.split(":")[1]) < end]
    copies = [p for p in places if p not in inside]
    assert inside, "check_finish must set the finish reason"
    assert copies == ["celeris/engine/request.py:" + str(next(
        i for i, line in enumerate(source, 1) if "finish_reason=self.finish" in line))], copies


def test_the_checker_sees_a_second_place(tmp_path):
    rogue = ROOT / "celeris" / "_rogue_finish_probe.py"
    rogue.write_text("def f(r):\n    r.finish = 'stop'\n", encoding="utf-8")
    try:
        assert _finish_writes(rogue) == ["celeris/_rogue_finish_probe.py:2"]
    finally:
        rogue.unlink()


@pytest.fixture(scope="module")
def block_model():
    torch.manual_seed(3)
    cfg = celeris.CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, mask_token_id=3,
                                attention="block_causal", block_size=8, shift_logits=True,
                                initializer_range=0.3)
    return celeris.CelerisForMaskedDiffusion(cfg).eval()


@pytest.fixture(scope="module")
def canvas_model():
    torch.manual_seed(4)
    cfg = celeris.CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, mask_token_id=3,
                                shift_logits=True, initializer_range=0.3)
    return celeris.CelerisForMaskedDiffusion(cfg).eval()


def _mixed(block: bool):
    P = celeris.GenerationParams
    common = dict(cache="prefix") if block else {}
    return [P(gen_length=16, block_length=8 if block else 8, temperature=0.8, top_p=0.9,
              **common),
            P(gen_length=20, block_length=4, decoding="threshold", threshold=0.2,
              suppress_eos=True, **common),
            P(gen_length=12, block_length=2, decoding="ltr", threshold=0.5,
              remasking="margin", defer_eos=True, **common),
            P(gen_length=16, block_length=8, decoding="factor", factor=2.0, top_k=5,
              temperature=0.5, cache="none")]


@pytest.mark.parametrize("family", ["block", "canvas"])
def test_requests_with_different_knobs_share_a_forward_and_match_their_solo_runs(
        family, block_model, canvas_model, monkeypatch):
    model = block_model if family == "block" else canvas_model
    params = _mixed(family == "block")
    engine = bare_engine(model, 3, 0, (2,))
    widths = []
    run = engine.runner.run
    monkeypatch.setattr(engine.runner, "run", lambda reqs: widths.append(len(reqs)) or run(reqs))
    together = run_requests(engine, [(f"r{j}", PROMPTS[j], p, 10 + j)
                                     for j, p in enumerate(params)])
    assert widths[0] == len(params)              # every request in the first forward
    for j, p in enumerate(params):
        alone = run_requests(bare_engine(model, 3, 0, (2,)), [("a", PROMPTS[j], p, 10 + j)])
        assert together[f"r{j}"][-1].canvas == alone["a"][-1].canvas
        assert together[f"r{j}"][-1].finish == alone["a"][-1].finish


def test_a_finished_request_leaves_and_a_queued_one_joins_at_the_next_step(block_model):
    engine = bare_engine(block_model, 3, 0, (2,), max_running=2)
    P = celeris.GenerationParams
    short = P(gen_length=8, block_length=8, suppress_eos=True, cache="prefix")
    long = short.replace(gen_length=32)
    outs: dict = {}
    submit(engine, outs, "short", PROMPTS[0], short, 1)
    submit(engine, outs, "long", PROMPTS[1], long, 2)
    submit(engine, outs, "queued", PROMPTS[2], short, 3)
    slots = []
    while engine.scheduler.has_work:
        engine.run_step()
        slots.append({r.request_id: r.slot for r in engine.scheduler.running})
    ended = next(i for i, s in enumerate(slots) if "short" not in s)
    assert outs["short"][-1].finish == "length"
    assert slots[ended] == {"long": slots[ended - 1]["long"]}    # left after its last step
    # the next step gives the queued request the seat and the KV slot it freed
    assert slots[ended + 1] == {"long": slots[ended - 1]["long"],
                                "queued": slots[ended - 1]["short"]}
    finish(engine)
    assert {rid: o[-1].finish for rid, o in outs.items()} == {
        "short": "length", "long": "length", "queued": "length"}


@pytest.mark.parametrize("family", ["block", "canvas"])
def test_a_finished_requests_hole_is_filled_from_the_top_and_tokens_are_unchanged(
        family, block_model, canvas_model, monkeypatch):
    """The first request leaves first; the last one's keys/values move into its slot, so the
    batch reads one view of consecutive slots (no per-layer gather) and decodes as alone."""
    model = block_model if family == "block" else canvas_model
    P = celeris.GenerationParams
    common = dict(block_length=8, suppress_eos=True, temperature=0.7)
    if family == "block":
        common["cache"] = "prefix"
    params = [P(gen_length=8, **common), P(gen_length=32, **common),
              P(gen_length=32, **common)]
    engine = bare_engine(model, 3, 0, (2,))
    views, bind = [], engine.runner.kv.bind

    def record(slots, *args):
        views.append((list(slots), bind(slots, *args)))
        return views[-1][1]
    monkeypatch.setattr(engine.runner.kv, "bind", record)
    outs: dict = {}
    for j, p in enumerate(params):
        submit(engine, outs, f"r{j}", PROMPTS[j], p, 20 + j)
    slots = []
    while engine.scheduler.has_work:
        engine.run_step()
        slots.append({r.request_id: r.slot for r in engine.scheduler.running})
    ended = next(i for i, s in enumerate(slots) if "r0" not in s)
    assert slots[ended] == {"r1": 1, "r2": 2}
    assert slots[ended + 1] == {"r1": 1, "r2": 0}             # moved into the hole
    assert [s for s, _ in views[ended + 1:ended + 3]] == [[0, 1], [0, 1]]
    assert all(isinstance(v._rows, slice) for _, v in views)   # never a gather
    finish(engine)
    for j, p in enumerate(params):
        alone = run_requests(bare_engine(model, 3, 0, (2,)), [("a", PROMPTS[j], p, 20 + j)])
        assert outs[f"r{j}"][-1].canvas == alone["a"][-1].canvas


def test_the_slot_cache_moves_a_slot_into_the_lowest_hole():
    from celeris.cache import SlotKVCache
    kv = SlotKVCache(2, 1, 4, 16, torch.float32, torch.device("cpu"), slots=4, length=8)
    taken = [kv.take() for _ in range(4)]
    for layer in range(2):
        kv.k[layer].normal_(), kv.v[layer].normal_()
    before = [(kv.k[i][3].clone(), kv.v[i][3].clone()) for i in range(2)]
    kv.give_back(1)
    assert taken == [0, 1, 2, 3] and kv.move(3) == 1
    assert kv.free == [3]
    for layer, (k, v) in enumerate(before):
        assert torch.equal(kv.k[layer][1], k) and torch.equal(kv.v[layer][1], v)


def test_the_step_is_a_handful_of_lines():
    source = (ROOT / "celeris" / "engine" / "llm_engine.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    step = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "step")
    assert step.end_lineno - step.lineno <= 25


def test_a_request_aborted_before_its_first_step_never_runs(block_model):
    engine = bare_engine(block_model, 3, 0, (2,))
    outs: dict = {}
    params = celeris.GenerationParams(gen_length=8, block_length=8)
    submit(engine, outs, "a", PROMPTS[0], params, 1)
    engine.abort("a")
    got = []
    engine.scheduler.reserved["a"].sink = got.append
    engine.run_step()
    assert [(r.finish_reason, r.nfe) for r in got] == [(FinishReason.ABORT, 0)]
    assert not engine.scheduler.has_work


def test_the_shipped_full_attention_model_streams_a_prefix_of_its_capped_answer():
    engine = celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny", device="cpu")
    for cap in (1, 5, 17):
        params = engine.default_params().replace(gen_length=cap, steps=None)
        texts = [item.text for item in engine.stream("Once upon a time", params)]
        final = texts[-1]
        assert all(final.startswith(t) for t in texts), (cap, texts)
        assert len(engine.tokenizer.encode(final, add_special_tokens=False)) <= cap


@pytest.mark.parametrize("block_size,sub_block", [(32, 8), (4, 4), (12, 6)])
def test_a_family_gets_its_published_sampler_unless_its_generation_config_says_otherwise(
        block_size, sub_block):
    from celeris.families import BlockLayout, by_name
    fast, sdar_family = by_name("fast_dllm_v2"), by_name("sdar")
    cfg = celeris.FastDLLMQwenConfig(bd_size=block_size, vocab_size=64, hidden_size=32,
                                     intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, mask_token_id=3)
    layout = BlockLayout(cfg, 3)
    p = fast.request_defaults(layout, {})
    assert (p.block_length, p.decoding, p.threshold, p.first_token, p.cache) == (
        sub_block, "threshold", 0.9, "greedy", "prefix")
    given = fast.request_defaults(layout, {"threshold": 0.5, "first_token": "policy"})
    assert (given.threshold, given.first_token, given.block_length) == (0.5, "policy", sub_block)
    assert by_name("celeris").request_defaults(layout, {}).decoding == \
        celeris.GenerationParams().decoding
    for config_cls in (celeris.SDARConfig, celeris.SDARMoeConfig):    # SDAR's generate.py
        sdar = config_cls(block_size=4, vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=4, mask_token_id=3)
        p = sdar_family.request_defaults(BlockLayout(sdar, 3), {})
        assert (p.decoding, p.threshold, p.block_length, p.temperature) == ("dynamic", 0.85,
                                                                            4, 0.0)


def test_a_full_attention_canvas_never_runs_past_the_context(canvas_model):
    """prompt + gen_length may equal the context; the block rounding must not push the
    canvas past it (the last block is cut instead)."""
    engine = bare_engine(canvas_model, 3, 0, (2,), max_prompt_tokens=8192)
    context = canvas_model.config.max_position_embeddings
    prompt = [5] * (context - 12)
    params = celeris.GenerationParams(gen_length=12, block_length=32, suppress_eos=True)
    outs = run_requests(engine, [("edge", prompt, params, 0)])
    assert len(outs["edge"][-1].canvas) == 12 and 3 not in outs["edge"][-1].canvas
    assert outs["edge"][-1].finish == "length"
    with pytest.raises(celeris.ContextLengthError):
        engine.generate(prompt, params.replace(gen_length=13))


@pytest.mark.parametrize("family", ["block", "canvas"])
def test_a_request_whose_forward_raises_fails_alone_and_its_batch_mates_are_unchanged(
        family, block_model, canvas_model):
    """A row that makes the forward raise (any error but out of memory) fails by itself:
    the step is retried row by row, and the healthy rows' tokens equal their solo runs."""
    model = block_model if family == "block" else canvas_model
    params = celeris.GenerationParams(gen_length=12, block_length=4,
                                      **({"cache": "prefix"} if family == "block" else {}))
    poison = 60                                   # a token only the poisoned prompt holds
    prompts = {"a": PROMPTS[0], "bad": (*PROMPTS[1], poison), "b": PROMPTS[2]}
    engine = bare_engine(model, 3, 0, (2,))
    forward = engine.runner.model

    def poisoned(ids, **kwargs):
        if bool((ids == poison).any()):
            raise RuntimeError("cannot reshape tensor of 0 elements")
        return forward(ids, **kwargs)

    engine.runner.model = poisoned
    results = {}
    for rid, prompt in prompts.items():
        engine.submit(list(prompt), params.replace(seed=1), rid, None,
                      lambda item, rid=rid: results.__setitem__(rid, item), events=False)
    finish(engine)
    assert isinstance(results["bad"], RuntimeError)
    for rid in ("a", "b"):
        alone = bare_engine(model, 3, 0, (2,)).generate(list(prompts[rid]),
                                                         params.replace(seed=1))
        assert results[rid].token_ids == alone.token_ids and results[rid].token_ids
        assert results[rid].finish_reason == alone.finish_reason

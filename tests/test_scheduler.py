"""Scheduler and engine integration: step-level batching, admission, abort, deadline, drain."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

import celeris
from celeris import (AsyncEngine, ContextLengthError, EngineBusyError, EngineClosedError,
                     FinishReason, GenerationResult, StepEvent)
from tests.live_server import slow_down
from tests.tiny_model import make_tiny_model_dir

PROMPTS = ["hello there", "def fib(n):", "Once upon a time", "the lazy dog jumps", "x"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), shift_logits=True)


@pytest.fixture
def make_engine(model_dir):
    engines = []

    def make(**options):
        engine = celeris.Engine.from_pretrained(model_dir, device="cpu", **options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def mixed_params(engine):
    """Different knobs per request: they must coexist in one batch."""
    p = engine.default_params()
    return [p.replace(temperature=0.8, seed=1, gen_length=16),
            p.replace(temperature=0.0, gen_length=24, block_length=8, decoding="threshold",
                      threshold=0.05),
            p.replace(temperature=1.0, seed=7, gen_length=16, cache="prefix"),
            p.replace(temperature=0.5, seed=3, gen_length=16, block_length=4, cache="dual",
                      decoding="threshold", threshold=0.2),
            p.replace(temperature=0.7, seed=9, gen_length=16, remasking="random")]


def long_params(engine, gen_length):
    """Full-length answers (a random model emits EOS anywhere)."""
    return engine.default_params().replace(gen_length=gen_length, block_length=8,
                                           suppress_eos=True)


def in_background(engine, prompt, params, request_id=None) -> Future:
    """Stream a request in a thread; return the future of its result once a step has run
    (so the request is surely submitted, not only holding a slot)."""
    stepped, future = threading.Event(), Future()

    def consume():
        try:
            for item in engine.stream(prompt, params, request_id):
                stepped.set()
            future.set_result(item)
        except BaseException as exc:   # noqa: BLE001
            stepped.set()
            future.set_exception(exc)

    threading.Thread(target=consume, daemon=True).start()
    assert stepped.wait(10)
    return future


def same(a: GenerationResult, b: GenerationResult) -> bool:
    return (a.canvas, a.text, a.finish_reason, a.nfe) == (b.canvas, b.text, b.finish_reason,
                                                          b.nfe)


def test_each_request_matches_its_solo_run_when_batched_concurrently(make_engine):
    engine = make_engine()
    params = mixed_params(engine)
    alone = [engine.generate(p, q) for p, q in zip(PROMPTS, params)]
    engine.start()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = list(pool.map(engine.generate, PROMPTS, params))
    assert all(same(a, b) for a, b in zip(alone, batched))
    assert engine.generate_batch(PROMPTS, params)[3].canvas == alone[3].canvas


def test_a_batch_larger_than_the_capacity_waits_for_its_own_requests(make_engine):
    engine = make_engine(max_running=1, max_queue=1)
    params = mixed_params(engine)
    alone = [engine.generate(p, q) for p, q in zip(PROMPTS, params)]
    batch = engine.start().generate_batch(PROMPTS, params)
    assert all(same(a, b) for a, b in zip(alone, batch))
    assert engine.stats()["running"] == engine.stats()["queued"] == 0


def test_inline_generate_batch_groups_by_cache_and_matches_solo(make_engine):
    engine = make_engine()
    params = mixed_params(engine)
    alone = [engine.generate(p, q) for p, q in zip(PROMPTS, params)]
    batch = engine.generate_batch(PROMPTS, params)
    assert [r.request_id for r in batch] != [r.request_id for r in alone]
    assert all(same(a, b) for a, b in zip(alone, batch))


@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_request_joining_mid_way_matches_its_solo_run(make_engine, cache):
    engine = make_engine()
    p = engine.default_params().replace(cache=cache, temperature=0.9)
    long_p, short_p = p.replace(gen_length=32, seed=5), p.replace(gen_length=16, seed=6)
    long_alone = engine.generate("a long one", long_p)
    short_alone = engine.generate("short", short_p)
    engine.start()
    events, joined = [], {}
    for item in engine.stream("a long one", long_p):
        events.append(item)
        if len(events) == 5:   # join while the first request is mid-block
            joined["r"] = engine.generate("short", short_p)
    assert same(events[-1], long_alone)
    assert same(joined["r"], short_alone)


def test_stream_yields_events_then_result_and_infill_matches_inline(make_engine):
    engine = make_engine()
    p = engine.default_params().replace(seed=2, temperature=0.6)
    inline = list(engine.stream("hello", p))
    infill_inline = list(engine.stream_infill("def f(x): [MASK] return x", p))
    assert engine.infill_text("def f(x): [MASK] return x", p) == \
        "def f(x):" + infill_inline[-1].text
    engine.start()
    scheduled = list(engine.stream("hello", p))
    assert all(isinstance(e, StepEvent) for e in scheduled[:-1])
    assert [e.canvas for e in scheduled[:-1]] == [e.canvas for e in inline[:-1]]
    assert same(scheduled[-1], inline[-1])
    assert same(list(engine.stream_infill("def f(x): [MASK] return x", p))[-1],
                infill_inline[-1])


def test_infill_moves_the_space_before_a_span_into_the_span(make_engine):
    assert celeris.split_infill("Once upon a [MASK] there [MASK]") == ["Once upon a", " there", ""]
    assert celeris.split_infill("x[MASK]y  [MASK]. ") == ["x", "y ", ". "]   # one space only
    engine = make_engine()
    tok = engine.tokenizer
    ids, canvas, _ = engine.infill_request("Once upon a [MASK] there was", None, 2, "[MASK]")
    assert ids == tok.encode("Once upon a")
    mask = engine.special.mask
    pinned = tok.encode(" there was", add_special_tokens=False)
    assert canvas[:2] == [mask, mask] and canvas[2:2 + len(pinned)] == pinned


def test_reserve_refuses_beyond_running_plus_queue_before_tokenising(make_engine, monkeypatch):
    engine = make_engine(max_running=1, max_queue=1)
    slow_down(engine, 0.02)
    engine.start()
    p = long_params(engine, 32)
    calls = []
    encode = engine.tokenizer.encode_prompt
    monkeypatch.setattr(engine.tokenizer, "encode_prompt", lambda x: calls.append(x) or
                        encode(x))
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(engine.generate, f"p{i}", p) for i in range(2)]
        while engine.stats()["running"] + engine.stats()["queued"] < 2:
            time.sleep(0.005)
        assert engine.stats() | {"draining": False} == {
            "running": 1, "queued": 1, "max_running": 1, "max_queue": 1, "draining": False,
            "step_failures": 0, "step_failures_total": 0}
        start = time.perf_counter()
        with pytest.raises(EngineBusyError) as busy:
            engine.generate("refused", p)
        assert time.perf_counter() - start < 0.5
        assert busy.value.retry_after >= 1
        assert "refused" not in calls
        results = [f.result() for f in running]
    assert all(r.finish_reason is not FinishReason.ABORT for r in results)
    assert results[1].timings.queue_s > 0
    assert engine.stats()["running"] == engine.stats()["queued"] == 0


def test_abort_frees_the_slot_within_one_step(make_engine):
    engine = make_engine(max_running=1)
    slow_down(engine, 0.01)
    engine.start()
    p = long_params(engine, 64)
    after_abort = 0
    for item in engine.stream("abort me", p, request_id="victim"):
        if isinstance(item, GenerationResult):
            result = item
        elif item.step == 2:
            engine.abort("victim")
        elif item.step > 2:
            after_abort += 1
    assert result.finish_reason is FinishReason.ABORT
    assert after_abort <= 1 and result.steps <= 3
    assert engine.stats()["running"] == 0


def test_abort_of_a_queued_request_answers_at_once(make_engine):
    engine = make_engine(max_running=1, max_queue=4)
    slow_down(engine, 0.01)
    engine.start()
    p = long_params(engine, 64)
    first = in_background(engine, "first", p)
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(engine.generate, "queued", p, "queued")
        while engine.stats()["queued"] < 1:
            time.sleep(0.001)
        engine.abort("queued")   # reserved; maybe still tokenising
        aborted = queued.result(timeout=1)
        assert not first.done()
        assert aborted.finish_reason is FinishReason.ABORT and aborted.nfe == 0
        assert first.result().finish_reason is not FinishReason.ABORT


def test_request_deadline_ends_with_abort(make_engine):
    engine = make_engine(request_timeout_s=0.3)
    slow_down(engine, 0.02)
    engine.start()
    start = time.perf_counter()
    result = engine.generate("slow", long_params(engine, 128))
    assert result.finish_reason is FinishReason.ABORT
    assert 0.3 <= time.perf_counter() - start < 3.0
    assert 0 < result.steps < 128


def test_drain_refuses_new_requests_and_lets_running_ones_finish(make_engine):
    engine = make_engine()
    slow_down(engine, 0.01)
    engine.start()
    p = long_params(engine, 32)
    running = in_background(engine, "keep going", p)
    with ThreadPoolExecutor(1) as pool:
        drained = pool.submit(engine.drain, 10)
        while not engine.stats()["draining"]:
            time.sleep(0.005)
        with pytest.raises(EngineClosedError):
            engine.generate("too late", p)
        assert drained.result() is True
        assert running.result().finish_reason is not FinishReason.ABORT
    assert engine.start().generate("open again").finish_reason is not FinishReason.ABORT


def test_drain_timeout_aborts_what_is_left(make_engine):
    engine = make_engine()
    slow_down(engine, 0.02)
    engine.start()
    running = in_background(engine, "long", long_params(engine, 128))
    assert engine.drain(0.1) is False
    assert running.result(timeout=2).finish_reason is FinishReason.ABORT


def test_async_engine_streams_and_abandoning_the_stream_aborts(make_engine):
    engine = make_engine()
    p = engine.default_params().replace(seed=4, temperature=0.5)
    inline = engine.generate("hi", p)
    aengine = AsyncEngine(engine)
    slow_down(engine, 0.01)

    async def scenario():
        items = [item async for item in aengine.stream("hi", p)]
        generated = await aengine.generate("hi", p)
        async for item in aengine.stream("hi", p.replace(gen_length=64), request_id="gone"):
            break   # the consumer leaves: the request must be aborted
        return items, generated

    items, generated = asyncio.run(scenario())
    assert isinstance(items[-1], GenerationResult) and same(items[-1], inline)
    assert same(generated, inline)
    deadline = time.monotonic() + 2
    while aengine.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert aengine.running == 0 and aengine.queue_depth == 0


def test_a_failing_step_reaches_its_caller_and_the_loop_survives(make_engine):
    engine = make_engine()
    engine.start()
    fail = {"on": True}

    def boom(*_):
        if fail["on"]:
            raise RuntimeError("forward exploded")

    handle = engine.model.register_forward_pre_hook(boom)
    with pytest.raises(RuntimeError, match="forward exploded"):
        engine.generate("x")
    fail["on"] = False
    handle.remove()
    assert engine.generate("x").finish_reason is not FinishReason.ABORT
    assert engine.stats()["running"] == 0


def test_prepare_names_the_numbers_of_a_context_overflow(make_engine):
    engine = make_engine()
    with pytest.raises(ContextLengthError) as exc:
        engine.generate("hello", long_params(engine, 256))
    assert (exc.value.gen_length, exc.value.limit) == (256, 256)
    assert f"prompt ({exc.value.prompt_tokens} tokens) + gen_length (256)" in str(exc.value)
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, "):
        engine.generate([1, 10**6])


def test_stop_aborts_running_requests_and_later_calls_run_inline(make_engine):
    engine = make_engine()
    slow_down(engine, 0.02)
    engine.start()
    running = in_background(engine, "x", long_params(engine, 128))
    engine.stop()
    assert running.result(timeout=2).finish_reason is FinishReason.ABORT
    assert not engine.started
    assert engine.generate("y").finish_reason is not FinishReason.ABORT


def test_an_abort_while_tokenising_is_answered_at_the_next_step(make_engine):
    engine = make_engine()
    scheduler, got = engine.scheduler, []
    scheduler.reserve("early")
    with pytest.raises(ValueError, match="already in use"):
        scheduler.reserve("early")
    assert scheduler.abort("early") and not scheduler.abort("unknown")
    req = engine.prepare("x", request_id="early")
    req.sink = got.append
    scheduler.submit(req)
    engine.run_step()
    assert [(r.finish_reason, r.nfe) for r in got] == [(FinishReason.ABORT, 0)]
    assert scheduler.stats()["running"] == 0
    scheduler.reserve("early")   # the id is free again

"""OpenAI's logit_bias and presence/frequency penalties (GenerationParams, RowKnobs.choose,
the runner's per-step counts, /v1 and batch lines).

What must hold: -100 on the token a greedy answer picks bans it, +100 on a token forces it
wherever nothing else decides; penalties make an answer less repetitive; a row with them
alone and beside rows without them gives the same tokens at temperature 0, and those rows are
untouched; a bias never makes a grammar-invalid token valid; bad values are refused naming
the field, over the API as a 400 naming the parameter.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch

import celeris
from celeris import GenerationParams, cli
from celeris.engine.runner import Runner
from celeris.request_params import request_params
from celeris.sampler.choose import RowKnobs
from celeris.server import create_app
from tests.live_server import live_server

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time"
PROMPTS = [PROMPT, "Mia Mia Mia Mia", "the the the"]
FORCED = 285            # " to" in the shipped models' tokenizer: never a whole answer by itself


@pytest.fixture(scope="module")
def bd():
    return celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny-bd", device="cpu")


@pytest.fixture(scope="module")
def tiny():
    return celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny", device="cpu")


@pytest.fixture
def engine(request, bd, tiny):
    return {"celeris-tiny-bd": bd, "celeris-tiny": tiny}[request.param]


def _params(engine, max_tokens=32, **fields):
    return request_params({"max_tokens": max_tokens, "temperature": 0.0, **fields},
                          engine.default_params())


def _repeats(ids) -> int:
    """Answer tokens that repeat an earlier one."""
    return len(ids) - len(set(ids))


# ---------------------------------------------------------------------- params
def test_params_take_a_dict_or_pairs_sorted_and_round_trip_through_json():
    p = GenerationParams(logit_bias={7: 5, 2: -100.0}, presence_penalty=0.5,
                         frequency_penalty=-1)
    assert p.logit_bias == ((2, -100.0), (7, 5.0))
    assert GenerationParams(logit_bias=[[7, 5], (2, -100)]) == p.replace(
        presence_penalty=0.0, frequency_penalty=0.0)
    data = json.loads(json.dumps(p.to_dict()))
    assert data["logit_bias"] == [[2, -100.0], [7, 5.0]]
    assert GenerationParams.from_dict(data) == p
    assert GenerationParams().logit_bias == ()


@pytest.mark.parametrize("fields,message", [
    ({"logit_bias": {5: 100.5}}, "logit_bias values must be numbers in [-100, 100], got 100.5 "
                                 "for token id 5"),
    ({"logit_bias": {5: float("nan")}}, "logit_bias values must be numbers in [-100, 100]"),
    ({"logit_bias": {5: True}}, "logit_bias values must be numbers in [-100, 100]"),
    ({"logit_bias": {-1: 1}}, "logit_bias token ids must be integers >= 0, got -1"),
    ({"logit_bias": {"5": 1}}, "logit_bias token ids must be integers >= 0, got '5'"),
    ({"logit_bias": [(5, 1), (5, 2)]}, "logit_bias gives token id 5 more than once"),
    ({"logit_bias": [(5,)]}, "logit_bias entries must be (token id, bias) pairs"),
    ({"logit_bias": 5}, "logit_bias must be a mapping of token id -> bias or a list"),
    ({"logit_bias": {i: 1 for i in range(301)}}, "logit_bias may hold at most 300 token ids, "
                                                 "got 301"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2.0, 2.0], got 2.5"),
    ({"frequency_penalty": -3}, "frequency_penalty must be in [-2.0, 2.0], got -3"),
    ({"frequency_penalty": "1"}, "frequency_penalty must be a number in [-2.0, 2.0]"),
])
def test_bad_values_are_refused_naming_the_field_and_the_range(fields, message):
    with pytest.raises(ValueError) as exc:
        GenerationParams(**fields)
    assert str(exc.value).startswith(message), str(exc.value)


def test_request_keys_are_token_ids_written_as_strings():
    base = GenerationParams()
    assert request_params({"logit_bias": {"12": 3, "4": -1}}, base).logit_bias == \
        ((4, -1.0), (12, 3.0))
    assert request_params({"logit_bias": {}}, base).logit_bias == ()
    with pytest.raises(ValueError, match=r"logit_bias keys must be token ids .*got 'x1'"):
        request_params({"logit_bias": {"x1": 3}}, base)
    with pytest.raises(ValueError, match="logit_bias gives token id 5 more than once"):
        request_params({"logit_bias": {"5": 3, "05": 1}}, base)
    with pytest.raises(ValueError, match="logit_bias token ids must be integers >= 0"):
        request_params({"logit_bias": {"-2": 3}}, base)


def test_a_token_id_beyond_the_vocabulary_is_refused_when_the_request_is_prepared(bd):
    vocab = bd.model.config.vocab_size
    with pytest.raises(ValueError) as exc:
        bd.generate(PROMPT, _params(bd, logit_bias={vocab: 1.0}))
    assert str(exc.value) == (f"logit_bias token ids must be in [0, {vocab}) (this model's "
                              f"vocabulary), got {vocab}")
    assert bd.generate(PROMPT, _params(bd, 4, logit_bias={vocab - 1: 1.0})).token_ids


def test_diffusion_gemma_refuses_them_by_name():
    from celeris.families.gemma_layout import GemmaLayout
    layout = GemmaLayout(SimpleNamespace(canvas_length=8, vocab_size=16), 15)
    for field, value in (("logit_bias", {3: 1.0}), ("presence_penalty", 0.5),
                         ("frequency_penalty", -0.5)):
        with pytest.raises(ValueError, match=f"{field} must be .* for DiffusionGemma"):
            layout.check(GenerationParams(block_length=8, **{field: value}))


# ---------------------------------------------------------------------- the sampler
def test_choose_adds_each_rows_bias_and_penalties_to_that_row_only():
    torch.manual_seed(0)
    V, mask = 10, 9
    rows = [GenerationParams(), GenerationParams(logit_bias={2: 7.5, 4: -100}),
            GenerationParams(presence_penalty=1.0, frequency_penalty=0.5)]
    knobs = RowKnobs(rows, [None] * 3, mask, (8,), torch.device("cpu"))
    logits = torch.randn(3, 4, V)
    counts = torch.zeros(3, V)
    counts[2, 1], counts[2, 5] = 1, 3
    counts[0, 1] = 5                     # a row without penalties: its counts are not read
    x0, conf, p_x0, _ = knobs.choose(logits.clone(), [4, 4, 4], counts=counts)
    want = logits.clone()
    want[..., mask] = float("-inf")
    want[1, :, 2] += 7.5
    want[1, :, 4] -= 100
    want[2, :, 1] -= 1.0 + 0.5
    want[2, :, 5] -= 1.0 + 1.5
    probs = want.softmax(-1)
    assert torch.equal(x0, probs.argmax(-1))
    torch.testing.assert_close(p_x0, probs.amax(-1))
    plain = RowKnobs(rows[:1], [None], mask, (8,), torch.device("cpu"))
    assert plain.bias_entries is None and not plain.any_penalty      # nothing built for none


def test_counts_are_the_committed_answer_tokens_of_penalised_rows():
    mask, V = 3, 8
    runner = SimpleNamespace(special=SimpleNamespace(mask=mask), device=torch.device("cpu"))
    reqs = [SimpleNamespace(seq=[5, 5, 6, mask, 6, 6, mask], prompt_len=2,
                            params=GenerationParams(frequency_penalty=1.0)),
            SimpleNamespace(seq=[1, 2, 2], prompt_len=1, params=GenerationParams())]
    counts = Runner._counts(runner, reqs, V)
    want = torch.zeros(2, V)
    want[0, 6] = 3                       # the prompt's 5s and the masks do not count
    assert torch.equal(counts, want)


# ---------------------------------------------------------------------- the engine
def test_minus_100_bans_the_token_a_greedy_answer_picks(bd):
    plain = bd.generate(PROMPT, _params(bd))
    top = Counter(plain.token_ids).most_common(1)[0][0]
    banned = bd.generate(PROMPT, _params(bd, logit_bias={top: -100}))
    assert top not in banned.token_ids and banned.token_ids != plain.token_ids


@pytest.mark.parametrize("engine", ["celeris-tiny-bd", "celeris-tiny"], indirect=True)
def test_plus_100_forces_the_token_at_every_answer_position(engine):
    out = engine.generate(PROMPT, _params(engine, 24, logit_bias={FORCED: 100}))
    assert out.token_ids == (FORCED,) * 24 and out.finish_reason == "length"


def test_a_bias_never_makes_a_grammar_invalid_token_valid(bd):
    choice = ("choice", json.dumps(["yes", "no"]))
    y = bd.tokenizer.encode("yes", add_special_tokens=False)[0]
    plain = bd.generate(PROMPT, _params(bd, 16).replace(structured=choice))
    forced = bd.generate(PROMPT, _params(bd, 16, logit_bias={FORCED: 100}).replace(
        structured=choice))
    steered = bd.generate(PROMPT, _params(bd, 16, logit_bias={y: 100}).replace(
        structured=choice))
    assert plain.text == forced.text == "no"     # " to" is never allowed: nothing changes
    assert steered.text == "yes"                 # an allowed token is still steered


def _batch_tokens(engine, **fields):
    """160 greedy tokens for each of PROMPTS (one batch), EOS suppressed."""
    params = _params(engine, 160, suppress_eos=True, **fields)
    return [r.token_ids for r in engine.generate_batch(PROMPTS, params)]


@pytest.fixture(scope="module")
def plain(bd):
    return _batch_tokens(bd)


def test_a_frequency_penalty_makes_answers_less_repetitive(bd, plain):
    penalised = _batch_tokens(bd, frequency_penalty=2.0)
    encouraged = _batch_tokens(bd, frequency_penalty=-1.0)
    assert sum(map(_repeats, penalised)) < sum(map(_repeats, plain)) - 20
    assert sum(map(_repeats, encouraged)) > sum(map(_repeats, plain))
    most = [Counter(ids).most_common(1)[0][1] for ids in (plain[0], penalised[0])]
    assert most[1] < most[0]                 # the most repeated token ("."), repeated less


def test_a_presence_penalty_makes_answers_use_more_distinct_tokens(bd, plain):
    penalised = _batch_tokens(bd, presence_penalty=2.0)
    assert sum(len(set(ids)) for ids in penalised) > sum(len(set(ids)) for ids in plain)


@pytest.mark.parametrize("engine", ["celeris-tiny-bd", "celeris-tiny"], indirect=True)
def test_a_biased_row_is_the_same_alone_and_in_a_batch_and_leaves_the_others(engine):
    base = _params(engine, 24)
    plain = engine.generate(PROMPT, base).token_ids
    top = Counter(plain).most_common(1)[0][0]
    rows = [base.replace(logit_bias={top: -100}, frequency_penalty=1.5), base,
            base.replace(presence_penalty=1.0, logit_bias={FORCED: 4.0})]
    prompts = [PROMPT, "The cat", "Tom had a dog"]
    alone = [engine.generate(q, p).token_ids for q, p in zip(prompts, rows)]
    together = [r.token_ids for r in engine.generate_batch(prompts, rows)]
    assert together == alone
    assert alone[0] != plain                 # the adjusted row did change its answer


# ---------------------------------------------------------------------- API and batch
@pytest.fixture(scope="module")
def url(bd):
    with live_server(create_app(bd, warmup=False)) as u:
        yield u


def test_the_api_applies_them_on_completions_and_chat(url, bd):
    out = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logit_bias": {str(FORCED): 100}})
    assert out.status_code == 200, out.text
    assert out.json()["choices"][0]["text"] == bd.tokenizer.decode([FORCED] * 6)
    messages = [{"role": "user", "content": "Tell me a story."}]
    fields = {"max_tokens": 48, "temperature": 0, "frequency_penalty": 2.0,
              "presence_penalty": 0.5, "logit_bias": {"21": -100}}
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                      json={"messages": messages, **fields})
    assert chat.status_code == 200, chat.text
    text = chat.json()["choices"][0]["message"]["content"]
    want = bd.generate(messages, request_params(fields, bd.default_params()))
    plain = bd.generate(messages, request_params({"max_tokens": 48, "temperature": 0},
                                                 bd.default_params()))
    assert text == want.text != plain.text


@pytest.mark.parametrize("body,param,message", [
    ({"logit_bias": {"abc": 1}}, "logit_bias", "logit_bias keys must be token ids"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "logit_bias values must be numbers in "
                                               "[-100, 100], got 101"),
    ({"logit_bias": {"5": "x"}}, "logit_bias", "logit_bias: Input should be a valid number"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias",
     "logit_bias may hold at most 300 token ids"),
    ({"logit_bias": {"1280": 1}}, "logit_bias", "logit_bias token ids must be in [0, 1280)"),
    ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty must be in [-2.0, 2.0]"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", "frequency_penalty must be in "
                                                        "[-2.0, 2.0]"),
])
def test_bad_values_over_the_api_are_a_400_naming_the_parameter(url, body, param, message):
    for path, ask in (("/v1/completions", {"prompt": "x"}),
                      ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        out = httpx.post(f"{url}{path}", json={**ask, "max_tokens": 4, **body}, timeout=60)
        assert out.status_code == 400, out.text
        error = out.json()["error"]
        assert error["param"] == param and error["message"].startswith(message), error


def test_a_batch_line_takes_them_like_the_api(tmp_path, bd):
    src, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    lines = [{"id": "forced", "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
              "logit_bias": {str(FORCED): 100}, "presence_penalty": 0.5},
             {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": PROMPT, "logit_bias": {"1280": 1}}}]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert cli.main(["batch", str(src), "--output", str(out), "--errors", str(err),
                     "--skip-invalid", "--device", "cpu",
                     "--model", str(ROOT / "models" / "celeris-tiny-bd")]) == 1
    done = json.loads(out.read_text())
    assert done["response"]["body"]["choices"][0]["text"] == bd.tokenizer.decode([FORCED] * 6)
    failed = json.loads(err.read_text())
    assert failed["custom_id"] == "bad"
    assert "logit_bias token ids must be in [0, 1280)" in failed["error"]["message"]

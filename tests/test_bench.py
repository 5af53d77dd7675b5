"""Bench: every suite end to end on a random tiny model, counting rules, and the HTML report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from celeris import cli
from celeris.bench.decode import (AR_ENGINE_SYSTEM, AR_SYSTEM, DEFAULT_SYSTEM, REFERENCE,
                                  REFERENCE_SYSTEM, best_config, tuned_system)
from celeris.bench.lengths import length_plan
from tests.test_bench_fixture import one_thread, tiny_ar_dir, tiny_model_dir  # noqa: F401

GEN, BLOCK = 16, 8
SUITES = ("decode", "ar", "stories", "lengths", "serve", "invariance", "structured", "scores",
          "quant", "gpu")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-models")
    model = tiny_model_dir(root / "m")
    return model, tiny_ar_dir(root / "ar", model)


@pytest.fixture(scope="module")
def bench_run(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    model, ar = models
    rc = cli.main(["bench", "--suite", "all", "--tiny", "--model", str(model), "--ar-model",
                   str(ar), "--n", "1", "--gen-length", str(GEN), "--block-length", str(BLOCK),
                   "--repeats", "2", "--concurrency", "1,4", "--no-progress", "--device", "cpu",
                   "--json", str(out / "r.json"), "--html", str(out / "r.html")])
    report = json.loads((out / "r.json").read_text())
    return SimpleNamespace(rc=rc, report=report, suites=report["suites"],
                           html=out / "r.html")


def test_every_suite_runs_end_to_end_and_the_report_names_the_machine(bench_run):
    assert bench_run.rc == 0
    assert {name: s["status"] for name, s in bench_run.suites.items()} == \
        {name: "ok" for name in SUITES}
    machine = bench_run.report["machine"]
    assert machine["cpu"] and machine["cpu_cores"] >= 1
    assert machine["torch"] == torch.__version__ and "triton" in machine and "gpu" in machine
    assert bench_run.suites["decode"]["settings"]["dtype"] == "float32"


def test_scores_suite_compares_samples_logprobs_and_scoring(bench_run):
    listed = bench_run.suites["scores"]["rows"]
    rows = {r["config"]: r for r in listed}
    assert "same as alone: True" in rows["n = 4 (one batch)"]["check"]
    assert rows["n = 4 (one batch)"]["ratio"] > 0
    on = [r for r in listed if r["config"].startswith("logprobs on")]
    assert [r["batch"] for r in on] == [1, 16]
    assert all(r["check"] == "same tokens: True" and r["ratio"] > 0 for r in on)
    score = next(r for c, r in rows.items() if c.startswith("score a"))
    assert score["tokens"] == 2 * int(score["config"].split()[2].split("-")[0])
    assert score["ratio"] > 0


def test_decode_counts_completion_tokens_like_the_engine(bench_run, models):
    from celeris import Engine, GenerationParams
    from celeris.bench.common import messages, task_examples

    rows = bench_run.suites["decode"]["rows"]
    ref = rows[0]
    assert ref["config"] == "reference" and ref["speedup"] == pytest.approx(1.0)
    assert ref["params"]["decoding"] == "fixed" and ref["params"]["cache"] == "none"
    assert ref["params"]["early_stop"] is False and ref["params"]["steps"] is None
    engine = Engine.from_pretrained(str(models[0]), device="cpu")
    params = GenerationParams.from_dict(ref["params"])
    expected = sum(engine.generate(messages(ex.prompt), params).usage.completion_tokens
                   for ex in task_examples(1))
    assert ref["completion_tokens"] == expected
    for row in rows:
        assert row["completion_tokens"] <= row["requests"] * GEN
        assert row["tokens_per_s"] == pytest.approx(row["completion_tokens"] / row["wall_s"])
        assert 0.0 <= row["accuracy"] <= 1.0 and row["nfe_mean"] >= 1
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / ref["tokens_per_s"])
    assert len(rows) == 14 and bench_run.suites["decode"]["best"] in {r["config"] for r in rows}


def test_ar_suite_puts_both_systems_side_by_side_at_batch_1_and_8(bench_run):
    rows = bench_run.suites["ar"]["rows"]
    assert [r["batch"] for r in rows] == [1, 1, 1, 1, 8, 8, 8, 8]
    assert [r["system"] for r in rows[:2]] == [AR_SYSTEM, AR_ENGINE_SYSTEM]
    best = bench_run.suites["decode"]["best"]
    assert [r["system"] for r in rows[2:4]] == [REFERENCE_SYSTEM, tuned_system(best)]
    for row in rows:
        assert row["requests"] == 6 and 0.0 <= row["accuracy"] <= 1.0
        assert row["completion_tokens"] <= 6 * GEN
    _assert_twin_ratios(rows)


def _assert_twin_ratios(rows):
    """Each batch's rows carry both ratios against the twin's two rows (the same-engine twin
    decodes the twin's tokens: tests/test_packed_forward.py, test_shipped_model.py; a random
    tiny model's near-tied logits may part them after a hundred tokens)."""
    for key in dict.fromkeys((r.get("prompts"), r["batch"]) for r in rows):
        group = {r["system"]: r for r in rows if (r.get("prompts"), r["batch"]) == key}
        hf, same = group[AR_SYSTEM], group[AR_ENGINE_SYSTEM]
        assert hf["vs_ar"] == 1.0 and same["vs_ar_engine"] == 1.0
        assert same["tokens_per_forward"] <= 1.0           # one position a step, EOS counted
        for row in group.values():
            assert row["vs_ar"] == pytest.approx(row["tokens_per_s"] / hf["tokens_per_s"])
            assert row["vs_ar_engine"] == pytest.approx(
                row["tokens_per_s"] / same["tokens_per_s"])


def test_stories_suite_scores_long_requests_for_both_systems_at_batch_1_and_8(bench_run):
    sec = bench_run.suites["stories"]
    rows = sec["rows"]
    assert [(r["prompts"], r["system"], r["batch"]) for r in rows] == \
        [("phrasings", AR_SYSTEM, 1), ("phrasings", AR_ENGINE_SYSTEM, 1),
         ("phrasings", DEFAULT_SYSTEM, 1), ("phrasings", AR_SYSTEM, 8),
         ("phrasings", AR_ENGINE_SYSTEM, 8), ("phrasings", DEFAULT_SYSTEM, 8),
         ("templates", AR_SYSTEM, 1), ("templates", AR_ENGINE_SYSTEM, 1),
         ("templates", DEFAULT_SYSTEM, 1)]
    _assert_twin_ratios(rows)
    assert sec["settings"]["requests"] == 8           # --n 1: 8 held-out long requests
    assert sec["settings"]["sets"] == {"phrasings": [1, 8], "templates": [1]}
    for row in rows[1:3] + rows[4:6] + rows[7:]:      # engine rows: per-chunk ratio spread
        median, low, high = map(float, re.fullmatch(
            r"([\d.]+) \(([\d.]+)-([\d.]+)\)", row["vs_ar_chunks"]).groups())
        assert 0 < low <= median <= high
    for row in rows:
        assert row["requests"] == 8
        assert row["completion_tokens"] <= 8 * sec["settings"]["max_new_tokens"]
        for key in ("grammatical", "hero_kept", "request_honoured", "objects_kept",
                    "repeated_sentences", "distinct_sentences"):
            assert 0.0 <= row[key] <= 1.0
            assert row[key] == row["quality"][key]
        fields = row["request_fields"]
        assert sum(f["asked"] for f in fields.values()) >= 8 and fields == \
            row["quality"]["request_fields"]
        assert all(0 <= f["honoured"] <= f["asked"] for f in fields.values())
        assert row["request_by_field"] == ", ".join(
            f"{k} {f['honoured']}/{f['asked']}" for k, f in fields.items())
        assert row["vs_ar"] is not None
    assert rows[0]["vs_ar"] == 1.0 and "tokens_per_forward" in rows[2]
    assert "tokens_per_forward" not in rows[0]
    # sampled diversity of the engine systems at batch 1 (phrasings): distinct stories of 5 seeds
    assert [("seed_stories" in r) for r in rows] == [False, True, True] + [False] * 6
    assert all(1.0 <= r["seed_stories"] <= 5.0 for r in rows[1:3])


def test_lengths_are_capped_by_the_context_and_repeated(bench_run):
    sec = bench_run.suites["lengths"]
    labels = [r["length"] for r in sec["rows"]]
    assert labels == ["short", "short", "medium", "medium"]       # Celeris and AR twin each
    assert all(len(r["latencies_s"]) == 2 for r in sec["rows"])
    assert any("long (1024) dropped" in n for n in sec["notes"])
    assert sec["rows"][2]["gen_length"] < 256


def test_invariance_finds_identical_tokens_at_batch_1_and_16(bench_run):
    rows = bench_run.suites["invariance"]["rows"]
    assert len(rows) == 3
    for row in rows:
        assert row["requests"] == 16
        assert row["identical"] == 16, row["differences"]


def test_serve_runs_in_process_without_a_url_and_says_so(bench_run):
    sec = bench_run.suites["serve"]
    assert [r["concurrency"] for r in sec["rows"]] == [1, 4]
    assert all(r["succeeded"] == r["requests"] == 8 for r in sec["rows"])
    assert all(r["tokens"] <= 8 * GEN and r["tokens_per_s"] > 0 for r in sec["rows"])
    assert "in-process" in sec["settings"]["mode"]


def test_gpu_script_runs_its_tiny_version_on_cpu(bench_run):
    sec = bench_run.suites["gpu"]
    plan = sec["settings"]["plan"]
    assert sec["settings"]["kernel_tests"]["status"] == "skipped"
    # full attention (none/prefix/dual) and the same weights block-causal (block/none, block/exact)
    assert len(sec["rows"]) == len(plan["batches"]) * (3 + 2) * 3
    assert {r["cache"] for r in sec["rows"]} == {"none", "prefix", "dual", "block/none",
                                                  "block/exact"}
    for row in sec["rows"]:
        assert row["steps"] == plan["gen_length"] // row["tokens_per_forward"]
        assert row["tokens"] == row["batch"] * plan["gen_length"]
        assert row["hbm_fraction"] is None and row["achieved_tflops"] > 0
    none = [r for r in sec["rows"] if r["cache"] == "none"]
    assert all(r["vs_none"] == pytest.approx(1.0) for r in none)


def test_gpu_suite_measures_the_step_with_each_kernel_setting_side_by_side(bench_run):
    sec = bench_run.suites["gpu"]
    assert [t["name"] for t in sec["tables"]] == ["step_variants", "moe_step", "quant_step"]
    table = sec["tables"][0]
    plan = sec["settings"]["plan"]
    rows = table["rows"]
    assert [(r["kernels"], r["cache"]) for r in rows] == [
        (k, c) for c in plan["variant_caches"] for k in ("torch", "fused", "compiled")]
    for row in rows:
        assert row["steps"] == plan["gen_length"] and row["tokens_per_forward"] == 1
        assert row["compiled_calls"] == (row["steps"] if row["kernels"] == "compiled" else None)
        assert row["step_ms"] > 0
    assert all(r["vs_torch"] == pytest.approx(1.0) for r in rows if r["kernels"] == "torch")


def _llada2_parameters(d: dict) -> dict[str, int]:
    """A llada2_moe config's parameters by kind, counted by hand from its upstream keys."""
    C, H, Hkv, D = (d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"],
                    d["head_dim"])
    L, dense, E = d["num_hidden_layers"], d["first_k_dense_replace"], d["num_experts"]
    expert = 3 * C * d["moe_intermediate_size"]          # gate, up, down of one SwiGLU expert
    return {"embedding": d["vocab_size"] * C, "head": d["vocab_size"] * C,
            "attention": L * (C * (H + 2 * Hkv) * D + H * D * C + 2 * D),   # qkv, o, q/k norm
            "norms": L * 2 * C + C, "dense_mlp": dense * 3 * C * d["intermediate_size"],
            "routers": (L - dense) * (E * C + E),                           # weight, bias
            "shared_experts": (L - dense) * d["num_shared_experts"] * expert,
            "experts": (L - dense) * E * expert}


def test_structured_suite_puts_constrained_beside_unconstrained_at_batch_1_and_16(bench_run):
    sec = bench_run.suites["structured"]
    rows = {(r["config"], r["batch"]): r for r in sec["rows"]}
    tools = {k: rows.pop(k) for k in list(rows) if k[0].startswith("tool_choice")}
    beside = {k[0]: rows.pop(k) for k in list(rows) if k[0].startswith("8 unconstrained")}
    assert set(beside) == {"8 unconstrained beside 8 unconstrained (same lengths)",
                           "8 unconstrained beside 8 constrained"}
    same, mixed = beside.values()
    assert same["tokens"] == mixed["tokens"] > 0        # the same 8 rows' tokens in both
    assert mixed["ratio"] == pytest.approx(mixed["tokens_per_s"] / same["tokens_per_s"],
                                           abs=0.01)
    assert set(rows) == {(c, b) for c in ("unconstrained", "constrained") for b in (1, 16)}
    assert set(tools) <= {(f"tool_choice {c}", 16) for c in ("required", "get_weather", "add")}
    assert all(r["valid_share"] in (None, 1.0) for r in tools.values())
    for batch in (1, 16):
        plain, constrained = rows["unconstrained", batch], rows["constrained", batch]
        assert plain["requests"] == constrained["requests"] == 16
        assert constrained["ratio"] == pytest.approx(
            constrained["tokens_per_s"] / plain["tokens_per_s"], abs=0.01)
        assert constrained["valid_share"] in (None, 1.0)   # every finished answer conforms
        assert 0 < constrained["stop_share"] <= 1           # a choice finishes within 16
    (acceptance,) = sec["tables"]                            # compile only: the schema corpus
    (row,) = acceptance["rows"]
    assert row["schemas"] >= 40 and row["accepted"] <= row["compiled"] <= row["schemas"]
    assert row["ratio"] == pytest.approx(row["accepted"] / row["compiled"], abs=0.001)
    assert row["ratio"] >= 0.9


def test_quant_suite_times_each_mode_on_both_paths_and_scores_them(bench_run):
    """--suite quant (tiny): float32, int8 and int4 side by side on the module and packed
    paths at batch 1 and 8, their real weight bytes, accuracy and token agreement against
    full width, and the fit table from published configs."""
    sec = bench_run.suites["quant"]
    keys = {(r["mode"], r["path"], r["batch"]) for r in sec["rows"]}
    assert keys == {(m, p, b) for m in ("float32", "int8", "int4")
                    for p in ("module", "packed") for b in (1, 8)}
    for row in sec["rows"]:
        assert row["step_ms"] > 0 and row["steps"] == sec["settings"]["gen_length"]
        if row["mode"] == "float32":
            assert row["vs_float32"] == 1.0 and row["weight_ratio"] is None
    size = {r["mode"]: r["weight_bytes"]["total"] for r in sec["rows"]}
    assert size["int4"] < size["int8"] < size["float32"]
    tables = {t["name"]: t for t in sec["tables"]}
    acc = {r["mode"]: r for r in tables["accuracy"]["rows"]}
    assert set(acc) == {"float32", "int8", "int4"}
    assert acc["float32"]["token_agreement"] == 1.0
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["n"] == 6 for r in acc.values())
    fit = {r["model"]: r for r in tables["fit"]["rows"]}
    assert set(fit) == {"LLaDA-8B", "Dream-7B", "LLaDA2.0-mini"}
    assert fit["LLaDA-8B"]["int8_gb"] < 0.6 * fit["LLaDA-8B"]["bf16_gb"]


def test_the_moe_step_model_has_llada2_mini_published_size():
    """LLADA2_MINI read by the llada2_moe config reader and shaped on the meta device: the
    model card's 16B total / 1.4B active, and the roofline's byte counts by hand."""
    from celeris import LLaDA2MoeConfig
    from celeris.bench.gpu import LLADA2_MINI, build_random_model, moe_costs, moe_step_bytes

    model = build_random_model(LLADA2_MINI, torch.device("meta"), torch.bfloat16,
                               LLaDA2MoeConfig)
    cfg = model.config
    assert cfg.block_causal and cfg.block_size == 32 and cfg.rotary_dim == 64
    assert (cfg.router_groups, cfg.router_topk_groups, cfg.norm_topk_prob) == (8, 4, True)
    assert cfg.shared_expert_intermediate_size == 512 and cfg.moe_layer_ids == set(range(1, 20))
    costs = moe_costs(model)
    by_hand = _llada2_parameters(LLADA2_MINI)
    assert costs["parameters_by_kind"] == by_hand
    assert costs["bytes_by_kind"] == {k: 2 * n for k, n in by_hand.items()}     # bf16
    assert costs["parameters"] == 16_255_643_392                    # "16B total"
    assert costs["active_parameters"] == 1_432_973_056              # "1.4B active": 8 of 256
    assert costs["expert_bytes"] == 3 * 2048 * 512 * 2 and costs["moe_layers"] == 19
    fixed = 2 * sum(n for k, n in by_hand.items() if k not in ("experts", "embedding"))
    assert costs["step_fixed_bytes"] == fixed == 1_265_819_136
    # every expert routed in every MoE layer, 32 tokens: all weights but 32 embedding rows
    assert moe_step_bytes(costs, 256, 32) == 2 * (sum(by_hand.values()) - by_hand["embedding"]
                                                  + 32 * 2048)


def test_gpu_suite_measures_a_moe_block_step_against_the_roofline(bench_run):
    sec = bench_run.suites["gpu"]
    moe = sec["settings"]["moe"]
    plan = sec["settings"]["plan"]
    assert moe["status"] == "ok" and moe["cache"] == "block/exact"
    table = sec["tables"][1]
    assert table["name"] == "moe_step"
    rows = table["rows"]
    assert [r["batch"] for r in rows] == plan["moe_batches"] == moe["batches"]
    d = moe["dims"]
    by_hand = _llada2_parameters(d)
    assert moe["parameters_by_kind"] == by_hand
    assert moe["bytes_by_kind"] == {k: 4 * n for k, n in by_hand.items()}       # float32
    E, k, C = d["num_experts"], d["num_experts_per_tok"], d["hidden_size"]
    moe_layers = d["num_hidden_layers"] - d["first_k_dense_replace"]
    expert_bytes = 4 * 3 * C * d["moe_intermediate_size"]
    assert (moe["num_experts"], moe["moe_layers"], moe["expert_bytes"]) == \
        (E, moe_layers, expert_bytes)
    fixed = 4 * sum(n for kind, n in by_hand.items() if kind not in ("experts", "embedding"))
    P, B, gen, tpf = (plan["prompt_len"], plan["block_length"], plan["moe_gen_length"],
                      plan["moe_tokens_per_forward"])
    steps_per_block = B // tpf
    for row in rows:
        b = row["batch"]
        assert row["cache"] == "block/exact" and row["tokens_per_forward"] == tpf
        assert row["steps"] == row["forwards"] == gen // tpf
        assert row["tokens"] == b * gen
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"])
        assert row["step_ms"] == pytest.approx(1e3 * row["wall_s"] / row["steps"])
        # one block a step against the exact cache: the prompt with the first block, a
        # finished block with the next one, the block alone otherwise
        per_row = (P + B + B * (steps_per_block - 1)
                   + (gen // B - 1) * (2 * B + B * (steps_per_block - 1)))
        assert row["forward_tokens"] == b * per_row
        # distinct experts per MoE layer and forward: at least k, at most all of them
        assert k <= row["routed_experts"] <= E
        step_bytes = (fixed + row["routed_experts"] * moe_layers * expert_bytes
                      + row["forward_tokens"] / row["forwards"] * C * 4)
        assert row["weight_bytes_per_step"] == pytest.approx(step_bytes)
        assert row["weight_gb_per_s"] == pytest.approx(
            step_bytes * row["forwards"] / row["wall_s"] / 1e9)
        assert row["roofline_ms"] is None and row["hbm_fraction"] is None   # no GPU peak
        assert row["achieved_tflops"] > 0 and row["peak_mem_gib"] > 0
    # more tokens in a step route to more (or as many) distinct experts
    assert rows[-1]["routed_experts"] >= rows[0]["routed_experts"]
    assert any(n.startswith("moe_step (") for n in sec["notes"])


def test_gpu_step_profile_runs_its_tiny_version_on_cpu(tmp_path, one_thread):  # noqa: F811
    report = _bench_script("gpu_step_profile").main(["--tiny", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "step_profile.json").read_text()) == json.loads(
        json.dumps(report))
    assert report["steps"] == 16 and report["wall_ms_per_step"] > 0
    assert report["gpu_busy_ms_per_step"] is None            # no CUDA: CPU rows only
    assert report["top_cpu_ops"] and all(o["count"] > 0 for o in report["top_cpu_ops"])
    assert report["block_exact_slot_length"] == 512 + 8       # tiny context + one block


def _bench_script(name: str):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_step_cost_times_block_windows_against_the_twins_token(tmp_path, one_thread):  # noqa: F811
    """bench/step_cost.py on the shipped pair, one tiny round: a row per window width, the
    twin's cached forward and generate() per token, and break-even = block ms / AR ms."""
    report = _bench_script("step_cost").main(
        ["--widths", "1,5", "--prefix", "24", "--repeats", "1", "--inner", "1",
         "--json", str(tmp_path / "c.json")])
    assert json.loads((tmp_path / "c.json").read_text()) == json.loads(json.dumps(report))
    ms = report["ms"]
    assert set(ms) == set(report["matmul_ms_profiled"]) | {"ar_generate_per_token"}
    assert all(v > 0 for v in report["matmul_ms_profiled"].values())
    assert set(ms) == {"bd_forward_w1", "bd_forward_w5", "bd_forward_w1_modules",
                       "bd_forward_w5_modules", "ar_forward_1", "ar_engine_forward_w2",
                       "ar_generate_per_token"}
    assert all(v > 0 for v in ms.values())
    for w in (1, 5):
        assert report["break_even_tpf"][f"w{w}"] == pytest.approx(
            ms[f"bd_forward_w{w}"] / ms["ar_generate_per_token"], abs=0.01)


@pytest.mark.browser
def test_html_report_opens_in_chromium_and_shows_its_charts(bench_run, chromium_path):
    from playwright.sync_api import sync_playwright

    html = bench_run.html.read_text()
    assert "<script src=" not in html                      # plotly.js is inline
    expected = int(html.split("data-charts='")[1].split("'")[0])
    assert expected == 6          # decode x2, ar, lengths, serve, gpu
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(bench_run.html.as_uri())
            page.wait_for_function(
                f"document.querySelectorAll('.plotly-graph-div .main-svg').length >= {expected}",
                timeout=30000)
            drawn = page.evaluate("[...document.querySelectorAll('.plotly-graph-div')]"
                                  ".filter(d => d.querySelectorAll('.trace').length > 0)"
                                  ".length")
            titles = page.evaluate("[...document.querySelectorAll('.gtitle')]"
                                   ".map(e => e.textContent)")
        finally:
            browser.close()
    assert not errors
    assert drawn == expected
    assert any("tokens/s vs accuracy" in t for t in titles)
    assert any("throughput vs concurrency" in t for t in titles)
    assert any("latency" in t for t in titles)


def test_unknown_suite_is_a_user_error(capsys):
    assert cli.main(["bench", "--suite", "decode,warp"]) == 2
    assert "--suite must be one of" in capsys.readouterr().err


def test_missing_ar_twin_skips_the_suite_with_a_reason(models, tmp_path, capsys):
    rc = cli.main(["bench", "--suite", "ar", "--model", str(models[0]), "--ar-model",
                   str(tmp_path / "none"), "--n", "1", "--gen-length", str(GEN),
                   "--block-length", str(BLOCK), "--no-progress", "--json",
                   str(tmp_path / "r.json")])
    sec = json.loads((tmp_path / "r.json").read_text())["suites"]["ar"]
    assert rc == 1 and sec["status"] == "skipped" and "--ar-model" in sec["reason"]


def test_best_config_is_the_fastest_within_two_points_of_the_reference():
    rows = [{"config": "reference", "accuracy": 0.90, "tokens_per_s": 1.0},
            {"config": "fast-but-wrong", "accuracy": 0.80, "tokens_per_s": 50.0},
            {"config": "fast", "accuracy": 0.885, "tokens_per_s": 20.0},
            {"config": "slow", "accuracy": 0.95, "tokens_per_s": 5.0}]
    assert best_config(rows) == "fast"
    assert REFERENCE[1]["early_stop"] is False


def test_length_plan_keeps_targets_that_fit_and_says_what_it_capped():
    ctx = SimpleNamespace(block_length=32, block_length_for_model=lambda: 32)
    plan, notes = length_plan(ctx, prompt_len=30, context=4096)
    assert plan == [("short", 64), ("medium", 256), ("long", 1024)] and notes == []
    plan, notes = length_plan(ctx, prompt_len=30, context=512)
    assert plan == [("short", 64), ("medium", 256), ("long", 480)]
    assert notes == ["long: gen_length 1024 capped to 480 by the 512-token context"]


def test_side_by_side_timing_runs_every_chunk_by_every_system_in_rotating_order():
    from celeris.bench.common import timed_side_by_side

    calls = []

    def runner(name):
        def run(chunk):
            calls.append((name, tuple(chunk)))
            return [f"{name}:{x}" for x in chunk]
        return run

    out = timed_side_by_side({"a": runner("a"), "b": runner("b")}, list(range(5)), 2)
    # chunk by chunk, both systems before the next chunk; the first system alternates
    assert calls == [("a", (0, 1)), ("b", (0, 1)), ("b", (2, 3)), ("a", (2, 3)),
                     ("a", (4,)), ("b", (4,))]
    for name in "ab":
        results, walls = out[name]
        assert results == [f"{name}:{x}" for x in range(5)]      # item order kept
        assert len(walls) == 3 and all(w >= 0 for w in walls)


def test_seed_stories_counts_distinct_samples_per_request():
    from celeris import GenerationParams
    from celeris.bench.stories import SEEDS, seed_stories

    seen = []

    class Echo:       # request 0 tells one story whatever the seed; request 1 one per seed
        def generate_batch(self, prompts, params):
            seen.extend((p.temperature, p.seed) for p in params)
            return [SimpleNamespace(text="same" if "first" in str(m) else f"story {p.seed}")
                    for m, p in zip(prompts, params)]

    reqs = [SimpleNamespace(text="first request"), SimpleNamespace(text="second request")]
    assert seed_stories(Echo(), GenerationParams(), reqs) == (1 + SEEDS) / 2
    assert seen == [(0.8, s) for _ in reqs for s in range(SEEDS)]


def test_progress_lines_come_at_most_every_few_seconds_with_k_of_n_and_time_left():
    import io

    from celeris.bench.progress import Progress

    out, now = io.StringIO(), iter([0.0, *range(1, 11)]).__next__
    bar = Progress("ar", "batch 1, 3 systems", 10, stream=out, every=5.0, now=now)
    for k in range(10):
        bar.update(1, system=f"system {k % 3}")
    lines = out.getvalue().splitlines()
    assert lines == ["bench ar: batch 1, 3 systems: 10 items",
                     "bench ar: batch 1, 3 systems: item 5 of 10, last: system 1, 0:05 "
                     "elapsed, about 0:05 left",
                     "bench ar: batch 1, 3 systems: item 10 of 10, last: system 0, 0:10 "
                     "elapsed"]
    quiet = io.StringIO()
    Progress("ar", "x", 3, enabled=False, stream=quiet).update(3)
    assert quiet.getvalue() == ""


def test_a_bench_run_prints_progress_to_stderr_and_names_one_system_default(models, tmp_path):
    """A real ``python -m celeris bench`` with its stderr redirected: progress lines (suite,
    what is measured, item k of n, elapsed), and a summary whose systems have distinct names,
    none of them but the model's own defaults called a default."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    model, ar = models
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "celeris", "bench", "--suite", "ar", "--model", str(model),
         "--ar-model", str(ar), "--n", "1", "--gen-length", str(GEN), "--block-length",
         str(BLOCK), "--device", "cpu", "--threads", "1", "--json", str(tmp_path / "r.json")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("bench ar: ")]
    assert progress[0] == "bench ar: started (suite 1 of 1)"
    assert any(re.search(r"item (\d+) of \1, .*elapsed$", line) for line in progress)
    assert any(re.search(r"item \d+ of \d+, last: .+, \d+:\d\d elapsed", line)
               for line in progress), progress
    assert progress[-1].startswith("bench ar: ok in ")
    assert "\r" not in done.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["suites"]["ar"]["rows"]
    systems = [r["system"] for r in rows if r["batch"] == 1]
    assert len(set(systems)) == len(systems) == 4
    assert not any("default" in s.lower() and s != DEFAULT_SYSTEM for s in systems), systems
    assert "(default)" not in done.stdout and "fast" not in " ".join(systems)


def test_gpu_suite_measures_each_quantize_mode_and_says_why_one_cannot_run(bench_run):
    sec = bench_run.suites["gpu"]
    plan = sec["settings"]["plan"]
    table = sec["tables"][2]
    assert table["name"] == "quant_step"
    rows = table["rows"]
    by = {(r["model"], r["mode"], r["batch"]): r for r in rows}
    batches = plan["quant_batches"]
    # what runs on a CPU: full width, int8, int4 (dense), full width, int8 (MoE), each batch
    for model, mode in (("dense", "full width"), ("dense", "int8"), ("dense", "int4"),
                        ("moe", "full width"), ("moe", "int8")):
        for b in batches:
            r = by[(model, mode, b)]
            assert r["status"] == "ok" and r["cache"] == "block/exact"
            assert r["tokens_per_forward"] == 1 and r["steps"] == plan["quant_gen_length"]
            assert r["tokens"] == b * plan["quant_gen_length"]
            full = by[(model, "full width", b)]
            assert r["vs_full"] == pytest.approx(r["step_ms"] / full["step_ms"])
            assert 0 < r["read_gb_per_step"] < r["weight_gb"]
            assert r["floor_ms"] is None and r["vs_floor"] is None       # no GPU peak
    # real storage: int8 and int4 weights take less than full width's, int4 the least
    weight = {(m, q): by[(m, q, batches[0])]["weight_gb"] for m, q, b in by if b == batches[0]}
    assert weight[("dense", "int4")] < weight[("dense", "int8")] < weight[("dense", "full width")]
    assert weight[("moe", "int8")] < weight[("moe", "full width")]
    # refusals are rows that say why: fp8 needs the hardware, int4 holds no experts
    refused = {(r["model"], r["mode"]): r["status"] for r in rows if r["batch"] is None}
    assert set(refused) == {("dense", "fp8"), ("moe", "fp8"), ("moe", "int4")}
    assert all(s.startswith("refused: --quantize fp8") and "compute capability" in s
               for (m, q), s in refused.items() if q == "fp8")
    assert "mixture-of-experts" in refused[("moe", "int4")]
    assert any(n.startswith("quant_step: ") for n in sec["notes"])


def test_stories_measures_the_full_attention_sibling_at_its_own_defaults(tmp_path):
    """Beside a block-diffusion model, the stories suite scores the full-attention model the
    playground runs next to it (--canvas-model) at that model's own generation_config.json;
    beside a full-attention model there is no such row."""
    from celeris.bench.common import BenchContext
    from celeris.bench.stories import CANVAS_BATCH, measure_canvas, requests_for

    block = tiny_model_dir(tmp_path / "block", attention="block_causal", block_size=4,
                           generation_defaults={"gen_length": 32, "decoding": "ltr",
                                                "threshold": 0.9, "cache": "prefix"})
    full = tiny_model_dir(tmp_path / "full", seed=1,
                          generation_defaults={"gen_length": 12, "block_length": 4,
                                               "decoding": "threshold", "threshold": 0.5})
    ctx = BenchContext(model=str(block), canvas_model=str(full), device="cpu", n=1,
                       progress=False)
    reqs = requests_for(ctx)
    [row] = measure_canvas(ctx, reqs, "phrasings")
    assert (row["system"], row["batch"], row["prompts"]) == \
        ("full-attention full (its defaults)", CANVAS_BATCH, "phrasings")
    assert row["requests"] == len(reqs) == 8
    params = row["params"]
    assert (params["gen_length"], params["block_length"], params["decoding"],
            params["threshold"]) == (12, 4, "threshold", 0.5)
    assert 0 < row["mean_tokens"] <= 12 and row["completion_tokens"] == 8 * row["mean_tokens"]
    assert 1.0 <= row["tokens_per_forward"] <= 12
    assert 0.0 <= row["grammatical"] <= 1.0 and row["wall_s"] > 0
    assert "vs_ar" not in row
    # a full-attention model benchmarked on its own has no sibling row
    alone = BenchContext(model=str(full), canvas_model=str(full), device="cpu", n=1,
                         progress=False)
    assert alone.canvas is None and measure_canvas(alone, reqs, "phrasings") == []
    # without --canvas-model, only a model beside models/celeris-tiny gets its row
    assert BenchContext(model=str(block), device="cpu", progress=False).canvas is None
    missing = BenchContext(model=str(block), canvas_model=str(tmp_path / "nowhere"),
                           device="cpu", progress=False)
    with pytest.raises(ValueError, match="--canvas-model: no model .* at .*nowhere"):
        missing.canvas

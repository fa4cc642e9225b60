"""KV-cache and state budgets of chapter 19 (attention_lib/kv_budget.py), checked against hand
arithmetic, against the library's own caches, and the decode benchmark's recorded cache sizes."""

import json
from pathlib import Path

import numpy as np
import pytest

from attention_lib.cache import KVCache
from attention_lib.kv_budget import (
    cache_numbers_per_token,
    kv_table,
    layer_bytes,
    load_kv_configs,
    mha_bytes,
    model_bytes,
    state_numbers,
)
from attention_lib.variants import MultiHeadLatentAttention, delta_rule

CONTEXT = 131072  # 128k tokens
RESULTS = Path(__file__).parent.parent / "benchmarks" / "results" / "decode_variants.json"


@pytest.fixture(scope="module")
def models():
    return {model["name"]: model for model in load_kv_configs()}


def test_llama_cache_at_128k_is_16_gib(models):
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 features x 2 (key and value) = 65,536
    # numbers per token, x 2 bytes (bf16) = 131,072 bytes = 128 KiB per token;
    # x 131,072 tokens = 17,179,869,184 bytes = 16 GiB. Plain MHA (32 heads): 4x, 64 GiB.
    llama = models["Llama-3.1-8B"]
    assert layer_bytes(llama["layers"][0], 1) == 2 * 8 * 128 * 2 == 4096
    assert model_bytes(llama, CONTEXT) == 16 * 2**30
    assert mha_bytes(llama, CONTEXT) == 64 * 2**30


def test_deepseek_v3_caches_576_numbers_per_token_and_layer(models):
    # DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 numbers = 1152 bytes per
    # token and layer; 61 layers x 1152 x 131,072 = 9,210,691,584 bytes (8.58 GiB).
    # MHA: 128 heads x (192 + 128) = 40,960 numbers per token and layer, 71.1 times more.
    deepseek = models["DeepSeek-V3 (671B)"]
    assert cache_numbers_per_token(deepseek["layers"][0]) == 576
    assert model_bytes(deepseek, CONTEXT) == 61 * 1152 * CONTEXT == 9_210_691_584
    assert mha_bytes(deepseek, CONTEXT) / model_bytes(deepseek, CONTEXT) == pytest.approx(
        40960 / 576)


def test_sliding_window_layers_stop_growing_at_the_window(models):
    # Mistral-7B: 32 layers x 4096 bytes per token, but at most 4096 tokens: 512 MiB.
    mistral = models["Mistral-7B-v0.1"]
    assert model_bytes(mistral, 4096) == model_bytes(mistral, CONTEXT) == 32 * 4096 * 4096
    assert model_bytes(mistral, 1000) == 32 * 4096 * 1000
    # Gemma 3 27B: 52 local layers capped at 1024 tokens, 10 global: 8192 bytes per token each
    gemma = models["Gemma-3-27B"]
    assert model_bytes(gemma, CONTEXT) == 8192 * (52 * 1024 + 10 * CONTEXT)


def test_recurrent_layers_hold_a_constant_state(models):
    # Qwen3-Next: 32 value heads x 128 x 128 = 524,288 numbers, plus 8192 conv channels x 3
    # = 24,576: 548,864 numbers = 1,097,728 bytes per Gated DeltaNet layer, at any context.
    qwen = models["Qwen3-Next-80B-A3B"]
    linear, full = qwen["layers"]
    assert state_numbers(linear) == 32 * 128 * 128 + 8192 * 3 == 548_864
    assert layer_bytes(linear, 1) == layer_bytes(linear, CONTEXT) == 1_097_728
    assert model_bytes(qwen, CONTEXT) == 36 * 1_097_728 + 12 * 2 * 2 * 256 * 2 * CONTEXT


def test_kimi_linear_has_the_released_checkpoints_seven_mla_layers(models):
    # Kimi-Linear-48B-A3B: full_attn_layers [4, 8, 12, 16, 20, 24, 27] (1-based) of 27: 7 MLA
    # layers of 576 numbers = 1152 bytes per token, and 20 KDA layers of 32 x 128 x 128 state
    # numbers plus 3 x 32 x 128 = 12,288 conv channels x 3 inputs: 561,152 numbers = 1,122,304
    # bytes each. At 128k: 7 x 1152 x 131,072 + 20 x 1,122,304 = 1,079,410,688 bytes (1.005 GiB).
    kimi = models["Kimi-Linear-48B-A3B"]
    recurrent, latent = kimi["layers"]
    assert latent["count"] == len(kimi["source"]["read"]["full_attn_layers"]) == 7
    assert recurrent["count"] == kimi["num_layers"] - 7 == 20
    assert layer_bytes(recurrent, 1) == (32 * 128 * 128 + 12288 * 3) * 2 == 1_122_304
    assert model_bytes(kimi, CONTEXT) == 7 * 1152 * CONTEXT + 20 * 1_122_304 == 1_079_410_688


def test_recurrent_state_size_is_the_delta_rule_state():
    layer = {"kind": "recurrent", "num_heads": 3, "d_k": 8, "d_v": 5, "conv_channels": 1,
             "conv_width": 1}
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 3, 7, 8))
    _, state = delta_rule(q, k / np.linalg.norm(k, axis=-1, keepdims=True),
                          rng.normal(size=(3, 7, 5)), np.full((3, 7), 0.5), return_state=True)
    assert state.size == state_numbers(layer)


def test_counts_equal_the_library_caches():
    cache = KVCache.init(num_layers=3, num_kv_heads=2, capacity=10, d_head=4, dtype=np.float32)
    group = {"kind": "full", "count": 3, "num_kv_heads": 2, "head_dim": 4}
    assert model_bytes({"num_layers": 3, "layers": [group]}, 10, itemsize=4) == cache.nbytes
    mla = MultiHeadLatentAttention.init(16, 4, np.random.default_rng(0), d_latent=6,
                                        d_query_latent=8, d_head=4, d_rope=2)
    latent = {"kind": "latent", "d_latent": 6, "d_rope": 2}
    assert layer_bytes(latent, 10, itemsize=8) == mla.new_cache(10).nbytes


def test_table_rows_agree_with_the_functions(models):
    rows = {row["name"]: row for row in kv_table(list(models.values()))}
    assert set(rows) == set(models)
    for name, row in rows.items():
        assert row["total"] == model_bytes(models[name], CONTEXT)
        assert row["ratio"] == pytest.approx(mha_bytes(models[name], CONTEXT) / row["total"])
    assert rows["Kimi-Linear-48B-A3B"]["per_token_per_layer"] == {"latent": 1152}
    assert rows["Llama-3.1-8B"]["state_per_layer"] == 0


def test_every_config_names_its_source(models):
    for model in models.values():
        source = model["source"]
        assert len(source["commit"]) == 40 and int(source["commit"], 16) >= 0
        assert source["repository"].count("/") == 1 and source["path"]


def test_bad_layers_are_refused():
    with pytest.raises(ValueError, match="kind"):
        cache_numbers_per_token({"kind": "dense"})
    with pytest.raises(ValueError, match="'window' is missing"):
        layer_bytes({"kind": "sliding", "num_kv_heads": 1, "head_dim": 2}, 10)
    with pytest.raises(ValueError, match="num_layers"):
        model_bytes({"num_layers": 3, "layers": [{"kind": "latent", "count": 2, "d_latent": 1,
                                                  "d_rope": 1}]}, 10)
    with pytest.raises(ValueError, match="context"):
        layer_bytes({"kind": "latent", "d_latent": 1, "d_rope": 1}, 0)


@pytest.mark.skipif(not RESULTS.exists(), reason="benchmarks/results/decode_variants.json absent")
def test_decode_benchmark_recorded_the_cache_sizes_the_formulas_give():
    """benchmarks/decode_variants.py records each variant's cache bytes at each context; they
    must be the sizes its configuration implies (float32, one layer)."""
    results = json.loads(RESULTS.read_text())
    config = results["config"]
    H, d_head, H_kv = config["num_heads"], config["d_head"], config["num_kv_heads"]
    expected_per_token = {
        "MHA": 2 * H * d_head * 4,
        "GQA": 2 * H_kv * d_head * 4,
        "MLA absorbed": (config["d_latent"] + config["d_rope"]) * 4,
        "MLA naive": (config["d_latent"] + config["d_rope"]) * 4,
    }
    for name, curve in results["variants"].items():
        contexts = np.array(results["contexts"][: len(curve["cache_bytes"])])
        if name in expected_per_token:
            np.testing.assert_array_equal(curve["cache_bytes"], expected_per_token[name] * contexts)
        else:  # linear attention and the delta rule: one state, whatever the context
            assert len(set(curve["cache_bytes"])) == 1
            assert curve["cache_bytes"][0] >= H * d_head * d_head * 4
        assert all(np.isfinite(curve["seconds"])) and min(curve["seconds"]) > 0
        # the prediction is the roofline of the recorded bytes, flops, bandwidth and peak
        np.testing.assert_allclose(curve["predicted_seconds"], np.maximum(
            np.array(curve["bytes_read"]) / results["bandwidth_bytes_per_s"],
            np.array(curve["flops"]) / results["peak_flops_per_s"]), rtol=1e-12)
        assert curve["seconds"] == [min(runs) for runs in curve["runs"]]
    # naive MLA up-projects every cached latent into 32 heads' keys and values: at T cached
    # tokens, 2 (T + 1) d_latent 2 H d_head flops for that alone, 68.7 GFLOP at T = 16384
    naive = results["variants"]["MLA naive"]
    T = np.array(results["contexts"])
    assert (np.array(naive["flops"]) > 2 * (T + 1) * config["d_latent"] * 2 * H * d_head).all()


@pytest.mark.skipif(not RESULTS.exists(), reason="benchmarks/results/decode_variants.json absent")
def test_decode_benchmark_rates_are_the_fastest_runs_and_the_record_says_what_ran():
    """Records of format 2 take the bound's rates from the fastest runs (read bandwidth for the
    bytes), and name the last-level cache, the code's commit and the load."""
    results = json.loads(RESULTS.read_text())
    if results.get("format", 1) < 2:
        pytest.skip("a record made before format 2 (rates from medians, copy bandwidth)")
    assert results["quick"] is False  # the committed results are a full run
    for rate, work, runs in [
            ("bandwidth_bytes_per_s", "bandwidth_bytes_per_run", "bandwidth_runs_s"),
            ("copy_bandwidth_bytes_per_s", "copy_bytes_per_run", "copy_runs_s"),
            ("peak_flops_per_s", "matmul_flops_per_run", "matmul_runs_s")]:
        assert len(results[runs]) == results["rate_repeat"]
        assert results[rate] == pytest.approx(results[work] / min(results[runs]), rel=1e-12)
    assert results["bandwidth_kind"].startswith("read")
    cache = results["machine"]["last_level_cache"]
    assert cache is None or (cache["level"] >= 2 and cache["bytes"] >= 2**20)
    code = results["code"]
    if code is not None:  # None: git was not available where the script ran
        assert len(code["commit"]) == 40 and int(code["commit"], 16) >= 0
        changed = code["uncommitted_files"]
        assert code["attention_lib_uncommitted"] == any(
            path.startswith("attention_lib") and path.endswith(".py") for path in changed)
    for key in ("load_average_before", "load_average_after"):
        assert len(results[key]) == 3 and min(results[key]) >= 0

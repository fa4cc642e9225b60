"""The committed comparison of chapter 19 (attention_lib/data/variant_comparison.json) against
the script that wrote it (scripts/compare_attention_variants.py): the settings are the
script's, the cache sizes are what cache_bytes computes, and re-training one variant and seed
for a few steps gives the step losses the file recorded (so the file cannot silently rot)."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_lib.training.variant_lm import VARIANTS, VariantLM, cache_bytes, train_variant

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "compare_attention_variants.py"
RESULTS = ROOT / "attention_lib" / "data" / "variant_comparison.json"
RECHECKED_STEPS = 3


def load_script():
    spec = importlib.util.spec_from_file_location("compare_attention_variants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return load_script()


@pytest.fixture(scope="module")
def results():
    return json.loads(RESULTS.read_text())


def test_the_file_was_written_with_the_scripts_settings(script, results):
    codec, _, _ = script.load_data()
    assert results["config"] == dict(script.CONFIG, vocab_size=codec.vocab_size)
    assert results["variants"] == VARIANTS
    assert sorted(script.RUN_ORDER) == sorted(VARIANTS)  # every variant is run
    assert results["first_token_windows"] == script.FIRST_TOKEN_WINDOWS
    assert results["probe_seed"] == script.PROBE_SEED
    assert results["validation"].startswith(f"{script.VAL_WINDOWS} windows")


def test_every_variant_has_every_seed(script, results):
    assert sorted(results["runs"]) == sorted(VARIANTS)
    for variant, runs in results["runs"].items():
        assert sorted(runs) == sorted(str(seed) for seed in script.SEEDS), variant


def test_every_run_is_complete_and_finite(results):
    steps = results["config"]["steps"]
    for variant, runs in results["runs"].items():
        for seed, run in runs.items():
            where = f"{variant} seed {seed}"
            assert len(run["step_losses"]) == steps, where
            assert all(math.isfinite(loss) for loss in run["step_losses"]), where
            # trained: well below the loss of a uniform guess over the characters
            assert run["val_loss"] < math.log(results["config"]["vocab_size"]) - 1, where
            probe = run["copy_probe"]
            assert math.isfinite(probe["loss_first"]) and math.isfinite(probe["loss_second"])
            sink = run["first_token_weight"]
            assert len(sink["per_layer"]) == results["config"]["num_layers"], where
            if variant == "delta":
                assert sink["mean"] is None
            else:
                assert 0 <= sink["mean"] <= 1, where


def test_cache_sizes_are_what_cache_bytes_computes(results):
    config = results["config"]
    for variant, cache in results["cache"].items():
        model = VariantLM.init(variant, config["vocab_size"], config["context_len"],
                               config["d_model"], config["num_heads"], config["num_layers"],
                               np.random.default_rng(0))
        assert cache["cache_bytes"] == cache_bytes(model, config["context_len"])
        assert cache["kv_bytes_per_token"] == cache["cache_bytes"] / config["context_len"]


@pytest.mark.parametrize("variant", ["mha", "delta"])
def test_retraining_the_first_steps_gives_the_recorded_losses(script, results, variant):
    """The first steps of seed 0 again, through the library: the same losses as the file
    (float32 training: equal to 1e-4 relative, allowing for another BLAS's rounding)."""
    codec, train_data, _ = script.load_data()
    _, losses, _ = train_variant(variant, 0, train_data, stop_after=RECHECKED_STEPS,
                                 **results["config"])
    recorded = results["runs"][variant]["0"]["step_losses"][:RECHECKED_STEPS]
    np.testing.assert_allclose(losses, recorded, rtol=1e-4)


def test_the_scripts_short_run_mode_repeats_the_library(script, results):
    """``--stop-after`` in a fresh process gives the same losses as train_variant here."""
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--variants", "gated", "--seeds", "0",
         "--stop-after", "2"], capture_output=True, text=True, check=True, cwd=ROOT)
    printed = json.loads(completed.stdout)
    codec, train_data, _ = script.load_data()
    _, losses, _ = train_variant("gated", 0, train_data, stop_after=2, **results["config"])
    assert printed["variant"] == "gated" and printed["seed"] == 0
    np.testing.assert_allclose(printed["step_losses"], losses, rtol=1e-6)
    recorded = results["runs"]["gated"]["0"]["step_losses"][:2]
    np.testing.assert_allclose(printed["step_losses"], recorded, rtol=1e-4)

"""scripts/train_shakespeare_gpt.py: a run stopped half-way and resumed ends where an
uninterrupted run ends, byte for byte (a tiny model, a few steps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "train_shakespeare_gpt.py"
TINY = ["--threads", "1", "--steps", "6", "--context-len", "16", "--d-model", "16",
        "--num-heads", "2", "--num-layers", "1", "--batch-size", "4", "--eval-every", "2",
        "--eval-windows", "2", "--warmup-steps", "2", "--print-every", "2", "--dropout", "0.1"]


def run(*arguments, check=True):
    environment = os.environ | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(SCRIPT), *TINY, *map(str, arguments)],
                            capture_output=True, text=True, env=environment)
    if check and result.returncode != 0:
        raise AssertionError(f"the script failed:\n{result.stdout}\n{result.stderr}")
    return result


def without_times(records):
    return [{key: value for key, value in record.items()
             if key not in ("elapsed_s", "chars_per_s", "eta_s")} for record in records]


@pytest.mark.parametrize("options", [[], ["--fused", "--activation", "gelu_tanh"]],
                         ids=["default", "fused-tanh"])
def test_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path, options):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    run("--out", whole, *options)
    run("--out", halves, "--exit-after", 3, *options)
    resume_file = halves / "shakespeare_gpt_resume.npz"
    assert resume_file.exists() and not (halves / "shakespeare_gpt.npz").exists()
    with np.load(resume_file) as archive:
        state = json.loads(str(archive["state"]))
        assert state["steps_done"] == 3 and state["adam_t"] == 3
        assert archive["step_losses"].shape == (3,)
        assert {"param/W_out", "adam_m/W_out", "adam_v/W_out"} <= set(archive.files)
    if not options:  # resuming with other arguments would silently train another run
        refused = run("--out", halves, "--resume", resume_file, "--lr", "1e-3", check=False)
        assert refused.returncode != 0 and "other arguments" in refused.stderr
    # As if the run had gone on to step 5 before it was killed: the resumed run drops the
    # records written after its checkpoint (else the two logs below would differ).
    lines_path = halves / "shakespeare_gpt_log.jsonl"
    lines_path.write_text(lines_path.read_text()
                          + json.dumps({"kind": "progress", "step": 5}) + "\n")
    resumed = run("--out", halves, "--resume", resume_file, *options)
    assert "resumed from" in resumed.stdout and "after step 3" in resumed.stdout

    assert (halves / "shakespeare_gpt.npz").read_bytes() == (
        whole / "shakespeare_gpt.npz").read_bytes()
    assert not resume_file.exists()  # a finished run removes its resume file
    logs = [json.loads((folder / "shakespeare_gpt_log.json").read_text())
            for folder in (whole, halves)]
    assert logs[0]["step_losses"] == logs[1]["step_losses"] and len(logs[0]["step_losses"]) == 6
    assert without_times(logs[0]["evaluations"]) == without_times(logs[1]["evaluations"])
    assert [record["step"] for record in logs[0]["evaluations"]] == [0, 2, 4, 6]
    assert logs[0]["final"]["sha256"] == logs[1]["final"]["sha256"]
    assert logs[0]["final"]["val_loss_full_split"] == logs[1]["final"]["val_loss_full_split"]
    lines = [[json.loads(line) for line in (folder / "shakespeare_gpt_log.jsonl").read_text()
              .splitlines()] for folder in (whole, halves)]
    assert without_times(lines[0]) == without_times(lines[1])
    progress = [record for record in lines[0] if record["kind"] == "progress"]
    assert [record["step"] for record in progress] == [2, 4, 6]
    assert all(record["chars_per_s"] > 0 and record["eta_s"] >= 0 for record in progress)
    assert progress[-1]["eta_s"] == 0
    if options:
        assert logs[0]["config"]["model"]["activation"] == "gelu_tanh"
    else:  # the defaults write the config the committed run wrote: no new keys
        assert "activation" not in logs[0]["config"] and "fused" not in logs[0]["config"]


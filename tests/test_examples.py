"""The examples in ``examples/`` run as a user runs them (docs/integrations.md), and never write over an earlier
run's output."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow  # trains a tiny Mixtral for 6 steps in a subprocess (~15 s)
def test_torchtitan_style_logs_every_vector_and_refuses_a_used_folder(tmp_path):
    out = tmp_path / "metrics"
    first = _run("torchtitan_style.py", "--steps", "6", "--log-every", "5", "--out", str(out))
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 5]  # the metrics object's cadence: step 0, then every 5th
    assert all("model.layers.1.mlp.gate.in_scale" in r["scales"] for r in rows)
    before = (out / "metrics.jsonl").read_bytes()
    again = _run("torchtitan_style.py", "--steps", "6", "--out", str(out))
    assert again.returncode != 0 and "non-empty folder" in again.stderr and len(again.stderr.splitlines()) == 1
    assert (out / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow  # each starts python with torch and transformers (~10 s)
@pytest.mark.parametrize("script", ["torchtitan_style.py", "hf_trainer.py"])
def test_examples_refuse_a_file_as_out_before_training(tmp_path, script):
    target = tmp_path / "taken.txt"
    target.write_text("an earlier result")
    got = _run(script, "--out", str(target))
    assert got.returncode != 0 and "nothing was trained" in got.stderr and len(got.stderr.splitlines()) == 1
    assert target.read_text() == "an earlier result"

"""experiments/run_archive.py: RL runs packed on a machine that keeps nothing, unpacked here (issue 25)."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import run_archive  # noqa: E402


def _run(runs: Path, name: str, steps: list[int]) -> dict[str, torch.Tensor]:
    """A campaign run as the trainer leaves it: checkpoints of fp32 adapters, metrics, curve, log."""
    directory = runs / "rl" / name
    weights = {}
    for step in steps:
        policy = directory / "checkpoints" / f"step_{step:06d}" / "policy"
        policy.mkdir(parents=True)
        weights = {"base_model.lora_A.weight": torch.randn(4, 8) + step}
        save_file(weights, str(policy / "adapter_model.safetensors"))
        (policy / "adapter_config.json").write_text('{"r": 4}')
        (policy.parent / "trainer_state.pt").write_bytes(b"state")
    (directory / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps[-1] + 1)))
    (directory / "curve.json").write_text('{"10": {"mix_em": 0.7}}')
    (directory / "devices.json").write_text('["cuda: NVIDIA H100 80GB HBM3"]')
    (runs / "logs").mkdir(exist_ok=True)
    (runs / "logs" / f"{name}.log").write_text("trained\n")
    return weights


def test_each_run_travels_as_its_newest_checkpoint_in_bf16_and_lands_where_from_repo_reads_it(tmp_path: Path) -> None:
    runs, out, repository, records = (tmp_path / name for name in ("runs", "out", "repo", "records"))
    newest = _run(runs, "grpo-e3-s0", [10, 14])  # stopped at its budget at step 14, after the chunk ending at 10
    _run(runs, "ppo-e3-s1", [10])
    (runs / "rl" / "rloo-e3-s2").mkdir(parents=True)  # started, nothing saved: nothing to bring back
    (runs / "campaign.log").write_text("campaign\n")
    (runs / "warm75_curve.json").write_text('{"0": {"mix_em": 0.67}}')

    written = run_archive.pack(runs, out)
    assert sorted(path.name for path in written) == ["campaign.tar.gz", "grpo-e3-s0.tar.gz", "ppo-e3-s1.tar.gz"]
    assert run_archive.unpack(sorted(out.glob("*.tar.gz")), records, repository) == [
        "campaign", "grpo-e3-s0", "ppo-e3-s1"]

    adapter = repository / "experiments" / "checkpoints" / "rl-grpo-e3-s0"
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    assert tensors["base_model.lora_A.weight"].dtype == torch.bfloat16
    assert torch.equal(tensors["base_model.lora_A.weight"], newest["base_model.lora_A.weight"].to(torch.bfloat16))
    assert json.loads((adapter / "progress.json").read_text()) == {"step": 14, "run": "grpo-e3-s0"}
    assert (adapter / "adapter_config.json").is_file() and (adapter / "curve.json").is_file()
    assert json.loads((records / "rl" / "grpo-e3-s0" / "devices.json").read_text()) == ["cuda: NVIDIA H100 80GB HBM3"]
    assert (records / "logs" / "ppo-e3-s1.log").read_text() == "trained\n"
    assert (records / "campaign" / "warm75_curve.json").is_file() and (records / "campaign" / "campaign.log").is_file()
    assert not (records / "experiments").exists() and not (repository / "rl").exists()

    import rl_campaign  # the committed layout is the one --from-repo continues from

    rl_campaign.CHECKPOINTS, saved = repository / "experiments" / "checkpoints", rl_campaign.CHECKPOINTS
    try:
        assert rl_campaign.repo_start("grpo", 0, "-e3") == (adapter, 14)
    finally:
        rl_campaign.CHECKPOINTS = saved


@pytest.mark.parametrize("member", ["../outside.txt", "/etc/evil", "elsewhere/file.txt"])
def test_an_archive_with_a_member_outside_the_runs_folders_is_refused_and_nothing_is_written(
        tmp_path: Path, member: str) -> None:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name in ("rl/run/metrics.jsonl", member):
            info = tarfile.TarInfo(name)
            info.size = 2
            archive.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(SystemExit, match="refusing|unexpected"):
        run_archive.unpack([path], tmp_path / "records", tmp_path / "repo")
    assert not (tmp_path / "records").exists() and not (tmp_path / "repo").exists()

"""Checkpoints that let a killed run continue exactly where it stopped.

Layout of ``RUN_DIR/checkpoints/step_000042/``:
  policy/              the policy as a Hugging Face directory (LoRA: the adapter), loadable for eval
  trainer_state.pt     trainable weights, optimizers, schedulers, critic, RNG states, sampler position, step
A checkpoint is written to ``step_000042.tmp`` and renamed into place (atomic on one filesystem), so a run
killed while saving leaves at most a ``.tmp`` directory: never listed as a checkpoint, and removed by the next
look for the latest checkpoint or the next save.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent_gym.error import AgentGymError
from agent_gym.models.saving import POLICY_DIR, STATE_FILE, save_model

CHECKPOINT_DIR = "checkpoints"
_PREFIX = "step_"
_COMPLETE = re.compile(rf"{_PREFIX}(\d+)")
_PARTIAL_SUFFIX = ".tmp"


class CheckpointError(AgentGymError, RuntimeError):
    """A checkpoint is missing, incomplete or does not match the model being resumed."""


def capture_rng_state() -> dict[str, Any]:
    """The state of every RNG a training step draws from."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only the parameters being trained (all of them, or the LoRA adapters): what resume must restore."""
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    expected = {name for name, p in params.items() if p.requires_grad}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise CheckpointError(
            f"checkpoint weights do not match the model (missing {missing[:5]}, unexpected {extra[:5]}); "
            "was it saved with the same model and LoRA settings?"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"{_PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = {
        int(match.group(1)): path
        for path in root.iterdir()
        if (match := _COMPLETE.fullmatch(path.name)) and (path / STATE_FILE).is_file()
    }
    return [found[step] for step in sorted(found)]


def remove_partial_checkpoints(run_dir: str | Path) -> None:
    """Delete the ``.tmp`` directories of saves that a killed run never finished."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if root.is_dir():
        for path in root.glob(f"{_PREFIX}*{_PARTIAL_SUFFIX}"):
            shutil.rmtree(path, ignore_errors=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (None if there is none); half-written ones are removed on the way."""
    remove_partial_checkpoints(run_dir)
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    state: dict[str, Any],
    policy: torch.nn.Module | None = None,
    tokenizer: Any = None,
    keep: int = 2,
) -> Path:
    """Write ``state`` (and the policy as a HF directory) atomically; prune all but the ``keep`` newest."""
    final = checkpoint_path(run_dir, step)
    tmp = final.with_name(final.name + _PARTIAL_SUFFIX)
    remove_partial_checkpoints(run_dir)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / STATE_FILE)
    if policy is not None and hasattr(policy, "save_pretrained"):
        save_model(policy, tokenizer, tmp / POLICY_DIR)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def export_checkpoint(path: str | Path, out_dir: str | Path) -> tuple[Path, int]:
    """A checkpoint's policy as a run's ``final/`` holds it: the Hugging Face directory (LoRA: the adapter) and a
    PPO run's critic beside it (``critic.pt``, as ``train --critic-init`` and ``eval --value-guided`` take it).
    For a run that must leave a machine between two ``final/`` saves; returns ``out_dir`` and the step."""
    from agent_gym.trainers.critic import CRITIC_FILE, critic_file_state

    path, out_dir = Path(path), Path(out_dir)
    state = load_checkpoint(path)
    policy = path / POLICY_DIR
    if not policy.is_dir():
        raise CheckpointError(f"{path} holds no {POLICY_DIR}/ directory: it was saved without its policy")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(policy, out_dir)
    if "critic" in state:
        config = state.get("config", {})
        torch.save(critic_file_state(state["critic"], config.get("critic", "full"), config.get("critic_lora_rank", 0)),
                   out_dir / CRITIC_FILE)
    return out_dir, int(state["step"])


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state dict saved by `save_checkpoint` (CPU tensors)."""
    path = Path(path)
    state_file = path / STATE_FILE if path.is_dir() else path
    if not state_file.is_file():
        raise CheckpointError(f"no {STATE_FILE} in {path}; pass a directory made by `agent-gym train`")
    # weights_only=False: the state holds RNG tuples and numpy arrays; only load checkpoints you wrote.
    return torch.load(state_file, map_location="cpu", weights_only=False)

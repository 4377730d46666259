"""Every command's flags come from its config dataclass (in the library module the command drives), so a
Python user builds the same settings the command line does, and the two cannot drift apart."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from agent_gym.cli import _build_parser
from agent_gym.cli.config_flags import field_default

ENV_KWARGS = {"env_kwarg", "env_kwargs"}  # CLI-only: shared by every env command (cli/args.py), merged into a dict

# command -> ("module:Config", flags that only the command line has)
COMMAND_CONFIGS = {
    "eval": ("agent_gym.evaluation:EvalConfig", ENV_KWARGS),
    "index build": ("agent_gym.retrieval_index.build:IndexBuildConfig", set()),
    "index serve": ("agent_gym.retrieval_index.service.server:ServeConfig", set()),
    "bench": ("agent_gym.bench.runners:BenchConfig", ENV_KWARGS),
    "env serve": ("agent_gym.adapters.openenv_server:EnvServeConfig", ENV_KWARGS),
    "data fetch": ("agent_gym.envs.datasets.download:DatasetFileConfig", set()),
    "data where": ("agent_gym.envs.datasets.download:DatasetFileConfig", set()),
    "data export-verl": ("agent_gym.adapters.verl_dataset:VerlExportConfig", ENV_KWARGS),
    "play": ("agent_gym.cli.env:PlayConfig", ENV_KWARGS),
    "plot": ("agent_gym.trainers.plot:PlotConfig", set()),
    "model get": ("agent_gym.models.pretrained:GetModelConfig", set()),
}


def _config(reference: str) -> type:
    import importlib

    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("command", sorted(COMMAND_CONFIGS))
def test_a_commands_flags_are_its_configs_fields_with_their_defaults(command):
    reference, cli_only = COMMAND_CONFIGS[command]
    config = _config(reference)
    parser = _build_parser(command)
    actions = {action.dest: action for action in parser._actions if not isinstance(action, argparse._HelpAction)}
    fields = {f.name: f for f in dataclasses.fields(config)}
    assert set(actions) == set(fields) | cli_only
    for name, f in fields.items():
        assert f.metadata.get("help"), f"{config.__name__}.{name} has no help"
        default = field_default(f)
        if default is not dataclasses.MISSING:
            assert actions[name].default == default, name


def test_the_commands_parse_to_the_same_settings_a_python_user_builds():
    from agent_gym.evaluation import EvalConfig
    from agent_gym.retrieval_index.build import IndexBuildConfig

    args = _build_parser("eval").parse_args(["Env-v0", "--model", "m", "--best-of", "4", "--policy-kwarg", "a=1",
                                             "--policy-kwarg", "b=2", "--no-progress"])
    parsed = EvalConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EvalConfig)})
    assert parsed == EvalConfig(env_id="Env-v0", model="m", best_of=4, policy_kwarg=["a=1", "b=2"], no_progress=True)
    with pytest.raises(SystemExit):  # --best-of and --value-guided exclude each other, as before
        _build_parser("eval").parse_args(["Env-v0", "--best-of", "2", "--value-guided", "2"])
    build = _build_parser("index build").parse_args(["--corpus", "c.jsonl", "--out", "ix", "--param", "k1=0.9",
                                                     "--faiss-index", "hnsw"])
    assert build.param == [("k1", 0.9)]
    python = IndexBuildConfig(corpus="c.jsonl", out="ix", param=["k1=0.9"], faiss_index="hnsw")
    assert python.engine_params() == {"k1": 0.9, "faiss_index": "hnsw"}
    with pytest.raises(SystemExit):
        _build_parser("index build").parse_args(["--corpus", "c", "--out", "o", "--param", "novalue"])
    with pytest.raises(SystemExit):  # a port out of range is argparse's usage error, as before
        _build_parser("env serve").parse_args(["Env-v0", "--port", "99999"])
    from agent_gym.trainers.plot import PlotConfig

    plot = _build_parser("plot").parse_args(["run-a", "run-b", "--keys", "charts/em"])
    assert (plot.run_dirs, plot.keys) == (["run-a", "run-b"], ["charts/em"])
    assert PlotConfig(**{f.name: getattr(plot, f.name) for f in dataclasses.fields(PlotConfig)}) == PlotConfig(
        run_dirs=["run-a", "run-b"], keys=["charts/em"])
    with pytest.raises(SystemExit):  # model get knows its models: a typo is a usage error naming the choices
        _build_parser("model get").parse_args(["smollm2-136m"])

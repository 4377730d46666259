"""TrainConfig: YAML and CLI flags generated from the dataclass, with clear errors."""

import argparse
import dataclasses

import pytest

from agent_gym.cli.config_flags import add_dataclass_arguments, config_from_dict, config_from_namespace, load_config
from agent_gym.trainers.algorithms import ESTIMATORS
from agent_gym.trainers.config import ConfigError, TrainConfig


def _parse(argv: list[str]) -> TrainConfig:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_dataclass_arguments(parser, TrainConfig)
    return config_from_namespace(parser.parse_args(argv), TrainConfig)


def test_every_field_has_help_text():
    missing = [f.name for f in dataclasses.fields(TrainConfig) if not f.metadata.get("help")]
    assert missing == []


def test_every_field_has_a_cli_flag():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, TrainConfig)
    dests = {action.dest for action in parser._actions}
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= dests


def test_flags_parse_to_typed_fields():
    config = _parse(
        [
            "--algo",
            "ppo",
            "--group-size",
            "3",
            "--lr",
            "1e-4",
            "--no-loss-mask",
            "--env-kwargs",
            '{"split": "train", "max_turns": 3}',
            "--dual-clip",
            "none",
            "--lora-target-modules",
            "q_proj",
            "v_proj",
        ]
    )
    assert config.algo == "ppo" and config.group_size == 3 and config.lr == 1e-4
    assert config.use_loss_mask is False and config.use_advantage_mask is True
    assert config.env_kwargs == {"split": "train", "max_turns": 3}
    assert config.dual_clip is None
    assert config.lora_target_modules == ["q_proj", "v_proj"]


def test_unspecified_flags_keep_defaults():
    assert _parse([]) == TrainConfig()


def test_cli_flags_override_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo: rloo\ngroup_size: 4\nclip_high: 0.28\n")
    config = _parse(["--config", str(path), "--group-size", "6"])
    assert (config.algo, config.group_size, config.clip_high) == ("rloo", 6, 0.28)


def test_yaml_with_unknown_field_names_the_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo: grpo\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(path, None, TrainConfig)


def test_missing_yaml_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", None, TrainConfig)


@pytest.mark.parametrize(
    ("values", "field_name"),
    [
        ({"algo": "a2c"}, "algo"),
        ({"aggregation": "mean"}, "aggregation"),
        ({"group_size": 0}, "group_size"),
        ({"dual_clip": 0.5}, "dual_clip"),
        ({"top_p": 0.0}, "top_p"),
        ({"lr": "fast"}, "lr"),
        ({"use_loss_mask": "maybe"}, "use_loss_mask"),
        ({"algo": "grpo", "group_size": 1}, "group_size"),
    ],
)
def test_invalid_values_raise_config_error_naming_the_field(values, field_name):
    with pytest.raises(ConfigError, match=field_name):
        config_from_dict(values, TrainConfig)


def test_yaml_roundtrip_of_to_dict(tmp_path):
    yaml = pytest.importorskip("yaml")
    config = TrainConfig(algo="reinforce_pp", env_kwargs={"a": 1}, dual_clip=None)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    assert load_config(path, None, TrainConfig) == config


@pytest.mark.parametrize(("old", "new"), [("loss_mask", "use_loss_mask"), ("advantage_mask", "use_advantage_mask")])
def test_old_mask_field_names_still_load_from_yaml(tmp_path, old, new):
    path = tmp_path / "run.yaml"
    path.write_text(f"{old}: false\n")
    assert getattr(load_config(path, None, TrainConfig), new) is False


def test_old_and_new_name_of_a_field_together_is_an_error_naming_both():
    with pytest.raises(ConfigError, match="loss_mask and use_loss_mask"):
        config_from_dict({"loss_mask": False, "use_loss_mask": True}, TrainConfig)


def test_old_mask_flags_are_aliases_of_the_new_ones():
    config = _parse(["--no-advantage-mask", "--loss-mask"])
    assert config.use_advantage_mask is False and config.use_loss_mask is True


@pytest.mark.parametrize("algo", sorted(ESTIMATORS))
def test_group_size_one_is_refused_exactly_for_the_estimators_that_need_groups(algo):
    if ESTIMATORS[algo].needs_groups:
        with pytest.raises(ConfigError, match="group_size must be >= 2"):
            TrainConfig(algo=algo, group_size=1)
    else:
        assert TrainConfig(algo=algo, group_size=1).group_size == 1


@pytest.mark.parametrize("algo", sorted(ESTIMATORS))
def test_kl_in_reward_is_refused_exactly_for_outcome_only_estimators(algo):
    if ESTIMATORS[algo].reads_token_rewards:
        assert TrainConfig(algo=algo, kl_in_reward_coef=0.01).kl_in_reward_coef == 0.01
    else:
        with pytest.raises(ConfigError, match="kl_in_reward_coef acts on token rewards"):
            TrainConfig(algo=algo, kl_in_reward_coef=0.01)

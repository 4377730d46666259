"""LoRA as a first-class option: adapters save and load with the same logits, samplers run them merged, and the
trainer continues a saved adapter. Also the precision default and the model's naive-RAG baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_gym.models.lora_weights import merged_tensors
from agent_gym.models.model_init import is_adapter_dir, load_model_and_tokenizer
from agent_gym.models.precision import (
    MIN_BF16_SPEEDUP,
    cpu_flags,
    cpu_has_fast_bf16,
    cpu_model,
    measured_bf16_speedup,
    resolve_dtype,
)
from agent_gym.warmstart.sft import SFTConfig, prepare_sft_model
from tests.conftest import TINY_SYNTHHOP


def _trained_adapter(model_dir: Path) -> torch.nn.Module:
    """A LoRA model whose adapters are not the identity (peft starts B at zero)."""
    model, _ = load_model_and_tokenizer(model_dir)
    peft_model = prepare_sft_model(model, SFTConfig(lora_rank=4, lora_alpha=8))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return peft_model.eval()


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_an_adapter_saves_and_loads_with_the_same_logits(tiny_model_dir_for_synthhop: Path, tmp_path: Path) -> None:
    peft_model = _trained_adapter(tiny_model_dir_for_synthhop)
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(1))
    expected = _logits(peft_model, ids)
    base_logits = _logits(load_model_and_tokenizer(tiny_model_dir_for_synthhop)[0], ids)
    assert not torch.allclose(expected, base_logits, atol=1e-4)  # the adapter changes the model
    peft_model.save_pretrained(tmp_path / "adapter")
    assert is_adapter_dir(tmp_path / "adapter")
    assert sum(f.stat().st_size for f in (tmp_path / "adapter").iterdir()) < 2_000_000  # adapter only, no base
    by_dir, _ = load_model_and_tokenizer(tmp_path / "adapter")  # the adapter names its base
    by_flag, _ = load_model_and_tokenizer(tiny_model_dir_for_synthhop, adapter=tmp_path / "adapter")
    for loaded in (by_dir, by_flag):
        assert torch.allclose(_logits(loaded, ids), expected, atol=1e-5)


def test_merged_tensors_give_a_plain_model_the_adapters_logits_and_leave_the_base_alone(
    tiny_model_dir_for_synthhop: Path,
) -> None:
    peft_model = _trained_adapter(tiny_model_dir_for_synthhop)
    before = {n: p.clone() for n, p in peft_model.named_parameters() if "lora_" not in n}
    plain, _ = load_model_and_tokenizer(tiny_model_dir_for_synthhop)
    from agent_gym.trainers.backends import TransformersBackend

    backend = TransformersBackend(plain)
    backend.sync_weights(peft_model)
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(_logits(plain, ids), _logits(peft_model, ids), atol=1e-5)
    assert backend.uses_fast_path  # plain linear layers: the fused decoder and its prefix cache
    assert all(torch.equal(before[n], p) for n, p in peft_model.named_parameters() if "lora_" not in n)
    names = dict(merged_tensors(peft_model))
    assert set(names) == set(plain.state_dict())


def test_the_trainer_continues_a_saved_adapter_and_samples_it_merged(tiny_model_dir_for_synthhop: Path,
                                                                     tmp_path: Path) -> None:
    from agent_gym.trainers.config import TrainConfig
    from agent_gym.trainers.trainer import Trainer

    peft_model = _trained_adapter(tiny_model_dir_for_synthhop)
    peft_model.save_pretrained(tmp_path / "warm")
    config = TrainConfig(env_id="AgentR1-SynthHop-v0", env_kwargs=TINY_SYNTHHOP, model=str(tiny_model_dir_for_synthhop),
                         adapter=str(tmp_path / "warm"), dtype="float32", tasks_per_step=1, group_size=2,
                         total_steps=1, max_new_tokens=8, output_dir=str(tmp_path / "run"), eval_every=0,
                         show_progress=False, tensorboard=False, torch_threads=1)
    trainer = Trainer(config)
    try:
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(3))
        sampler = trainer.backend.model
        assert sampler is not trainer.model and trainer.backend.uses_fast_path
        assert torch.allclose(_logits(sampler, ids), _logits(peft_model, ids), atol=1e-5)  # starts at the warm start
        trainer.train()
        assert torch.allclose(_logits(sampler, ids), _logits(trainer.model, ids), atol=1e-5)  # synced after updates
        assert is_adapter_dir(tmp_path / "run" / "final")
    finally:
        trainer.close()


def test_kl_reference_start_anchors_to_the_warm_start_and_base_to_the_model_under_it(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path
) -> None:
    from agent_gym.trainers.config import ConfigError, TrainConfig
    from agent_gym.trainers.trainer import Trainer

    peft_model = _trained_adapter(tiny_model_dir_for_synthhop)
    peft_model.save_pretrained(tmp_path / "warm")
    other = _trained_adapter(tiny_model_dir_for_synthhop)
    with torch.no_grad():  # a second adapter, different from the warm start
        for name, parameter in other.named_parameters():
            if "lora_B" in name:
                parameter.mul_(-1.0)
    other.save_pretrained(tmp_path / "other")
    base, _ = load_model_and_tokenizer(tiny_model_dir_for_synthhop)
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(4))

    def reference_logits(reference: str) -> torch.Tensor:
        config = TrainConfig(env_id="AgentR1-SynthHop-v0", env_kwargs=TINY_SYNTHHOP,
                             model=str(tiny_model_dir_for_synthhop), adapter=str(tmp_path / "warm"), dtype="float32",
                             tasks_per_step=1, group_size=2, total_steps=1, max_new_tokens=8, kl_coef=0.1,
                             kl_reference=reference, output_dir=str(tmp_path / reference.replace("/", "_")),
                             eval_every=0, show_progress=False, tensorboard=False, torch_threads=1)
        trainer = Trainer(config)
        try:
            if trainer.reference is None:  # base: the policy with its adapter off, no copy
                with trainer.model.disable_adapter():
                    return _logits(trainer.model, ids)
            assert not any(p.requires_grad for p in trainer.reference.parameters())
            return _logits(trainer.reference, ids)
        finally:
            trainer.close()

    assert torch.allclose(reference_logits("start"), _logits(peft_model, ids), atol=1e-5)
    assert torch.allclose(reference_logits("base"), _logits(base, ids), atol=1e-5)
    assert torch.allclose(reference_logits(str(tmp_path / "other")), _logits(other, ids), atol=1e-5)
    assert not torch.allclose(_logits(other, ids), _logits(peft_model, ids), atol=1e-3)
    with pytest.raises(Exception, match="not a LoRA adapter directory"):
        reference_logits(str(tmp_path))
    with pytest.raises(ConfigError, match="kl_reference"):
        TrainConfig(kl_reference=" ").validate()


def test_sft_lora_layers_puts_adapters_on_the_top_layers_only_and_train_continues_them(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path
) -> None:
    from agent_gym.trainers.config import ConfigError, TrainConfig
    from agent_gym.trainers.trainer import Trainer

    model, _ = load_model_and_tokenizer(tiny_model_dir_for_synthhop)
    total = int(model.config.num_hidden_layers)
    peft_model = prepare_sft_model(model, SFTConfig(lora_rank=4, lora_alpha=8, lora_layers=1))
    trained = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name and f".layers.{total - 1}." in name for name in trained)
    kinds = {name.split(f".layers.{total - 1}.")[1].split(".lora_")[0] for name in trained}
    assert {"self_attn.q_proj", "mlp.down_proj"} <= kinds  # every linear module of the layer, as all-linear means
    peft_model.save_pretrained(tmp_path / "top")
    config = TrainConfig(env_id="AgentR1-SynthHop-v0", env_kwargs=TINY_SYNTHHOP, model=str(tiny_model_dir_for_synthhop),
                         adapter=str(tmp_path / "top"), dtype="float32", tasks_per_step=1, group_size=2,
                         total_steps=1, max_new_tokens=8, output_dir=str(tmp_path / "run"), eval_every=0,
                         show_progress=False, tensorboard=False, torch_threads=1)
    trainer = Trainer(config)
    try:
        assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == set(trained)
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="lora_layers"):
        SFTConfig(env="e", model="m", output_dir="o", lora_layers=1).validate()  # no lora_rank
    with pytest.raises(ConfigError, match="between 1 and"):
        prepare_sft_model(load_model_and_tokenizer(tiny_model_dir_for_synthhop)[0],
                          SFTConfig(lora_rank=4, lora_layers=total + 1))


def test_bf16_is_the_default_only_where_the_cpu_computes_it_natively_and_it_measured_faster(tmp_path: Path) -> None:
    assert resolve_dtype("auto", "cpu", flags=frozenset({"avx2", "avx512_bf16"}), speedup=2.4) == torch.bfloat16
    assert resolve_dtype("auto", "cpu", flags=frozenset({"avx2", "amx_bf16"}), speedup=1.6) == torch.bfloat16
    # native bf16 that measured slower than fp32 (one thread on the shared Xeon: 0.59x) stays fp32
    assert resolve_dtype("auto", "cpu", flags=frozenset({"avx512_bf16"}), speedup=0.59) == torch.float32
    assert resolve_dtype("auto", "cpu", flags=frozenset({"avx2", "avx512f"}), speedup=9.0) == torch.float32
    measured = measured_bf16_speedup(torch.get_num_threads())
    assert measured > 0 and measured_bf16_speedup(torch.get_num_threads()) == measured  # measured once
    expected = torch.bfloat16 if cpu_has_fast_bf16() and measured >= MIN_BF16_SPEEDUP else torch.float32
    assert resolve_dtype("auto", "cpu") == expected
    assert resolve_dtype("float32", "cpu", flags=frozenset({"avx512_bf16"})) == torch.float32
    assert resolve_dtype("bfloat16", "cpu", flags=frozenset()) == torch.bfloat16
    with pytest.raises(ValueError, match="float16"):
        resolve_dtype("float16")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx512_bf16\n\n"
                       "processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "sse2", "avx512_bf16"})
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu_model(cpuinfo) == "AMD EPYC"
    assert cpu_model(tmp_path / "missing") != ""  # platform's name, or "unknown"


def test_model_naive_rag_searches_the_question_once_then_the_model_answers(tiny_model_dir_for_synthhop: Path) -> None:
    import gymnasium as gym

    import agent_gym  # noqa: F401
    from agent_gym.agents.model_naive_rag import ModelNaiveRAGPolicy
    from agent_gym.agents.model_policy import ModelPolicy
    from agent_gym.evaluation import evaluate

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir_for_synthhop)
    env = gym.make("AgentR1-SynthHop-v0", **{**TINY_SYNTHHOP, "max_turns": 2})
    policy = ModelNaiveRAGPolicy(ModelPolicy(model, tokenizer, max_new_tokens=8, max_context_tokens=1024))
    records = evaluate(env, policy, 3, progress=False)
    assert len(records) == 3 and all(r.tool_calls >= 1 for r in records)
    observation, info = env.reset(options={"task_index": 0})
    policy.begin(env.unwrapped, observation, info)
    generated_before = policy.generated_tokens
    first = policy.act(observation, info)
    question = env.unwrapped.task.question
    assert "search" in first and question.split()[0] in first  # the question verbatim, as the query
    observation, _, _, _, info = env.step(first)
    assert [call["name"] for call in info["tool_calls"]] == ["search"]
    assert policy.generated_tokens == generated_before  # the first turn is scripted
    policy.act(observation, info)
    assert policy.generated_tokens > generated_before  # the model writes turn 2
    env.close()


def test_eval_and_play_take_a_model_with_an_adapter_and_eval_runs_its_naive_rag(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from agent_gym.cli import main

    _trained_adapter(tiny_model_dir_for_synthhop).save_pretrained(tmp_path / "adapter")
    settings = ["--env-kwargs", json.dumps(TINY_SYNTHHOP), "--max-new-tokens", "6"]
    out = tmp_path / "naive.jsonl"
    assert main(["eval", "AgentR1-SynthHop-v0", "--model", str(tiny_model_dir_for_synthhop), "--adapter",
                 str(tmp_path / "adapter"), "--naive-rag", "--max-turns", "2", "--episodes", "2", "--out", str(out),
                 "--no-progress", *settings]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["tool_calls"] >= 1 and r["turns"] <= 2 for r in records)
    assert "+adapter naive-rag" in capsys.readouterr().out
    assert main(["play", "AgentR1-SynthHop-v0", "--model", str(tiny_model_dir_for_synthhop), "--adapter",
                 str(tmp_path / "adapter"), *settings]) == 0
    shown = capsys.readouterr().out
    assert f"== {tiny_model_dir_for_synthhop} ==" in shown and "episode over" in shown
    assert main(["eval", "AgentR1-SynthHop-v0", "--adapter", str(tmp_path / "adapter")]) == 2
    assert "need --model" in capsys.readouterr().err


def test_a_training_checkpoint_loads_as_the_policy_it_holds_and_a_bare_folder_is_a_clear_error(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path
) -> None:
    from agent_gym.models.model_init import ModelInitError

    peft_model = _trained_adapter(tiny_model_dir_for_synthhop)
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(2))
    step = tmp_path / "run" / "checkpoints" / "step_000005"
    peft_model.save_pretrained(step / "policy")
    (step / "trainer_state.pt").write_bytes(b"")
    by_checkpoint, tokenizer = load_model_and_tokenizer(step)
    assert torch.allclose(_logits(by_checkpoint, ids), _logits(peft_model, ids), atol=1e-5)
    by_flag, _ = load_model_and_tokenizer(tiny_model_dir_for_synthhop, adapter=step)
    assert torch.allclose(_logits(by_flag, ids), _logits(peft_model, ids), atol=1e-5)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "trainer_state.pt").write_bytes(b"")  # a checkpoint whose policy/ is gone
    with pytest.raises(ModelInitError, match="cannot load a model"):
        load_model_and_tokenizer(bare)

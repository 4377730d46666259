"""The warm-start sweep's selection rule (issue 25): fixed before any RL result, read off the 8-sample groups."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import warmstart_sweep as sweep  # noqa: E402

from agent_gym.rewards import get_reward_spec  # noqa: E402


def _pass8(informative_1hop: float, informative_2hop: float) -> dict[str, dict[str, float]]:
    return {"pass8_1hop": {"informative": informative_1hop}, "pass8_2hop": {"informative": informative_2hop}}


def test_group_stats_counts_only_groups_with_both_a_right_and_a_wrong_answer_as_informative() -> None:
    successes = {0: [True] * 8, 1: [False] * 8, 2: [True] + [False] * 7, 3: [False, True] * 4}
    stats = sweep.group_stats(successes, searches=[1, 2, 1, 3])
    assert stats["informative"] == 0.5  # groups 2 and 3
    assert stats["pass_at_k"] == 0.75  # every group but 1
    assert stats["em"] == pytest.approx((8 + 1 + 4) / 32)
    assert stats["multihop"] == 0.5
    assert stats["questions"] == 4 and stats["samples"] == 32


def test_choose_warm_start_maximises_the_smaller_informative_share_of_the_two_hop_counts() -> None:
    evals = {5: _pass8(0.80, 0.02), 25: _pass8(0.70, 0.20), 50: _pass8(0.50, 0.30), 100: _pass8(0.10, 0.60)}
    chosen, scores = sweep.choose_warm_start(evals)
    assert chosen == 50  # min 0.30 beats 0.20 (25 %), 0.10 (100 %) and 0.02 (5 %)
    assert scores == {5: 0.02, 25: 0.20, 50: 0.30, 100: 0.10}


def test_choose_warm_start_breaks_ties_toward_fewer_two_hop_demos_and_skips_unfinished_shares() -> None:
    evals = {25: _pass8(0.4, 0.3), 75: _pass8(0.3, 0.5), 100: {"pass8_1hop": {"informative": 0.9}}}
    assert sweep.choose_warm_start(evals)[0] == 25
    with pytest.raises(ValueError, match="no warm start"):
        sweep.choose_warm_start({100: {"pass8_1hop": {"informative": 0.9}}})


def test_the_choice_is_final_once_every_unfinished_share_is_ruled_out_by_the_measure_it_has() -> None:
    done = {5: _pass8(0.67, 0.0), 25: _pass8(0.78, 0.08), 50: _pass8(0.80, 0.23), 75: _pass8(0.80, 0.61)}
    assert not sweep.choice_is_final(done)  # 100 % not measured at all
    assert sweep.choice_is_final({**done, 100: {"pass8_1hop": {"informative": 0.50}}})  # at most 0.50 < 0.61
    assert not sweep.choice_is_final({**done, 100: {"pass8_1hop": {"informative": 0.70}}})  # could still win
    assert sweep.choice_is_final({**done, 100: {"pass8_1hop": {"informative": 0.61}}})  # a tie goes to 75 %
    assert sweep.choice_is_final({**done, 100: _pass8(0.9, 0.9)})
    assert not sweep.choice_is_final({})


def test_every_share_cycles_its_hop_list_to_the_named_share_of_two_hop_questions() -> None:
    for share, hops in sweep.SHARES.items():
        assert 100 * hops.count(2) / len(hops) == share
    assert sweep.HELD_OUT["world_seed"] not in (0, sweep.TRAIN_ENV["world_seed"])
    assert sweep.HELD_OUT["split"] == "test"


def test_rl_campaign_chunks_land_on_every_curve_point_and_publication_and_the_last_step() -> None:
    import rl_campaign

    done, stops = 0, []
    while done < 52:
        done, curve_due, publish_due = rl_campaign.next_chunk(done, steps=52, chunk=5)
        stops.append((done, curve_due, publish_due))
    assert [s for s, curve, _ in stops if curve] == [10, 20, 30, 40, 50, 52]
    assert [s for s, _, publish in stops if publish] == [25, 50, 52]
    assert rl_campaign.next_chunk(7, steps=52, chunk=5)[0] == 10  # a run resumed mid-chunk stops on the grid


def test_rl_campaign_counts_steps_from_the_metrics_and_reads_a_committed_run(tmp_path: Path, monkeypatch) -> None:
    import rl_campaign

    assert rl_campaign.steps_done(tmp_path) == 0
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n\n{"step": 3}\n')
    assert rl_campaign.steps_done(tmp_path) == 3
    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path)
    assert rl_campaign.repo_start("grpo", 0) is None
    (tmp_path / "rl-grpo-s0").mkdir()
    (tmp_path / "rl-grpo-s0" / "progress.json").write_text('{"step": 25, "run": "grpo-s0"}')
    assert rl_campaign.repo_start("grpo", 0) == (tmp_path / "rl-grpo-s0", 25)


def test_a_recipe_flag_overrides_the_campaign_setting_it_repeats(tmp_path: Path) -> None:
    import argparse

    import rl_campaign

    args = argparse.Namespace(model="m", tasks_per_step=4, group_size=8, lr=1e-4, micro_batch_size=2, chunk=5,
                              backend="transformers", train_python="")
    command = rl_campaign.train_command(args, tmp_path / "warm", rl_campaign.RECIPES["grpo_lr2e-5"], 0, 5, tmp_path)
    assert [command[i + 1] for i, flag in enumerate(command) if flag == "--lr"][-1] == "2e-5"  # argparse: last wins
    plain = rl_campaign.train_command(args, tmp_path / "warm", rl_campaign.RECIPES["grpo"], 0, 5, tmp_path)
    assert plain[plain.index("--micro-batch-size") + 1] == "2"
    grouped = rl_campaign.train_command(argparse.Namespace(**{**vars(args), "micro_batch_size": None}),
                                        tmp_path / "warm", rl_campaign.RECIPES["grpo"], 0, 5, tmp_path)
    assert grouped[grouped.index("--micro-batch-size") + 1] == "8"  # default: a group a micro-batch
    assert [plain[i + 1] for i, flag in enumerate(plain) if flag == "--lr"] == ["0.0001"]
    assert "--kl-reference" not in plain and plain[plain.index("--kl-coef") + 1] == "0"
    # a run continued from a committed adapter still anchors its KL to the warm start
    anchored = rl_campaign.train_command(args, tmp_path / "rl-committed", rl_campaign.RECIPES["grpo_lr2e-5_kl"], 0, 5,
                                         tmp_path, warm=tmp_path / "warm75")
    assert anchored[anchored.index("--adapter") + 1] == str(tmp_path / "rl-committed")
    assert anchored[anchored.index("--kl-reference") + 1] == str(tmp_path / "warm75")
    assert [anchored[i + 1] for i, flag in enumerate(anchored) if flag == "--kl-coef"][-1] == "0.1"
    assert plain[0] == sys.executable and plain[plain.index("--backend") + 1] == "transformers"
    ppo = rl_campaign.train_command(args, tmp_path / "rl-committed", rl_campaign.RECIPES["ppo_lr5e-5_kl0.3"], 0, 5,
                                    tmp_path, warm=tmp_path / "warm75")
    assert ppo[ppo.index("--algo") + 1] == "ppo" and ppo[ppo.index("--critic") + 1] == "lora"
    assert ppo[ppo.index("--kl-reference") + 1] == str(tmp_path / "warm75")
    assert [ppo[i + 1] for i, flag in enumerate(ppo) if flag == "--lr"][-1] == "5e-5"
    assert "--critic-init" not in ppo  # nothing committed beside the adapter: the critic starts from zero
    (tmp_path / "rl-committed").mkdir()
    (tmp_path / "rl-committed" / "critic.pt").write_bytes(b"")
    ppo = rl_campaign.train_command(args, tmp_path / "rl-committed", rl_campaign.RECIPES["ppo_lr5e-5_kl0.3"], 0, 5,
                                    tmp_path, warm=tmp_path / "warm75")
    assert ppo[ppo.index("--critic-init") + 1] == str(tmp_path / "rl-committed" / "critic.pt")
    grpo = rl_campaign.train_command(args, tmp_path / "rl-committed", rl_campaign.RECIPES["grpo_lr5e-5_kl0.3"], 0, 5,
                                     tmp_path, warm=tmp_path / "warm75")
    assert "--critic-init" not in grpo and "--step-offset" not in grpo
    continued = rl_campaign.train_command(args, tmp_path / "rl-committed", rl_campaign.RECIPES["grpo_lr5e-5_kl0.3"],
                                          0, 5, tmp_path, warm=tmp_path / "warm75", offset=20)
    assert continued[continued.index("--step-offset") + 1] == "20"  # draws on from its step 20, not from step 1


def test_the_charged_recipe_trains_on_the_reward_that_charges_an_idle_search(tmp_path: Path) -> None:
    import argparse

    import rl_campaign

    args = argparse.Namespace(model="m", tasks_per_step=4, group_size=8, lr=1e-4, micro_batch_size=2, chunk=5,
                              backend="transformers", train_python="")
    command = rl_campaign.train_command(args, tmp_path / "warm", rl_campaign.RECIPES["grpo_charged_lr5e-5_kl0.3"],
                                        0, 5, tmp_path, warm=tmp_path / "warm")
    env_kwargs = json.loads(command[command.index("--env-kwargs") + 1])
    assert env_kwargs["reward"] == "dense_charged" and env_kwargs["split"] == "train"
    assert get_reward_spec(env_kwargs["reward"]).idle_call_cost > 0  # a name the env resolves
    assert [command[i + 1] for i, flag in enumerate(command) if flag == "--kl-coef"][-1] == "0.3"


def test_the_8x4_recipe_plays_the_same_episodes_a_step_over_twice_the_questions(tmp_path: Path) -> None:
    import argparse

    import rl_campaign

    args = argparse.Namespace(model="m", tasks_per_step=4, group_size=8, lr=1e-4, micro_batch_size=4, chunk=5,
                              backend="transformers", train_python="")
    recipe = rl_campaign.RECIPES["grpo_lr5e-5_kl0.3_stratified_8x4"]
    command = rl_campaign.train_command(args, tmp_path / "warm", recipe, 0, 5, tmp_path / "run", offset=10)

    def last(flag: str) -> str:  # argparse keeps a flag's last value
        return [command[i + 1] for i, word in enumerate(command) if word == flag][-1]

    tasks, group = int(last("--tasks-per-step")), int(last("--group-size"))
    assert (tasks, group) == (8, 4) and tasks * group == args.tasks_per_step * args.group_size
    assert last("--stratify-by") == "hops" and last("--kl-coef") == "0.3" and last("--step-offset") == "10"
    assert recipe.algo == "grpo" and not recipe.ablation


@pytest.mark.parametrize(("recipe", "lr", "mini_batches"), [("grpo_lr1e-4_kl0.3", "1e-4", "1"),
                                                          ("grpo_lr5e-5_kl0.3_4mb", "5e-5", "4")])
def test_the_pace_recipes_move_further_a_step_and_keep_the_kl_anchor(tmp_path: Path, recipe: str, lr: str,
                                                                      mini_batches: str) -> None:
    import argparse

    import rl_campaign

    args = argparse.Namespace(model="m", tasks_per_step=4, group_size=8, lr=1e-4, micro_batch_size=4, chunk=5,
                              backend="transformers", train_python="")
    warm, start = tmp_path / "warm", tmp_path / "committed"
    command = rl_campaign.train_command(args, start, rl_campaign.RECIPES[recipe], 0, 5, tmp_path / "run", warm=warm)
    flags = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    assert flags["--lr"] == lr and flags["--kl-coef"] == "0.3" and flags["--kl-reference"] == str(warm)
    assert flags.get("--num-mini-batches", "1") == mini_batches and flags["--adapter"] == str(start)
    from agent_gym.trainers.config import TrainConfig

    assert TrainConfig().num_mini_batches == 1  # the grid's other recipes take one optimizer step a batch


def test_a_campaign_on_vllm_runs_its_train_processes_in_the_vllm_venv(tmp_path: Path) -> None:
    import argparse

    import rl_campaign

    args = argparse.Namespace(model="m", tasks_per_step=4, group_size=8, lr=1e-4, micro_batch_size=2, chunk=5,
                              backend="vllm", train_python=".venv-vllm/bin/python")
    command = rl_campaign.train_command(args, tmp_path / "warm", rl_campaign.RECIPES["grpo"], 0, 5, tmp_path)
    assert command[:4] == [".venv-vllm/bin/python", "-m", "agent_gym.cli", "train"]
    assert command[command.index("--backend") + 1] == "vllm"


def test_rl_campaign_summary_plays_nothing_while_no_run_has_its_final_eval(tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    played: list[Path] = []
    monkeypatch.setattr(rl_campaign, "final_eval", lambda args, adapter, path: played.append(adapter) or {})
    args = argparse.Namespace(out=str(tmp_path), recipes=["grpo"], seeds=[0], tag="")
    (tmp_path / "rl" / "grpo-s0").mkdir(parents=True)
    (tmp_path / "rl" / "grpo-s0" / "final_eval.json").write_text('{"greedy_1hop": {"em": 1.0}}')  # unfinished
    assert rl_campaign.summarize(args, "warm50", tmp_path / "warm50") == []
    assert played == []  # the probe's warm start is not given 1,200 episodes of final eval


def test_a_campaign_from_the_3_epoch_sweep_starts_from_its_choice_and_keeps_apart(tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "checkpoints")
    monkeypatch.setattr(rl_campaign, "results_path", lambda epochs: tmp_path / f"sweep{epochs}.json")
    (tmp_path / "sweep3.json").write_text('{"chosen": 75}')
    (tmp_path / "sweep1.json").write_text('{"chosen": 50}')
    for name in ("sweep-e3-warm75", "sweep-warm50"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "adapter_config.json").write_text("{}")
    e3 = argparse.Namespace(warm="", sweep_out=str(tmp_path / "none"), sweep_epochs=3, tag="-e3", out=str(tmp_path))
    assert rl_campaign.chosen_warm_start(e3) == ("warm75", tmp_path / "checkpoints" / "sweep-e3-warm75")
    first = argparse.Namespace(warm="", sweep_out=str(tmp_path / "none"), sweep_epochs=1, tag="", out=str(tmp_path))
    assert rl_campaign.chosen_warm_start(first) == ("warm50", tmp_path / "checkpoints" / "sweep-warm50")
    assert rl_campaign.run_dir(e3, "grpo_lr5e-5_kl0.3", 0).name == "grpo_lr5e-5_kl0.3-e3-s0"
    # each campaign replaces only its own learning.json records (a recipe named lr2e-5 is not a sweep tag)
    assert rl_campaign._same_campaign("rl-grpo_lr5e-5_kl0.3-e3-s0", "-e3")
    assert not rl_campaign._same_campaign("rl-grpo_lr5e-5_kl0.3-e3-s0", "")
    assert rl_campaign._same_campaign("rl-grpo_lr2e-5-s1", "") and not rl_campaign._same_campaign("sweep-warm5", "")
    assert rl_campaign.results_file("rl_table.md", "-e3").name == "rl_table_e3.md"


def test_a_campaign_from_another_warm_start_of_the_sweep_gets_names_of_its_own(tmp_path: Path) -> None:
    import argparse

    import rl_campaign

    (tmp_path / "chosen.json").write_text('{"chosen": 75}')
    args = argparse.Namespace(sweep_out=str(tmp_path), sweep_epochs=3)
    assert rl_campaign.sweep_choice(args) == 75
    tag = rl_campaign.campaign_tag(3, "experiments/checkpoints/sweep-e3-warm50", 75)
    assert tag == "-e3-warm50"
    assert rl_campaign.run_name("grpo_lr5e-5_kl0.3", 0, tag) == "grpo_lr5e-5_kl0.3-e3-warm50-s0"
    # the choice itself, passed as --warm (the 1-epoch probes' command), keeps the names its runs already have
    assert rl_campaign.campaign_tag(1, "~/agent-gym-runs/sweep/warm75", 75) == ""
    assert rl_campaign.campaign_tag(3, "", 75) == "-e3"
    with pytest.raises(SystemExit, match="name a warm start of the sweep"):
        rl_campaign.campaign_tag(3, "experiments/checkpoints/rl-grpo-s0", 75)
    # its learning.json records are its own, apart from the choice's campaign
    assert rl_campaign._same_campaign("rl-grpo_lr5e-5_kl0.3-e3-warm50-s0", "-e3-warm50")
    assert not rl_campaign._same_campaign("rl-grpo_lr5e-5_kl0.3-e3-warm50-s0", "-e3")
    assert not rl_campaign._same_campaign("rl-grpo_lr5e-5_kl0.3-e3-s0", "-e3-warm50")


def test_a_new_machine_resumes_the_sweep_from_the_committed_adapter_and_measures(tmp_path: Path, monkeypatch) -> None:
    committed = tmp_path / "checkpoints" / "sweep-warm25"
    committed.mkdir(parents=True)
    (committed / "adapter_config.json").write_text("{}")
    (committed / "sft_summary.json").write_text('{"episodes": 160}')
    results = tmp_path / "warmstart_sweep.json"
    results.write_text('{"evals": {"25": {"pass8_1hop": {"informative": 0.5}}}}')
    monkeypatch.setattr(sweep, "CHECKPOINTS", tmp_path / "checkpoints")
    monkeypatch.setattr(sweep, "results_path", lambda epochs: results if epochs == 1 else tmp_path / "none.json")
    out = tmp_path / "sweep"
    out.mkdir()
    assert sweep.restore_from_repo(out, 25)
    assert (out / "warm25" / "adapter_config.json").is_file() and (out / "warm25" / "RESTORED").is_file()
    assert json.loads((out / "warm25_eval.json").read_text()) == {"pass8_1hop": {"informative": 0.5}}
    assert not sweep.restore_from_repo(out, 25)  # a local warm start is never overwritten
    assert not sweep.restore_from_repo(out, 50)  # nothing committed for that share
    assert not sweep.restore_from_repo(tmp_path / "sweep-e3", 25, epochs=3)  # a 3-epoch sweep never takes 1-epoch ones


def test_a_sweep_of_more_epochs_is_named_apart_from_the_first() -> None:
    assert sweep.run_name(1, 25) == "sweep-warm25" and sweep.run_name(3, 25) == "sweep-e3-warm25"
    assert sweep.results_path(1).name == "warmstart_sweep.json"
    assert sweep.results_path(3).name == "warmstart_sweep_e3.json"


def test_play_groups_reads_each_episode_from_its_summary(tiny_model, recwarn) -> None:
    from tests.conftest import TINY_SYNTHHOP

    model, tokenizer = tiny_model
    stats = sweep.play_groups(model, tokenizer, {**TINY_SYNTHHOP, "max_turns": 2}, questions=2, temperature=1.0,
                              seed=0, samples=2)
    assert stats["questions"] == 2 and stats["samples"] == 4
    assert 1.0 <= stats["turns"] <= 2.0 and 0.0 <= stats["em"] <= stats["pass_at_k"] <= 1.0
    deprecated = [w for w in recwarn if "trajectory.info" in str(w.message)]
    assert deprecated == []


def test_the_decision_probe_reads_the_choice_after_the_first_search(tiny_model) -> None:
    import math

    import decision_probe

    from tests.conftest import TINY_SYNTHHOP

    model, tokenizer = tiny_model
    contexts = decision_probe.first_search_contexts(2, 3, {**TINY_SYNTHHOP, "max_turns": 4})
    assert len(contexts) == 3
    for messages in contexts:
        assert messages[-1]["role"] == "tool" and [m["role"] for m in messages].count("assistant") == 1
        assert "<tool_call>" in messages[-2]["content"]  # the oracle's first search
    result = decision_probe.probe(model, tokenizer, contexts)
    assert 0.0 < result["p_search"] < 1.0 and result["questions"] == 3
    assert result["greedy_search_share"] in (0.0, 1 / 3, 2 / 3, 1.0)
    # p_search is the logistic of each question's log-odds of searching; a mean p over 0.5 needs some positive odds
    single = decision_probe.probe(model, tokenizer, contexts[:1])
    assert math.isclose(single["p_search"], 1 / (1 + math.exp(-single["log_odds"])), rel_tol=1e-9)
    assert (result["greedy_search_share"] > 0) == (max(
        decision_probe.probe(model, tokenizer, [c])["log_odds"] for c in contexts) > 0)
    # the probability of an opening is the product of its tokens' next-token probabilities
    from agent_gym.models.chat_template import render_prompt

    context = render_prompt(tokenizer, contexts[0])
    ids = tokenizer.encode("<answer>", add_special_tokens=False)
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + ids])).logits[0].float()
    expected = sum(float(torch.log_softmax(logits[len(context) - 1 + i], -1)[token]) for i, token in enumerate(ids))
    assert math.isclose(decision_probe.opening_logprob(model, context, ids), expected, rel_tol=1e-4)


def test_the_probe_reads_both_openings_from_one_pass_over_the_context(tiny_model) -> None:
    import math

    import decision_probe

    from agent_gym.models.chat_template import render_prompt
    from tests.conftest import TINY_SYNTHHOP

    model, tokenizer = tiny_model
    contexts = decision_probe.first_search_contexts(1, 2, {**TINY_SYNTHHOP, "max_turns": 4})
    # the longer opening first: the context's cache is extended by it, then cropped back for the others
    openings = {"longer": tokenizer.encode("The answer is Paris, France.", add_special_tokens=False)}
    openings.update({name: tokenizer.encode(text, add_special_tokens=False)
                     for name, text in decision_probe.OPENINGS.items()})
    openings["one token"] = openings["answer"][:1]
    assert len(openings["longer"]) > 2
    for messages in contexts:
        context = render_prompt(tokenizer, messages)
        cached = decision_probe.opening_logprobs(model, context, openings)
        for name, ids in openings.items():  # each as a full forward over context + opening gives it
            assert math.isclose(cached[name], decision_probe.opening_logprob(model, context, ids), rel_tol=1e-4)
    result = decision_probe.probe(model, tokenizer, contexts)
    assert len(result["per_question"]) == 2
    assert math.isclose(result["log_odds"], sum(result["per_question"]) / 2, abs_tol=1e-3)


def test_the_probe_names_a_run_checkpoint_by_run_and_step_and_a_committed_adapter_by_itself() -> None:
    import decision_probe

    run = Path("runs/rl/grpo-e3-s1/checkpoints/step_000040")
    assert decision_probe.label(run) == "grpo-e3-s1 step_000040"
    assert decision_probe.label(run / "policy") == "grpo-e3-s1 step_000040"  # a PPO checkpoint's policy
    assert decision_probe.label(Path("experiments/checkpoints/sweep-e3-warm75")) == "sweep-e3-warm75"


def test_separation_tells_a_learned_condition_from_a_shared_shift() -> None:
    import decision_probe

    # every 2-hop question above every 1-hop one, but all above 0: greedy searches everywhere
    shifted = decision_probe.separation([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert shifted == {"auc": 1.0, "decision_accuracy": 0.5, "best_shift_accuracy": 1.0}
    # the hop counts interleaved: no threshold does better than 2 of 3 on each side
    mixed = decision_probe.separation([-1.0, 1.0, 3.0], [0.0, 2.0, 4.0])
    assert mixed["auc"] == 6 / 9 and mixed["decision_accuracy"] == (1 / 3 + 2 / 3) / 2
    assert mixed["best_shift_accuracy"] == (2 / 3 + 2 / 3) / 2
    # ties count one half, and the conditional policy itself scores 1.0 everywhere
    assert decision_probe.separation([0.5], [0.5])["auc"] == 0.5
    assert decision_probe.separation([-2.0, -1.0], [1.0, 2.0]) == {"auc": 1.0, "decision_accuracy": 1.0,
                                                                    "best_shift_accuracy": 1.0}


def test_decision_curves_start_each_run_at_its_own_warm_start(tmp_path: Path) -> None:
    import decision_curves

    def record(gap: float) -> dict:
        return {"1hop": {"p_search": 0.5}, "2hop": {"p_search": 0.6}, "log_odds_gap": gap}

    records = {"sweep-e3-warm75": record(0.4), "sweep-e3-warm50": record(2.0),
               "grpo-e3-s1 step_000020": record(0.8), "grpo-e3-s1 step_000010": record(0.6),
               "grpo-e3-warm50-s0 step_000010": record(2.2), "grpo-e3-warm50-s0 step_000030": record(2.8),
               "ppo-e3-s2 step_000050": record(1.1)}  # one step only: no curve
    curves = decision_curves.run_curves(records)
    assert list(curves) == ["grpo-e3-s1", "grpo-e3-warm50-s0"]
    assert [(step, r["log_odds_gap"]) for step, r in curves["grpo-e3-s1"]] == [(0, 0.4), (10, 0.6), (20, 0.8)]
    assert [(step, r["log_odds_gap"]) for step, r in curves["grpo-e3-warm50-s0"]] == [(0, 2.0), (10, 2.2), (30, 2.8)]
    out = tmp_path / "curves.png"
    decision_curves.plot(curves, records, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_publish_only_trains_and_measures_nothing_and_keeps_every_committed_measure(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    def must_not_run(*args, **kwargs):
        raise AssertionError("--publish-only must not train or measure")

    published: list[dict] = []
    monkeypatch.setattr(sweep, "sft", must_not_run)
    monkeypatch.setattr(sweep, "evaluate_share", must_not_run)
    monkeypatch.setattr(sweep, "publish", lambda args, evals, chosen: published.append(evals))
    # Committed: share 5 (measured on another machine, absent here) and an older measure of share 50.
    committed = tmp_path / "committed.json"
    committed.write_text(json.dumps({"evals": {
        "5": {"greedy_1hop": {"em": 0.92}},
        "50": {"pass8_1hop": {"informative": 0.1, "pass_at_k": 0.5},
               "pass8_2hop": {"informative": 0.2, "pass_at_k": 0.4}}}}))
    monkeypatch.setattr(sweep, "results_path", lambda epochs: committed if epochs == 3 else tmp_path / "none.json")
    out = tmp_path / "sweep-e3"
    out.mkdir()
    (out / "warm50_eval.json").write_text('{"pass8_1hop": {"informative": 0.6, "pass_at_k": 0.9}}')
    assert sweep.main(["--publish-only", "--epochs", "3", "--out", str(out), "--model", str(tmp_path / "m"),
                       "--shares", "50"]) == 0
    # This machine's measure wins; nothing committed is dropped (a run directory with fewer shares once published
    # over the other shares' measures).
    assert published == [{5: {"greedy_1hop": {"em": 0.92}},
                           50: {"pass8_1hop": {"informative": 0.6, "pass_at_k": 0.9},
                                "pass8_2hop": {"informative": 0.2, "pass_at_k": 0.4}}}]


def test_rl_campaign_names_every_device_a_run_trained_on_once(tmp_path: Path, monkeypatch) -> None:
    import rl_campaign

    monkeypatch.setattr(rl_campaign, "device_label", lambda: "cpu: Intel(R) Xeon(R) Processor")
    rl_campaign.note_device(tmp_path)
    rl_campaign.note_device(tmp_path)  # the next chunk on the same machine adds nothing
    monkeypatch.setattr(rl_campaign, "device_label", lambda: "cuda: NVIDIA H100 80GB HBM3")
    rl_campaign.note_device(tmp_path)  # resumed on a GPU machine
    assert json.loads((tmp_path / "devices.json").read_text()) == [
        "cpu: Intel(R) Xeon(R) Processor", "cuda: NVIDIA H100 80GB HBM3"]


def test_a_run_resumed_from_the_repository_at_its_last_step_evaluates_the_committed_adapter(
        tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    checkpoints = tmp_path / "checkpoints"
    committed = checkpoints / "rl-grpo-s0"
    committed.mkdir(parents=True)
    (committed / "progress.json").write_text(json.dumps({"step": 50, "run": "grpo-s0"}))
    (committed / "final_eval.json").write_text(json.dumps({"greedy_1hop": {"em": 0.5}}))  # measured elsewhere
    (committed / "curve.json").write_text(json.dumps({"50": {"mix_em": 0.5}}))  # its last curve point with it
    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", checkpoints)
    monkeypatch.setattr(rl_campaign, "_run", lambda *a, **k: pytest.fail("a finished run trains no further"))
    measured: list[tuple[Path, str]] = []

    def measure(adapter, env_kwargs, questions, temperature, seed):
        measured.append((adapter, env_kwargs["hops"]))
        return {"em": 1.0}

    monkeypatch.setattr(rl_campaign, "measure_adapter", measure)
    args = argparse.Namespace(out=str(tmp_path / "runs"), tag="", steps=50, chunk=5, from_repo=True,
                              final_eval=True, eval_questions=4)
    rl_campaign.run_one(args, "grpo", 0, tmp_path / "warm", rl_campaign.Timings(tmp_path))

    assert measured and {adapter for adapter, _ in measured} == {committed}
    assert len(measured) == len(rl_campaign.FINAL_MEASURES) - 1  # the committed measure is not played again
    result = json.loads((committed / "final_eval.json").read_text())  # back beside the adapter, complete
    assert result["greedy_1hop"] == {"em": 0.5} and set(result) == set(rl_campaign.FINAL_MEASURES)
    assert all(result[key]["seconds"] >= 0 for key in rl_campaign.FINAL_MEASURES if key != "greedy_1hop")  # timed


def test_final_measures_play_side_by_side_and_each_is_cached_as_it_ends(tmp_path: Path, monkeypatch) -> None:
    import argparse
    import threading

    import rl_campaign

    first_two = threading.Barrier(2, timeout=10)  # broken, and the measures failed, unless two of them run at once
    calls: list[str] = []
    path = tmp_path / "final_eval.json"
    path.write_text(json.dumps({"greedy_1hop": {"em": 0.5}}))  # measured by an earlier sitting

    def measure(adapter, env_kwargs, questions, temperature, seed):
        calls.append(adapter.name)
        if len(calls) <= 2:
            first_two.wait()
        return {"em": env_kwargs["hops"] / 2}

    monkeypatch.setattr(rl_campaign, "measure_adapter", measure)
    result = rl_campaign.final_eval(argparse.Namespace(eval_questions=4, eval_workers=2), tmp_path / "adapter", path)

    assert len(calls) == len(rl_campaign.FINAL_MEASURES) - 1  # the cached measure is not played again
    assert set(result) == set(rl_campaign.FINAL_MEASURES) and result["greedy_1hop"] == {"em": 0.5}
    assert json.loads(path.read_text()) == result  # every measure on disk, none lost to a concurrent write
    assert result["greedy_2hop"]["em"] == 1.0 and result["world1_greedy_1hop"]["em"] == 0.5


def test_a_failed_final_measure_keeps_the_ones_that_ended(tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    def measure(adapter, env_kwargs, questions, temperature, seed):
        if temperature > 0:
            raise RuntimeError("measuring failed: out of memory")
        return {"em": 0.25}

    monkeypatch.setattr(rl_campaign, "measure_adapter", measure)
    path = tmp_path / "final_eval.json"
    with pytest.raises(RuntimeError, match="out of memory"):
        rl_campaign.final_eval(argparse.Namespace(eval_questions=4, eval_workers=2), tmp_path / "adapter", path)
    kept = json.loads(path.read_text())
    greedy = {key for key, (_, _, temperature, _) in rl_campaign.FINAL_MEASURES.items() if temperature == 0}
    assert set(kept) == greedy and all(kept[key]["em"] == 0.25 for key in greedy)


def test_a_run_published_at_a_curve_step_before_its_point_gets_the_point_on_the_next_machine(
        tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    committed = tmp_path / "checkpoints" / "rl-grpo-s0"
    committed.mkdir(parents=True)
    (committed / "progress.json").write_text(json.dumps({"step": 10, "run": "grpo-s0"}))  # by --publish-now
    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "checkpoints")
    measured: list[tuple[Path, int]] = []

    def measure(adapter, env_kwargs, questions, temperature, seed):
        measured.append((adapter, env_kwargs["hops"]))
        return {"em": 0.5, "multihop": 0.5, "f1": 0.5}

    monkeypatch.setattr(rl_campaign, "measure_adapter", measure)
    trained: list[list[str]] = []
    monkeypatch.setattr(rl_campaign, "_run", lambda command, *a, **k: trained.append(command))
    args = argparse.Namespace(out=str(tmp_path / "runs"), tag="", steps=10, chunk=5, from_repo=True,
                              final_eval=False, curve_questions=4)
    rl_campaign.run_one(args, "grpo", 0, tmp_path / "warm", rl_campaign.Timings(tmp_path))

    assert measured == [(committed, 1), (committed, 2)]  # the committed adapter's point at step 10, once
    curve = json.loads((tmp_path / "runs" / "rl" / "grpo-s0" / "curve.json").read_text())
    assert list(curve) == ["10"] and not trained


def test_a_run_continued_from_the_repository_trains_on_from_its_step_with_new_task_draws(
        tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    committed = tmp_path / "checkpoints" / "rl-grpo-s0"
    committed.mkdir(parents=True)
    (committed / "progress.json").write_text(json.dumps({"step": 10, "run": "grpo-s0"}))
    (committed / "curve.json").write_text(json.dumps({"10": {"mix_em": 0.5}}))
    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "checkpoints")
    calls: list[tuple[Path, int, int]] = []

    def command(args, start, recipe, seed, total_steps, directory, warm=None, offset=0):
        calls.append((start, total_steps, offset))
        return ["train", str(directory), str(total_steps)]

    def train(command, *a, **k):  # the train process: its own steps, numbered from 1
        directory, steps = Path(command[1]), int(command[2])
        (directory / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps + 1)))

    monkeypatch.setattr(rl_campaign, "train_command", command)
    monkeypatch.setattr(rl_campaign, "_run", train)
    monkeypatch.setattr(rl_campaign, "curve_point", lambda *a: {})  # the last step's point and publication:
    monkeypatch.setattr(rl_campaign, "publish_run", lambda *a: None)  # not this test's
    args = argparse.Namespace(out=str(tmp_path / "runs"), tag="", steps=15, chunk=5, from_repo=True,
                              final_eval=False)
    rl_campaign.run_one(args, "grpo", 0, tmp_path / "warm", rl_campaign.Timings(tmp_path))

    # steps 11-15 from the committed adapter, told its 10 steps so that their task draws are not played again
    assert calls == [(committed, 5, 10)]


def test_a_campaign_record_names_the_precision_its_updates_took() -> None:
    import rl_campaign

    def steps(*flags: float) -> list[dict]:
        return [{"step": i + 1, "perf/update_bf16": flag} for i, flag in enumerate(flags)]

    assert rl_campaign.run_precision(steps(1.0, 1.0)) == "bf16"
    assert rl_campaign.run_precision(steps(0.0, 0.0, 0.0)) == "fp32"  # e.g. a CPU without native bf16
    # resumed on a machine that chose otherwise: both, counted
    assert rl_campaign.run_precision(steps(1.0, 1.0, 0.0)) == "bf16 on 2 of 3 steps, fp32 on the rest"
    assert rl_campaign.run_precision([{"step": 1}]) == "unknown"  # metrics from before the flag was logged


def test_the_campaign_summary_replaces_only_the_runs_it_has_and_reuses_the_published_warm_measures(
        tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    warm = {"greedy": 0.7, "greedy_mix": 0.7, "greedy_1hop": 0.6, "greedy_2hop": 0.8, "sampled": 0.5,
            "world1_greedy_mix": 0.75}
    finished_elsewhere = {"run": "rl-grpo-e3-s0", "recipe": "grpo", "warm_start": "warm75", "final_em": warm,
                          "warm_start_em": warm, "em_curve": [], "second_search_curve": {}}
    other = {"run": "sweep-e3-warm5", "algorithm": "sft", "two_hop_share": 0.05,
             "final_em": {"greedy_mix": 0.46, "greedy_1hop": 0.92, "greedy_2hop": 0.0, "sampled": 0.425}}
    (results / "learning.json").write_text(json.dumps([other, finished_elsewhere]))
    monkeypatch.setattr(rl_campaign, "ROOT", tmp_path)
    monkeypatch.setattr(rl_campaign, "final_eval", lambda *a: pytest.fail("the warm start is not played again"))
    plotted: list[list[str]] = []
    monkeypatch.setattr(rl_campaign, "plot", lambda records, *a: plotted.append([r["run"] for r in records]))
    run = tmp_path / "runs" / "rl" / "grpo-e3-s1"
    run.mkdir(parents=True)
    (run / "final_eval.json").write_text(json.dumps({key: {"em": 0.9, "seconds": 300.0}
                                                     for key in rl_campaign.FINAL_MEASURES}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": step, "perf/rollout_s": 1000.0,
                                                           "perf/update_s": 800.0}) + "\n" for step in (1, 2)))
    (tmp_path / "runs" / "warm75_curve.json").write_text(json.dumps(
        {"0": {"mix_em": 0.7, "1hop": {"multihop": 0.4}, "2hop": {"multihop": 0.8}}}))
    args = argparse.Namespace(out=str(tmp_path / "runs"), recipes=["grpo"], seeds=[0, 1], tag="-e3",
                              model="m", eval_questions=200, steps=50)

    records = rl_campaign.summarize(args, "warm75", tmp_path / "warm75")

    assert [r["run"] for r in records] == ["rl-grpo-e3-s1"] and records[0]["warm_start_em"] == warm
    assert records[0]["final_em"]["greedy_mix"] == pytest.approx(0.9)
    assert records[0]["hours"] == {"train_steps": 1.0, "final_eval": 0.5}  # 2 steps of 1,800 s; 6 measures of 300 s
    assert records[0]["steps"] == 2  # what it trained, not the campaign's --steps 50
    assert records[0]["precision"] == "unknown"  # its metrics do not log perf/update_bf16
    published = json.loads((results / "learning.json").read_text())
    assert [r["run"] for r in published] == ["sweep-e3-warm5", "rl-grpo-e3-s0", "rl-grpo-e3-s1"]
    assert plotted == [["rl-grpo-e3-s0", "rl-grpo-e3-s1"]]
    assert "(n=2)" in (results / "rl_table_e3.md").read_text()  # both seeds in the table
    # the sweep's other warm starts are rows too (the target: above every one); world 1 was not measured for them
    assert "| another warm start of the sweep (warm5) | 0.460 | 0.920 | 0.000 | 0.425 | … |" in (
        results / "rl_table_e3.md").read_text()


def test_the_campaign_table_gives_the_mean_and_sample_standard_deviation_over_seeds(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    import rl_campaign

    (tmp_path / "docs" / "results").mkdir(parents=True)
    monkeypatch.setattr(rl_campaign, "ROOT", tmp_path)
    keys = ("greedy_mix", "greedy_1hop", "greedy_2hop", "sampled", "world1_greedy_mix")
    warm = dict.fromkeys(keys, 0.5)
    records = [{"recipe": recipe, "eval_episodes": 200, "final_em": dict.fromkeys(keys, em)}
               for recipe, em in (("grpo_lr5e-5_kl0.3", 0.6), ("grpo_lr5e-5_kl0.3", 0.9), ("grpo_lr5e-5_kl0.3", 0.9),
                                  ("ppo_lr5e-5_kl0.3", 0.7))]

    rl_campaign.write_table(records, "warm75", warm, "-e3")

    table = (tmp_path / "docs" / "results" / "rl_table_e3.md").read_text()
    grpo, ppo = (line for line in table.splitlines() if line.startswith(("| GRPO", "| PPO")))
    assert "0.800 ± 0.173 (n=3)" in grpo  # sd of (0.6, 0.9, 0.9) with n - 1; half the range would be 0.150
    assert "0.700 (n=1)" in ppo and "±" not in ppo
    assert "sample standard deviation" in table and "200 held-out questions" in table


def test_the_campaign_reads_its_runs_against_every_other_warm_start_of_its_own_sweep() -> None:
    import rl_campaign

    def sft(run: str, share: float, mix: float | None = 0.5) -> dict:
        em = {} if mix is None else {"greedy_mix": mix, "greedy_1hop": mix, "greedy_2hop": mix}
        return {"run": run, "algorithm": "sft", "two_hop_share": share, "final_em": em}

    published = [sft("sweep-e3-warm50", 0.5, 0.69), sft("sweep-e3-warm5", 0.05, 0.46), sft("sweep-e3-warm75", 0.75),
                 sft("sweep-warm25", 0.25), sft("sweep-e3-warm100", 1.0, None),
                 {"run": "rl-grpo-e3-s0", "algorithm": "grpo", "final_em": {"greedy_mix": 0.8}}]

    others = rl_campaign.sweep_warm_starts(published, "-e3", "warm75")
    assert list(others) == ["warm5", "warm50"]  # by share; not the chosen one, another sweep's, nor an unmeasured one
    assert others["warm50"]["greedy_mix"] == 0.69
    assert list(rl_campaign.sweep_warm_starts(published, "-e3-warm50", "warm50")) == ["warm5", "warm75"]
    assert list(rl_campaign.sweep_warm_starts(published, "", "warm75")) == ["warm25"]  # the 1-epoch sweep


def test_the_campaign_curves_mark_the_sweeps_warm_starts(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.axes
    import rl_campaign

    (tmp_path / "docs" / "results").mkdir(parents=True)
    monkeypatch.setattr(rl_campaign, "ROOT", tmp_path)
    marked: list[float] = []
    axhline = matplotlib.axes.Axes.axhline
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline",
                        lambda self, y=0, *a, **k: marked.append(y) or axhline(self, y, *a, **k))
    curve = [(0, 0.6), (10, 0.7)]
    record = {"recipe": "grpo_lr5e-5_kl0.3", "em_curve": curve,
              "second_search_curve": {"1hop": curve, "2hop": curve}}

    rl_campaign.plot([record, record], {"greedy_mix": 0.72}, "-e3",
                     {"warm5": {"greedy_mix": 0.46}, "warm50": {"greedy_mix": 0.69}})

    assert marked == [0.72, 0.46, 0.69]  # the chosen warm start, then each other one
    assert (tmp_path / "docs" / "results" / "rl_curves_e3.png").stat().st_size > 10_000


def test_a_published_ppo_run_carries_its_critic_in_bf16(tmp_path: Path, monkeypatch) -> None:
    import real_model
    import torch
    from safetensors.torch import save_file

    source = tmp_path / "final"
    source.mkdir()
    save_file({"lora_A": torch.ones(2, 3)}, str(source / "adapter_model.safetensors"))
    (source / "adapter_config.json").write_text("{}")
    torch.save({"value_head.weight": torch.full((1, 3), 0.1), "lora_rank": torch.tensor(4)}, source / "critic.pt")
    (source / "trainer_state.pt").write_bytes(b"not published")
    monkeypatch.setattr(real_model, "ROOT", tmp_path)

    target = real_model.publish_adapter(source, "rl-ppo-s1")

    assert sorted(path.name for path in target.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                             "critic.pt"]
    critic = torch.load(target / "critic.pt", weights_only=True)
    assert critic["value_head.weight"].dtype == torch.bfloat16 and int(critic["lora_rank"]) == 4
    assert torch.allclose(critic["value_head.weight"].float(), torch.full((1, 3), 0.1), rtol=1e-2)


def test_a_run_resumed_from_the_repository_publishes_its_whole_history(tmp_path: Path, monkeypatch) -> None:
    import rl_campaign

    committed = tmp_path / "checkpoints" / "rl-grpo-s0"
    committed.mkdir(parents=True)
    (committed / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "em": s / 10}) + "\n" for s in (1, 2)))
    (committed / "curve.json").write_text(json.dumps({"10": {"mix_em": 0.5}}))
    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "checkpoints")
    monkeypatch.setattr(rl_campaign, "publish_adapter", lambda source, name: tmp_path / "checkpoints" / name)
    directory = tmp_path / "runs" / "rl" / "grpo-s0"
    # what run_one does on a machine without the run directory, then two steps trained here
    (directory).mkdir(parents=True)
    for name, kept in (("metrics.jsonl", rl_campaign.HISTORY), ("curve.json", "curve.json")):
        (directory / kept).write_bytes((committed / name).read_bytes())
    (directory / "offset.json").write_text(json.dumps({"offset": 2, "adapter": str(committed)}))
    (directory / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "em": 1.0}) + "\n" for s in (1, 2)))

    rl_campaign.publish_run(directory, 4)

    published = [json.loads(line) for line in (committed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in published] == [1, 2, 3, 4] and [r["em"] for r in published] == [0.1, 0.2, 1.0, 1.0]
    assert json.loads((committed / "curve.json").read_text()) == {"10": {"mix_em": 0.5}}
    assert json.loads((committed / "progress.json").read_text())["step"] == 4


def test_two_campaigns_started_side_by_side_measure_the_warm_starts_curve_point_once(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    import argparse
    import threading
    import time

    import rl_campaign

    played: list[int] = []

    def measure(adapter, env_kwargs, questions, temperature, seed):
        played.append(env_kwargs["hops"])
        time.sleep(0.2)  # long enough for the other campaign to arrive while this one measures
        return {"em": 0.5, "multihop": 0.25 * env_kwargs["hops"], "f1": 0.5}

    monkeypatch.setattr(rl_campaign, "measure_adapter", measure)
    args = argparse.Namespace(curve_questions=4)
    path = tmp_path / "rl-e3" / "warm75_curve.json"
    points: list[dict] = []
    campaigns = [threading.Thread(target=lambda: points.append(rl_campaign.curve_point(args, path, tmp_path, 0)))
                 for _ in range(2)]
    for campaign in campaigns:
        campaign.start()
    for campaign in campaigns:
        campaign.join()
    assert sorted(played) == [1, 2]  # one measure of each hop count, not two
    assert points[0] == points[1] == json.loads(path.read_text())["0"]
    assert points[0]["2hop"]["multihop"] == 0.5 and points[0]["mix_em"] == 0.5


def test_a_sitting_that_ends_between_publications_publishes_the_newest_checkpoint(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    import argparse

    import real_model
    import rl_campaign
    import torch
    from safetensors.torch import save_file

    from agent_gym.trainers.checkpoint import save_checkpoint

    monkeypatch.setattr(real_model, "ROOT", tmp_path)
    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "experiments" / "checkpoints")
    args = argparse.Namespace(out=str(tmp_path / "runs"), tag="-e3")
    directory = rl_campaign.run_dir(args, "ppo", 1)
    directory.mkdir(parents=True)
    # resumed from a committed step 10; its own steps 1-7 logged, the chunk killed after its step-5 checkpoint
    (directory / "offset.json").write_text(json.dumps({"offset": 10, "adapter": "committed"}))
    (directory / rl_campaign.HISTORY).write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 11)))
    (directory / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 8)))
    (directory / "curve.json").write_text(json.dumps({"10": {"mix_em": 0.5}}))
    head = torch.full((1, 3), 0.25)
    checkpoint = save_checkpoint(directory, 5, {"step": 5, "config": {"critic": "lora", "critic_lora_rank": 4},
                                                "critic": {"value_head.weight": head}})
    (checkpoint / "policy").mkdir()
    save_file({"lora_A": torch.ones(2, 3)}, str(checkpoint / "policy" / "adapter_model.safetensors"))
    (checkpoint / "policy" / "adapter_config.json").write_text("{}")

    target = rl_campaign.publish_latest(args, "ppo", 1)

    assert target == tmp_path / "experiments" / "checkpoints" / "rl-ppo-e3-s1"
    assert json.loads((target / "progress.json").read_text())["step"] == 15
    published = [json.loads(line)["step"] for line in (target / "metrics.jsonl").read_text().splitlines()]
    assert published == list(range(1, 16))  # not steps 16 and 17, past the published adapter
    critic = torch.load(target / "critic.pt", weights_only=True)
    assert int(critic["lora_rank"]) == 4 and torch.equal(critic["value_head.weight"].float(), head)
    assert rl_campaign.repo_start("ppo", 1, "-e3") == (target, 15)  # where the next machine continues
    assert rl_campaign.publish_latest(args, "ppo", 1) is None  # published already: nothing replaced
    assert rl_campaign.publish_latest(args, "ppo", 2) is None  # no run directory, nothing to publish


def test_a_warm_start_trained_in_another_sitting_gets_its_record_from_the_committed_summary(
        tmp_path: Path, monkeypatch) -> None:
    committed = tmp_path / "checkpoints" / "sweep-e3-warm25"
    committed.mkdir(parents=True)
    (committed / "sft_summary.json").write_text('{"episodes": 160, "steps": 120, "final_loss": 0.05}')
    monkeypatch.setattr(sweep, "CHECKPOINTS", tmp_path / "checkpoints")
    measure = {"em": 0.5, "multihop": 0.25, "questions": 200, "pass_at_k": 0.75, "informative": 0.5}
    evaluation = {key: dict(measure) for key in (*sweep.MEASURES, "pass8_1hop", "pass8_2hop")}
    args = sweep.argparse.Namespace(out=str(tmp_path / "sweep-e3"), epochs=3, model="m")  # no local run of it
    record = sweep.record(args, 25, evaluation)
    assert record["run"] == "sweep-e3-warm25" and record["sft"] == {"episodes": 160, "steps": 120, "final_loss": 0.05}
    assert record["final_em"]["greedy_mix"] == 0.5 and record["two_hop_share"] == 0.25


def test_the_transfer_table_plays_the_baselines_the_warm_start_and_each_published_run(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    import argparse

    import rl_campaign

    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path)
    published = tmp_path / "rl-ppo_lr5e-5_kl0.3-e3-s1"
    published.mkdir()
    (published / "adapter_config.json").write_text("{}")
    (published / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (49, 50)))
    (tmp_path / "rl-ppo_lr5e-5_kl0.3-e3-s2").mkdir()  # started, nothing published: not an agent yet
    args = argparse.Namespace(model="smollm2-135m-instruct", recipes=["ppo_lr5e-5_kl0.3"], seeds=[1, 2], tag="-e3")
    agents = rl_campaign.transfer_agents(args, "warm75", tmp_path / "warm75")
    assert list(agents) == ["zero-shot", "naive RAG", "warm start (warm75)",
                            "ppo_lr5e-5_kl0.3-e3-s1 (step 50)"]
    assert agents["naive RAG"] == {"model": "smollm2-135m-instruct", "naive_rag": True}
    assert agents["ppo_lr5e-5_kl0.3-e3-s1 (step 50)"] == {"model": published}
    table = rl_campaign.transfer_table({"zero-shot | HotpotQA": {"em": 0.1, "f1": 0.25},
                                        "zero-shot | MuSiQue": {"em": 0.0, "f1": 0.05}}, ["zero-shot", "naive RAG"])
    assert table.splitlines() == ["| agent | HotpotQA EM / F1 | MuSiQue EM / F1 |", "|---|---|---|",
                                  "| zero-shot | 0.100 / 0.250 | 0.000 / 0.050 |", "| naive RAG | — | — |"]


def test_value_guided_decoding_plays_three_decoders_per_hop_count_for_each_run_with_a_critic(
        tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "checkpoints")
    monkeypatch.setattr(rl_campaign, "results_file", lambda name, tag: tmp_path / f"{Path(name).stem}{tag}.json")
    for seed, files in ((1, ("adapter_config.json", "critic.pt")), (2, ("adapter_config.json",))):
        adapter = tmp_path / "checkpoints" / f"rl-ppo_lr5e-5_kl0.3-e3-s{seed}"
        adapter.mkdir(parents=True)
        for name in files:
            (adapter / name).write_text("{}")
    played: list[list[str]] = []

    def fake_eval(command, log, what, threads):  # two episodes: EM 1 and 0, 2 and 1 searches
        played.append(command)
        out = Path(command[command.index("--out") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps({"em": em, "tool_calls": calls, "generated_tokens": 10 * calls,
                                           "seconds": 1.0}) + "\n" for em, calls in ((1.0, 2), (0.0, 1))))

    monkeypatch.setattr(rl_campaign, "_run", fake_eval)
    args = argparse.Namespace(model="smollm2-135m-instruct", recipes=["ppo_lr5e-5_kl0.3"], seeds=[1, 2], tag="-e3",
                              value_guided=4, vg_questions=2, out=str(tmp_path / "out"))
    rl_campaign.run_value_guided(args, rl_campaign.Timings(tmp_path / "out"))
    assert len(played) == 6  # seed 2 has no critic
    assert [c[c.index("--adapter") + 2:c.index("--episodes")] for c in played[:3]] == [
        [], ["--best-of", "4"], ["--value-guided", "4"]]
    assert [json.loads(c[c.index("--env-kwargs") + 1])["hops"] for c in played] == [1, 1, 1, 2, 2, 2]
    results = json.loads((tmp_path / "value_guided-e3.json").read_text())
    cell = results["ppo_lr5e-5_kl0.3-e3-s1 (step 0) | 2-hop | value-guided-4"]
    assert (cell["em"], cell["searches"], cell["tokens_per_episode"], cell["episodes"]) == (0.5, 1.5, 15, 2)
    rl_campaign.run_value_guided(args, rl_campaign.Timings(tmp_path / "out"))
    assert len(played) == 6  # every cell cached


def test_a_transfer_cell_played_on_another_number_of_questions_is_played_again(tmp_path: Path, monkeypatch) -> None:
    import argparse

    import rl_campaign

    monkeypatch.setattr(rl_campaign, "CHECKPOINTS", tmp_path / "checkpoints")
    monkeypatch.setattr(rl_campaign, "results_file",
                        lambda name, tag: tmp_path / f"{Path(name).stem}{tag}{Path(name).suffix}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "transfer.json").write_text(json.dumps({
        "zero-shot | HotpotQA": {"em": 0.0, "f1": 0.1, "episodes": 50},
        "naive RAG | HotpotQA": {"em": 0.1, "f1": 0.2, "episodes": 100}}))
    seen = {}

    def fake_transfer(namespace, agents, timings):
        seen.update(json.loads((Path(namespace.out) / "transfer.json").read_text()))
        assert namespace.transfer_episodes == 100
        return {**seen, **{f"{agent} | HotpotQA": {"em": 0.0, "f1": 0.0, "episodes": 100} for agent in agents
                           if f"{agent} | HotpotQA" not in seen}}

    monkeypatch.setattr(rl_campaign, "play_transfer", fake_transfer)
    args = argparse.Namespace(model="m", recipes=["grpo"], seeds=[0], tag="-e3", out=str(tmp_path / "out"),
                              transfer_questions=100)
    rl_campaign.run_transfer(args, "warm75", tmp_path / "warm75", rl_campaign.Timings(tmp_path / "out"))
    assert list(seen) == ["naive RAG | HotpotQA"]  # the 50-question cell was dropped before playing
    written = json.loads((tmp_path / "transfer-e3.json").read_text())
    assert written["naive RAG | HotpotQA"]["em"] == 0.1 and written["zero-shot | HotpotQA"]["episodes"] == 100
    assert (tmp_path / "transfer_table-e3.md").read_text().startswith("| agent | HotpotQA EM / F1 |")


def test_each_mask_ablation_runs_its_paired_recipe_with_only_the_mask_turned_off(tmp_path: Path) -> None:
    import argparse

    import rl_campaign

    args = argparse.Namespace(model="m", tasks_per_step=4, group_size=8, lr=1e-4, micro_batch_size=None, chunk=5,
                              backend="transformers", train_python="")
    pairs = {"grpo_lr5e-5_kl0.3_no_loss_mask": ("grpo_lr5e-5_kl0.3", "--no-use-loss-mask"),
             "ppo_lr5e-5_kl0.3_no_advantage_mask": ("ppo_lr5e-5_kl0.3", "--no-use-advantage-mask")}
    for name, (paired, mask_flag) in pairs.items():
        ablated, full = rl_campaign.RECIPES[name], rl_campaign.RECIPES[paired]
        assert ablated.ablation and not full.ablation and ablated.algo == full.algo
        commands = [rl_campaign.train_command(args, tmp_path / "warm", recipe, 3, 5, tmp_path / "run")
                    for recipe in (ablated, full)]
        assert commands[0].count(mask_flag) == 1 and mask_flag not in commands[1]
        assert [flag for flag in commands[0] if flag != mask_flag] == commands[1]
    stratified, full = (rl_campaign.train_command(args, tmp_path / "warm", rl_campaign.RECIPES[name], 3, 5,
                                                  tmp_path / "run")
                        for name in ("grpo_lr5e-5_kl0.3_stratified", "grpo_lr5e-5_kl0.3"))
    at = stratified.index("--stratify-by")
    assert stratified[at + 1] == "hops" and stratified[:at] + stratified[at + 2:] == full  # GRPO's run but for the draw


def test_the_replay_check_finds_the_step_after_which_a_run_drew_its_first_tasks_again() -> None:
    import draw_replay_check as check

    def metrics(seed: int, restart: int, steps: int) -> list[dict]:
        rows, position = [], 0
        for step in range(1, steps + 1):
            if restart and step == restart + 1:
                position = 0
            hops = check.step_hops(seed, position, check.TASKS_PER_STEP)
            position += check.TASKS_PER_STEP
            rows.append({"step": step, **{f"charts/em/{h}": 0.5 for h in (1, 2) if h in hops},
                         **{f"charts/informative_groups/{h}": 1 / hops.count(h) for h in (1, 2) if h in hops}})
        return rows

    replayed, whole = metrics(1, 20, 50), metrics(1, 0, 50)
    assert check.agreeing_steps(replayed, 1, 20) == 50 and check.agreeing_steps(replayed, 1, 0) < 50
    assert check.agreeing_steps(whole, 1, 0) == 50 and check.agreeing_steps(whole, 1, 20) < 50

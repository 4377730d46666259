"""Rollout wall time with the envs in Ray actors (`RayEnvPool`) against the same envs in process, same run.

Each repeat plays the same 64 episodes (default) twice, interleaved: with `RolloutCollector` over in-process
envs (`LocalEnvBatch`, the turn batch of a native vector env) and over a `RayEnvPool` of `--workers` actors.
The model generates every turn (a throwaway tiny model by default); with `--turns search` (default) the turn
the env receives is then replaced by a search for the episode's question, so the env and its retriever do real
work every turn while the model's cost stays in the wall time (a random tiny model's own turns are malformed
and cost the env almost nothing: `--turns model` measures that case).

    python benchmarks/env_workers.py                         # 64 envs, 4 workers, SynthHop, tiny model
    python benchmarks/env_workers.py --turns scripted        # no model: the pool's bare overhead per turn
    python benchmarks/env_workers.py --nodes 2               # 2 simulated nodes (ray.cluster_utils.Cluster)

The pool's overhead is ``pool_s / local_s - 1`` over the repeats. `--nodes K` starts K raylets on this machine
with Ray's own multi-node test cluster and spreads the actors over them (``scheduling_strategy="SPREAD"``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections.abc import Sequence
from functools import partial

import torch

from agent_gym.distributed import RayEnvPool, connect_ray
from agent_gym.models.model_init import init_model, load_model_and_tokenizer
from agent_gym.trainers.backends import Generation, GenerationBackend, SamplingParams, TransformersBackend
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig


def make_env(env_id: str, env_kwargs: dict):

    from agent_gym.make import make_env

    return make_env(env_id, env_kwargs)


class SearchTurns(GenerationBackend):
    """Each turn the env receives is a search for the episode's question. With ``inner``, the model generates
    the turn first (its cost is real), and its tokens are replaced by the search call's."""

    def __init__(self, tokenizer, inner: GenerationBackend | None = None) -> None:
        self.tokenizer, self.inner = tokenizer, inner
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if self.inner is not None:
            self.inner.generate(prompts, params)
        generations = []
        for prompt in prompts:
            prompt = list(prompt)
            # The question is the first user message: between the second <|im_start|> and the second <|im_end|>.
            end_of_system = prompt.index(self.end_of_turn)
            end_of_question = prompt.index(self.end_of_turn, end_of_system + 1)
            question = self.tokenizer.decode(prompt[end_of_system + 1 : end_of_question]).split("user\n", 1)[-1]
            call = json.dumps({"name": "search", "arguments": {"query": question}})
            ids = self.tokenizer.encode(f"<tool_call>\n{call}\n</tool_call>", add_special_tokens=False)
            generations.append(Generation([*ids, self.end_of_turn], [0.0] * (len(ids) + 1), "stop"))
        return generations


def _tiny_model(seed: int, preset: str) -> str:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    texts = [" ".join(rng.choices(words, k=40)) for _ in range(3000)]
    return str(init_model(texts, tempfile.mkdtemp(prefix="agent-gym-bench-"), preset=preset))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="AgentR1-SynthHop-v0")
    parser.add_argument("--env-kwargs", default='{"num_pages": 2000}', help="JSON kwargs for gymnasium.make")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=0, help="simulated Ray nodes (0: one local cluster)")
    parser.add_argument("--turns", choices=("search", "model", "scripted"), default="search",
                        help="search: the model generates, the env gets a search; model: the model's own turns; "
                             "scripted: searches, no model")
    parser.add_argument("--model", help="Hugging Face model dir (default: a throwaway model of --preset)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    env_kwargs = json.loads(args.env_kwargs)

    model, tokenizer = load_model_and_tokenizer(args.model or _tiny_model(args.seed, args.preset))
    model.eval()
    model_backend = TransformersBackend(model, tokenizer, max_batch_size=args.num_envs)
    backend = {"search": SearchTurns(tokenizer, model_backend), "model": model_backend,
               "scripted": SearchTurns(tokenizer)}[args.turns]
    config = RolloutConfig(max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, max_context_tokens=4096,
                           show_progress=False)
    specs = [{"seed": i, "options": {"task_index": i}} for i in range(args.num_envs)]

    cluster = None
    started = time.perf_counter()
    if args.nodes:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 128 << 20})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.workers, object_store_memory=128 << 20)
        cluster.wait_for_nodes()
        connect_ray(cluster.address)
    else:
        connect_ray(num_cpus=max(os.cpu_count() or 1, args.workers))
    ray_start_s = time.perf_counter() - started

    env_fns = [partial(make_env, args.env, env_kwargs)] * args.num_envs
    local_envs = [make() for make in env_fns]
    started = time.perf_counter()
    actor_options = {"scheduling_strategy": "SPREAD"} if args.nodes else None
    pool = RayEnvPool(env_fns, args.workers, actor_options=actor_options)
    pool_start_s = time.perf_counter() - started
    nodes = set(pool.worker_nodes())
    print(f"{args.num_envs} envs of {args.env} {env_kwargs}, {args.workers} workers on {len(nodes)} node(s), "
          f"turns: {args.turns}, max_turns {args.max_turns}, max_new_tokens {args.max_new_tokens}, "
          f"torch threads {torch.get_num_threads()}, {args.repeats} repeats")
    print(f"ray start {ray_start_s:.1f} s, pool start (actors build their envs) {pool_start_s:.1f} s")

    totals = {"local_s": 0.0, "pool_s": 0.0, "local_env_s": 0.0, "pool_env_s": 0.0, "turns": 0, "calls": 0}
    runs = {"local": RolloutCollector(local_envs, backend, tokenizer, config),
            "pool": RolloutCollector(pool, backend, tokenizer, config)}
    calls = []
    original_call = pool._call
    pool._call = lambda method, indices, arguments: calls.append(method) or original_call(method, indices, arguments)
    outcomes = {}
    for repeat in range(args.repeats):
        order = ("local", "pool") if repeat % 2 == 0 else ("pool", "local")  # alternate, so load drifts hit both
        for name in order:
            collector = runs[name]
            env_before = collector.env_seconds
            started = time.perf_counter()
            trajectories = collector.collect(specs, seed=args.seed + repeat)
            totals[f"{name}_s"] += time.perf_counter() - started
            totals[f"{name}_env_s"] += collector.env_seconds - env_before
            outcomes.setdefault(name, []).append([(t.response_ids, t.outcome) for t in trajectories])
            if name == "local":
                totals["turns"] += sum(t.num_turns for t in trajectories)
    same = outcomes["local"] == outcomes["pool"]
    rounds = calls.count("step_batch")
    print(f"  turns played per run: {totals['turns'] / args.repeats:.0f}; pool calls per run: "
          f"{len(calls) / args.repeats:.1f} batches ({rounds / args.repeats:.1f} step batches), each one call "
          f"per actor; trajectories identical: {same}; dropped: {runs['pool'].dropped_episodes}")
    for name in ("local", "pool"):
        print(f"  {name:5s}: {totals[f'{name}_s'] / args.repeats:7.2f} s per rollout, "
              f"{totals[f'{name}_env_s'] / args.repeats:6.2f} s of it in the envs")
    overhead = totals["pool_s"] / totals["local_s"] - 1
    per_round_ms = 1000 * (totals["pool_env_s"] - totals["local_env_s"]) / max(1, len(calls))
    print(f"  pool overhead on rollout wall time: {overhead:+.1%}  (env-side: {per_round_ms:+.1f} ms per batch call)")
    pool.close()
    if cluster is not None:
        import ray

        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()

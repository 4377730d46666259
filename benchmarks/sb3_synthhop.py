"""Stable-Baselines3 PPO on SynthHop through the fixed-space adapter, against a random policy, same run.

    python benchmarks/sb3_synthhop.py --hops 1 --timesteps 15000

Prints held-out EM of random vs trained PPO and their ratio.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.adapters.candidate_actions import CandidateActionWrapper


def make(split: str, hops: int) -> CandidateActionWrapper:
    env = gym.make("AgentR1-SynthHop-v0", hops=hops, num_pages=2000, num_questions=300, split=split)
    return CandidateActionWrapper(env.unwrapped)


def held_out_em(model, hops: int, episodes: int) -> float:
    env = make("test", hops)
    total = 0.0
    for index in range(episodes):
        observation, _ = env.reset(seed=index, options={"task_index": index})
        done = False
        while not done:
            action = model.predict(observation, deterministic=True)[0] if model else env.action_space.sample()
            observation, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        total += info["reward_components"]["em"]
    return total / episodes


def main() -> None:
    from stable_baselines3 import PPO

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hops", type=int, default=1)
    parser.add_argument("--timesteps", type=int, default=15_000)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random_em = held_out_em(None, args.hops, args.episodes)
    start = time.perf_counter()
    model = PPO("MlpPolicy", make("train", args.hops), n_steps=512, batch_size=64, seed=args.seed, verbose=0)
    model.learn(args.timesteps)
    seconds = time.perf_counter() - start
    ppo_em = held_out_em(model, args.hops, args.episodes)
    print(f"| policy | held-out EM ({args.hops}-hop, {args.episodes} episodes) |\n|---|---|")
    print(f"| random | {random_em:.3f} |\n| SB3 PPO ({args.timesteps} steps, {seconds:.0f} s) | {ppo_em:.3f} |")
    print(f"PPO / random EM ratio: {ppo_em / max(random_em, 1e-9):.1f}x")


if __name__ == "__main__":
    main()

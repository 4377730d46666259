"""Precision on CPU: SmolLM2-135M training speed and learning in fp32, bf16 autocast, pure bf16 and LoRA over bf16.

Four ways to train the same model on the same SFT rows (oracle episodes of AgentR1-SynthHop-v0, hops=1,
top_k=3, tokenized by `agent_gym.trainers.token_episode.tokenize_episode`, loss `weighted_lm_loss` on assistant tokens):

- `fp32`:       fp32 weights, fp32 compute (the reference every ratio is against);
- `autocast`:   fp32 master weights, forward and backward under `torch.autocast(bfloat16)` (what `agent-gym sft`
                does for a full fine-tune with `--dtype bfloat16`);
- `bf16`:       the weights themselves in bf16, AdamW on bf16 parameters (no fp32 master copy);
- `lora-bf16`:  a frozen bf16 base with rank-`--lora-rank` adapters in fp32 on every linear layer (`--lora-rank`).

Three measurements, all in one process and on one torch thread, so machine load hits every variant alike:

0. matmul: GFLOP/s of one SmolLM2-sized matmul (512x576 @ 576x1536) in fp32 and bf16, interleaved
   (`--matmul-only` runs just this, in seconds);

1. speed: forward + backward tokens/s on the same batch. All four models are alive at once and the timed
   passes are interleaved round-robin (`--speed-rounds` rounds); the ratio is each variant's tokens/s over
   fp32's, summed over the rounds.
2. learning: the same `--learn-steps` AdamW steps (batch `--batch-size`, constant lr, grad clip 1) on the same
   batches in the same order, starting from the same weights; reported: the training loss of the first and last
   steps, and the loss on `--eval-episodes` held-out oracle episodes (later task indices) after training, each
   evaluated the same way (bf16 autocast over fp32 copies of the trained weights). Full fine-tunes use `--lr`;
   LoRA uses `--lora-lr` (adapters need a larger rate).

    OMP_NUM_THREADS=1 python benchmarks/precision.py                 # ~20 minutes when other jobs hold both cores
    OMP_NUM_THREADS=1 python benchmarks/precision.py --speed-rounds 3 --learn-steps 8 --batch-size 2

Results go to benchmarks/results/precision.json (`--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agent_gym.evaluation import iter_episodes
from agent_gym.models.model_init import load_model_and_tokenizer
from agent_gym.models.precision import cpu_has_fast_bf16
from agent_gym.trainers.token_episode import tokenize_episode
from agent_gym.warmstart.lm_loss import WeightedRow, weighted_lm_loss

VARIANTS = ("fp32", "autocast", "bf16", "lora-bf16")


@dataclass
class Variant:
    """One way to train: its model and whether its forward/backward runs under bf16 autocast."""

    name: str
    model: torch.nn.Module
    autocast: bool

    def context(self) -> Any:
        if self.autocast:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def make_variant(name: str, base: torch.nn.Module, lora_rank: int, share: bool = False) -> Variant:
    """A fresh copy of the fp32 ``base`` set up as ``name`` (``share``: fp32 and autocast use ``base`` itself)."""
    model = base if share and name in ("fp32", "autocast") else copy.deepcopy(base)
    if name in ("bf16", "lora-bf16"):
        model = model.to(torch.bfloat16)
    if name == "lora-bf16":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)  # peft keeps the adapters in fp32 over the bf16 base
    model.train()
    return Variant(name, model, autocast=name == "autocast")


def oracle_rows(tokenizer: Any, episodes: int, offset: int, env_kwargs: dict, seq_len: int) -> list[WeightedRow]:
    """SFT rows of ``episodes`` oracle episodes from task ``offset`` on, cut to ``seq_len`` tokens."""
    from agent_gym.make import make_env
    from agent_gym.policies import make_policy

    env = make_env("AgentR1-SynthHop-v0", env_kwargs)
    try:
        played = list(iter_episodes(env, make_policy("oracle"), episodes, seed=offset, task_offset=offset,
                                    keep_messages=True, progress=False))
    finally:
        env.close()
    rows = []
    for episode in played:
        example = tokenize_episode(tokenizer, episode.messages)
        rows.append(WeightedRow(example.input_ids[:seq_len], [float(f) for f in example.loss_mask[:seq_len]]))
    return rows


def forward_backward(variant: Variant, rows: Sequence[WeightedRow], pad_id: int) -> float:
    """One forward + backward pass over ``rows``; returns the loss."""
    with variant.context():
        loss = weighted_lm_loss(variant.model, rows, pad_id)
    loss.backward()
    return loss.item()


def bench_speed(variants: Sequence[Variant], rows: Sequence[WeightedRow], pad_id: int, rounds: int) -> dict:
    """Forward + backward tokens/s of each variant, passes interleaved round-robin (one warm-up pass each)."""
    tokens = sum(len(row.input_ids) for row in rows)
    seconds = {v.name: 0.0 for v in variants}
    per_round: dict[str, list[float]] = {v.name: [] for v in variants}
    for round_index in range(rounds + 1):
        for variant in variants:
            variant.model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            forward_backward(variant, rows, pad_id)
            elapsed = time.perf_counter() - started
            variant.model.zero_grad(set_to_none=True)
            if round_index:  # round 0 is the warm-up
                seconds[variant.name] += elapsed
                per_round[variant.name].append(tokens / elapsed)
            print(f"  speed round {round_index}/{rounds} {variant.name:10s} {tokens / elapsed:8.1f} tok/s"
                  f"{'  (warm-up)' if not round_index else ''}", flush=True)
    reference = seconds["fp32"]
    return {
        name: {
            "tokens_per_s": rounds * tokens / s,
            "per_round_tokens_per_s": per_round[name],
            "speedup_vs_fp32": reference / s,
        }
        for name, s in seconds.items()
    }


def bench_matmul(rounds: int = 3, repeats: int = 10) -> dict[str, float]:
    """GFLOP/s of a 512x576 @ 576x1536 matmul (an MLP projection of a 512-token pass) in fp32 and bf16."""
    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    flops = 2 * 512 * 576 * 1536 * repeats
    seconds = {"fp32": 0.0, "bf16": 0.0}
    for round_index in range(rounds + 1):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            x, y = a.to(dtype), b.to(dtype)
            started = time.perf_counter()
            for _ in range(repeats):
                x @ y
            if round_index:  # round 0 is the warm-up
                seconds[name] += time.perf_counter() - started
    result = {f"{name}_gflops": rounds * flops / s / 1e9 for name, s in seconds.items()}
    result["bf16_over_fp32"] = seconds["fp32"] / seconds["bf16"]
    print(f"matmul 512x576 @ 576x1536: fp32 {result['fp32_gflops']:.1f} GFLOP/s, bf16 {result['bf16_gflops']:.1f}"
          f" GFLOP/s, bf16/fp32 {result['bf16_over_fp32']:.2f}x", flush=True)
    return result


def batches(rows: Sequence[WeightedRow], batch_size: int, steps: int) -> Iterator[list[WeightedRow]]:
    for step in range(steps):
        start = (step * batch_size) % len(rows)
        yield [rows[(start + i) % len(rows)] for i in range(batch_size)]


@torch.no_grad()
def eval_loss(model: torch.nn.Module, rows: Sequence[WeightedRow], pad_id: int) -> float:
    """Mean held-out loss (one row at a time), bf16 autocast over an fp32 copy: the same evaluator for all."""
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    else:
        model = copy.deepcopy(model)
    model = model.float().eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = [weighted_lm_loss(model, [row], pad_id).item() for row in rows]
    return sum(losses) / len(losses)


def bench_learning(name: str, base: torch.nn.Module, train: Sequence[WeightedRow], held_out: Sequence[WeightedRow],
                   pad_id: int, args: argparse.Namespace) -> dict:
    """``args.learn_steps`` AdamW steps of ``name`` from ``base`` on the same batches; losses and step time."""
    torch.manual_seed(args.seed)
    variant = make_variant(name, base, args.lora_rank)
    trainable = variant.trainable()
    lr = args.lora_lr if name == "lora-bf16" else args.lr
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    losses, seconds = [], 0.0
    for batch in batches(train, args.batch_size, args.learn_steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        losses.append(forward_backward(variant, batch, pad_id))
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        seconds += time.perf_counter() - started
        print(f"  learn {name:10s} step {len(losses)}/{args.learn_steps} loss {losses[-1]:.4f}", flush=True)
    held = eval_loss(variant.model, held_out, pad_id)
    print(f"  learn {name:10s} held-out loss {held:.4f}", flush=True)
    del variant, optimizer
    return {"lr": lr, "train_losses": losses, "first_loss": losses[0], "last_loss": losses[-1],
            "held_out_loss": held, "seconds_per_step": seconds / len(losses)}


def machine() -> dict[str, Any]:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": uptime, "cpus": os.cpu_count(), "fast_bf16_cpu": cpu_has_fast_bf16(),
            "torch": torch.__version__, "python": platform.python_version()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=1024, help="rows are cut to this many tokens")
    parser.add_argument("--batch-size", type=int, default=1, help="rows per forward/backward pass")
    parser.add_argument("--speed-rounds", type=int, default=2, help="timed passes per variant (after a warm-up)")
    parser.add_argument("--learn-steps", type=int, default=5, help="AdamW steps per variant (0: skip learning)")
    parser.add_argument("--train-episodes", type=int, default=8)
    parser.add_argument("--eval-episodes", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora-lr", type=float, default=1e-3)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--matmul-only", action="store_true", help="only the matmul measurement (no model)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "precision.json"))
    args = parser.parse_args(argv)
    names = [name for name in args.variants.split(",") if name]
    if "fp32" not in names or any(name not in VARIANTS for name in names):
        parser.error(f"--variants must include fp32 (the reference) and name only {VARIANTS}")
    torch.set_num_threads(args.torch_threads)
    env_kwargs = {"hops": 1, "top_k": 3}

    info = machine()
    print(f"{info['uptime']}\ntorch threads {torch.get_num_threads()}, fast bf16 CPU: {info['fast_bf16_cpu']}")
    matmul = bench_matmul()
    if args.matmul_only:
        print(machine()["uptime"])
        return 0
    base, tokenizer = load_model_and_tokenizer(args.model, dtype=torch.float32)
    pad_id = tokenizer.pad_token_id
    train = oracle_rows(tokenizer, args.train_episodes, 0, env_kwargs, args.seq_len)
    held_out = oracle_rows(tokenizer, args.eval_episodes, 10_000, env_kwargs, args.seq_len)
    speed_rows = train[: args.batch_size]
    tokens = sum(len(row.input_ids) for row in speed_rows)
    print(f"{args.model}: SFT rows of AgentR1-SynthHop-v0 {env_kwargs} oracle episodes, cut to {args.seq_len} "
          f"tokens; speed batch {len(speed_rows)} rows = {tokens} tokens, {args.speed_rounds} interleaved rounds")

    variants = [make_variant(name, base, args.lora_rank, share=True) for name in names]  # speed only: no steps
    speed = bench_speed(variants, speed_rows, pad_id, args.speed_rounds)
    del variants
    learning = {}
    if args.learn_steps:
        print(f"learning: {args.learn_steps} steps x {args.batch_size} rows, the same batches for every variant")
        for name in names:
            learning[name] = bench_learning(name, base, train, held_out, pad_id, args)
        start_loss = eval_loss(base, held_out, pad_id)
        learning["untrained_held_out_loss"] = start_loss

    print(f"\nforward+backward, {tokens} tokens a pass, torch threads {args.torch_threads}")
    print(f"{'variant':12s} {'tok/s':>8s} {'vs fp32':>8s} {'first loss':>11s} {'last loss':>10s} "
          f"{'held-out':>9s} {'s/step':>7s}")
    for name in names:
        row = f"{name:12s} {speed[name]['tokens_per_s']:8.1f} {speed[name]['speedup_vs_fp32']:7.2f}x"
        if name in learning:
            result = learning[name]
            row += (f" {result['first_loss']:11.4f} {result['last_loss']:10.4f} {result['held_out_loss']:9.4f}"
                    f" {result['seconds_per_step']:7.1f}")
        print(row)
    if learning:
        print(f"untrained held-out loss: {learning['untrained_held_out_loss']:.4f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    record = {"command": f"OMP_NUM_THREADS={threads} python benchmarks/precision.py {command}",
              "machine": info, "uptime_after": machine()["uptime"], "settings": vars(args), "speed_tokens": tokens,
              "matmul": matmul, "speed": speed, "learning": learning}
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

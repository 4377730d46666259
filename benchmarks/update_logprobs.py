"""The update's forward and backward on SmolLM2 + LoRA: log-probs from the hidden states against the logits path.

One micro-batch of the RL update (``--rows`` samples of one GRPO group: a shared prompt of ``--prompt`` tokens and
``--response`` tokens of each row's own), through `packed_logprobs` (the group's prompt once, no padding) and a
policy-gradient-like loss, forward and backward, under the update's bf16 autocast. Five variants, interleaved
round-robin in one process on one thread, so machine load hits each alike:

- ``logits``: the model's own logits for the response positions, log-softmax and entropy over them, under plain
  ``torch.autocast`` (peft casts every adapter input to fp32 and autocast casts it back): the path before
  `trainers/head_logprobs.py`;
- ``head``: log-probs and entropies from the hidden states in chunks (`head_logprobs`), plain autocast;
- ``logits+cast-off`` / ``head+cast-off`` (the trainer's path): the same under `bf16_autocast`, which turns
  peft's input cast off;
- ``head+cast-off+lean``: that path with `trainers/lean_activations.py` (`TrainConfig.lean_activations`): every
  MLP recomputed in the backward, RMSNorms keeping their bf16 input.

Every variant computes the same log-probs (to float rounding; printed). Reported per variant: the median seconds
of a forward+backward over ``--rounds`` rounds, and the peak resident memory above the model during it; ratios
against ``logits``. With ``--lora-layers N`` the adapters sit on the top N layers only.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/update_logprobs.py                  # ~5 minutes, quiet core
    OMP_NUM_THREADS=1 python benchmarks/update_logprobs.py --rounds 2 --lora-layers 8

Results go to benchmarks/results/update_logprobs.json (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from agent_gym.models.host_memory import release_freed_memory, resident_mb
from agent_gym.models.lora_setup import add_lora
from agent_gym.models.model_init import load_model_and_tokenizer
from agent_gym.models.precision import bf16_autocast, cpu_model
from agent_gym.models.pretrained import get_model
from agent_gym.trainers import packed_forward
from agent_gym.trainers.lean_activations import install_lean_activations

VARIANTS = ("logits", "head", "logits+cast-off", "head+cast-off", "head+cast-off+lean")


class PeakMemory:
    """The process's peak resident memory, sampled every 10 ms on a thread, above a baseline taken at entry."""

    def __enter__(self) -> PeakMemory:
        release_freed_memory()
        self.base = resident_mb() or 0.0
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, resident_mb() or 0.0)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def above_base_mb(self) -> float:
        return self.peak - self.base


@contextlib.contextmanager
def _variant(model: torch.nn.Module, name: str) -> Iterator[None]:
    """The variant's head path and autocast, restored on exit."""
    split_head = packed_forward.split_head
    if name.startswith("logits"):
        packed_forward.split_head = lambda model: None  # type: ignore[assignment]
    autocast = bf16_autocast(model, "cpu") if "cast-off" in name else torch.autocast("cpu", torch.bfloat16)
    restore = install_lean_activations(model) if name.endswith("+lean") else (lambda: None)
    try:
        with autocast:
            yield
    finally:
        packed_forward.split_head = split_head  # type: ignore[assignment]
        restore()


def one_pass(model: torch.nn.Module, batch: dict[str, torch.Tensor], name: str) -> tuple[float, float, torch.Tensor]:
    """Seconds and peak MB above the start of one forward+backward, and the log-probs (detached)."""
    model.zero_grad(set_to_none=True)
    with PeakMemory() as memory:
        started = time.perf_counter()
        with _variant(model, name):
            out = packed_forward.packed_logprobs(model, batch["ids"], batch["lengths"], batch["prompts"],
                                                 batch["groups"], 1.0, entropy=True)
        # an advantage-weighted loss over the response tokens, as the policy loss is
        (-(out.logprobs * batch["advantages"]).sum() / batch["advantages"].count_nonzero()).backward()
        seconds = time.perf_counter() - started
    return seconds, memory.above_base_mb, out.logprobs.detach()


def make_batch(rows: int, prompt: int, response: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, vocab, (1, prompt), generator=generator)
    ids = torch.cat([shared.repeat(rows, 1), torch.randint(0, vocab, (rows, response), generator=generator)], 1)
    advantages = torch.zeros(ids.shape)
    advantages[:, prompt:] = torch.randn(rows, 1, generator=generator)  # one advantage per row, GRPO-like
    return {"ids": ids, "lengths": torch.full((rows,), prompt + response), "prompts": torch.full((rows,), prompt),
            "groups": torch.zeros(rows, dtype=torch.long), "advantages": advantages}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, _ = load_model_and_tokenizer(get_model(args.model), dtype=torch.bfloat16)
    model = add_lora(model, rank=args.lora_rank, alpha=2 * args.lora_rank, top_layers=args.lora_layers)
    model.train()
    batch = make_batch(args.rows, args.prompt, args.response, model.config.vocab_size, args.seed)
    seconds: dict[str, list[float]] = {name: [] for name in args.variants}
    memory: dict[str, list[float]] = {name: [] for name in args.variants}
    logprobs: dict[str, torch.Tensor] = {}
    for name in args.variants:  # warm-up (and the split check) outside the timing
        logprobs[name] = one_pass(model, batch, name)[2]
    for round_index in range(args.rounds):
        for name in args.variants:
            took, peak, _ = one_pass(model, batch, name)
            seconds[name].append(took)
            memory[name].append(peak)
            print(f"round {round_index + 1}/{args.rounds} {name}: {took:.1f} s, +{peak:.0f} MB", flush=True)
    reference = args.variants[0]
    mask = batch["advantages"] != 0
    result: dict[str, Any] = {
        "model": args.model, "cpu": cpu_model(), "threads": args.threads, "rows": args.rows, "prompt": args.prompt,
        "response": args.response, "lora_rank": args.lora_rank, "lora_layers": args.lora_layers,
        "rounds": args.rounds, "load": os.getloadavg(), "torch": torch.__version__, "variants": {},
    }
    for name in args.variants:
        median = statistics.median(seconds[name])
        result["variants"][name] = {
            "seconds": seconds[name], "median_s": median, "peak_mb": memory[name],
            "median_peak_mb": statistics.median(memory[name]),
            "speedup_vs_" + reference: statistics.median(seconds[reference]) / median,
            "memory_vs_" + reference: statistics.median(memory[name]) / statistics.median(memory[reference]),
            "max_abs_logprob_diff_vs_" + reference: float((logprobs[name] - logprobs[reference])[mask].abs().max()),
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4, help="samples of the group in the micro-batch")
    parser.add_argument("--prompt", type=int, default=300, help="the group's shared prompt tokens")
    parser.add_argument("--response", type=int, default=530, help="each row's own tokens after it")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-layers", type=int, default=0, help="0: every layer; N: the top N")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "update_logprobs.json"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    for name, row in result["variants"].items():
        reference = args.variants[0]
        print(f"{name:>16}: {row['median_s']:6.1f} s ({row['speedup_vs_' + reference]:.2f}x), "
              f"+{row['median_peak_mb']:.0f} MB ({row['memory_vs_' + reference]:.2f}x), "
              f"max |log-prob diff| {row['max_abs_logprob_diff_vs_' + reference]:.2e}")
    if not args.no_write:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

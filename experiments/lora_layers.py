"""LoRA on every layer against LoRA on the top layers only, on the warm-start sweep's setting (issue 26).

The warm start that RL starts from (the sweep's 75 % share: 160 `oracle` episodes of world 0, LoRA r16, 1 epoch,
batch 4, lr 5e-4) is trained once per layer setting, each timed in its own process on one thread, then played
greedily on world 7's test split (``--eval-questions`` of each hop count, as the sweep's table):

    python experiments/lora_layers.py --layers 0 8            # 0: every layer (the sweep's own recipe)
    python experiments/lora_layers.py --layers 0 8 --publish  # also docs/results/lora_layers.json
    python experiments/lora_layers.py --layers 0 8 --epochs 3  # the 3-epoch sweep's recipe (warm75-e3-...)

Resumable: a finished SFT or eval is read back from OUT, not redone. The SFT seconds of both settings come from this
script's runs on one machine, so their ratio is fair; run it when nothing else does (each SFT about 15 minutes on
one loaded Xeon thread).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import ENV_ID, ROOT, _agent_gym, _run, fresh_flags  # noqa: E402
from real_model import MODEL, TRAIN_ENV  # noqa: E402
from warmstart_sweep import SHARES, measure, sweep_tag  # noqa: E402

SHARE = 75


def setting_name(layers: int, epochs: int = 1) -> str:
    return f"warm{SHARE}{sweep_tag(epochs)}-{'all' if layers == 0 else f'top{layers}'}"


def sft(args: argparse.Namespace, layers: int) -> tuple[Path, float]:
    """The warm start with adapters on every layer (0) or the top ``layers``; its SFT wall seconds."""
    name = setting_name(layers, args.epochs)
    out_dir = Path(args.out) / name
    seconds_file = out_dir / "sft_seconds.json"
    if seconds_file.is_file():
        return out_dir, json.loads(seconds_file.read_text())["seconds"]
    started = time.perf_counter()
    _run(_agent_gym("sft", "--env", ENV_ID, "--env-kwargs", json.dumps({**TRAIN_ENV, "hops": SHARES[SHARE]}),
                    "--policy", "oracle", "--model", args.model, "--output-dir", str(out_dir),
                    "--episodes", "160", "--epochs", str(args.epochs), "--batch-size", "4", "--lr", "5e-4",
                    "--lora-rank", "16", "--lora-layers", str(layers), "--dtype", args.dtype,
                    "--torch-threads", "1", "--seed", "0", *fresh_flags(out_dir)),
         Path(args.out) / "logs" / f"sft-{name}.log", f"sft {name}")
    seconds = time.perf_counter() - started
    seconds_file.write_text(json.dumps({"seconds": seconds}))
    return out_dir, seconds


def evaluate(args: argparse.Namespace, layers: int, adapter: Path) -> dict[str, dict]:
    """Greedy EM and second-search rate on each hop count (cached in OUT/NAME_eval.json)."""
    path = Path(args.out) / f"{setting_name(layers, args.epochs)}_eval.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    todo = [key for key in ("greedy_1hop", "greedy_2hop") if key not in result]
    if todo:
        from agent_gym.models.model_init import load_model_and_tokenizer
        from agent_gym.models.precision import resolve_dtype

        dtype = resolve_dtype(args.dtype)
        model, tokenizer = load_model_and_tokenizer(adapter, dtype=dtype)
        for key in todo:
            result[key] = measure(model, tokenizer, key, args.eval_questions, str(dtype))
            path.with_suffix(".tmp").write_text(json.dumps(result, indent=2))
            os.replace(path.with_suffix(".tmp"), path)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", type=int, default=[0, 8], help="0: every layer; N: the top N")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--out", default=str(Path.home() / "agent-gym-runs" / "lora_layers"))
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--eval-questions", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1, help="SFT epochs of both settings (the sweep's: 1 or 3)")
    parser.add_argument("--publish", action="store_true")
    args = parser.parse_args(argv)
    Path(args.out, "logs").mkdir(parents=True, exist_ok=True)
    rows = {}
    for layers in args.layers:
        adapter, seconds = sft(args, layers)
        evaluation = evaluate(args, layers, adapter)
        name = setting_name(layers, args.epochs)
        rows[name] = {
            "lora_layers": layers, "sft_seconds": round(seconds, 1),
            **{f"{key}_em": evaluation[key]["em"] for key in ("greedy_1hop", "greedy_2hop")},
            **{f"{key}_second_search": evaluation[key]["multihop"] for key in ("greedy_1hop", "greedy_2hop")},
        }
        print(name, json.dumps(rows[name]), flush=True)
    if 0 in args.layers:
        base = rows[setting_name(0, args.epochs)]["sft_seconds"]
        for row in rows.values():
            row["sft_speedup_vs_all"] = round(base / row["sft_seconds"], 2)
    from agent_gym.models.precision import cpu_model

    report = {"model": args.model, "share": SHARE, "epochs": args.epochs, "cpu": cpu_model(),
              "eval_questions": args.eval_questions, "rows": rows}
    if args.publish:
        tag = sweep_tag(args.epochs).replace("-", "_")
        (ROOT / "docs" / "results" / f"lora_layers{tag}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

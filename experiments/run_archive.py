"""RL runs in and out of a machine that keeps nothing: an archive a run: adapter (bf16), metrics, curve and log.

The borrowed GPU machine (scripts/device_campaign.sh) is given back with everything on it, and its tool returns at
most 8 files of 16 MB. ``pack`` turns each run of a campaign's OUT into OUT_FILES/RUN.tar.gz (about 9 MB for
SmolLM2's LoRA r16), from the run's newest checkpoint (a run stopped at its time budget saved its step there, after
its last chunk's final/); ``unpack`` puts them back here:

    python experiments/run_archive.py pack /tmp/agent-gym-runs/rl-e3 $OUT         # there
    python experiments/run_archive.py unpack /work/.device/FILES ~/agent-gym-runs/rl-e3-gpu   # here

An archive holds ``experiments/checkpoints/rl-RUN/`` (the adapter in bf16 with ``progress.json``, the layout that
``rl_campaign.py --from-repo`` continues from, with a fresh optimizer) and ``rl/RUN/`` and ``logs/`` (the run's
metrics, curve, devices, settings and log). ``unpack`` writes the first into this repository and the rest under
its second argument, never into a campaign's own OUT (whose run directories hold checkpoints to resume).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_FILES = ("metrics.jsonl", "curve.json", "devices.json", "run_config.json")
ADAPTER_FILES = ("adapter_config.json",)


def _bf16_adapter(policy: Path) -> bytes:
    """The checkpoint's adapter weights in bf16 (peft loads them back into fp32 adapters)."""
    import torch
    from safetensors.torch import load_file, save

    weights = load_file(str(policy / "adapter_model.safetensors"))
    tensors = {key: value.to(torch.bfloat16) for key, value in weights.items()}
    return save(tensors, metadata={"format": "pt"})


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def pack(runs: Path, out: Path) -> list[Path]:
    """One ``RUN.tar.gz`` in ``out`` for each run under ``runs/rl`` that has a checkpoint; the archives written."""
    from agent_gym.trainers.checkpoint import list_checkpoints

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for directory in sorted(path for path in (runs / "rl").glob("*") if path.is_dir()):
        checkpoints = list_checkpoints(directory)
        if not checkpoints:
            print(f"{directory.name}: no checkpoint to bring back", flush=True)
            continue
        step = int(checkpoints[-1].name.rsplit("_", 1)[-1])
        policy = checkpoints[-1] / "policy"
        published = f"experiments/checkpoints/rl-{directory.name}"
        path = out / f"{directory.name}.tar.gz"
        with tarfile.open(path, "w:gz") as archive:
            _add_bytes(archive, f"{published}/adapter_model.safetensors", _bf16_adapter(policy))
            for name in ADAPTER_FILES:
                archive.add(policy / name, arcname=f"{published}/{name}")
            _add_bytes(archive, f"{published}/progress.json",
                       json.dumps({"step": step, "run": directory.name}).encode())
            for name in RUN_FILES:
                if (directory / name).is_file():
                    archive.add(directory / name, arcname=f"rl/{directory.name}/{name}")
                    if name in ("metrics.jsonl", "curve.json"):  # beside the adapter too, as publish_run does
                        archive.add(directory / name, arcname=f"{published}/{name}")
            if (log := runs / "logs" / f"{directory.name}.log").is_file():
                archive.add(log, arcname=f"logs/{log.name}")
        written.append(path)
        print(f"{directory.name}: step {step}, {path.stat().st_size / 2**20:.1f} MB", flush=True)
    # the campaign's own records: its log, timings and the warm start's curve point
    path = out / "campaign.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for item in sorted([*runs.glob("*.json"), *runs.glob("*.log")]):
            archive.add(item, arcname=f"campaign/{item.name}")
    written.append(path)
    return written


def unpack(archives: Sequence[Path], records: Path, repository: Path = ROOT) -> list[str]:
    """Each archive's adapter into ``repository``, its run files under ``records``; the runs unpacked.

    Refuses an archive whose members leave those folders (an absolute path, ``..``, a link)."""
    done = []
    for path in archives:
        with tarfile.open(path, "r:gz") as archive:
            members = archive.getmembers()
            for member in members:
                parts = Path(member.name).parts
                if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                    raise SystemExit(f"{path}: refusing member {member.name!r} (outside the run's folders)")
                if parts[:2] != ("experiments", "checkpoints") and parts[0] not in ("rl", "logs", "campaign"):
                    raise SystemExit(f"{path}: unexpected member {member.name!r}")
            for member in members:
                parts = Path(member.name).parts
                root = repository if parts[0] == "experiments" else records
                target = root / member.name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                extracted = archive.extractfile(member)
                assert extracted is not None
                target.write_bytes(extracted.read())
        done.append(path.name.removesuffix(".tar.gz"))
        print(f"unpacked {path.name}", flush=True)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="each run of a campaign's OUT into OUT_FILES/RUN.tar.gz")
    packing.add_argument("runs", type=Path, help="the campaign's --out")
    packing.add_argument("out", type=Path, help="where the archives go ($OUT on the device machine)")
    unpacking = commands.add_parser("unpack", help="archives back: adapters into the repository, the rest aside")
    unpacking.add_argument("files", type=Path, help="a folder of RUN.tar.gz (the device tool's files_at)")
    unpacking.add_argument("records", type=Path, help="where the runs' metrics, curves and logs go")
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.runs, args.out)
        return 0
    archives = sorted(args.files.glob("*.tar.gz"))
    if not archives:
        raise SystemExit(f"no *.tar.gz in {args.files}")
    unpack(archives, args.records)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where dataset files live, and how to fetch the official ones on first use.

Files are cached under ``cache_dir() / "datasets" / <dataset>/`` (``~/.cache/agent-gym/datasets/<dataset>/``).
:func:`fetch` returns the cached file, downloading it (with a progress bar and a sha256 check) when it is
missing. Without network, or with ``AGENT_GYM_OFFLINE=1``, it raises :class:`DatasetNotAvailable`, whose message
names the file and the exact path to put it at. ``HF_HUB_OFFLINE=1`` (Hugging Face's own switch) stops every
download from the Hub (MuSiQue's file comes from there) and nothing else. Compressed copies (``.gz``, ``.xz``)
placed there load too.

HotpotQA has two settings: ``distractor`` (the default) and ``fullwiki``, whose dev file holds the same
questions with the paragraphs an IR system retrieved from all of Wikipedia (one training file serves both).

Checksums: where the table below knows a file's sha256 it is enforced. Otherwise the first download's
sha256 is recorded in ``checksums.json`` beside the files and enforced on any later download, so a
changed or truncated upstream file is caught rather than silently trained on.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from agent_gym.cache_root import DATA_DIR_ENV, data_root
from agent_gym.error import AgentGymError, InvalidValue

OFFLINE_ENV = "AGENT_GYM_OFFLINE"
HF_OFFLINE_ENV = "HF_HUB_OFFLINE"
_HUB_HOSTS = ("huggingface.co", "hf.co")
DATASET_NAMES = ("hotpotqa", "2wikimultihopqa", "musique")
SPLITS = ("dev", "train")
_NAME_ALIASES = {
    "hotpotqa": "hotpotqa",
    "hotpot_qa": "hotpotqa",
    "hotpot": "hotpotqa",
    "2wikimultihopqa": "2wikimultihopqa",
    "2wiki": "2wikimultihopqa",
    "twowiki": "2wikimultihopqa",
    "2wikimqa": "2wikimultihopqa",
    "musique": "musique",
}
_SPLIT_ALIASES = {"dev": "dev", "validation": "dev", "val": "dev", "train": "train"}
_COMPRESSED_SUFFIXES = (".gz", ".xz")
_CHUNK_BYTES = 1 << 20
_LEDGER_NAME = "checksums.json"


@dataclass
class DatasetFileConfig:
    """Which official dataset file ``agent-gym data fetch`` and ``data where`` look for (their flags come from
    these fields): ``fetch(config.name, config.split, setting=config.setting)``."""

    name: str = field(metadata={"positional": True, "help": "hotpotqa, 2wikimultihopqa or musique"})
    split: str = field(default="dev", metadata={"help": "dev or train"})
    setting: str | None = field(default=None, metadata={"help": "HotpotQA only: distractor (default) or fullwiki"})


class DatasetNotAvailable(AgentGymError, FileNotFoundError):
    """A dataset file is neither on disk nor downloadable; the message says where to put it."""


class DatasetChecksumError(AgentGymError, ValueError):
    """A downloaded file's sha256 differs from the known or first-recorded one."""


@dataclass(frozen=True)
class RemoteFile:
    """One official dataset file and where to download it.

    Attributes:
        filename: the official file name the loader reads.
        url: where to download it (or the archive holding it).
        origin: the authors' page for the file, shown in error messages.
        sha256: the downloaded object's digest when known (the archive's, when ``archive_name`` is set).
        archive_name: set when ``url`` serves a zip that holds ``filename``.
        archive_members: other files to extract from the same archive (e.g. an alias table).
    """

    filename: str
    url: str
    origin: str
    sha256: str | None = None
    archive_name: str | None = None
    archive_members: tuple[str, ...] = ()


@dataclass(frozen=True)
class HubSource:
    """The Hugging Face ``datasets`` coordinates of a split (used with ``source="hf"``)."""

    repo_id: str
    config: str | None
    split: str


_HOTPOT_ORIGIN = "https://hotpotqa.github.io"
_TWOWIKI_ZIP = "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1"
_TWOWIKI_ORIGIN = "https://github.com/Alab-NII/2wikimultihop (data_ids_april7.zip, linked in its README)"
_MUSIQUE_HUB = "https://huggingface.co/datasets/dgslibisey/MuSiQue/resolve/main/"
_MUSIQUE_ORIGIN = (
    "https://github.com/StonyBrookNLP/musique (musique_v1.0.zip on Google Drive, "
    "id 1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h; the file is downloaded from its Hub copy dgslibisey/MuSiQue)"
)

# No sha256 is pinned: we could not verify one from here, so the first download's digest is recorded.
OFFICIAL_FILES: dict[tuple[str, str], RemoteFile] = {
    ("hotpotqa", "dev"): RemoteFile(
        "hotpot_dev_distractor_v1.json",
        "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
        _HOTPOT_ORIGIN,
    ),
    ("hotpotqa", "train"): RemoteFile(
        "hotpot_train_v1.1.json",
        "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json",
        _HOTPOT_ORIGIN,
    ),
    # The April-7-2021 release fixes sentence segmentation and carries evidences_id / answer_id;
    # id_aliases.json maps those Wikidata ids to the answer aliases the official evaluation accepts.
    ("2wikimultihopqa", "dev"): RemoteFile(
        "dev.json",
        _TWOWIKI_ZIP,
        _TWOWIKI_ORIGIN,
        None,
        "data_ids_april7.zip",
        ("train.json", "id_aliases.json"),
    ),
    ("2wikimultihopqa", "train"): RemoteFile(
        "train.json",
        _TWOWIKI_ZIP,
        _TWOWIKI_ORIGIN,
        None,
        "data_ids_april7.zip",
        ("dev.json", "id_aliases.json"),
    ),
    ("musique", "dev"): RemoteFile(
        "musique_ans_v1.0_dev.jsonl", _MUSIQUE_HUB + "musique_ans_v1.0_dev.jsonl", _MUSIQUE_ORIGIN
    ),
    ("musique", "train"): RemoteFile(
        "musique_ans_v1.0_train.jsonl", _MUSIQUE_HUB + "musique_ans_v1.0_train.jsonl", _MUSIQUE_ORIGIN
    ),
}

# Settings other than a dataset's default (the first listed), and their files.
SETTINGS: dict[str, tuple[str, ...]] = {"hotpotqa": ("distractor", "fullwiki")}
SETTING_FILES: dict[tuple[str, str, str], RemoteFile] = {
    ("hotpotqa", "dev", "fullwiki"): RemoteFile(
        "hotpot_dev_fullwiki_v1.json",
        "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_fullwiki_v1.json",
        _HOTPOT_ORIGIN,
    ),
    ("hotpotqa", "train", "fullwiki"): OFFICIAL_FILES[("hotpotqa", "train")],
}

HUB_SOURCES: dict[tuple[str, str], HubSource] = {
    ("hotpotqa", "dev"): HubSource("hotpotqa/hotpot_qa", "distractor", "validation"),
    ("hotpotqa", "train"): HubSource("hotpotqa/hotpot_qa", "distractor", "train"),
    ("musique", "dev"): HubSource("dgslibisey/MuSiQue", None, "validation"),
    ("musique", "train"): HubSource("dgslibisey/MuSiQue", None, "train"),
}


def canonical_name(name: str) -> str:
    """Map a dataset name or alias (``"2wiki"``, ``"hotpot_qa"``) to its canonical name."""
    key = name.strip().lower().replace("-", "")
    if key not in _NAME_ALIASES:
        raise InvalidValue(f"unknown dataset {name!r}; expected one of {', '.join(DATASET_NAMES)}")
    return _NAME_ALIASES[key]


def canonical_split(split: str) -> str:
    """Map ``"validation"``/``"val"`` to ``"dev"``; accept ``"dev"`` and ``"train"``."""
    key = split.strip().lower()
    if key not in _SPLIT_ALIASES:
        raise InvalidValue(
            f"unknown split {split!r}; expected one of {', '.join(SPLITS)} "
            "(the official test splits have no gold answers)"
        )
    return _SPLIT_ALIASES[key]


def cache_dir() -> Path:
    """The data cache root: ``$AGENT_GYM_DATA_DIR`` if set, else ``$AGENT_GYM_CACHE``, else ``~/.cache/agent-gym``
    (the root the converted models and compiled kernels share).

    Older versions kept data in ``~/.cache/agent_gym``: while that folder holds ``datasets/`` and the new root
    holds none, it is still the one read (and written), so nothing downloaded before is fetched again."""
    return data_root("datasets")


def dataset_dir(name: str, root: str | Path | None = None) -> Path:
    """The folder holding one dataset's files: ``<root or cache_dir()>/datasets/<name>``."""
    return Path(root if root is not None else cache_dir()) / "datasets" / canonical_name(name)


def canonical_setting(name: str, setting: str | None) -> str | None:
    """``None`` for a dataset's default setting (or one without settings); else the setting, checked."""
    settings = SETTINGS.get(canonical_name(name), ())
    if setting is None or (settings and setting == settings[0]):
        return None
    if setting not in settings:
        choices = f"choose one of {', '.join(settings)}" if settings else "it has none"
        raise InvalidValue(f"{canonical_name(name)} has no setting {setting!r}; {choices}")
    return setting


def remote_file(name: str, split: str, setting: str | None = None) -> RemoteFile:
    """The official file of a dataset split (in a setting: HotpotQA's ``fullwiki``)."""
    key = (canonical_name(name), canonical_split(split))
    setting = canonical_setting(name, setting)
    return OFFICIAL_FILES[key] if setting is None else SETTING_FILES[(*key, setting)]


def expected_path(name: str, split: str = "dev", root: str | Path | None = None, *,
                  setting: str | None = None) -> Path:
    """Where :func:`fetch` looks for (and downloads) a split's official file."""
    return dataset_dir(name, root) / remote_file(name, split, setting).filename


def find_data_file(directory: str | Path, filename: str) -> Path | None:
    """Return ``directory/filename`` or its ``.gz`` / ``.xz`` variant if one exists, else None."""
    directory = Path(directory)
    for candidate in (filename, *(filename + suffix for suffix in _COMPRESSED_SUFFIXES)):
        if (directory / candidate).is_file():
            return directory / candidate
    return None


def _is_true(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() in {"1", "true", "yes", "on"}


def is_offline() -> bool:
    """True when ``AGENT_GYM_OFFLINE`` is set to a true value: no download is attempted."""
    return _is_true(OFFLINE_ENV)


def is_hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (read as huggingface_hub reads it)."""
    return _is_true(HF_OFFLINE_ENV)


def _on_the_hub(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return any(host == hub or host.endswith(f".{hub}") for hub in _HUB_HOSTS)


def fetch(name: str, split: str = "dev", root: str | Path | None = None, *, timeout_s: float = 60.0,
          setting: str | None = None) -> Path:
    """Return the local path of a split's official file, downloading it on first use.

    Raises:
        DatasetNotAvailable: not cached and not downloadable (offline, or ``HF_HUB_OFFLINE`` set for a file on
            the Hugging Face Hub); the message names the file and its path.
        DatasetChecksumError: the download's sha256 does not match the known or recorded digest.
    """
    remote = remote_file(name, split, setting)
    directory = dataset_dir(name, root)
    found = find_data_file(directory, remote.filename)
    if found is not None:
        return found
    target = directory / remote.filename
    if is_offline():
        raise DatasetNotAvailable(
            _not_available_message(name, split, remote, target, f"{OFFLINE_ENV} is set")
        )
    if is_hub_offline() and _on_the_hub(remote.url):
        raise DatasetNotAvailable(
            _not_available_message(name, split, remote, target,
                                   f"{HF_OFFLINE_ENV} is set, so nothing is downloaded from the Hugging Face Hub")
        )
    downloaded = target if remote.archive_name is None else directory / remote.archive_name
    try:
        digest = download_file(remote.url, downloaded, timeout_s=timeout_s)
        _check_digest(remote, downloaded, digest)
        if remote.archive_name is not None:
            _extract_members(downloaded, directory, (remote.filename, *remote.archive_members))
    except (OSError, http.client.HTTPException, zipfile.BadZipFile) as error:
        raise DatasetNotAvailable(_not_available_message(name, split, remote, target, str(error))) from error
    finally:
        if downloaded != target:
            downloaded.unlink(missing_ok=True)
    if not target.is_file():
        raise DatasetNotAvailable(
            _not_available_message(
                name, split, remote, target, f"{remote.archive_name} holds no {remote.filename}"
            )
        )
    # Recorded only once the download proved usable, so an error page never becomes the reference.
    _record_digest(directory, downloaded.name, digest)
    return target


def fetch_hub_rows(name: str, split: str = "dev", setting: str | None = None) -> list[dict[str, Any]]:
    """Rows of a split from the Hugging Face Hub through the optional ``datasets`` library (which, with
    ``HF_HUB_OFFLINE`` set, reads only its own cache).

    Raises:
        DatasetNotAvailable: ``datasets`` is not installed, the split has no Hub source, or the Hub is
            unreachable.
    """
    key = (canonical_name(name), canonical_split(split))
    setting = canonical_setting(name, setting)
    if key not in HUB_SOURCES:
        raise DatasetNotAvailable(
            f"{key[0]} has no Hugging Face source here; use the official file: {expected_path(*key)}"
        )
    source = HUB_SOURCES[key]
    if setting is not None:  # HotpotQA's Hub configs are named after its settings
        source = HubSource(source.repo_id, setting, source.split)
    official = expected_path(*key, setting=setting)
    if is_offline():
        raise DatasetNotAvailable(
            f"{OFFLINE_ENV} is set: not loading {source.repo_id} from the Hugging Face Hub. "
            f"Put the official file at {official} instead."
        )
    try:
        import datasets  # optional: only this code path needs it
    except ImportError as error:
        raise DatasetNotAvailable(
            f"loading {key[0]} {key[1]} from the Hugging Face Hub needs the `datasets` package "
            f"(pip install datasets), or put the official file at {official} instead"
        ) from error
    try:
        rows = datasets.load_dataset(source.repo_id, source.config, split=source.split)
    except Exception as error:  # the library raises many network/hub error types
        offline = (f" {HF_OFFLINE_ENV} is set, so only the `datasets` cache was read, and it lacks this split."
                   if is_hub_offline() else "")
        raise DatasetNotAvailable(
            f"could not load {source.repo_id} ({source.config or 'default'}, {source.split}) from the "
            f"Hugging Face Hub: {error}.{offline} Put the official file at {official} instead."
        ) from error
    return [dict(row) for row in rows]


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(url: str, target: Path, *, timeout_s: float = 60.0) -> str:
    """Download ``url`` to ``target`` atomically with a progress bar; return the sha256 of the bytes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # A per-process partial name: parallel workers fetching the same file never write into each other.
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    request = urllib.request.Request(url, headers={"User-Agent": "agent-gym"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response, partial.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=target.name) as bar:
                while chunk := response.read(_CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return digest.hexdigest()


def _check_digest(remote: RemoteFile, downloaded: Path, actual: str) -> None:
    ledger = downloaded.parent / _LEDGER_NAME
    expected = remote.sha256 or _read_ledger(ledger).get(downloaded.name)
    if expected is not None and expected != actual:
        downloaded.unlink(missing_ok=True)
        source = "the known digest" if remote.sha256 else f"the digest recorded at first download in {ledger}"
        raise DatasetChecksumError(
            f"{remote.url}: sha256 {actual} differs from {source} ({expected}); the file was removed. "
            "If the upstream file changed on purpose, delete its entry from the ledger and fetch again."
        )


def _record_digest(directory: Path, filename: str, digest: str) -> None:
    ledger = directory / _LEDGER_NAME
    recorded = _read_ledger(ledger)
    if filename not in recorded:
        recorded[filename] = digest
        ledger.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _read_ledger(ledger: Path) -> dict[str, str]:
    if not ledger.is_file():
        return {}
    try:
        recorded = json.loads(ledger.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DatasetChecksumError(
            f"{ledger} is not valid JSON ({error}); delete it to start afresh"
        ) from error
    return recorded if isinstance(recorded, dict) else {}


def _extract_members(archive: Path, directory: Path, basenames: tuple[str, ...]) -> None:
    """Extract members by base name (archives nest them in a folder whose name varies by release)."""
    with zipfile.ZipFile(archive) as bundle:
        members = [m for m in bundle.namelist() if not m.startswith("__MACOSX/") and not m.endswith("/")]
        for basename in basenames:
            matches = sorted((m for m in members if Path(m).name == basename), key=len)
            if not matches:
                continue
            partial = directory / f"{basename}.{os.getpid()}.part"
            try:
                with bundle.open(matches[0]) as source, partial.open("wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK_BYTES)
                partial.replace(directory / basename)
            finally:
                partial.unlink(missing_ok=True)


def _not_available_message(name: str, split: str, remote: RemoteFile, target: Path, reason: str) -> str:
    inside = f" (inside {remote.archive_name})" if remote.archive_name else ""
    return (
        f"{canonical_name(name)} {canonical_split(split)}: {remote.filename} is not in the cache and "
        f"could not be downloaded from {remote.url}{inside}: {reason}.\n"
        f"Get it from {remote.origin} and put it at:\n  {target}\n"
        f"(a .gz or .xz copy there works too), or pass data_path= to the loader, "
        f"or set {DATA_DIR_ENV} to the folder that holds datasets/{canonical_name(name)}/."
    )

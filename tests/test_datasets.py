"""Dataset loaders, distractor corpora and download code, on the real samples in ../shared/data."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import http.server
import io
import json
import lzma
import re
import threading
import zipfile
from pathlib import Path

import pytest
from support.data import DATA_DIR, HOTPOT_SAMPLE, MUSIQUE_SAMPLE, SEARCH_R1_PARQUET, TWOWIKI_SAMPLE

from agent_gym.envs.datasets import (
    DatasetChecksumError,
    DatasetFormatError,
    DatasetNotAvailable,
    build_distractor_corpus,
    document_id,
    expected_path,
    fetch,
    load_dataset,
    load_searchr1_parquet,
)
from agent_gym.envs.datasets import download as download_module
from agent_gym.envs.datasets.hotpotqa import record_from_hub_row
from agent_gym.envs.datasets.hotpotqa import task_from_record as hotpotqa_task

SAMPLES = {"hotpotqa": HOTPOT_SAMPLE, "2wikimultihopqa": TWOWIKI_SAMPLE, "musique": MUSIQUE_SAMPLE}

needs_samples = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason=f"real data samples not found at {DATA_DIR} (see ../shared/data/README.md)"
)


@functools.cache
def loaded(name: str):
    return load_dataset(name, data_path=SAMPLES[name])


def _xz_text(path: Path) -> str:
    return lzma.open(path, "rt", encoding="utf-8").read()


@pytest.fixture
def no_cache(tmp_path, monkeypatch):
    """An empty cache root, so no test sees a real user cache."""
    monkeypatch.setenv("AGENT_GYM_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("AGENT_GYM_OFFLINE", raising=False)
    return tmp_path / "cache"


# --- counts and field mapping ---------------------------------------------------------------------


@needs_samples
@pytest.mark.parametrize(("name", "count"), [("hotpotqa", 297), ("2wikimultihopqa", 657), ("musique", 200)])
def test_loader_reads_every_record_of_the_sample(name, count):
    tasks, _ = loaded(name)
    assert len(tasks) == count


@needs_samples
def test_searchr1_parquet_reads_every_row():
    assert len(load_searchr1_parquet(SEARCH_R1_PARQUET)) == 3197


@needs_samples
def test_hotpotqa_record_maps_to_task_fields():
    task = loaded("hotpotqa")[0].by_id("5a8b57f25542995d1e6f1371")
    assert task.question == "Were Scott Derrickson and Ed Wood of the same nationality?"
    assert task.answers == ("yes",)
    assert task.supporting_titles == ("Scott Derrickson", "Ed Wood")
    assert task.kind == "comparison"
    assert task.decomposition == ()
    assert task.metadata["level"] == "hard"
    assert task.metadata["supporting_facts"] == [["Scott Derrickson", 0], ["Ed Wood", 0]]
    assert "context" not in task.metadata


@needs_samples
def test_twowiki_evidence_triples_become_hops_on_supporting_pages():
    task = loaded("2wikimultihopqa")[0].by_id("298f23b8088a11ebbd6eac1f6bf848b6")
    assert task.answers == ("El Extraño Viaje",)
    assert task.kind == "bridge_comparison"
    assert task.supporting_titles == (
        "El extraño viaje",
        "Love in Pawn",
        "Fernando Fernán Gómez",
        "Charles Saunders (director)",
    )
    assert [(hop.query, hop.answer, hop.title) for hop in task.decomposition] == [
        ("El extraño viaje", "Fernando Fernán Gómez", "El extraño viaje"),
        ("Love in Pawn", "Charles Saunders", "Love in Pawn"),
        ("Fernando Fernán Gómez", "28 August 1921", "Fernando Fernán Gómez"),
        ("Charles Saunders (director)", "8 April 1904", "Charles Saunders (director)"),
    ]
    assert task.metadata["answer_id"] == "Q5352428"


@needs_samples
def test_twowiki_hop_title_matches_page_with_qualified_name():
    task = loaded("2wikimultihopqa")[0].by_id("252694580bde11eba7f7acde48001122")
    assert task.decomposition[0].query == "Gerard I of Guelders"
    assert task.decomposition[0].title == "Gerard I, Count of Guelders"


@needs_samples
def test_musique_hop_query_substitutes_earlier_answers():
    task = loaded("musique")[0].by_id("2hop__574419_270105")
    assert task.answers == ("Stanley",)
    assert task.kind == "2hop"
    assert task.supporting_titles == (
        "Van Hook Township, Mountrail County, North Dakota",
        "Mountrail County Courthouse",
    )
    second = task.decomposition[1]
    assert (second.question, second.query, second.answer) == (
        "#1 >> capital",
        "Mountrail County >> capital",
        "Stanley",
    )
    assert second.title == "Mountrail County Courthouse"


@needs_samples
def test_musique_answers_include_aliases():
    task = loaded("musique")[0].by_id("2hop__335418_279684")
    assert task.answers == (
        "Pittsburgh Pirates",
        "Orioles",
        "Pirates",
        "Baltimore Orioles",
        "New York Mets",
        "Mets",
    )


@needs_samples
def test_searchr1_answer_split_string_becomes_answer_list():
    task = load_searchr1_parquet(SEARCH_R1_PARQUET).by_id("popqa_3474310")
    assert task.question == "What is the capital of Columbia County?"
    assert task.answers == ("Bloomsburg", "The Only Town in Pennsylvania", "Eyersburg")
    assert task.kind == "popqa"


@needs_samples
def test_searchr1_data_source_filter_keeps_only_that_source():
    tasks = load_searchr1_parquet(SEARCH_R1_PARQUET, data_source="HotpotQA")
    assert len(tasks) == 512
    assert {task.kind for task in tasks} == {"hotpotqa"}


@needs_samples
def test_searchr1_unknown_data_source_is_a_clear_error():
    with pytest.raises(DatasetFormatError, match="Bamboogle"):
        load_searchr1_parquet(SEARCH_R1_PARQUET, data_source="squad")


def test_searchr1_target_dict_ground_truth_is_read(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    prompt = "Answer the given question. ... Question: who wrote hamlet?\n"
    rows = [
        {
            "id": "test_0",
            "data_source": "nq",
            "prompt": [{"role": "user", "content": prompt}],
            "reward_model": {
                "style": "rule",
                "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]},
            },
            "extra_info": {"split": "test", "index": 0},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "search_r1.parquet")
    task = load_searchr1_parquet(tmp_path / "search_r1.parquet")[0]
    assert (task.id, task.question) == ("nq_test_0", "who wrote hamlet?")
    assert task.answers == ("Shakespeare", "William Shakespeare")


# --- distractor corpora ---------------------------------------------------------------------------


@needs_samples
@pytest.mark.parametrize("name", ["hotpotqa", "2wikimultihopqa", "musique"])
def test_every_supporting_title_is_in_the_distractor_corpus(name):
    tasks, corpus = loaded(name)
    titles = {document["title"] for document in corpus}
    missing = [(task.id, title) for task in tasks for title in task.supporting_titles if title not in titles]
    assert missing == []


@needs_samples
@pytest.mark.parametrize("name", ["hotpotqa", "2wikimultihopqa", "musique"])
def test_every_supporting_doc_id_is_a_corpus_document(name):
    tasks, corpus = loaded(name)
    ids = {document["id"] for document in corpus}
    assert len(ids) == len(corpus)
    assert all(doc_id in ids for task in tasks for doc_id in task.metadata["supporting_doc_ids"])


@needs_samples
def test_distractor_corpus_sizes_match_deduplicated_paragraphs():
    assert [len(loaded(name)[1]) for name in ("hotpotqa", "2wikimultihopqa", "musique")] == [2920, 4306, 3141]


@needs_samples
def test_hotpotqa_paragraph_text_keeps_the_original_single_spaces():
    _, corpus = loaded("hotpotqa")
    text = next(document["text"] for document in corpus if document["title"] == "Scott Derrickson")
    assert text.startswith(
        "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer. He lives"
    )
    assert "  " not in text


@needs_samples
def test_twowiki_paragraph_sentences_are_joined_with_one_space():
    _, corpus = loaded("2wikimultihopqa")
    text = next(document["text"] for document in corpus if document["title"] == "Cold Moon (2016 film)")
    assert 'Cold Moon Over Babylon". It stars Josh Stewart' in text


@needs_samples
def test_musique_keeps_same_title_paragraphs_as_separate_documents():
    tasks, corpus = loaded("musique")
    task = tasks.by_id("2hop__29367_29376")  # both hops are supported by paragraphs of one page
    supporting_ids = task.metadata["supporting_doc_ids"]
    assert task.supporting_titles == ("Liberal Party of Australia",)
    assert len(set(supporting_ids)) == 2
    assert {d["title"] for d in corpus if d["id"] in supporting_ids} == {"Liberal Party of Australia"}


@needs_samples
def test_document_ids_do_not_depend_on_which_records_are_loaded():
    _, small = load_dataset("hotpotqa", data_path=HOTPOT_SAMPLE, limit=10)
    _, full = loaded("hotpotqa")
    by_id = {document["id"]: document for document in full}
    assert all(by_id[document["id"]] == document for document in small)
    assert len(small) < len(full)


def test_title_conflict_keeps_the_longer_text_and_is_counted():
    corpus = build_distractor_corpus(
        [("Ed Wood", "short"), ("Ed Wood", "a longer text"), ("Ed Wood", "short")]
    )
    assert corpus.documents == [{"id": document_id("Ed Wood"), "title": "Ed Wood", "text": "a longer text"}]
    assert (corpus.paragraphs_seen, corpus.title_conflicts) == (3, 2)


def test_document_id_is_a_slug_with_a_hash_and_never_empty():
    assert document_id("El extraño viaje").startswith("el-extrano-viaje-")
    assert document_id("東京") != "" and document_id("東京") != document_id("大阪")


# --- files: compression, folders, errors ----------------------------------------------------------


@needs_samples
@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_plain_gzip_and_xz_files_load_alike(tmp_path, suffix):
    raw = _xz_text(HOTPOT_SAMPLE).encode("utf-8")
    path = tmp_path / f"hotpot_dev_distractor_v1.json{suffix}"
    writer = {"": lambda data: data, ".gz": gzip.compress, ".xz": lzma.compress}[suffix]
    path.write_bytes(writer(raw))
    tasks, corpus = load_dataset("hotpotqa", data_path=path)
    assert [task.id for task in tasks] == [task.id for task in loaded("hotpotqa")[0]]
    assert corpus == loaded("hotpotqa")[1]


@needs_samples
def test_plain_jsonl_loads_like_the_xz_sample(tmp_path):
    path = tmp_path / "musique_ans_v1.0_dev.jsonl"
    path.write_text(_xz_text(MUSIQUE_SAMPLE), encoding="utf-8")
    assert len(load_dataset("musique", data_path=path)[0]) == 200


@needs_samples
def test_gzip_parquet_loads(tmp_path):
    path = tmp_path / "test.parquet.gz"
    path.write_bytes(gzip.compress(SEARCH_R1_PARQUET.read_bytes()))
    assert len(load_searchr1_parquet(path)) == 3197


@needs_samples
def test_data_path_folder_finds_the_official_file_name(tmp_path):
    (tmp_path / "hotpot_dev_distractor_v1.json.xz").write_bytes(HOTPOT_SAMPLE.read_bytes())
    assert len(load_dataset("hotpotqa", split="validation", data_path=tmp_path)[0]) == 297


def test_missing_data_file_error_names_the_path(tmp_path, no_cache):
    missing = tmp_path / "nowhere" / "dev.json"
    with pytest.raises(DatasetNotAvailable, match=re.escape(str(missing))):
        load_dataset("2wikimultihopqa", data_path=missing)


def test_record_without_answer_is_a_format_error_naming_the_record(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"_id": "abc", "question": "q?", "supporting_facts": [], "context": []}]))
    with pytest.raises(DatasetFormatError, match="'abc'.*answer"):
        load_dataset("hotpotqa", data_path=path)


def test_invalid_json_lines_error_gives_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a"}\n{not json\n')
    with pytest.raises(DatasetFormatError, match="line 2"):
        load_dataset("musique", data_path=path)


def test_unknown_dataset_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="hotpotqa, 2wikimultihopqa, musique"):
        load_dataset("squad")


def test_option_a_loader_does_not_take_is_rejected():
    with pytest.raises(ValueError, match="aliases_path"):
        load_dataset("hotpotqa", aliases_path="x")


@needs_samples
def test_twowiki_answers_gain_aliases_from_id_aliases_file(tmp_path):
    (tmp_path / "dev.json.xz").write_bytes(TWOWIKI_SAMPLE.read_bytes())
    alias_row = {"Q_id": "Q5352428", "aliases": ["The Strange Voyage"], "demonyms": []}
    (tmp_path / "id_aliases.json").write_text(json.dumps(alias_row) + "\n")
    tasks, _ = load_dataset("2wikimultihopqa", data_path=tmp_path)
    assert tasks.by_id("298f23b8088a11ebbd6eac1f6bf848b6").answers == (
        "El Extraño Viaje",
        "The Strange Voyage",
    )


@needs_samples
def test_hub_row_layout_gives_the_same_task_as_the_official_record():
    record = json.loads(_xz_text(HOTPOT_SAMPLE))[0]
    titles, sentences = zip(*record["context"], strict=True)
    hub_row = {
        "id": record["_id"],
        "question": record["question"],
        "answer": record["answer"],
        "type": record["type"],
        "level": record["level"],
        "supporting_facts": {
            "title": [t for t, _ in record["supporting_facts"]],
            "sent_id": [i for _, i in record["supporting_facts"]],
        },
        "context": {"title": list(titles), "sentences": list(sentences)},
    }
    assert hotpotqa_task(record_from_hub_row(hub_row)) == hotpotqa_task(record)


# --- download -------------------------------------------------------------------------------------


def _point_at(monkeypatch, key, url):
    remote = download_module.OFFICIAL_FILES[key]
    monkeypatch.setitem(download_module.OFFICIAL_FILES, key, dataclasses.replace(remote, url=url))


def test_offline_download_raises_dataset_not_available_with_target_path(monkeypatch, no_cache):
    _point_at(monkeypatch, ("hotpotqa", "dev"), "http://127.0.0.1:1/hotpot_dev_distractor_v1.json")
    target = expected_path("hotpotqa", "dev")
    with pytest.raises(DatasetNotAvailable) as raised:
        load_dataset("hotpotqa", split="dev")
    assert str(target) in str(raised.value)
    assert "hotpot_dev_distractor_v1.json" in str(raised.value)
    assert not target.exists()


def test_offline_env_var_stops_any_download_attempt(monkeypatch, no_cache):
    monkeypatch.setenv("AGENT_GYM_OFFLINE", "1")
    with pytest.raises(DatasetNotAvailable, match="AGENT_GYM_OFFLINE is set") as raised:
        fetch("musique", "train")
    assert str(no_cache / "datasets" / "musique" / "musique_ans_v1.0_train.jsonl") in str(raised.value)


def test_hub_source_offline_raises_dataset_not_available_naming_the_file(monkeypatch, no_cache):
    monkeypatch.setenv("AGENT_GYM_OFFLINE", "1")
    with pytest.raises(DatasetNotAvailable, match="musique_ans_v1.0_dev.jsonl"):
        load_dataset("musique", source="hf")


def test_cached_compressed_file_is_used_without_download(monkeypatch, no_cache):
    monkeypatch.setenv("AGENT_GYM_OFFLINE", "1")
    target = expected_path("musique", "dev")
    target.parent.mkdir(parents=True)
    Path(f"{target}.xz").write_bytes(lzma.compress(b"{}\n"))
    assert fetch("musique", "dev") == Path(f"{target}.xz")


@pytest.fixture
def loopback_server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving ``tmp_path / "served"``."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


def test_download_records_sha256_then_rejects_a_changed_file(monkeypatch, no_cache, loopback_server):
    served, base = loopback_server
    (served / "musique.jsonl").write_text('{"id": "2hop__1_2"}\n')
    _point_at(monkeypatch, ("musique", "dev"), f"{base}/musique.jsonl")
    path = fetch("musique", "dev")
    ledger = json.loads((path.parent / "checksums.json").read_text())
    assert ledger == {path.name: download_module.file_sha256(path)}

    path.unlink()
    (served / "musique.jsonl").write_text('{"id": "changed"}\n')
    with pytest.raises(DatasetChecksumError, match="differs"):
        fetch("musique", "dev")
    assert not path.exists()


@needs_samples
def test_twowiki_archive_download_extracts_data_and_aliases(monkeypatch, no_cache, loopback_server):
    served, base = loopback_server
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data_ids_april7/dev.json", _xz_text(TWOWIKI_SAMPLE))
        archive.writestr(
            "data_ids_april7/id_aliases.json", '{"Q_id": "Q5352428", "aliases": ["X"], "demonyms": []}\n'
        )
        archive.writestr("__MACOSX/data_ids_april7/._dev.json", "junk")
    (served / "data.zip").write_bytes(buffer.getvalue())
    _point_at(monkeypatch, ("2wikimultihopqa", "dev"), f"{base}/data.zip")
    tasks, corpus = load_dataset("2wikimultihopqa")
    assert len(tasks) == 657 and len(corpus) == 4306
    assert tasks.by_id("298f23b8088a11ebbd6eac1f6bf848b6").answers == ("El Extraño Viaje", "X")
    assert not (no_cache / "datasets" / "2wikimultihopqa" / "data_ids_april7.zip").exists()


def test_archive_that_is_not_a_zip_is_not_recorded_as_the_reference(monkeypatch, no_cache, loopback_server):
    served, base = loopback_server
    (served / "page.html").write_text("<html>sign in to download</html>")
    _point_at(monkeypatch, ("2wikimultihopqa", "dev"), f"{base}/page.html")
    with pytest.raises(DatasetNotAvailable, match=re.escape(str(expected_path("2wikimultihopqa", "dev")))):
        fetch("2wikimultihopqa", "dev")
    assert not (no_cache / "datasets" / "2wikimultihopqa" / "checksums.json").exists()


# --- HotpotQA fullwiki setting --------------------------------------------------------------------


@needs_samples
def test_hotpotqa_fullwiki_setting_reads_the_fullwiki_file_of_a_folder(tmp_path):
    # The fullwiki file has the distractor file's layout; a copy of the sample under its name stands in for it.
    (tmp_path / "hotpot_dev_fullwiki_v1.json.xz").write_bytes(HOTPOT_SAMPLE.read_bytes())
    tasks, corpus = load_dataset("hotpotqa", data_path=tmp_path, setting="fullwiki")
    assert len(tasks) == 297 and tasks[0].metadata["setting"] == "fullwiki" and corpus
    with pytest.raises(DatasetNotAvailable, match="hotpot_dev_distractor_v1.json"):
        load_dataset("hotpotqa", data_path=tmp_path)  # the default setting looks for its own file


@needs_samples
def test_hotpotqa_fullwiki_setting_finds_its_file_in_the_cache(monkeypatch, no_cache):
    monkeypatch.setenv("AGENT_GYM_OFFLINE", "1")
    target = expected_path("hotpotqa", "dev", setting="fullwiki")
    assert target == no_cache / "datasets" / "hotpotqa" / "hotpot_dev_fullwiki_v1.json"
    target.parent.mkdir(parents=True)
    Path(f"{target}.xz").write_bytes(HOTPOT_SAMPLE.read_bytes())
    tasks, _ = load_dataset("hotpotqa", setting="fullwiki", limit=3)
    assert [task.metadata["setting"] for task in tasks] == ["fullwiki"] * 3


def test_hotpotqa_fullwiki_training_file_is_the_one_training_file():
    # HotpotQA publishes one training set for both settings.
    assert expected_path("hotpotqa", "train", setting="fullwiki") == expected_path("hotpotqa", "train")


def test_unknown_setting_is_refused_listing_the_settings():
    with pytest.raises(ValueError, match="distractor, fullwiki"):
        load_dataset("hotpotqa", setting="open-domain")


def test_a_dataset_without_settings_refuses_one():
    with pytest.raises(ValueError, match="setting"):
        load_dataset("musique", setting="fullwiki")


@needs_samples
def test_the_hotpotqa_env_takes_the_fullwiki_setting(tmp_path):
    import gymnasium as gym

    import agent_gym  # noqa: F401 - registers the ids

    (tmp_path / "hotpot_dev_fullwiki_v1.json.xz").write_bytes(HOTPOT_SAMPLE.read_bytes())
    env = gym.make("AgentR1-HotpotQA-v0", setting="fullwiki", data_path=str(tmp_path), limit=2)
    env.reset(options={"task_index": 0})
    assert env.unwrapped.task.metadata["setting"] == "fullwiki"
    env.close()


def test_data_where_takes_a_setting(capsys, no_cache):
    from agent_gym.cli import main

    assert main(["data", "where", "hotpotqa", "--setting", "fullwiki"]) == 0
    assert capsys.readouterr().out.strip().endswith("hotpot_dev_fullwiki_v1.json")


# --- short format errors --------------------------------------------------------------------------


@needs_samples
def test_a_table_of_columns_is_refused_in_a_short_message_naming_the_file_and_layout(tmp_path):
    records = json.loads(_xz_text(HOTPOT_SAMPLE))
    columns = {field: {str(i): record[field] for i, record in enumerate(records)} for field in records[0]}
    path = tmp_path / "hotpot_columns.json"
    path.write_text(json.dumps(columns))  # pandas' DataFrame.to_json() default layout
    with pytest.raises(DatasetFormatError) as raised:
        load_dataset("hotpotqa", data_path=path)
    message = str(raised.value)
    assert len(message) < 600 and str(path) in message and "orient='records'" in message
    assert '"_id", "question", "answer"' in message  # the layout it expected


def test_a_record_with_huge_malformed_fields_gives_a_short_message(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"_id": "x" * 10_000, "question": "q?", "answer": "a",
                                 "supporting_facts": "y" * 10_000, "context": []}]))
    with pytest.raises(DatasetFormatError) as raised:
        load_dataset("hotpotqa", data_path=path)
    message = str(raised.value)
    assert len(message) < 600 and str(path) in message and "supporting_facts" in message


# --- HF_HUB_OFFLINE -------------------------------------------------------------------------------


def _no_downloads(monkeypatch):
    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setattr(download_module, "download_file", refuse)


def test_hf_hub_offline_stops_musique_from_trying_the_hub(monkeypatch, no_cache):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _no_downloads(monkeypatch)
    with pytest.raises(DatasetNotAvailable, match="HF_HUB_OFFLINE is set") as raised:
        load_dataset("musique")
    assert str(expected_path("musique", "dev")) in str(raised.value)


def test_hf_hub_offline_leaves_downloads_from_elsewhere_alone(monkeypatch, no_cache, loopback_server):
    served, base = loopback_server
    (served / "hotpot.json").write_text("[]")
    _point_at(monkeypatch, ("hotpotqa", "dev"), f"{base}/hotpot.json")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch("hotpotqa", "dev").read_text() == "[]"


def test_hub_source_under_hf_hub_offline_says_so_when_the_hub_cache_lacks_the_split(monkeypatch, no_cache):
    import sys
    import types

    fake_datasets = types.ModuleType("datasets")

    def load_from_cache_only(*args, **kwargs):  # what `datasets` does offline without a cached copy
        raise ConnectionError("Couldn't reach 'dgslibisey/MuSiQue' on the Hub (LocalEntryNotFoundError)")

    fake_datasets.load_dataset = load_from_cache_only
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetNotAvailable, match="HF_HUB_OFFLINE is set"):
        load_dataset("musique", source="hf")


# --- the cache root ----------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home folder with no agent-gym cache variables set."""
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    for variable in ("AGENT_GYM_DATA_DIR", "AGENT_GYM_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path


def test_data_shares_the_models_cache_root(home, monkeypatch):
    from agent_gym.models.pretrained import cache_root

    assert download_module.cache_dir() == home / ".cache" / "agent-gym" == cache_root().parent
    monkeypatch.setenv("AGENT_GYM_CACHE", str(home / "elsewhere"))
    assert download_module.cache_dir() == home / "elsewhere" == cache_root().parent


def test_models_data_kernels_and_embeddings_share_one_cache_root(home, monkeypatch):
    from agent_gym.models.pretrained import cache_root
    from agent_gym.retrieval_index.engines.dense_faiss import default_embedding_cache
    from agent_gym.retrieval_index.engines.impact_bm25 import kernel_cache_dir

    monkeypatch.setenv("AGENT_GYM_CACHE", str(home / "shared"))
    roots = {cache_root().parent, download_module.cache_dir(), kernel_cache_dir().parent,
             default_embedding_cache().parent}
    assert roots == {home / "shared"}


def test_embeddings_encoded_into_the_old_cache_root_are_still_read(home):
    from agent_gym.retrieval_index.engines.dense_faiss import default_embedding_cache

    assert default_embedding_cache() == home / ".cache" / "agent-gym" / "embeddings"
    (home / ".cache" / "agent_gym" / "embeddings").mkdir(parents=True)
    assert default_embedding_cache() == home / ".cache" / "agent_gym" / "embeddings"


def test_data_downloaded_into_the_old_cache_root_is_still_read(home):
    (home / ".cache" / "agent_gym" / "datasets").mkdir(parents=True)
    assert download_module.cache_dir() == home / ".cache" / "agent_gym"
    (home / ".cache" / "agent-gym" / "datasets").mkdir(parents=True)
    assert download_module.cache_dir() == home / ".cache" / "agent-gym"


def test_agent_gym_data_dir_wins_over_every_other_root(home, monkeypatch):
    monkeypatch.setenv("AGENT_GYM_CACHE", str(home / "shared"))
    monkeypatch.setenv("AGENT_GYM_DATA_DIR", str(home / "data"))
    assert download_module.cache_dir() == home / "data"

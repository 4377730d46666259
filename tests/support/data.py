"""The real data samples in the shared data folder beside the repository (see ../shared/data/README.md)."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
#: 297 HotpotQA dev questions (distractor setting)
HOTPOT_SAMPLE = DATA_DIR / "hotpotqa" / "hotpot_dev_distractor_v1.sample297.json.xz"
#: 657 2WikiMultihopQA dev questions
TWOWIKI_SAMPLE = DATA_DIR / "2wikimultihopqa" / "dev.sample657.json.xz"
#: 200 MuSiQue-Ans dev questions
MUSIQUE_SAMPLE = DATA_DIR / "musique" / "musique_ans_v1.0_dev.sample200.jsonl.xz"
#: Search-R1's test split in its own parquet layout
SEARCH_R1_PARQUET = DATA_DIR / "search_r1_format" / "test.parquet"
#: each QA env's sample, by env id
QA_SAMPLES = {
    "AgentR1-HotpotQA-v0": HOTPOT_SAMPLE,
    "AgentR1-2WikiMultihopQA-v0": TWOWIKI_SAMPLE,
    "AgentR1-Musique-v0": MUSIQUE_SAMPLE,
}

"""Helpers that several test modules share: scripted generation backends, the shared data samples and the
HotpotQA sample corpus.

Fixtures built from them (the tiny model, the HotpotQA records) live in ``tests/conftest.py``.
"""

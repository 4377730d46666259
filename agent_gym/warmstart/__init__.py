"""The warm-start workshop: what readies a model before RL.

Pretraining a from-scratch model to copy (induction set-up, pointer drills, the copy-skill probe), supervised
fine-tuning on scripted episodes, and their weighted LM loss. It builds on ``models/`` and on the run
bookkeeping of ``trainers/`` (run directories, checkpoints, metric names); ``trainers/`` never imports it.
"""

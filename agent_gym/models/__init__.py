"""The language model room: get a model by name, load it (and its LoRA adapter), render its chat template,
pick its precision and its torch threads.

Both the RL pipeline (``trainers/``) and the warm-start workshop (``warmstart/``) load models, so loading sits
beneath both of them, not inside either.
"""

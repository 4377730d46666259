"""Agents that play an env with a language model, for evaluation: :class:`ModelPolicy` (chat template, tool
calls, greedy or sampled, optionally value-guided) and :class:`ModelNaiveRAGPolicy` (the paper's naive RAG: one
search with the question, then the model answers)."""

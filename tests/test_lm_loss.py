"""SFT's weighted next-token loss: the LM head runs only where a weighted token is predicted, with the same loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from agent_gym.models.model_init import load_model_and_tokenizer
from agent_gym.warmstart.lm_loss import WeightedRow, weighted_lm_loss


def _reference(model: torch.nn.Module, rows: list[WeightedRow], pad_id: int) -> torch.Tensor:
    """sum_t w_t * -log p(x_t | x_<t) / sum_t w_t from every position's full logits."""
    total, weight = torch.zeros(()), torch.zeros(())
    for row in rows:
        ids = torch.tensor([row.input_ids])
        logprobs = F.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        picked = logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1)
        w = torch.tensor(row.weights[1:])
        total, weight = total - (picked * w).sum(), weight + w.sum()
    return total / weight


@pytest.mark.parametrize("split", [True, False], ids=["hidden-states", "logits"])
def test_the_loss_over_kept_positions_equals_the_full_computation(
    tiny_model_dir_for_synthhop: Path, monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    # split: the weighted positions' hidden states through head_logprobs; else the model's logits there
    from agent_gym.warmstart import lm_loss

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir_for_synthhop)
    assert lm_loss.split_head(model) is not None
    if not split:
        monkeypatch.setattr(lm_loss, "split_head", lambda model: None)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for length, weighted in ((30, range(10, 18)), (22, range(3, 6)), (26, (25,))):
        ids = torch.randint(5, 500, (length,), generator=generator).tolist()
        rows.append(WeightedRow(ids, [0.5 if i in weighted else 0.0 for i in range(length)]))
    loss = weighted_lm_loss(model, rows, tokenizer.pad_token_id)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = _reference(model, rows, tokenizer.pad_token_id)
    expected.backward()
    assert torch.allclose(loss, expected, atol=1e-5)
    assert all(torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, model.parameters(), strict=True))

"""The PPO critic: a copy of the policy's transformer body with a scalar value head.

Why a separate model rather than a value head on the policy: Agent-R1 is built on verl, whose PPO uses a
separate critic, so this reproduces the paper's setup; it keeps value-loss gradients out of the policy (no
vf_coef to tune against the policy loss), and the critic trains on all its weights even when the policy is a
LoRA adapter. Cost: one more forward/backward per step, which is small next to generation in agentic rollouts.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["CRITIC_FILE", "ValueModel"]

CRITIC_FILE = "critic.pt"  # beside the policy in a run's final/ directory


class ValueModel(torch.nn.Module):
    """Critic: a transformer backbone and a linear head giving V(s_t) for the state before each token.

    ``values[:, t]`` is read from the hidden state at ``t - 1`` (the prefix the policy saw when it chose
    token t), aligned with ``token_logprobs``; position 0 gets 0.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)  # V = 0 at start: advantages start as plain returns
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module) -> ValueModel:
        """A critic initialised from the policy's transformer body (without its LM head)."""
        backbone = copy.deepcopy(getattr(policy, "base_model", policy))
        for parameter in backbone.parameters():
            parameter.requires_grad_(True)
        return cls(backbone, policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Values ``[B, T]``; right-padded batches need no mask (see ``Trainer._response_logits``)."""
        output = self.backbone(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        hidden = output.hidden_states[-1]  # works for a bare body and for a model with an LM head alike
        values = self.value_head(hidden.float()).squeeze(-1)
        return F.pad(values[:, :-1], (1, 0))

    @torch.no_grad()
    def turn_values(self, sequences: list[list[int]]) -> list[float]:
        """V at each sequence's last token: the critic's estimate of the return after that token is chosen.

        Read where the trainer trains it: ``values[:, t]`` for the last token t, i.e. from the hidden state just
        before it. Sequences of one call are right-padded into one batch (a causal model ignores the padding).
        """
        width = max(len(ids) for ids in sequences)
        batch = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, ids in enumerate(sequences):
            batch[row, : len(ids)] = torch.tensor(ids)
        device = next(self.parameters()).device
        values = self(batch.to(device))
        return [float(values[row, len(ids) - 1]) for row, ids in enumerate(sequences)]

    def save(self, path: str | Path) -> None:
        """The critic's weights (its backbone and value head)."""
        torch.save(self.state_dict(), path)

    @classmethod
    def load(cls, path: str | Path, policy: torch.nn.Module) -> ValueModel:
        """A critic saved by :meth:`save`, shaped after ``policy`` (the policy it was trained beside)."""
        critic = cls.from_policy(policy)
        critic.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return critic.eval()

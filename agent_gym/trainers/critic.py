"""The PPO critic, in two forms (``TrainConfig.critic``): a full copy of the policy's body, or a LoRA on it.

``ValueModel`` (``critic="full"``): a copy of the policy's transformer body with a scalar value head. Why a
separate model rather than a value head on the policy: Agent-R1 is built on verl, whose PPO uses a separate
critic, so this reproduces the paper's setup; it keeps value-loss gradients out of the policy (no vf_coef to
tune against the policy loss), and the critic trains on all its weights even when the policy is a LoRA adapter.
Its cost: a second model in memory, and an update on all its weights (2.5x GRPO's update, measured at 135M).

``LoraValueModel`` (``critic="lora"``): the policy's own body, shared and not copied, read through the critic's
own LoRA adapters (on every linear layer of the body) and its own value head. Only those train. The critic's
forward runs with the policy's weights (its base, and its adapter if it has one) excluded from autograd, so the
value loss reaches neither the base nor the policy's adapter: it keeps the separate critic's property above at
the memory of an adapter. Its features follow the policy as it learns (a shared trunk with a stop-gradient).
The adapters are forward hooks on the body's linear layers, active only inside the critic's own forward, so
the policy's forward, its peft adapter, its checkpoints and the sampler's weight sync never see them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agent_gym.error import InvalidValue
from agent_gym.trainers.packed_forward import packed_values

__all__ = ["CRITIC_FILE", "LoraValueModel", "ValueModel", "critic_file_state", "critic_from_policy",
           "load_critic_state"]

CRITIC_FILE = "critic.pt"  # beside the policy in a run's final/ directory


def _head_values(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The value head on hidden states ``[..., H]`` -> ``[...]``, in fp32 even inside the trainer's bf16 autocast:
    bf16 keeps 8 bits of mantissa, too few for value targets a few hundredths apart, and it is one dot product a
    token."""
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.float()).squeeze(-1)


def _values(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` values from the body's last hidden states: ``values[:, t]`` from position ``t - 1``, 0 at t = 0."""
    return F.pad(_head_values(head, hidden)[:, :-1], (1, 0))


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
        return _values(self.value_head, hidden)

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
    def load(cls, path: str | Path, policy: torch.nn.Module) -> ValueModel | LoraValueModel:
        """A critic saved by :meth:`save` (or `LoraValueModel.save`: the file says which), shaped after
        ``policy`` (the policy it was trained beside; a LoRA critic reads through that very model)."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if _LORA_RANK_KEY in state:
            return LoraValueModel.from_state(policy, state)
        critic = cls.from_policy(policy)
        critic.load_state_dict(state)
        return critic.eval()


_LORA_RANK_KEY = "lora_rank"  # in a saved LoRA critic's file, beside its weights


def _body(policy: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a causal LM (no LM head), seen through a peft wrapper."""
    model = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    return getattr(model, "base_model", model)


def _critic_targets(body: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The body's linear layers, by a name that is the same with or without a peft adapter around them (peft's
    ``q_proj.base_layer`` is ``q_proj``), so a critic trained on a LoRA policy loads on its merged copy."""
    targets = {}
    for name, module in body.named_modules():
        if not isinstance(module, torch.nn.Linear) or ".lora_" in f".{name}":
            continue  # peft's own lora_A / lora_B layers are the policy's adapter, not its base
        targets[name.replace(".base_layer", "")] = module
    return targets


class _LoraDelta(torch.nn.Module):
    """One linear layer's critic adapter: x -> scale * B(A(x)), A Kaiming-uniform and B zero as in peft."""

    def __init__(self, in_features: int, out_features: int, rank: int) -> None:
        super().__init__()
        self.lora_A = torch.nn.Parameter(torch.empty(rank, in_features))
        self.lora_B = torch.nn.Parameter(torch.zeros(out_features, rank))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = 2.0  # alpha = 2 x rank (TrainConfig.lora_alpha's default ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * (x.to(self.lora_A.dtype) @ self.lora_A.T) @ self.lora_B.T


class LoraValueModel(torch.nn.Module):
    """Critic: the policy's own body read through the critic's LoRA adapters, and a linear value head.

    The policy is held, not registered: ``parameters()``, ``state_dict()`` and ``.to()`` cover the adapters and
    the head only, so the critic's optimizer, checkpoint and file hold nothing of the base. Values align as
    `ValueModel`'s: ``values[:, t]`` is read from the hidden state at ``t - 1``; position 0 gets 0.

    Args:
        policy: the policy model (a causal LM, bare or with a peft adapter), shared.
        rank: the adapters' rank.
    """

    def __init__(self, policy: torch.nn.Module, rank: int) -> None:
        super().__init__()
        object.__setattr__(self, "_policy", policy)  # shared, never a submodule (see the class docstring)
        self.rank = rank
        targets = _critic_targets(_body(policy))
        device = next(policy.parameters()).device
        self.adapters = torch.nn.ModuleDict(
            {
                name.replace(".", "__"): _LoraDelta(layer.in_features, layer.out_features, rank).to(device)
                for name, layer in targets.items()
            }
        )
        self.value_head = torch.nn.Linear(_body(policy).config.hidden_size, 1, device=device)
        torch.nn.init.zeros_(self.value_head.weight)  # V = 0 at start, as ValueModel
        torch.nn.init.zeros_(self.value_head.bias)
        self._active = False
        self._hooks = [
            layer.register_forward_hook(self._hook(self.adapters[name.replace(".", "__")]))
            for name, layer in targets.items()
        ]

    def _hook(self, delta: _LoraDelta) -> Any:
        def add_delta(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor | None:
            if not self._active:  # the policy's own forward: untouched
                return None
            return output + delta(args[0]).to(output.dtype)

        return add_delta

    @property
    def policy(self) -> torch.nn.Module:
        return self._policy  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def _critic_pass(self) -> Iterator[None]:
        """The adapters on, and the policy's weights out of autograd (restored after, whatever happens)."""
        frozen = [p for p in self.policy.parameters() if p.requires_grad] if torch.is_grad_enabled() else []
        for parameter in frozen:
            parameter.requires_grad_(False)
        self._active = True
        try:
            yield
        finally:
            self._active = False
            for parameter in frozen:
                parameter.requires_grad_(True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Values ``[B, T]``; right-padded batches need no mask (see ``Trainer._response_logits``)."""
        with self._critic_pass():
            # no key/value cache: the critic scores whole sequences and never decodes
            hidden = _body(self.policy)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)[0]
        return _values(self.value_head, hidden)

    def packed(
        self, input_ids: torch.Tensor, lengths: torch.Tensor, prompt_lengths: torch.Tensor,
        group_index: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`forward`'s values at the response positions (0 before them), each row at its own length and a
        group's shared prefix once (:func:`~agent_gym.trainers.packed_forward.packed_values`): what the trainer
        runs, as it runs the policy."""
        with self._critic_pass():
            return packed_values(_body(self.policy), functools.partial(_head_values, self.value_head), input_ids,
                                 lengths, prompt_lengths, group_index)

    turn_values = ValueModel.turn_values

    def remove_hooks(self) -> None:
        """Detach the adapters from the policy's layers (the critic is unusable after)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def save(self, path: str | Path) -> None:
        """The adapters and the value head, with the rank (no base weights: they are the policy's)."""
        torch.save(critic_file_state(self.state_dict(), "lora", self.rank), path)

    @classmethod
    def from_state(cls, policy: torch.nn.Module, state: dict[str, torch.Tensor]) -> LoraValueModel:
        """A critic saved by :meth:`save`, on ``policy`` (the policy it was trained beside, or its merged copy)."""
        weights = {key: value for key, value in state.items() if key != _LORA_RANK_KEY}
        critic = cls(policy, int(state[_LORA_RANK_KEY]))
        critic.load_state_dict(weights)
        return critic.eval()


def critic_from_policy(policy: torch.nn.Module, kind: str, lora_rank: int = 16) -> ValueModel | LoraValueModel:
    """The critic ``TrainConfig.critic`` names: ``full`` (a copy of the body) or ``lora`` (on the shared body)."""
    if kind == "lora":
        return LoraValueModel(policy, lora_rank)
    return ValueModel.from_policy(policy)


def critic_file_state(state: dict[str, torch.Tensor], kind: str, lora_rank: int) -> dict[str, torch.Tensor]:
    """A critic's ``state_dict`` (as a training checkpoint holds it) in the form ``save`` writes: a LoRA critic's
    file carries its rank, which its state dict does not."""
    if kind == "lora":
        return {**state, _LORA_RANK_KEY: torch.tensor(lora_rank)}
    if kind == "full":
        return dict(state)
    raise InvalidValue(f"unknown critic kind {kind!r}; a checkpoint's critic is full or lora")


def load_critic_state(critic: ValueModel | LoraValueModel, path: str | Path) -> None:
    """Load the weights of a critic saved by ``save`` (fp32, or bf16 as the campaign publishes them) into
    ``critic``, which must be of the saved one's kind and rank: how a PPO run continued from a committed adapter
    keeps the critic it trained (``TrainConfig.critic_init``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no critic file at {path}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved = f"lora (rank {int(state[_LORA_RANK_KEY])})" if _LORA_RANK_KEY in state else "full"
    wanted = f"lora (rank {critic.rank})" if isinstance(critic, LoraValueModel) else "full"
    if saved != wanted:
        raise InvalidValue(f"{path} holds a {saved} critic; this run's critic is {wanted}")
    # load_state_dict copies into the critic's own tensors, casting a bf16 file to their dtype
    critic.load_state_dict({key: value for key, value in state.items() if key != _LORA_RANK_KEY})

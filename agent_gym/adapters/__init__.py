"""Other RL libraries on agent-gym envs, each through that library's own current interface (docs/DESIGN.md §7).

One module per library, each behind an extra (``pip install "agent-gym[trl]"`` and so on), imported only by the
user or by ``agent-gym bench``: importing ``agent_gym.adapters`` imports no library. None imports a concrete env:
each takes an env id (or a factory) plus keyword arguments, and speaks the Gymnasium contract of README's
"The environment contract".

- ``candidate_actions``: Box observations and Discrete actions over candidate spans (Stable-Baselines3,
  sb3-contrib's MaskablePPO through ``action_masks()``).
- ``torchrl``: TorchRL's ``GymWrapper`` over our ``UnicodeText`` spaces (strings as non-tensor specs).
- ``skyrl``: a SkyRL-Gym ``BaseTextEnv`` view of any env, registered with ``skyrl_gym``.
- ``trl``: TRL's ``GRPOTrainer`` entry points, an ``environment_factory`` class and a token-exact
  ``rollout_func`` built on our ``RolloutCollector``.
- ``verifiers``: a ``verifiers.v1`` taskset and env over our tasks.
- ``openenv``: serve any env over the OpenEnv protocol, and ``RemoteEnv``, a ``gymnasium.Env`` client.
"""

"""``python -m agent_gym.cli``: the ``agent-gym`` command without the console script."""

from agent_gym.cli import main

raise SystemExit(main())

"""``agent-gym bench``: RL libraries side by side on one env (runners, one metrics schema, table and curves)."""

"""Agent environments: a task source and a rollout kind, not a second pipeline (DESIGN.md, "Agent environments").

``base`` (the interface and the episode record), ``terminal`` and ``terminal_tasks`` (shell tasks run in
the project's sandbox), ``swe``, ``swe_tasks`` and ``swe_repos`` (mini-SWE: fix a bug injected into a
small shipped repository; the tests decide), ``runner`` (episodes from any policy; episodes as ``turns`` rows), ``agents``
(scripted policies) and ``policies`` (a transformers chat policy that keeps exact token ids).
Nothing here imports Dagster, deltalake or DuckDB.
"""

"""A stand-in scorer for the reward server's deadline (``ScoringPool(scorer="tests.slow_scorer:score_query")``):
the real ``score_query``, except that a query starting ``SLEEP`` never finishes and one starting ``CRASH``
kills its worker. After the fixes of issue 73 no real input is slow, so this is how a test reaches the
deadline's backstop."""

from __future__ import annotations

import os
import time

from tentalis_pipelines.rewards.remote_reward import score_query as real_score_query


def score_query(query: str, prompt: str, label: str):
    """``remote_reward.score_query``, or a hang (``SLEEP...``) or the worker's death (``CRASH...``)."""
    if query.startswith("SLEEP"):
        time.sleep(3600)
    if query.startswith("CRASH"):
        os._exit(3)
    return real_score_query(query, prompt, label)

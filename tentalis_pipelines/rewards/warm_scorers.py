"""Importing this module warms the reward scorers up (``remote_reward.warm_up``): the reward server's
forkserver preloads it, so every scoring worker forked from it starts with math-verify imported and its
grammar built, in milliseconds, instead of paying seconds of first use inside a sample's deadline."""

from tentalis_pipelines.rewards.remote_reward import warm_up

warm_up()

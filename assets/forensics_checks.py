"""Reward-hacking forensics as asset checks on `trajectories` and `checkpoints`.

Thin: each check reads the lakehouse, calls a detector of ``tentalis_pipelines.forensics`` and puts its
verdict and evidence in the check's metadata. All are **non-blocking WARN**: a hacking signal is a
statistical hint over the whole chain of policies, for a person to look at (the asset page shows the
numbers); the data itself is not wrong, so it must not stop the loop the way a blocking data-quality
check does. What stops a hacked checkpoint from serving is the promotion gate on held-out accuracy
(`serving`), which a policy cannot game by pleasing its manager.
"""

from __future__ import annotations

import json

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from assets.batch_assets import reviews, rollouts, trajectories
from assets.resources import LakehouseResource
from assets.training_assets import checkpoints
from tentalis_pipelines import forensics


def verdict_result(verdict: forensics.Verdict) -> AssetCheckResult:
    """A detector's verdict as a WARN check result: passed when it did not fire, the evidence as JSON."""
    meta = {"fired": MetadataValue.bool(verdict.fired), "detector": MetadataValue.text(verdict.detector),
            "evidence": MetadataValue.json(json.loads(json.dumps(verdict.evidence, default=str)))}
    return AssetCheckResult(passed=not verdict.fired, description=verdict.description, metadata=meta,
                            severity=AssetCheckSeverity.WARN)


def _training_chain(lakehouse: LakehouseResource):
    """The chain without held-out accuracy: these checks run inside the rollout job, before the policy's
    benchmarks exist (and `benchmark_results` is downstream of `trajectories`)."""
    chain = forensics.checkpoint_chain(lakehouse.lakehouse())
    return chain.drop_columns(["heldout_accuracy"])


@asset_check(asset=trajectories, additional_deps=[rollouts], blocking=False,
             description="WARN when the mean reward rises over the chain of policies while the verifier's accuracy on the "
                         "same rollouts does not keep up (tentalis_pipelines.forensics.reward_vs_accuracy).")
def reward_tracks_verifier(lakehouse: LakehouseResource) -> AssetCheckResult:
    return verdict_result(forensics.reward_vs_accuracy(_training_chain(lakehouse), accuracy_columns=("accuracy",)))


@asset_check(asset=trajectories, additional_deps=[rollouts], blocking=False,
             description="WARN when accuracy is flat or falling while completions grow longer, repeat steps or answer tags, "
                         "or gain format reward as the outcome falls (forensics.stuffing).")
def no_format_or_length_stuffing(lakehouse: LakehouseResource) -> AssetCheckResult:
    return verdict_result(forensics.stuffing(_training_chain(lakehouse)))


@asset_check(asset=trajectories, additional_deps=[reviews], blocking=False,
             description="WARN when a judge (a non-verifier manager) agrees with the verifier on the rollouts both scored "
                         "less often than the bar, 95% interval wholly below it (forensics.judge_vs_verifier).")
def judge_agrees_with_verifier(lakehouse: LakehouseResource) -> AssetCheckResult:
    return verdict_result(forensics.judge_vs_verifier(forensics.judge_table(forensics.review_table(lakehouse.lakehouse()))))


@asset_check(asset=trajectories, additional_deps=[reviews], blocking=False,
             description="WARN when a manager-worker pair (reviewer x tenant or policy version) scores beyond what the "
                         "verifier's correctness explains, 95% interval above the threshold (forensics.collusion).")
def no_collusion(lakehouse: LakehouseResource) -> AssetCheckResult:
    return verdict_result(forensics.collusion(forensics.review_table(lakehouse.lakehouse())))


@asset_check(asset=trajectories, additional_deps=[rollouts], blocking=False,
             description="WARN when an environment episode's agent reached for the verifier's machinery: the mini-SWE "
                         "detector's exploit findings (builtins, exit hooks, introspection, the runner's marker), or edits "
                         "to test files in more than 5% of the episodes (forensics.verifier_tampering).")
def no_verifier_tampering(lakehouse: LakehouseResource) -> AssetCheckResult:
    return verdict_result(forensics.verifier_tampering(forensics.tampering_table(lakehouse.lakehouse())))


# benchmark_results is downstream of checkpoints (a declared dependency would be a cycle): this check reads
# the held-out results that exist when it runs, i.e. those of the earlier checkpoints.
@asset_check(asset=checkpoints, additional_deps=[trajectories], blocking=False,
             description="WARN when the reward of the policies' rollouts rises over the chain of checkpoints while neither "
                         "the verifier's accuracy on them nor the held-out benchmark accuracy keeps up (forensics.reward_vs_accuracy).")
def reward_tracks_heldout(lakehouse: LakehouseResource) -> AssetCheckResult:
    return verdict_result(forensics.reward_vs_accuracy(forensics.checkpoint_chain(lakehouse.lakehouse())))


FORENSICS_CHECKS = [reward_tracks_verifier, no_format_or_length_stuffing, judge_agrees_with_verifier, no_collusion, reward_tracks_heldout,
                    no_verifier_tampering]

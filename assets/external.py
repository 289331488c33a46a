"""Tables that Tentalis reads but no asset writes: declared so the graph shows every input."""

from dagster import AssetSpec

from assets.table_metadata import table_definition_metadata

human_reviews = AssetSpec(
    "human_reviews",
    group_name="inputs",
    kinds={"delta"},
    metadata=table_definition_metadata("human_reviews"),
    description="Human reviews of rollouts (score, critique, hint, reviewer), merged by rollout id by "
    "`tentalis import-reviews FILE`; the `human` manager reads them when it builds `reviews`.",
)

reward_activations = AssetSpec(
    "reward_activations",
    group_name="inputs",
    kinds={"delta"},
    metadata=table_definition_metadata("reward_activations"),
    description="Every switch of the active reward version (who, why, the weights), appended by "
    "`tentalis rescore --activate VERSION`; the trajectories stage builds new batches with the active version's weights.",
)

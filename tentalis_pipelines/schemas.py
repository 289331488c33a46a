"""The data contract: one Arrow schema per lakehouse table, each column described.

The Arrow schema is the contract: it is what lands in Delta (names, types, nullability, column order)
and, as field metadata under the key ``description``, what each column means; each table's own
description is schema metadata under the same key. The Dagster UI shows the column descriptions in
every table asset's column schema (``assets/table_metadata.py``); ``column_descriptions`` and
``table_description`` read them.

The descriptions document; they are not written into the Delta log (``lakehouse.to_table`` drops them).
delta-rs stores Arrow field metadata in a table's schema and then refuses any later write whose
metadata for a field differs ("Cannot merge metadata with different values for key description"), so
editing a description would break every table that already exists. Names and types, by contrast, are
stored: never change a column's type (tables already exist in users' homes); add columns at the end.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
DESCRIPTION = b"description"
# rollouts.turn_spans: where each assistant turn lies in a multi-turn rollout's completion tokens.
TURN_SPAN = pa.list_(pa.struct([("turn_id", pa.string()), ("turn_index", pa.int32()),
                                 ("start", pa.int32()), ("end", pa.int32())]))


def col(name: str, type: pa.DataType, description: str = "", nullable: bool = True) -> pa.Field:
    """One column: name, Arrow type, what it means (field metadata ``description``), nullability.

    Descriptions are Markdown (the Dagster UI renders them): put ``<tags>`` and code in backticks."""
    metadata = {DESCRIPTION: description} if description else None
    return pa.field(name, type, nullable=nullable, metadata=metadata)


SCHEMAS: dict[str, pa.Schema] = {
    "tasks": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("task_id", pa.string(),
                "unique within the batch: the file's id, or a generator's "
                "index, or the session id", nullable=False),
            col("source", pa.string(), "where the task came from: a generator name or a file path"),
            col("environment", pa.string(), "math | code | chat"),
            col("prompt", pa.string(), "the question the policy answers"),
            col("reference", pa.string(), "ground truth: the answer, or tests for code"),
            col("difficulty", pa.int32(),
                "the generator's level, or the file's 'difficulty'/'level'; null when unknown"),
            col("metadata", pa.string(), "JSON object with anything else the source knew"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: "One task to answer: a prompt and its reference, per task batch."},
    ),
    "rollouts": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(),
                "hash of (batch, task, policy version, group index); 's-' + "
                "hash for a session segment", nullable=False),
            col("task_id", pa.string(), "the task answered (tasks.task_id)"),
            col("group_index", pa.int32(), "0..G-1: which of the task's G samples (the GRPO group)"),
            col("policy_version", pa.string(), "checkpoint id that sampled it, or 'base'"),
            col("backend", pa.string(), "the generation backend: transformers | vllm | openai"),
            col("model", pa.string(), "the model's name (the backend's model_name)"),
            col("prompt_text", pa.string(),
                "the rendered prompt the model saw (chat template, skills, worked example)"),
            col("completion", pa.string(), "the generated text"),
            col("steps", pa.list_(pa.string()), "the reasoning steps parsed from the completion, in order"),
            col("answer", pa.string(),
                "the final answer parsed from the completion; null when none was found"),
            col("parse_mode", pa.string(), "'tagged' when `<step>`/`<answer>` tags were used, else 'fallback'"),
            col("prompt_tokens", pa.int32(), "tokens in the prompt"),
            col("completion_tokens", pa.int32(), "tokens generated"),
            col("completion_token_ids", pa.list_(pa.int32()),
                "the generated token ids (what the trainer scores)"),
            col("sampling_logprobs", pa.list_(pa.float32()),
                "per completion token; null on a session's context tokens"),
            col("finish_reason", pa.string(), "'stop' (EOS or `</answer>`) or 'length'"),
            col("temperature", pa.float64(), "the sampling temperature"),
            col("seconds", pa.float64(), "generation wall time of this sample"),
            col("created_at", TS, "when the row was written (UTC)"),
            col("session_id", pa.string(), "sessions batches: the live session this rollout was built from"),
            col("prompt_token_ids", pa.list_(pa.int32()),
                "sessions batches: the exact prompt tokens (single-turn rows tokenize prompt_text)"),
            col("assistant_mask", pa.list_(pa.int8()),
                "sessions batches: 1 on tokens the model generated, 0 on system/user/tool/template tokens"),
            col("turn_spans", TURN_SPAN,
                "sessions batches: each assistant turn's [start, end) in completion_token_ids"),
            col("skill_ids", pa.list_(pa.string()),
                "the verified skills injected into this rollout's prompt (empty when none)"),
            col("episode", pa.string(),
                "environment batches: JSON of the agent episode (end_reason, passed, reward, detail, turns, "
                "max_turns, format_errors, check_kind, level); null otherwise"),
        ],
        metadata={DESCRIPTION: (
            "One sampled answer: G samples per task from the serving policy, or a live session's segment."
        )},
    ),
    "step_scores": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(),
                "the rollout: one sampled answer (rollouts.rollout_id)", nullable=False),
            col("step_index", pa.int32(), "0-based position of the step in rollouts.steps"),
            col("step_text", pa.string(), "the step as scored"),
            col("scorer", pa.string(),
                "calculator (checks the equations a step states) | judge (an LLM process reward model)"),
            col("score", pa.float64(),
                "calculator: 1 or 0; judge: 1 correct, 0 unsure, -1 wrong; "
                "null when the step states nothing checkable"),
            col("votes", pa.list_(pa.float64()),
                "every judge vote (one per sample); the calculator's score alone; empty when unscored"),
            col("rationale", pa.string(), "why: the failed equation, or the judge's words"),
        ],
        metadata={DESCRIPTION: (
            "One scored reasoning step of a rollout (calculator verifier or LLM judge with votes)."
        )},
    ),
    "grounding_flags": pa.schema(
        [
            col("batch_id", pa.string(), "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(), "the rollout whose completion holds the flagged turn (rollouts.rollout_id)", nullable=False),
            col("turn_index", pa.int32(), "the assistant turn's index in its session or episode (0 for a single-turn rollout)"),
            col("turn_token_start", pa.int32(), "first completion token of the flagged turn (its span in rollouts.completion_token_ids)"),
            col("turn_token_end", pa.int32(), "end (exclusive) of the flagged turn's completion tokens"),
            col("char_start", pa.int32(), "first character of the flagged claim in the turn's decoded text"),
            col("char_end", pa.int32(), "end (exclusive) of the flagged claim in the turn's decoded text"),
            col("token_start", pa.int32(), "first completion token of the claim (index into rollouts.completion_token_ids)"),
            col("token_end", pa.int32(), "end (exclusive) of the claim's completion tokens"),
            col("text", pa.string(), "the flagged claim as the answer states it"),
            col("kind", pa.string(), "number, unit, date, time, path or entity (the tagger's spans: entity)"),
            col("reason", pa.string(), "why it was flagged (what the context lacks)"),
            col("detector", pa.string(), "`rules` (the deterministic check) or `tagger` (the MiniLM token tagger)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One claim of an agent's answer that the tool outputs and context of its session do not support "
            "(the grounding check, docs/grounding.md)."
        )},
    ),
    "step_labels": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(),
                "the rollout: one sampled answer (rollouts.rollout_id)", nullable=False),
            col("step_index", pa.int32(), "0-based position of the step in rollouts.steps"),
            col("num_samples", pa.int32(),
                "continuations sampled from the prefix up to and including this step"),
            col("num_correct", pa.int32(), "of those, how many reached the right answer"),
            col("label", pa.float64(),
                "Math-Shepherd: fraction of continuations from this step prefix that reach the right answer"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "Math-Shepherd Monte-Carlo label of one step: how often continuations from it reach the answer."
        )},
    ),
    "reviews": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch, or 'live' for a review of gateway work (POST /v1/reviews)", nullable=False),
            col("rollout_id", pa.string(),
                "the reviewed rollout; for live work the turn id (or the "
                "session id for a session-level review)", nullable=False),
            col("manager", pa.string(), "who reviewed: verifier | llm | human | judge"),
            col("score", pa.float64(), "the review's score in [0, 1] (the reward's manager component)"),
            col("critique", pa.string(), "what was wrong or right, in words"),
            col("hint", pa.string(),
                "advice for the next attempt (empty when none); the OPD teacher's context"),
            col("created_at", TS, "when the row was written (UTC)"),
            # Live reviews (POST /v1/reviews) only; the pipeline's writers leave them null.
            col("review_id", pa.string(),
                "merge key of a live review (default: a hash of tenant, target and reviewer)"),
            col("session_id", pa.string(), "the reviewed session (a live review)"),
            col("reviewer", pa.string(), "who reviewed: a person, a script or an LLM"),
            col("rubric", pa.string(), "the rubric the score follows"),
            col("tenant", pa.string(), "the tenant of the API key that posted it"),
        ],
        metadata={DESCRIPTION: (
            "One manager review of a rollout: score, critique and hint (pipeline managers and live reviews)."
        )},
    ),
    "trajectories": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(),
                "the rollout: one sampled answer (rollouts.rollout_id)", nullable=False),
            col("task_id", pa.string(), "the task answered (tasks.task_id)"),
            col("group_index", pa.int32(), "0..G-1: which of the task's G samples (the GRPO group)"),
            col("policy_version", pa.string(), "checkpoint id that sampled the rollout, or 'base'"),
            col("outcome_reward", pa.float64(), "1 when the verifier accepts the answer, else 0"),
            col("format_reward", pa.float64(),
                "0.6 for an `<answer>` tag plus 0.4 for `<step>` tags, halved when cut off by length"),
            col("process_reward", pa.float64(),
                "mean of the scored steps (only when an answer was reached); null when nothing to credit"),
            col("step_rewards", pa.list_(pa.float64()),
                "each step's score on a 0..1 scale (judge -1/0/1 maps to 0/0.5/1); null = unscored"),
            col("manager_score", pa.float64(), "the review's score (reviews.score)"),
            col("overlong_penalty", pa.float64(), "DAPO soft overlong punishment added to the reward"),
            col("reward", pa.float64(),
                "the weighted sum of the components (reward_weights) plus overlong_penalty"),
            col("reward_weights", pa.string(), "JSON of the weights that combined the components"),
            col("advantage", pa.float64(),
                "group-relative advantage of reward (GRPO; the group is task x policy version)"),
            col("step_advantages", pa.list_(pa.float64()), "DeepSeekMath process advantages, one per step"),
            col("advantage_mode", pa.string(),
                "'outcome' (one advantage per sample) or 'process' (per step, per token)"),
            col("kept", pa.bool_(), "False when dynamic sampling drops the group (all rewards equal)"),
            col("created_at", TS, "when the row was written (UTC)"),
            col("kind", pa.string(),
                "'single' (one completion) or 'multi_turn' (a live session's segment); null = single"),
            col("loss_mask", pa.list_(pa.int8()),
                "multi_turn: 1 on the completion tokens trained on (rewarded assistant turns)"),
            col("token_advantages", pa.list_(pa.float64()),
                "multi_turn: the advantage of every completion token (0 on masked ones)"),
            col("turn_rewards", pa.list_(pa.float64()),
                "multi_turn: each assistant turn's reward (rollouts.turn_spans order)"),
            col("turn_advantages", pa.list_(pa.float64()),
                "multi_turn: each assistant turn's normalised advantage"),
            col("opd_signal", pa.list_(pa.float64()),
                "hinted OPD: clipped log pi_teacher(a|s+hint) - log pi(a|s) "
                "per completion token; null = no OPD term"),
            col("w_rl", pa.float64(),
                "weight of the RL advantage in the trained per-token advantage (null = 1)"),
            col("w_opd", pa.float64(), "weight of opd_signal in the trained per-token advantage (null = 0)"),
            col("reward_version", pa.string(),
                "the reward version whose rewards and advantages the row "
                "carries (`tentalis rescore`); null = the pipeline's own (v0)"),
            col("guide_hint_id", pa.string(),
                "a guided sample (guided_rollouts.rollout_id = rollout_id): the hint it was drawn with; null otherwise"),
            col("policy_lag", pa.int32(),
                "policy versions between the one that sampled the row and the one serving when the row was "
                "written (0 = the serving policy; the chain is checkpoints.parent_id); null = outside the chain"),
        ],
        metadata={DESCRIPTION: (
            "One training sample: the reward components, the reward, the advantages and the kept flag."
        )},
    ),
    "guided_rollouts": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(),
                "'g-' + hash of (batch, task, policy version, hint, index): a guided sample", nullable=False),
            col("task_id", pa.string(), "the task answered (tasks.task_id)"),
            col("group_index", pa.int32(), "0..guide_generations-1: which of the group's hinted samples"),
            col("policy_version", pa.string(), "checkpoint id that sampled it (with the hint), or 'base'"),
            col("hint_id", pa.string(), "the hint's id, as teacher_logprobs.hint_id (its source rollout, manager, text)"),
            col("hint_source", pa.string(), "the manager that wrote the hint"),
            col("hint", pa.string(), "the hint that was in the context"),
            col("source_rollout_id", pa.string(),
                "the failed rollout whose review carries the hint (rollouts.rollout_id)"),
            col("hint_votes", pa.int32(), "how many of the group's reviews gave this hint"),
            col("hint_reward", pa.float64(),
                "the hint's dense reward: log p(reference | prompt + hint, `<answer>`) - log p(reference | prompt, `<answer>`) "
                "under the sampling policy (rewards/hint_reward.py); 0 for a hint that leaks the answer"),
            col("prompt_text", pa.string(), "the student's prompt, without the hint: what the sample trains on"),
            col("behaviour_prompt_text", pa.string(), "the prompt the sample was drawn from: the hint after the task"),
            col("completion", pa.string(), "the generated text"),
            col("steps", pa.list_(pa.string()), "the reasoning steps parsed from the completion, in order"),
            col("answer", pa.string(), "the graded answer; null when none was found"),
            col("completion_tokens", pa.int32(), "tokens generated"),
            col("completion_token_ids", pa.list_(pa.int32()), "the generated token ids (what the trainer scores)"),
            col("behaviour_logprobs", pa.list_(pa.float32()),
                "per completion token, log pi_b(a|s+hint): the sampler's own, the guided ratio's denominator"),
            col("finish_reason", pa.string(), "'stop' (EOS or `</answer>`) or 'length'"),
            col("temperature", pa.float64(), "the sampling temperature"),
            col("correct", pa.bool_(), "the verifier accepts the answer: only correct samples become trajectories"),
            col("format_score", pa.float64(), "as trajectories.format_reward"),
            col("step_rewards", pa.list_(pa.float64()), "the calculator's check of each step (null = unscored)"),
            col("manager_score", pa.float64(), "the verifier manager's review score of the sample"),
            col("created_at", TS, "when the row was written (UTC)"),
            # Environment batches (training/episode_guide.py): a guided episode; null on arithmetic rows.
            col("rescue", pa.string(),
                "environment batches: what was in the episode's context: hint | prefix | both | resample (guide_with_hint = false)"),
            col("prefix_turns", pa.int32(), "environment batches: k, the demonstrated turns given as an expert prefix (0: none)"),
            col("demo_source", pa.string(), "environment batches: the demonstration the prefix came from (oracle:terminal, ...)"),
            col("prompt_token_ids", pa.list_(pa.int32()),
                "environment batches: the student's prompt ids (the first observation and the prefix, without the hint)"),
            col("assistant_mask", pa.list_(pa.int8()), "environment batches: 1 on the policy's own tokens of the completion"),
            col("turn_spans", TURN_SPAN, "environment batches: the policy's turns inside the completion (empty: not trainable)"),
            col("session_id", pa.string(), "environment batches: the guided episode's id (= rollout_id)"),
            col("episode", pa.string(), "environment batches: the episode record (JSON), as rollouts.episode"),
        ],
        metadata={DESCRIPTION: (
            "Hint-guided resampling (`--method guide`): samples (arithmetic) or episodes (environment batches) drawn "
            "with the manager's hint or an expert prefix for groups in which every sample failed; the correct ones "
            "train the student without the hint."
        )},
    ),
    "teacher_logprobs": pa.schema(
        [
            col("batch_id", pa.string(),
                "the task batch (partition key; a dynamic partition of task_batches)", nullable=False),
            col("rollout_id", pa.string(),
                "the rollout: one sampled answer (rollouts.rollout_id)", nullable=False),
            col("hint_id", pa.string(),
                "content hash of (rollout, manager, hint); null when the review has no hint"),
            col("hint_source", pa.string(),
                "the manager that wrote the hint: verifier | llm | human | judge"),
            col("hint", pa.string(), "the hint as the teacher saw it"),
            col("teacher", pa.string(),
                "`self:<policy_version>` (the sampling policy given the hint) or the teacher model's folder"),
            col("policy_version", pa.string(), "checkpoint id that sampled the rollout, or 'base'"),
            col("temperature", pa.float64(),
                "the completion's sampling temperature; both log-probs are at it"),
            col("decision", pa.string(), "used | no_hint | trivial | leaks_answer | no_effect"),
            col("reason", pa.string(), "why the hint filter decided so, in words"),
            col("teacher_logprobs", pa.list_(pa.float64()),
                "the teacher's log-prob of each completion token (decision = used only)"),
            col("student_logprobs", pa.list_(pa.float64()),
                "the sampling policy's log-prob of each completion token "
                "without the hint (decision = used only)"),
            col("opd_signal", pa.list_(pa.float64()),
                "clipped teacher - student per token (what trajectories carry)"),
            col("signal_mean", pa.float64(), "mean OPD signal over the completion tokens"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One hint-filter decision per reviewed rollout; for used hints, the teacher's and student's "
            "per-token log-probs."
        )},
    ),
    "human_reviews": pa.schema(
        [
            col("rollout_id", pa.string(),
                "the reviewed rollout (rollouts.rollout_id); one review per "
                "rollout, merged on import", nullable=False),
            col("batch_id", pa.string(), "the rollout's batch (looked up on import)"),
            col("reviewer", pa.string(), "who reviewed (the file's reviewer field)"),
            col("score", pa.float64(), "the reviewer's score in [0, 1]"),
            col("critique", pa.string(), "what was wrong or right, in words"),
            col("hint", pa.string(), "advice for the next attempt (empty when none)"),
            col("source", pa.string(), "the imported file's path"),
            col("line", pa.int64(), "the line of the file the review came from"),
            col("imported_at", TS, "when `tentalis import-reviews` imported it (UTC)"),
        ],
        metadata={DESCRIPTION: "One imported human review of a rollout (`tentalis import-reviews`)."},
    ),
    "checkpoints": pa.schema(
        [
            col("checkpoint_id", pa.string(),
                "the LoRA adapter's id; rollouts.policy_version names it", nullable=False),
            col("parent_id", pa.string(),
                "the checkpoint it was trained from; null = trained from the base model"),
            col("base_model", pa.string(), "the base model the adapter applies to"),
            col("adapter_uri", pa.string(), "where the adapter folder lies"),
            col("algorithm", pa.string(), "the loss: grpo | dr_grpo | dapo | cispo | gspo"),
            col("config", pa.string(), "JSON: the training configuration (GRPOConfig)"),
            col("trained_on", pa.list_(pa.string()), "the batches whose trajectories it trained on"),
            col("trajectory_ids", pa.list_(pa.string()),
                "the rollout ids of the trajectories it trained on, sorted"),
            col("trajectory_count", pa.int64(), "how many trajectories it trained on"),
            col("metrics", pa.string(),
                "JSON: training metrics (loss, KL, clip fraction, mean reward and accuracy of the data)"),
            col("promoted", pa.bool_(),
                "true once it has been promoted to serve (the serving table records every move)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One trained LoRA adapter with its lineage: parent, batches and trajectories, config, metrics."
        )},
    ),
    # Demonstrations live in their own table, not as columns on ``reviews``: a review's grain is one
    # rollout (its ``rollout_id``), while a demonstration answers a *task* (an oracle's or a person's
    # needs no rollout at all), holds a list of actions and the episode that verified them, and is
    # trained on by its own stage (``stages/warm_start.py``). ``demonstrations.py`` says more.
    "demonstrations": pa.schema(
        [
            col("demonstration_id", pa.string(),
                "'demo-' + hash of (batch, task, source, actions): the same demonstration lands once", nullable=False),
            col("batch_id", pa.string(), "the task batch of the task it solves (tasks.batch_id)", nullable=False),
            col("task_id", pa.string(), "the task it solves (tasks.task_id); never a held-out task", nullable=False),
            col("environment", pa.string(), "terminal | bfcl | swe: the environment it was verified in"),
            col("source", pa.string(),
                "who demonstrated: `oracle` (the task's scripted solution) | `openai:<model>` (a stronger model's "
                "verified episode) | `human:<file>` (imported by a person)"),
            col("source_line", pa.int64(), "the line of the imported file (human demonstrations); null otherwise"),
            col("actions", pa.list_(pa.string()),
                "the assistant turns, in order, in the policy's action format (a bash block, a list of calls)"),
            col("verified", pa.bool_(), "true when replaying the actions in the real environment passed the task's check"),
            col("verify_detail", pa.string(), "the verifying episode's end and the check's detail"),
            col("messages", pa.string(),
                "JSON: the verifying episode's conversation (role, content, kind): what the warm start trains on"),
            col("task_fingerprint", pa.string(), "sha256 of the task's prompt, check and initial state when it was demonstrated (contamination.task_fingerprint)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One demonstration: a sequence of actions that solves a training task, verified in its environment "
            "(the warm-start stage's data)."
        )},
    ),
    "benchmark_results": pa.schema(
        [
            col("checkpoint_id", pa.string(), "checkpoint id, or 'base' for the base model", nullable=False),
            col("benchmark", pa.string(),
                "arithmetic | gsm8k | math500 | humaneval, or `file:<name>` for a JSONL task file",
                nullable=False),
            col("n", pa.int64(), "items evaluated"),
            col("accuracy", pa.float64(),
                "strict: the answer inside the required tags is right (pass@1 for code)"),
            col("lenient_accuracy", pa.float64(),
                "the last number in the text is right (code: same as accuracy)"),
            col("format_rate", pa.float64(), "fraction of completions with the answer in the required tags"),
            col("ci_low", pa.float64(), "95% bootstrap interval of accuracy"),
            col("ci_high", pa.float64(), "the same interval, high end"),
            col("seconds", pa.float64(), "wall time of the evaluation"),
            col("backend", pa.string(), "the generation backend: transformers | vllm | openai"),
            col("model", pa.string(), "the model's name (the backend's model_name)"),
            col("config", pa.string(),
                "JSON: the evaluation settings (limit, seed, decoding, max new tokens, ...)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: "A checkpoint's accuracy on one benchmark (checkpoint x benchmark)."},
    ),
    "benchmark_items": pa.schema(
        [
            col("checkpoint_id", pa.string(), "checkpoint id, or 'base' for the base model", nullable=False),
            col("benchmark", pa.string(),
                "the benchmark's name (benchmark_results.benchmark)", nullable=False),
            col("item_id", pa.string(), "the item's id within the benchmark"),
            col("prompt", pa.string(), "the question as posed"),
            col("completion", pa.string(), "the generated text"),
            col("extracted_answer", pa.string(),
                "the answer taken from the completion; null when none was found"),
            col("reference", pa.string(), "the benchmark's answer (or tests, for code)"),
            col("correct", pa.bool_(),
                "strict: right, with the answer in the required tags (code: the tests pass)"),
            col("lenient_correct", pa.bool_(),
                "right by the last number in the text (code: same as correct)"),
            col("formatted", pa.bool_(), "the completion put its answer in the required tags"),
            col("created_at", TS, "when the row was written (UTC)"),
            col("skill_ids", pa.list_(pa.string()),
                "the verified skills injected into this item's prompt (empty when none)"),
        ],
        metadata={DESCRIPTION: "One benchmark item answered by one checkpoint."},
    ),
    "serving": pa.schema(
        [
            col("seq", pa.int64(),
                "position in the serving log; the row with the highest seq is what serves", nullable=False),
            col("from_checkpoint", pa.string(), "what served before this change: a checkpoint id or 'base'"),
            col("to_checkpoint", pa.string(),
                "what serves from this change on: a checkpoint id or 'base'", nullable=False),
            col("action", pa.string(), "promote | rollback | gate | reconcile | migrate | retract"),
            col("actor", pa.string(), "who: a user name, 'gate', 'trainer' or 'reconcile'"),
            col("reason", pa.string(), "why, in words"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "The serving log: each change of the policy that serves; the highest seq serves."
        )},
    ),
    "manager_checkpoints": pa.schema(
        [
            col("checkpoint_id", pa.string(),
                "the manager's LoRA adapter id ('m-…'); manager_serving names what reviews", nullable=False),
            col("parent_id", pa.string(), "the manager checkpoint it was trained from; null = the untrained manager"),
            col("base_model", pa.string(), "the base model the adapter applies to (review.judge_model)"),
            col("adapter_uri", pa.string(), "where the adapter folder lies"),
            col("algorithm", pa.string(), "the loss (GRPO family, as checkpoints.algorithm)"),
            col("config", pa.string(), "JSON: the manager's training configuration (ManagerRLConfig and GRPOConfig)"),
            col("trained_on", pa.list_(pa.string()), "the batches whose failed rollouts it learned to review"),
            col("trajectory_ids", pa.list_(pa.string()), "the failed rollouts it learned to write hints for, sorted"),
            col("trajectory_count", pa.int64(), "how many failed rollouts"),
            col("metrics", pa.string(),
                "JSON: mean reward, rescue rate of its hints, share of usable hints, score error against the verifier"),
            col("promoted", pa.bool_(), "true once it has been promoted to review (manager_serving records every move)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One trained manager adapter (meta-RL: hints rewarded by the worker's rescue, scores kept accurate) "
            "with its lineage."
        )},
    ),
    "manager_serving": pa.schema(
        [
            col("seq", pa.int64(), "position in the manager's serving log; the highest seq reviews", nullable=False),
            col("from_checkpoint", pa.string(), "what reviewed before this change: a manager checkpoint id or 'base'"),
            col("to_checkpoint", pa.string(), "what reviews from this change on: a manager checkpoint id or 'base'",
                nullable=False),
            col("action", pa.string(), "promote | rollback | gate | retract"),
            col("actor", pa.string(), "who: a user name or 'gate'"),
            col("reason", pa.string(), "why, in words"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "The manager's serving log: which manager adapter writes the llm reviews; the highest seq serves."
        )},
    ),
    "manager_samples": pa.schema(
        [
            col("checkpoint_id", pa.string(), "the manager checkpoint these samples trained", nullable=False),
            col("sample_id", pa.string(), "'ms-' + hash of (checkpoint, failed rollout, index)", nullable=False),
            col("batch_id", pa.string(), "the batch of the failed rollout"),
            col("rollout_id", pa.string(), "the failed rollout the manager reviewed (rollouts.rollout_id)"),
            col("task_id", pa.string(), "its task"),
            col("sample_index", pa.int32(), "0..num_generations-1: which of the group's sampled reviews; num_generations: a proposal"),
            col("manager_version", pa.string(), "the manager checkpoint that sampled the review, or 'base'"),
            col("proposer", pa.string(), "who wrote the hint: 'manager' (sampled by manager_version) or the reviewer whose "
                "hint was offered beside the samples (ManagerRLConfig.hint_proposals, e.g. 'verifier'; its sample_index is "
                "num_generations)"),
            col("worker_version", pa.string(), "the worker checkpoint whose rescue measured the hint, or 'base'"),
            col("review_text", pa.string(), "the manager's reply as generated (a proposal: written after its context reply)"),
            col("score", pa.float64(), "the score it gave, in [0, 1] (null: unparseable)"),
            col("hint", pa.string(), "the hint it wrote"),
            col("hint_decision", pa.string(), "the OPD hint screen: used | no_hint | trivial | leaks_answer"),
            col("rescue_k", pa.int32(), "worker samples drawn with the hint"),
            col("rescued", pa.int32(), "how many of them the verifier accepted"),
            col("dense_reward", pa.float64(), "the hint's dense reward (rewards/hint_reward.py), when that is the reward"),
            col("verifier_score", pa.float64(), "the verifier manager's score of the same rollout"),
            col("worker_correct", pa.bool_(), "the verifier accepted the rollout: no hint is measured, the score alone counts"),
            col("reward", pa.float64(), "the manager's reward: hint value - accuracy_weight * |score - verifier_score|"),
            col("advantage", pa.float64(), "the group-relative advantage (group = the failed rollout) of the review's critique "
                "and hint tokens: of the hint value alone (credit 'fields') or of the reward (credit 'review', every token)"),
            col("score_advantage", pa.float64(), "the advantage of the score's tokens: of - accuracy_weight * |score - "
                "verifier_score| alone (credit 'fields'), or the reward's (credit 'review', equal to advantage)"),
            col("credit", pa.string(), "which tokens each part of the reward trained: fields | review (ManagerRLConfig.credit)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: "What taught a manager checkpoint: each sampled review, what its hint did, its reward."},
    ),
    "manager_evals": pa.schema(
        [
            col("checkpoint_id", pa.string(), "the manager evaluated: a manager checkpoint id or 'base'", nullable=False),
            col("rollout_id", pa.string(), "a held-out failed rollout (rollouts.rollout_id)", nullable=False),
            col("task_id", pa.string(), "its task"),
            col("worker_version", pa.string(), "the worker checkpoint whose rescue measured the hint, or 'base'"),
            col("score", pa.float64(), "the manager's score (greedy review; null: unparseable)"),
            col("hint", pa.string(), "the hint it wrote"),
            col("hint_decision", pa.string(), "the OPD hint screen: used | no_hint | trivial | leaks_answer"),
            col("rescue_k", pa.int32(), "worker samples drawn with the hint (0 when it was not usable)"),
            col("rescued", pa.int32(), "how many of them the verifier accepted"),
            col("verifier_score", pa.float64(), "the verifier manager's score of the same rollout"),
            col("worker_correct", pa.bool_(), "the verifier accepted the rollout: only its score is compared"),
            col("seed", pa.int64(), "the rescue sampling seed (the same for every manager compared)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "A manager on held-out failures: its greedy review, whether its hint rescued the worker, its score "
            "against the verifier's. The manager's promotion gate compares two managers on the same rows."
        )},
    ),
    "gate_decisions": pa.schema(
        [
            col("checkpoint_id", pa.string(),
                "the candidate checkpoint the promotion gate decided on", nullable=False),
            col("benchmark", pa.string(), "the gate benchmark (bench.gate_benchmark)", nullable=False),
            col("incumbent", pa.string(),
                "what it was compared with: the serving policy, or its parent / 'base'"),
            col("promote", pa.bool_(), "the decision: true moves the serving pointer, false leaves it"),
            col("n_paired", pa.int64(), "items both answered (the paired comparison's size)"),
            col("candidate_accuracy", pa.float64(), "the candidate's accuracy on the paired items"),
            col("incumbent_accuracy", pa.float64(), "the incumbent's accuracy on the paired items"),
            col("diff", pa.float64(), "mean per-item difference, candidate - incumbent"),
            col("diff_ci_low", pa.float64(), "95% paired-bootstrap interval of the difference, low end"),
            col("diff_ci_high", pa.float64(), "95% paired-bootstrap interval of the difference, high end"),
            col("margin", pa.float64(), "bench.gate_margin: rejected when diff_ci_high < -margin"),
            col("reason", pa.string(), "the decision in words"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One promotion-gate decision: a candidate checkpoint against the incumbent on the gate benchmark."
        )},
    ),
    "training_claims": pa.schema(
        [
            col("claim_id", pa.string(), "one training run's claim; its rows are its events", nullable=False),
            col("event", pa.string(),
                "claimed | done | abandoned; a claim's last event is its state", nullable=False),
            col("policy_version", pa.string(),
                "the serving policy whose fresh trajectories the run trains on"),
            col("checkpoint_id", pa.string(), "the checkpoint the run writes"),
            col("promote", pa.bool_(), "whether the run intends to promote it (trainer.promotion = always)"),
            col("trajectory_count", pa.int64(), "fresh trajectories the run trains on"),
            col("host", pa.string(), "the machine the run ran on"),
            col("pid", pa.int64(), "the run's process id"),
            col("pid_start", pa.int64(),
                "the process's start time in clock ticks (tells a reused pid apart)"),
            col("thread", pa.int64(), "the run's thread id (two runs in one process are told apart)"),
            col("run", pa.string(), "the run's name: $TENTALIS_RUN_ID, else the program's name"),
            col("reason", pa.string(), "why the event happened, in words"),
            col("created_at", TS, "when the event happened (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "The events of training runs' claims on fresh trajectories (claimed, done, abandoned)."
        )},
    ),
    "training_windows": pa.schema(
        [
            col("window_id", pa.string(), "one idle-window training run", nullable=False),
            col("run_id", pa.string(), "the Dagster run (or the program) that trained in it"),
            col("policy_version", pa.string(), "the serving policy whose fresh trajectories it trained on"),
            col("outcome", pa.string(),
                "finished (a checkpoint was recorded) | preempted (a request arrived; progress saved) | "
                "nothing (no fresh trajectories) | failed", nullable=False),
            col("idle_minutes", pa.float64(),
                "how long the gateway had been idle when the window opened; null = it never served"),
            col("trained_minutes", pa.float64(), "wall minutes from the window's start to its end"),
            col("micro_steps", pa.int64(), "forward/backward micro-batches completed in this window"),
            col("steps", pa.int64(), "optimizer steps completed in this window"),
            col("saves", pa.int64(), "progress saves in this window"),
            col("resumed_from", pa.string(),
                "the saved position it resumed at, 'iteration/step/micro-batch'; null = a fresh start"),
            col("saved_at", pa.string(), "the position of its last saved progress; null = none saved"),
            col("yield_seconds", pa.float64(),
                "preempted: seconds from the request that ended the window to the run's stop"),
            col("checkpoint_id", pa.string(), "finished: the checkpoint it recorded"),
            col("refused_policy_lag", pa.int64(),
                "fresh trajectories refused as older than trainer.max_policy_lag"),
            col("reason", pa.string(), "what ended the window, in words"),
            col("started_at", TS, "when the window opened (UTC)"),
            col("ended_at", TS, "when it ended (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One idle-window training run: how long the box was idle, how long it trained, and whether it finished or yielded."
        )},
    ),
    "quarantine": pa.schema(
        [
            col("source", pa.string(),
                "where the rejected input came from: a file path, 'live-sessions', 'judge', ..."),
            col("line", pa.int64(), "the line in the file; null when the input was not a file line"),
            col("raw", pa.string(), "the rejected input as it came (truncated)"),
            col("error", pa.string(), "why it was rejected"),
            col("batch_id", pa.string(),
                "the batch it was meant for; null when none (e.g. a human "
                "review that names no known rollout)"),
            col("stage", pa.string(), "the stage that rejected it: tasks | reviews | human_reviews"),
            col("seen_at", TS, "when it was rejected (UTC)"),
        ],
        metadata={DESCRIPTION: "One rejected input, kept with the reason (never dropped silently)."},
    ),
    "sessions": pa.schema(
        [
            col("session_id", pa.string(),
                "from the X-Session-Id header or the request's `user` field "
                "(else a new id per request)", nullable=False),
            col("tenant", pa.string(), "the tenant of the API key that opened it", nullable=False),
            col("turn_count", pa.int64(), "model calls in the session"),
            col("policy_versions", pa.list_(pa.string()),
                "every policy version that answered in the session, in order"),
            col("models", pa.list_(pa.string()),
                "every model name requested in the session, in order of first use"),
            col("first_turn_at", TS, "when the session's first turn was answered (UTC)"),
            col("last_turn_at", TS, "when the session's last turn was answered (UTC)"),
            col("metadata", pa.string(), "JSON object: client-supplied session metadata"),
        ],
        metadata={DESCRIPTION: "One agent session through the gateway."},
    ),
    "turns": pa.schema(
        [
            col("turn_id", pa.string(),
                "unique per model call and choice: the response id plus the choice index", nullable=False),
            col("session_id", pa.string(), "the session it belongs to (sessions.session_id)", nullable=False),
            col("tenant", pa.string(), "the tenant of the API key that made the call", nullable=False),
            col("turn_index", pa.int32(), "0-based position of this call in its session"),
            col("choice_index", pa.int32(), "which of the `n` choices this row is"),
            col("endpoint", pa.string(), "'chat.completions' or 'completions'"),
            col("model", pa.string(), "the model name the request asked for"),
            col("policy_version", pa.string(),
                "checkpoint id that answered, or 'base', or `upstream:<model>`"),
            col("backend", pa.string(), "the generation backend that answered: transformers | vllm | openai"),
            col("messages", pa.string(), "JSON: the request's messages (or the prompt for /v1/completions)"),
            col("tools", pa.string(), "JSON: the request's tools, '[]' when none"),
            col("response", pa.string(), "JSON: the assistant message (content and tool_calls)"),
            col("prompt_token_ids", pa.list_(pa.int32()), "the exact templated prompt the model saw"),
            col("completion_token_ids", pa.list_(pa.int32()), "the generated token ids"),
            col("sampling_logprobs", pa.list_(pa.float32()),
                "per completion token, where the backend gives them"),
            col("finish_reason", pa.string(), "'stop', 'length' or 'tool_calls'"),
            col("temperature", pa.float64(), "the sampling temperature"),
            col("max_tokens", pa.int32(), "the request's max_tokens; null when not given"),
            col("stream", pa.bool_(), "whether the response was streamed"),
            col("prompt_tokens", pa.int32(), "tokens in the prompt"),
            col("completion_tokens", pa.int32(), "tokens generated"),
            col("latency_ms", pa.float64(), "time to answer, in milliseconds"),
            col("created_at", TS, "when the call was answered (UTC)"),
        ],
        metadata={DESCRIPTION: "One model call (one choice) in an agent session."},
    ),
    "lineage": pa.schema(
        [
            col("checkpoint_id", pa.string(),
                "the checkpoint whose training the row records", nullable=False),
            col("kind", pa.string(),
                "manifest | table | trajectory | review | hint | skill: what "
                "the row records", nullable=False),
            col("table_name", pa.string(),
                "the table read (table) or holding the row (trajectory, review, hint, skill)"),
            col("table_version", pa.int64(),
                "the Delta version of table_name that training read (time travel replays it)"),
            col("row_id", pa.string(),
                "the row trained on: a rollout id (trajectory), a review key (review, hint), a skill id"),
            col("batch_id", pa.string(), "the batch of the row trained on; null for manifest and table rows"),
            col("detail", pa.string(),
                "JSON; the manifest row: parent, config, code version, model, ancestors"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "What each checkpoint trained on: manifest, table versions and the rows used."
        )},
    ),
    "audit": pa.schema(
        [
            col("actor", pa.string(),
                "who: a user name, 'gate', 'trainer', 'reconcile', 'retract'", nullable=False),
            col("at", TS, "when it happened (UTC)"),
            col("action", pa.string(),
                "promote | rollback | gate | reconcile | migrate | retract "
                "(serving moves), gate_decision, retraction", nullable=False),
            col("subject", pa.string(),
                "what it is about: a checkpoint id, or the retracted review / session / task"),
            col("from_state", pa.string(),
                "before: the serving checkpoint, the incumbent, or the rows retracted"),
            col("to_state", pa.string(),
                "after: the serving checkpoint, 'promote' / 'reject', or the rows left"),
            col("reason", pa.string(), "why, in words"),
            col("detail", pa.string(), "JSON with the numbers behind it"),
        ],
        metadata={DESCRIPTION: "Each promotion, rollback, retraction and gate decision: who, when, why."},
    ),
    "judge_agreement": pa.schema(
        [
            col("judge", pa.string(),
                "who scored: a reviews.manager (llm, verifier) or "
                "`<reward_version>:<manager>` of a re-score", nullable=False),
            col("rubric", pa.string(),
                "the rubric it scored with ('default' when the row does not name one)", nullable=False),
            col("window_kind", pa.string(), "'batch', 'day' or 'all'; a step scorer's 'processbench' or 'verifier'",
                nullable=False),
            col("window_id", pa.string(), "the batch id, the day (YYYY-MM-DD) or 'all'", nullable=False),
            col("window_start", TS, "the earliest judge score of the window (orders the windows)"),
            col("n", pa.int64(), "rollouts scored by both the judge and a human manager"),
            col("mean_abs_diff", pa.float64(), "mean |judge score - human score| (scores in [0, 1])"),
            col("spearman", pa.float64(),
                "Spearman rank correlation (average ranks for ties); null when either side is constant"),
            col("pass_agreement", pa.float64(),
                "fraction of rollouts where judge and human agree on pass (score >= 0.5) or fail"),
            col("judge_mean", pa.float64(), "the judge's mean score over the window's rollouts"),
            col("human_mean", pa.float64(), "the human manager's mean score over the same rollouts"),
            col("computed_at", TS, "when the table was recomputed (UTC)"),
            col("f1", pa.float64(),
                "window_kind 'processbench' (a step scorer against ProcessBench's human labels): ProcessBench's F1; "
                "else null"),
            col("error_accuracy", pa.float64(),
                "window_kind 'processbench': share of erroneous solutions whose first wrong step was found exactly"),
            col("correct_accuracy", pa.float64(),
                "window_kind 'processbench': share of correct solutions judged all correct"),
        ],
        metadata={DESCRIPTION: "How well a judge agrees with human managers, per judge, rubric and window; a step "
                               "scorer's rows against ProcessBench's labels ('processbench') and the verifier "
                               "('verifier') are written by `tentalis prm eval`."},
    ),
    "reward_versions": pa.schema(
        [
            col("reward_version", pa.string(),
                "the version's name; 'v0' is the pipeline's own trajectories", nullable=False),
            col("rollout_id", pa.string(),
                "the rollout: one sampled answer (rollouts.rollout_id)", nullable=False),
            col("batch_id", pa.string(), "the rollout's batch"),
            col("task_id", pa.string(), "the task answered (tasks.task_id)"),
            col("group_index", pa.int32(), "0..G-1: which of the task's G samples"),
            col("policy_version", pa.string(), "checkpoint id that sampled the rollout, or 'base'"),
            col("outcome_reward", pa.float64(), "1 when the verifier accepts the answer, else 0"),
            col("format_reward", pa.float64(), "the format component (as trajectories.format_reward)"),
            col("process_reward", pa.float64(),
                "the process component (as trajectories.process_reward); null when nothing to credit"),
            col("step_rewards", pa.list_(pa.float64()),
                "each step's score on a 0..1 scale under this version's step scorer; null = unscored"),
            col("manager_score", pa.float64(), "the manager component the reward used"),
            col("manager", pa.string(),
                "who gave manager_score: human, llm, verifier, or the stored review's manager"),
            col("judge_score", pa.float64(),
                "the re-scoring manager's own score, also where a human's score was kept (null: its reply did not parse)"),
            col("overlong_penalty", pa.float64(), "DAPO soft overlong punishment added to the reward"),
            col("reward", pa.float64(), "the reward under this version"),
            col("reward_weights", pa.string(), "JSON of the weights that combined the components"),
            col("advantage", pa.float64(), "group-relative advantage of reward under this version"),
            col("step_advantages", pa.list_(pa.float64()), "DeepSeekMath process advantages, one per step"),
            col("advantage_mode", pa.string(), "'outcome' or 'process'"),
            col("kept", pa.bool_(), "False when dynamic sampling drops the group"),
            col("rank", pa.int32(),
                "1 = the best reward of its group (task x policy version); ties share the better rank"),
            col("base_version", pa.string(),
                "the version this one is compared with (the active one when it was made)"),
            col("base_reward", pa.float64(), "the reward under base_version"),
            col("base_advantage", pa.float64(), "the advantage under base_version"),
            col("base_rank", pa.int32(), "the rank under base_version"),
            col("reward_delta", pa.float64(), "reward - base_reward"),
            col("rank_change", pa.int32(), "rank - base_rank (negative: moved up)"),
            col("sign_flip", pa.bool_(),
                "the advantage's sign (-, 0, +; |a| < 1e-9 is 0) differs from the base's"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "Each trajectory's rewards and advantages under one reward version, compared with its base."
        )},
    ),
    "reward_version_defs": pa.schema(
        [
            col("reward_version", pa.string(),
                "the version's name (reward_versions.reward_version)", nullable=False),
            col("base_version", pa.string(), "the version it was compared with when made; null for v0"),
            col("definition", pa.string(),
                "JSON: weights overrides, manager, step scorer, judge model, "
                "rubric and its hash, advantage settings"),
            col("batches", pa.list_(pa.string()), "the batches it re-scored"),
            col("n", pa.int64(), "trajectory rows it re-scored"),
            col("summary", pa.string(),
                "JSON: the diff against base_version (deltas, rank changes, sign flips)"),
            col("created_by", pa.string(), "who made it (a user name; 'snapshot' for v0)"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: "One reward version: its definition and its diff against the base version."},
    ),
    "reward_activations": pa.schema(
        [
            col("seq", pa.int64(),
                "position in the activation log; the highest seq is the active"
                " reward version", nullable=False),
            col("from_version", pa.string(), "the reward version active before"),
            col("to_version", pa.string(), "the reward version active from this row on", nullable=False),
            col("actor", pa.string(), "who activated it"),
            col("reason", pa.string(), "why, in words"),
            col("weights", pa.string(),
                "JSON: the new version's weight overrides, which batches built from now on take"),
            col("batches", pa.list_(pa.string()),
                "the batches whose trajectories were rewritten to the new version"),
            col("rows", pa.int64(), "trajectory rows rewritten"),
            col("created_at", TS, "when the row was written (UTC)"),
        ],
        metadata={DESCRIPTION: "The activation log of reward versions; the highest seq is the active one."},
    ),
    "hint_efficacy": pa.schema(
        [
            col("checkpoint_id", pa.string(),
                "the checkpoint that trained on the hinted failures", nullable=False),
            col("before_policy", pa.string(),
                "the policy that failed and got the hints (what the checkpoint trained from)"),
            col("manager", pa.string(), "who wrote the hints: verifier | llm | human | judge"),
            col("hint_kind", pa.string(),
                "wrong_step | plan | finish_with_answer | format | free_text (from the wording)"),
            col("family", pa.string(),
                "task family: the arithmetic operation pattern, a session family, or environment:source"),
            col("hinted_failures", pa.int64(),
                "failed rollouts with such a hint that the checkpoint trained on"),
            col("distilled", pa.int64(),
                "of those, how many got an OPD term (teacher_logprobs.decision = 'used')"),
            col("before_n", pa.int64(), "the family's rollouts by the before policy"),
            col("before_success", pa.float64(),
                "the family's success rate among the before policy's rollouts"),
            col("after_n", pa.int64(), "the family's rollouts by the checkpoint"),
            col("after_success", pa.float64(),
                "the family's success rate among the checkpoint's own rollouts"),
            col("delta", pa.float64(), "after_success - before_success"),
            col("delta_ci_low", pa.float64(), "95% interval of after - before (Newcombe, Wilson score)"),
            col("delta_ci_high", pa.float64(), "95% interval of after - before, high end"),
            col("computed_at", TS, "when the table was recomputed (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "Did the hint change behaviour? Per checkpoint x manager x hint kind x task family."
        )},
    ),
    "skills": pa.schema(
        [
            col("skill_id", pa.string(), "content hash of the normalised text", nullable=False),
            col("text", pa.string(), "one imperative sentence, at most 200 characters"),
            col("failure_type", pa.string(),
                "no_answer | length | format | wrong_step | wrong_operation | other"),
            col("embedding", pa.list_(pa.float32()), "all-MiniLM-L6-v2 embedding of the text (unit length)"),
            col("source_review_ids", pa.list_(pa.string()),
                "the reviews it was distilled from (the reviewed rollout ids)"),
            col("support", pa.int32(), "number of source reviews"),
            col("source", pa.string(), "template | llm"),
            col("status", pa.string(), "candidate | verified | retired"),
            col("gain", pa.float64(),
                "last measured paired accuracy gain (with - without) on the validation items"),
            col("ci_low", pa.float64(), "95% paired bootstrap interval of the gain, lower end"),
            col("ci_high", pa.float64(), "95% paired bootstrap interval of the gain, higher end"),
            col("n", pa.int32(), "validation items of the last measurement"),
            col("measured_on", pa.string(), "checkpoint (policy version) the last measurement used"),
            col("measured_at", TS, "when the gain was last measured (UTC)"),
            col("verified_at", TS, "when it was last promoted to verified"),
            col("created_at", TS, "when the skill was first distilled (UTC)"),
            col("updated_at", TS, "when the row last changed (UTC)"),
        ],
        metadata={DESCRIPTION: "One distilled lesson (skill) with its measured effect and status."},
    ),
    "skill_decisions": pa.schema(
        [
            col("decision_id", pa.string(),
                "hash of the batch, the skill, the policy version and the time", nullable=False),
            col("skill_id", pa.string(), "the skill decided on (skills.skill_id)", nullable=False),
            col("text", pa.string(), "the skill's text at the time"),
            col("batch_id", pa.string(), "the batch whose skills run made the decision"),
            col("kind", pa.string(), "verify (a candidate) | recheck (a verified skill)"),
            col("from_status", pa.string(), "the skill's status before: candidate | verified"),
            col("to_status", pa.string(), "its status after: verified | retired | candidate"),
            col("gain", pa.float64(), "paired accuracy gain, with - without the skill"),
            col("ci_low", pa.float64(), "95% paired bootstrap interval of the gain, low end"),
            col("ci_high", pa.float64(), "95% paired bootstrap interval of the gain, high end"),
            col("n", pa.int32(), "validation items"),
            col("wins", pa.int32(), "items right only with the skill"),
            col("losses", pa.int32(), "items right only without it"),
            col("with_accuracy", pa.float64(), "validation accuracy with the skill in the prompt"),
            col("without_accuracy", pa.float64(), "validation accuracy without it"),
            col("checkpoint_id", pa.string(), "the policy version evaluated"),
            col("validation", pa.string(), "the validation set: generator, seed, size"),
            col("rule", pa.string(), "the decision rule with its numbers"),
            col("seconds", pa.float64(), "wall time of the evaluation with the skill"),
            col("decided_at", TS, "when the decision was made (UTC)"),
        ],
        metadata={DESCRIPTION: (
            "One verify or recheck decision on a skill, with the paired measurement behind it."
        )},
    ),
}

# Tables with one partition per task batch: a re-run of a batch replaces exactly that batch's rows.
BATCH_TABLES = ("tasks", "rollouts", "step_scores", "step_labels", "reviews", "teacher_logprobs", "guided_rollouts", "trajectories",
                "grounding_flags")


def column_descriptions(table: str) -> dict[str, str]:
    """``{column: description}`` of table ``table``, in column order ("" for a column without one)."""
    return {f.name: (f.metadata or {}).get(DESCRIPTION, b"").decode() for f in SCHEMAS[table]}


def table_description(table: str) -> str:
    """What one row of table ``table`` is."""
    return (SCHEMAS[table].metadata or {}).get(DESCRIPTION, b"").decode()

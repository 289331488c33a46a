"""The data contract: one Arrow schema and one pydantic row model per lakehouse table.

The Arrow schema is what lands in Delta; the pydantic model validates rows that come from outside
(task files, human reviews) and documents each column. ``tests/test_schemas.py`` keeps the two in step.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
from pydantic import BaseModel, Field

TS = pa.timestamp("us", tz="UTC")


class TaskRow(BaseModel):
    batch_id: str
    task_id: str
    source: str = Field(description="where the task came from: a generator name or a file path")
    environment: str = Field(description="math | code | chat")
    prompt: str
    reference: str = Field(description="ground truth: the answer, or tests for code")
    difficulty: int | None = None
    metadata: str = Field("{}", description="JSON object with anything else the source knew")
    created_at: datetime


class RolloutRow(BaseModel):
    batch_id: str
    rollout_id: str
    task_id: str
    group_index: int
    policy_version: str = Field(description="checkpoint id that sampled it, or 'base'")
    backend: str
    model: str
    prompt_text: str
    completion: str
    steps: list[str]
    answer: str | None
    parse_mode: str = Field(description="'tagged' when <step>/<answer> tags were used, else 'fallback'")
    prompt_tokens: int
    completion_tokens: int
    completion_token_ids: list[int]
    sampling_logprobs: list[float | None] | None = Field(None, description="per completion token; null on a session's context tokens")
    finish_reason: str = Field(description="'stop' (EOS or </answer>) or 'length'")
    temperature: float
    seconds: float
    created_at: datetime
    session_id: str | None = Field(None, description="sessions batches: the live session this rollout was built from")
    prompt_token_ids: list[int] | None = Field(None, description="sessions batches: the exact prompt tokens (single-turn rows tokenize prompt_text)")
    assistant_mask: list[int] | None = Field(None, description="sessions batches: 1 on tokens the model generated, 0 on system/user/tool/template tokens")
    turn_spans: list[dict] | None = Field(None, description="sessions batches: each assistant turn's [start, end) in completion_token_ids")
    skill_ids: list[str] | None = Field(None, description="the verified skills injected into this rollout's prompt (empty when none)")


class StepScoreRow(BaseModel):
    batch_id: str
    rollout_id: str
    step_index: int
    step_text: str
    scorer: str
    score: float | None
    votes: list[float]
    rationale: str


class StepLabelRow(BaseModel):
    batch_id: str
    rollout_id: str
    step_index: int
    num_samples: int
    num_correct: int
    label: float = Field(description="Math-Shepherd: fraction of continuations from this step prefix that reach the right answer")
    created_at: datetime


class ReviewRow(BaseModel):
    batch_id: str = Field(description="the task batch, or 'live' for a review of gateway work (POST /v1/reviews)")
    rollout_id: str = Field(description="the reviewed rollout; for live work the turn id (or the session id for a session-level review)")
    manager: str
    score: float
    critique: str
    hint: str
    created_at: datetime
    # Live reviews (POST /v1/reviews) only; the pipeline's writers leave them null.
    review_id: str | None = Field(None, description="merge key of a live review (default: a hash of tenant, target and reviewer)")
    session_id: str | None = Field(None, description="the reviewed session (a live review)")
    reviewer: str | None = Field(None, description="who reviewed: a person, a script or an LLM")
    rubric: str | None = Field(None, description="the rubric the score follows")
    tenant: str | None = Field(None, description="the tenant of the API key that posted it")


class TrajectoryRow(BaseModel):
    batch_id: str
    rollout_id: str
    task_id: str
    group_index: int
    policy_version: str
    outcome_reward: float
    format_reward: float
    process_reward: float | None
    step_rewards: list[float | None]
    manager_score: float
    overlong_penalty: float = Field(0.0, description="DAPO soft overlong punishment added to the reward")
    reward: float
    reward_weights: str = Field(description="JSON of the weights that combined the components")
    advantage: float
    step_advantages: list[float] = Field(description="DeepSeekMath process advantages, one per step")
    advantage_mode: str = Field(description="'outcome' (one advantage per sample) or 'process' (per step, per token)")
    kept: bool = Field(description="False when dynamic sampling drops the group (all rewards equal)")
    created_at: datetime
    kind: str | None = Field(None, description="'single' (one completion) or 'multi_turn' (a live session's segment); null = single")
    loss_mask: list[int] | None = Field(None, description="multi_turn: 1 on the completion tokens trained on (rewarded assistant turns)")
    token_advantages: list[float] | None = Field(None, description="multi_turn: the advantage of every completion token (0 on masked ones)")
    turn_rewards: list[float | None] | None = Field(None, description="multi_turn: each assistant turn's reward (rollouts.turn_spans order)")
    turn_advantages: list[float | None] | None = Field(None, description="multi_turn: each assistant turn's normalised advantage")
    opd_signal: list[float] | None = Field(None, description="hinted OPD: clipped log pi_teacher(a|s+hint) - log pi(a|s) per completion token; null = no OPD term")
    w_rl: float | None = Field(None, description="weight of the RL advantage in the trained per-token advantage (null = 1)")
    w_opd: float | None = Field(None, description="weight of opd_signal in the trained per-token advantage (null = 0)")
    reward_version: str | None = Field(None, description="the reward version whose rewards and advantages the row carries "
                                                     "(`tentalis rescore`); null = the pipeline's own (v0)")


class TeacherLogprobRow(BaseModel):
    """One hint-filter decision per reviewed rollout, and for the hints that go on to the teacher, the
    teacher's and the student's per-token log-probs of the student's own completion."""

    batch_id: str
    rollout_id: str
    hint_id: str | None = Field(None, description="content hash of (rollout, manager, hint); null when the review has no hint")
    hint_source: str = Field(description="the manager that wrote the hint: verifier | llm | human | judge")
    hint: str = Field(description="the hint as the teacher saw it")
    teacher: str = Field(description="'self:<policy_version>' (the sampling policy given the hint) or the teacher model's folder")
    policy_version: str
    temperature: float = Field(description="the completion's sampling temperature; both log-probs are at it")
    decision: str = Field(description="used | no_hint | trivial | leaks_answer | no_effect")
    reason: str
    teacher_logprobs: list[float] | None = None
    student_logprobs: list[float] | None = None
    opd_signal: list[float] | None = Field(None, description="clipped teacher - student per token (what trajectories carry)")
    signal_mean: float | None = Field(None, description="mean OPD signal over the completion tokens")
    created_at: datetime


class HumanReviewRow(BaseModel):
    rollout_id: str
    batch_id: str
    reviewer: str
    score: float = Field(ge=0.0, le=1.0)
    critique: str
    hint: str
    source: str
    line: int
    imported_at: datetime


class CheckpointRow(BaseModel):
    checkpoint_id: str
    parent_id: str | None
    base_model: str
    adapter_uri: str
    algorithm: str
    config: str
    trained_on: list[str]
    trajectory_ids: list[str]
    trajectory_count: int
    metrics: str
    promoted: bool
    created_at: datetime


class ServingRow(BaseModel):
    seq: int = Field(description="position in the serving log; the row with the highest seq is what serves")
    from_checkpoint: str = Field(description="what served before this change: a checkpoint id or 'base'")
    to_checkpoint: str = Field(description="what serves from this change on: a checkpoint id or 'base'")
    action: str = Field(description="promote | rollback | gate | reconcile | migrate | retract")
    actor: str = Field(description="who: a user name, 'gate', 'trainer' or 'reconcile'")
    reason: str
    created_at: datetime


class GateDecisionRow(BaseModel):
    checkpoint_id: str = Field(description="the candidate checkpoint the promotion gate decided on")
    benchmark: str = Field(description="the gate benchmark (bench.gate_benchmark)")
    incumbent: str = Field(description="what it was compared with: the serving policy, or its parent / 'base'")
    promote: bool = Field(description="the decision: true moves the serving pointer, false leaves it")
    n_paired: int = Field(description="items both answered (the paired comparison's size)")
    candidate_accuracy: float
    incumbent_accuracy: float
    diff: float = Field(description="mean per-item difference, candidate - incumbent")
    diff_ci_low: float = Field(description="95% paired-bootstrap interval of the difference, low end")
    diff_ci_high: float
    margin: float = Field(description="bench.gate_margin: rejected when diff_ci_high < -margin")
    reason: str
    created_at: datetime


class TrainingClaimRow(BaseModel):
    claim_id: str
    event: str = Field(description="claimed | done | abandoned; a claim's last event is its state")
    policy_version: str = Field(description="the serving policy whose fresh trajectories the run trains on")
    checkpoint_id: str = Field(description="the checkpoint the run writes")
    promote: bool = Field(description="whether the run intends to promote it (trainer.promotion = always)")
    trajectory_count: int
    host: str
    pid: int
    pid_start: int | None = Field(None, description="the process's start time in clock ticks (tells a reused pid apart)")
    thread: int
    run: str
    reason: str
    created_at: datetime


class QuarantineRow(BaseModel):
    source: str
    line: int | None
    raw: str
    error: str
    batch_id: str | None
    stage: str
    seen_at: datetime


class BenchmarkResultRow(BaseModel):
    checkpoint_id: str = Field(description="checkpoint id, or 'base' for the base model")
    benchmark: str
    n: int
    accuracy: float = Field(description="strict: the answer inside the required tags is right (pass@1 for code)")
    lenient_accuracy: float = Field(description="the last number in the text is right (code: same as accuracy)")
    format_rate: float
    ci_low: float = Field(description="95% bootstrap interval of accuracy")
    ci_high: float
    seconds: float
    backend: str
    model: str
    config: str
    created_at: datetime


class BenchmarkItemRow(BaseModel):
    checkpoint_id: str
    benchmark: str
    item_id: str
    prompt: str
    completion: str
    extracted_answer: str | None
    reference: str
    correct: bool
    lenient_correct: bool
    formatted: bool
    created_at: datetime
    skill_ids: list[str] | None = Field(None, description="the verified skills injected into this item's prompt (empty when none)")


class SessionRow(BaseModel):
    session_id: str = Field(description="from the X-Session-Id header or the request's `user` field (else a new id per request)")
    tenant: str = Field(description="the tenant of the API key that opened it")
    turn_count: int
    policy_versions: list[str] = Field(description="every policy version that answered in the session, in order")
    models: list[str]
    first_turn_at: datetime
    last_turn_at: datetime
    metadata: str = Field("{}", description="JSON object: client-supplied session metadata")


class TurnRow(BaseModel):
    turn_id: str = Field(description="unique per model call and choice: the response id plus the choice index")
    session_id: str
    tenant: str
    turn_index: int = Field(description="0-based position of this call in its session")
    choice_index: int = Field(description="which of the `n` choices this row is")
    endpoint: str = Field(description="'chat.completions' or 'completions'")
    model: str
    policy_version: str = Field(description="checkpoint id that answered, or 'base', or 'upstream:<model>'")
    backend: str
    messages: str = Field(description="JSON: the request's messages (or the prompt for /v1/completions)")
    tools: str = Field(description="JSON: the request's tools, '[]' when none")
    response: str = Field(description="JSON: the assistant message (content and tool_calls)")
    prompt_token_ids: list[int] = Field(description="the exact templated prompt the model saw")
    completion_token_ids: list[int]
    sampling_logprobs: list[float] | None = Field(None, description="per completion token, where the backend gives them")
    finish_reason: str
    temperature: float
    max_tokens: int | None
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    created_at: datetime


class LineageRow(BaseModel):
    checkpoint_id: str
    kind: str = Field(description="manifest | table | trajectory | review | hint | skill: what the row records")
    table_name: str | None = Field(None, description="the table read (table) or holding the row (trajectory, review, hint, skill)")
    table_version: int | None = Field(None, description="the Delta version of table_name that training read (time travel replays it)")
    row_id: str | None = Field(None, description="the row trained on: a rollout id (trajectory), a review key (review, hint), a skill id")
    batch_id: str | None = None
    detail: str | None = Field(None, description="JSON; the manifest row: parent, config, code version, model, ancestors")
    created_at: datetime


class AuditRow(BaseModel):
    actor: str = Field(description="who: a user name, 'gate', 'trainer', 'reconcile', 'retract'")
    at: datetime
    action: str = Field(description="promote | rollback | gate | reconcile | migrate | retract (serving moves), "
                        "gate_decision, retraction")
    subject: str = Field(description="what it is about: a checkpoint id, or the retracted review / session / task")
    from_state: str | None = Field(None, description="before: the serving checkpoint, the incumbent, or the rows retracted")
    to_state: str | None = Field(None, description="after: the serving checkpoint, 'promote' / 'reject', or the rows left")
    reason: str
    detail: str | None = Field(None, description="JSON with the numbers behind it")


class JudgeAgreementRow(BaseModel):
    judge: str = Field(description="who scored: a reviews.manager (llm, verifier) or '<reward_version>:<manager>' of a re-score")
    rubric: str = Field(description="the rubric it scored with ('default' when the row does not name one)")
    window_kind: str = Field(description="'batch', 'day' or 'all'")
    window_id: str = Field(description="the batch id, the day (YYYY-MM-DD) or 'all'")
    window_start: datetime = Field(description="the earliest judge score of the window (orders the windows)")
    n: int = Field(description="rollouts scored by both the judge and a human manager")
    mean_abs_diff: float = Field(description="mean |judge score - human score| (scores in [0, 1])")
    spearman: float | None = Field(None, description="Spearman rank correlation (average ranks for ties); null when either side is constant")
    pass_agreement: float = Field(description="fraction of rollouts where judge and human agree on pass (score >= 0.5) or fail")
    judge_mean: float
    human_mean: float
    computed_at: datetime


class RewardVersionRow(BaseModel):
    reward_version: str = Field(description="the version's name; 'v0' is the pipeline's own trajectories")
    rollout_id: str
    batch_id: str
    task_id: str
    group_index: int
    policy_version: str
    outcome_reward: float
    format_reward: float
    process_reward: float | None
    step_rewards: list[float | None]
    manager_score: float = Field(description="the manager component the reward used")
    manager: str = Field(description="who gave manager_score: human, llm, verifier, or the stored review's manager")
    judge_score: float | None = Field(None, description="the re-scoring manager's own score, also where a human's score was kept")
    overlong_penalty: float
    reward: float
    reward_weights: str
    advantage: float
    step_advantages: list[float]
    advantage_mode: str
    kept: bool
    rank: int = Field(description="1 = the best reward of its group (task x policy version); ties share the better rank")
    base_version: str | None = Field(None, description="the version this one is compared with (the active one when it was made)")
    base_reward: float | None = None
    base_advantage: float | None = None
    base_rank: int | None = None
    reward_delta: float | None = Field(None, description="reward - base_reward")
    rank_change: int | None = Field(None, description="rank - base_rank (negative: moved up)")
    sign_flip: bool | None = Field(None, description="the advantage's sign (-, 0, +; |a| < 1e-9 is 0) differs from the base's")
    created_at: datetime


class RewardVersionDefRow(BaseModel):
    reward_version: str
    base_version: str | None
    definition: str = Field(description="JSON: weights overrides, manager, step scorer, judge model, rubric and its hash, advantage settings")
    batches: list[str]
    n: int
    summary: str = Field(description="JSON: the diff against base_version (deltas, rank changes, sign flips)")
    created_by: str
    created_at: datetime


class RewardActivationRow(BaseModel):
    seq: int = Field(description="position in the activation log; the highest seq is the active reward version")
    from_version: str
    to_version: str
    actor: str
    reason: str
    weights: str = Field(description="JSON: the new version's weight overrides, which batches built from now on take")
    batches: list[str] = Field(description="the batches whose trajectories were rewritten to the new version")
    rows: int = Field(description="trajectory rows rewritten")
    created_at: datetime


class HintEfficacyRow(BaseModel):
    """Did the hint change behaviour? One row per checkpoint x manager x hint kind x task family."""

    checkpoint_id: str
    before_policy: str = Field(description="the policy that failed and got the hints (what the checkpoint trained from)")
    manager: str = Field(description="who wrote the hints: verifier | llm | human | judge")
    hint_kind: str = Field(description="wrong_step | plan | finish_with_answer | format | free_text (from the wording)")
    family: str = Field(description="task family: the arithmetic operation pattern, a session family, or environment:source")
    hinted_failures: int = Field(description="failed rollouts with such a hint that the checkpoint trained on")
    distilled: int = Field(description="of those, how many got an OPD term (teacher_logprobs.decision = 'used')")
    before_n: int
    before_success: float | None = Field(None, description="the family's success rate among the before policy's rollouts")
    after_n: int
    after_success: float | None = Field(None, description="the family's success rate among the checkpoint's own rollouts")
    delta: float | None = None
    delta_ci_low: float | None = Field(None, description="95% interval of after - before (Newcombe, Wilson score)")
    delta_ci_high: float | None = None
    computed_at: datetime


class SkillRow(BaseModel):
    skill_id: str = Field(description="content hash of the normalised text")
    text: str = Field(description="one imperative sentence, at most 200 characters")
    failure_type: str = Field(description="no_answer | length | format | wrong_step | wrong_operation | other")
    embedding: list[float] = Field(description="all-MiniLM-L6-v2 embedding of the text (unit length)")
    source_review_ids: list[str] = Field(description="the reviews it was distilled from (the reviewed rollout ids)")
    support: int = Field(description="number of source reviews")
    source: str = Field(description="template | llm")
    status: str = Field(description="candidate | verified | retired")
    gain: float | None = Field(None, description="last measured paired accuracy gain (with - without) on the validation items")
    ci_low: float | None = Field(None, description="95% paired bootstrap interval of the gain, lower end")
    ci_high: float | None = None
    n: int | None = Field(None, description="validation items of the last measurement")
    measured_on: str | None = Field(None, description="checkpoint (policy version) the last measurement used")
    measured_at: datetime | None = None
    verified_at: datetime | None = Field(None, description="when it was last promoted to verified")
    created_at: datetime
    updated_at: datetime


class SkillDecisionRow(BaseModel):
    decision_id: str
    skill_id: str
    text: str
    batch_id: str = Field(description="the batch whose skills run made the decision")
    kind: str = Field(description="verify (a candidate) | recheck (a verified skill)")
    from_status: str
    to_status: str
    gain: float
    ci_low: float
    ci_high: float
    n: int
    wins: int = Field(description="items right only with the skill")
    losses: int = Field(description="items right only without it")
    with_accuracy: float
    without_accuracy: float
    checkpoint_id: str
    validation: str = Field(description="the validation set: generator, seed, size")
    rule: str = Field(description="the decision rule with its numbers")
    seconds: float = Field(description="wall time of the evaluation with the skill")
    decided_at: datetime


SCHEMAS: dict[str, pa.Schema] = {
    "tasks": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("task_id", pa.string(), False),
            ("source", pa.string()),
            ("environment", pa.string()),
            ("prompt", pa.string()),
            ("reference", pa.string()),
            ("difficulty", pa.int32()),
            ("metadata", pa.string()),
            ("created_at", TS),
        ]
    ),
    "rollouts": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("task_id", pa.string()),
            ("group_index", pa.int32()),
            ("policy_version", pa.string()),
            ("backend", pa.string()),
            ("model", pa.string()),
            ("prompt_text", pa.string()),
            ("completion", pa.string()),
            ("steps", pa.list_(pa.string())),
            ("answer", pa.string()),
            ("parse_mode", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("completion_token_ids", pa.list_(pa.int32())),
            ("sampling_logprobs", pa.list_(pa.float32())),
            ("finish_reason", pa.string()),
            ("temperature", pa.float64()),
            ("seconds", pa.float64()),
            ("created_at", TS),
            ("session_id", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int32())),
            ("assistant_mask", pa.list_(pa.int8())),
            ("turn_spans", pa.list_(pa.struct([("turn_id", pa.string()), ("turn_index", pa.int32()),
                                               ("start", pa.int32()), ("end", pa.int32())]))),
            ("skill_ids", pa.list_(pa.string())),
        ]
    ),
    "step_scores": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("step_index", pa.int32()),
            ("step_text", pa.string()),
            ("scorer", pa.string()),
            ("score", pa.float64()),
            ("votes", pa.list_(pa.float64())),
            ("rationale", pa.string()),
        ]
    ),
    "step_labels": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("step_index", pa.int32()),
            ("num_samples", pa.int32()),
            ("num_correct", pa.int32()),
            ("label", pa.float64()),
            ("created_at", TS),
        ]
    ),
    "reviews": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("manager", pa.string()),
            ("score", pa.float64()),
            ("critique", pa.string()),
            ("hint", pa.string()),
            ("created_at", TS),
            ("review_id", pa.string()),
            ("session_id", pa.string()),
            ("reviewer", pa.string()),
            ("rubric", pa.string()),
            ("tenant", pa.string()),
        ]
    ),
    "trajectories": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("task_id", pa.string()),
            ("group_index", pa.int32()),
            ("policy_version", pa.string()),
            ("outcome_reward", pa.float64()),
            ("format_reward", pa.float64()),
            ("process_reward", pa.float64()),
            ("step_rewards", pa.list_(pa.float64())),
            ("manager_score", pa.float64()),
            ("overlong_penalty", pa.float64()),
            ("reward", pa.float64()),
            ("reward_weights", pa.string()),
            ("advantage", pa.float64()),
            ("step_advantages", pa.list_(pa.float64())),
            ("advantage_mode", pa.string()),
            ("kept", pa.bool_()),
            ("created_at", TS),
            ("kind", pa.string()),
            ("loss_mask", pa.list_(pa.int8())),
            ("token_advantages", pa.list_(pa.float64())),
            ("turn_rewards", pa.list_(pa.float64())),
            ("turn_advantages", pa.list_(pa.float64())),
            ("opd_signal", pa.list_(pa.float64())),
            ("w_rl", pa.float64()),
            ("w_opd", pa.float64()),
            ("reward_version", pa.string()),
        ]
    ),
    "teacher_logprobs": pa.schema(
        [
            ("batch_id", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("hint_id", pa.string()),
            ("hint_source", pa.string()),
            ("hint", pa.string()),
            ("teacher", pa.string()),
            ("policy_version", pa.string()),
            ("temperature", pa.float64()),
            ("decision", pa.string()),
            ("reason", pa.string()),
            ("teacher_logprobs", pa.list_(pa.float64())),
            ("student_logprobs", pa.list_(pa.float64())),
            ("opd_signal", pa.list_(pa.float64())),
            ("signal_mean", pa.float64()),
            ("created_at", TS),
        ]
    ),
    "human_reviews": pa.schema(
        [
            ("rollout_id", pa.string(), False),
            ("batch_id", pa.string()),
            ("reviewer", pa.string()),
            ("score", pa.float64()),
            ("critique", pa.string()),
            ("hint", pa.string()),
            ("source", pa.string()),
            ("line", pa.int64()),
            ("imported_at", TS),
        ]
    ),
    "checkpoints": pa.schema(
        [
            ("checkpoint_id", pa.string(), False),
            ("parent_id", pa.string()),
            ("base_model", pa.string()),
            ("adapter_uri", pa.string()),
            ("algorithm", pa.string()),
            ("config", pa.string()),
            ("trained_on", pa.list_(pa.string())),
            ("trajectory_ids", pa.list_(pa.string())),
            ("trajectory_count", pa.int64()),
            ("metrics", pa.string()),
            ("promoted", pa.bool_()),
            ("created_at", TS),
        ]
    ),
    "benchmark_results": pa.schema(
        [
            ("checkpoint_id", pa.string(), False),
            ("benchmark", pa.string(), False),
            ("n", pa.int64()),
            ("accuracy", pa.float64()),
            ("lenient_accuracy", pa.float64()),
            ("format_rate", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("seconds", pa.float64()),
            ("backend", pa.string()),
            ("model", pa.string()),
            ("config", pa.string()),
            ("created_at", TS),
        ]
    ),
    "benchmark_items": pa.schema(
        [
            ("checkpoint_id", pa.string(), False),
            ("benchmark", pa.string(), False),
            ("item_id", pa.string()),
            ("prompt", pa.string()),
            ("completion", pa.string()),
            ("extracted_answer", pa.string()),
            ("reference", pa.string()),
            ("correct", pa.bool_()),
            ("lenient_correct", pa.bool_()),
            ("formatted", pa.bool_()),
            ("created_at", TS),
            ("skill_ids", pa.list_(pa.string())),
        ]
    ),
    "serving": pa.schema(
        [
            ("seq", pa.int64(), False),
            ("from_checkpoint", pa.string()),
            ("to_checkpoint", pa.string(), False),
            ("action", pa.string()),
            ("actor", pa.string()),
            ("reason", pa.string()),
            ("created_at", TS),
        ]
    ),
    "gate_decisions": pa.schema(
        [
            ("checkpoint_id", pa.string(), False),
            ("benchmark", pa.string(), False),
            ("incumbent", pa.string()),
            ("promote", pa.bool_()),
            ("n_paired", pa.int64()),
            ("candidate_accuracy", pa.float64()),
            ("incumbent_accuracy", pa.float64()),
            ("diff", pa.float64()),
            ("diff_ci_low", pa.float64()),
            ("diff_ci_high", pa.float64()),
            ("margin", pa.float64()),
            ("reason", pa.string()),
            ("created_at", TS),
        ]
    ),
    "training_claims": pa.schema(
        [
            ("claim_id", pa.string(), False),
            ("event", pa.string(), False),
            ("policy_version", pa.string()),
            ("checkpoint_id", pa.string()),
            ("promote", pa.bool_()),
            ("trajectory_count", pa.int64()),
            ("host", pa.string()),
            ("pid", pa.int64()),
            ("pid_start", pa.int64()),
            ("thread", pa.int64()),
            ("run", pa.string()),
            ("reason", pa.string()),
            ("created_at", TS),
        ]
    ),
    "quarantine": pa.schema(
        [
            ("source", pa.string()),
            ("line", pa.int64()),
            ("raw", pa.string()),
            ("error", pa.string()),
            ("batch_id", pa.string()),
            ("stage", pa.string()),
            ("seen_at", TS),
        ]
    ),
    "sessions": pa.schema(
        [
            ("session_id", pa.string(), False),
            ("tenant", pa.string(), False),
            ("turn_count", pa.int64()),
            ("policy_versions", pa.list_(pa.string())),
            ("models", pa.list_(pa.string())),
            ("first_turn_at", TS),
            ("last_turn_at", TS),
            ("metadata", pa.string()),
        ]
    ),
    "turns": pa.schema(
        [
            ("turn_id", pa.string(), False),
            ("session_id", pa.string(), False),
            ("tenant", pa.string(), False),
            ("turn_index", pa.int32()),
            ("choice_index", pa.int32()),
            ("endpoint", pa.string()),
            ("model", pa.string()),
            ("policy_version", pa.string()),
            ("backend", pa.string()),
            ("messages", pa.string()),
            ("tools", pa.string()),
            ("response", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int32())),
            ("completion_token_ids", pa.list_(pa.int32())),
            ("sampling_logprobs", pa.list_(pa.float32())),
            ("finish_reason", pa.string()),
            ("temperature", pa.float64()),
            ("max_tokens", pa.int32()),
            ("stream", pa.bool_()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("latency_ms", pa.float64()),
            ("created_at", TS),
        ]
    ),
    "lineage": pa.schema(
        [
            ("checkpoint_id", pa.string(), False),
            ("kind", pa.string(), False),
            ("table_name", pa.string()),
            ("table_version", pa.int64()),
            ("row_id", pa.string()),
            ("batch_id", pa.string()),
            ("detail", pa.string()),
            ("created_at", TS),
        ]
    ),
    "audit": pa.schema(
        [
            ("actor", pa.string(), False),
            ("at", TS),
            ("action", pa.string(), False),
            ("subject", pa.string()),
            ("from_state", pa.string()),
            ("to_state", pa.string()),
            ("reason", pa.string()),
            ("detail", pa.string()),
        ]
    ),
    "judge_agreement": pa.schema(
        [
            ("judge", pa.string(), False),
            ("rubric", pa.string(), False),
            ("window_kind", pa.string(), False),
            ("window_id", pa.string(), False),
            ("window_start", TS),
            ("n", pa.int64()),
            ("mean_abs_diff", pa.float64()),
            ("spearman", pa.float64()),
            ("pass_agreement", pa.float64()),
            ("judge_mean", pa.float64()),
            ("human_mean", pa.float64()),
            ("computed_at", TS),
        ]
    ),
    "reward_versions": pa.schema(
        [
            ("reward_version", pa.string(), False),
            ("rollout_id", pa.string(), False),
            ("batch_id", pa.string()),
            ("task_id", pa.string()),
            ("group_index", pa.int32()),
            ("policy_version", pa.string()),
            ("outcome_reward", pa.float64()),
            ("format_reward", pa.float64()),
            ("process_reward", pa.float64()),
            ("step_rewards", pa.list_(pa.float64())),
            ("manager_score", pa.float64()),
            ("manager", pa.string()),
            ("judge_score", pa.float64()),
            ("overlong_penalty", pa.float64()),
            ("reward", pa.float64()),
            ("reward_weights", pa.string()),
            ("advantage", pa.float64()),
            ("step_advantages", pa.list_(pa.float64())),
            ("advantage_mode", pa.string()),
            ("kept", pa.bool_()),
            ("rank", pa.int32()),
            ("base_version", pa.string()),
            ("base_reward", pa.float64()),
            ("base_advantage", pa.float64()),
            ("base_rank", pa.int32()),
            ("reward_delta", pa.float64()),
            ("rank_change", pa.int32()),
            ("sign_flip", pa.bool_()),
            ("created_at", TS),
        ]
    ),
    "reward_version_defs": pa.schema(
        [
            ("reward_version", pa.string(), False),
            ("base_version", pa.string()),
            ("definition", pa.string()),
            ("batches", pa.list_(pa.string())),
            ("n", pa.int64()),
            ("summary", pa.string()),
            ("created_by", pa.string()),
            ("created_at", TS),
        ]
    ),
    "reward_activations": pa.schema(
        [
            ("seq", pa.int64(), False),
            ("from_version", pa.string()),
            ("to_version", pa.string(), False),
            ("actor", pa.string()),
            ("reason", pa.string()),
            ("weights", pa.string()),
            ("batches", pa.list_(pa.string())),
            ("rows", pa.int64()),
            ("created_at", TS),
        ]
    ),
    "hint_efficacy": pa.schema(
        [
            ("checkpoint_id", pa.string(), False),
            ("before_policy", pa.string()),
            ("manager", pa.string()),
            ("hint_kind", pa.string()),
            ("family", pa.string()),
            ("hinted_failures", pa.int64()),
            ("distilled", pa.int64()),
            ("before_n", pa.int64()),
            ("before_success", pa.float64()),
            ("after_n", pa.int64()),
            ("after_success", pa.float64()),
            ("delta", pa.float64()),
            ("delta_ci_low", pa.float64()),
            ("delta_ci_high", pa.float64()),
            ("computed_at", TS),
        ]
    ),
    "skills": pa.schema(
        [
            ("skill_id", pa.string(), False),
            ("text", pa.string()),
            ("failure_type", pa.string()),
            ("embedding", pa.list_(pa.float32())),
            ("source_review_ids", pa.list_(pa.string())),
            ("support", pa.int32()),
            ("source", pa.string()),
            ("status", pa.string()),
            ("gain", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("n", pa.int32()),
            ("measured_on", pa.string()),
            ("measured_at", TS),
            ("verified_at", TS),
            ("created_at", TS),
            ("updated_at", TS),
        ]
    ),
    "skill_decisions": pa.schema(
        [
            ("decision_id", pa.string(), False),
            ("skill_id", pa.string(), False),
            ("text", pa.string()),
            ("batch_id", pa.string()),
            ("kind", pa.string()),
            ("from_status", pa.string()),
            ("to_status", pa.string()),
            ("gain", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("n", pa.int32()),
            ("wins", pa.int32()),
            ("losses", pa.int32()),
            ("with_accuracy", pa.float64()),
            ("without_accuracy", pa.float64()),
            ("checkpoint_id", pa.string()),
            ("validation", pa.string()),
            ("rule", pa.string()),
            ("seconds", pa.float64()),
            ("decided_at", TS),
        ]
    ),
}

ROW_MODELS: dict[str, type[BaseModel]] = {
    "tasks": TaskRow,
    "rollouts": RolloutRow,
    "step_scores": StepScoreRow,
    "step_labels": StepLabelRow,
    "reviews": ReviewRow,
    "trajectories": TrajectoryRow,
    "teacher_logprobs": TeacherLogprobRow,
    "human_reviews": HumanReviewRow,
    "checkpoints": CheckpointRow,
    "benchmark_results": BenchmarkResultRow,
    "benchmark_items": BenchmarkItemRow,
    "serving": ServingRow,
    "gate_decisions": GateDecisionRow,
    "training_claims": TrainingClaimRow,
    "quarantine": QuarantineRow,
    "sessions": SessionRow,
    "turns": TurnRow,
    "lineage": LineageRow,
    "audit": AuditRow,
    "judge_agreement": JudgeAgreementRow,
    "reward_versions": RewardVersionRow,
    "reward_version_defs": RewardVersionDefRow,
    "reward_activations": RewardActivationRow,
    "hint_efficacy": HintEfficacyRow,
    "skills": SkillRow,
    "skill_decisions": SkillDecisionRow,
}

# Tables with one partition per task batch: a re-run of a batch replaces exactly that batch's rows.
BATCH_TABLES = ("tasks", "rollouts", "step_scores", "step_labels", "reviews", "teacher_logprobs", "trajectories")

"""Lineage, retraction and the audit table over real Delta tables, without a model: LLM-distilled skills
retracted with their review. In tests/test_lineage_integration.py: sessions retracted everywhere on disk,
the manifest naming skills and optional tables, and the three-cycle chain c1 <- c2 <- c3 (replay,
retraction of a review two checkpoints trained on, the audit).
"""

from __future__ import annotations

from pathlib import Path

from tentalis_pipelines import retraction
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths

PROMPTS = {"b1": "What is 2 + 3?", "b2": "What is 4 + 4?", "b3": "What is 9 - 2?"}
ANSWERS = {"b1": "5", "b2": "8", "b3": "7"}
REVIEWED = "b2/b2-r0/human"  # the review retracted in must-hold 2: a human's review of b2's first rollout
SECRET = "UNIQUE-CRITIQUE-b2-r0: the reviewer's words that must leave the disk"


def critique(batch_id: str, i: int) -> str:
    return SECRET if (batch_id, i) == ("b2", 0) else f"critique {batch_id} {i}"


def write_batch(lake: Lakehouse, tok, batch_id: str, policy_version: str, *, advantages=(1.3, -0.7, -0.7, 0.1), texts=None) -> None:
    """Tasks, rollouts, step scores, reviews (hints on rollouts 0 and 2) and trajectories of one batch."""
    prompt, answer = PROMPTS.get(batch_id, "What is 1 + 1?"), ANSWERS.get(batch_id, "2")
    texts = texts or [f" <answer>{answer}</answer>", " 7", " <answer>6</answer>", " five"]
    now = now_utc()
    rollouts, steps, reviews, trajectories = [], [], [], []
    for i, (text, adv) in enumerate(zip(texts, advantages)):
        rid = f"{batch_id}-r{i}"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rollouts.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": "t0", "group_index": i, "policy_version": policy_version,
            "backend": "transformers", "model": "tiny", "prompt_text": prompt, "completion": text, "steps": [text], "answer": None,
            "parse_mode": "fallback", "prompt_tokens": 5, "completion_tokens": len(ids), "completion_token_ids": ids,
            "sampling_logprobs": [-1.0 - 0.1 * k for k in range(len(ids))], "finish_reason": "stop", "temperature": 0.7 + 0.1 * i,
            "seconds": 0.1, "created_at": now,
        })
        steps.append({"batch_id": batch_id, "rollout_id": rid, "step_index": 0, "step_text": text, "scorer": "verifier",
                      "score": float(i == 0), "votes": [], "rationale": ""})
        manager = "human" if (batch_id, i) == ("b2", 0) else "verifier"
        reviews.append({"batch_id": batch_id, "rollout_id": rid, "manager": manager, "score": float(i == 0),
                        "critique": critique(batch_id, i), "hint": f"hint {batch_id} {i}" if i in (0, 2) else "", "created_at": now})
        trajectories.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": "t0", "group_index": i, "policy_version": policy_version,
            "outcome_reward": float(i == 0), "format_reward": 0.0, "process_reward": None, "step_rewards": [],
            "manager_score": float(i == 0), "overlong_penalty": 0.0, "reward": float(i == 0), "reward_weights": "{}",
            "advantage": adv, "step_advantages": [], "advantage_mode": "outcome", "kept": True, "created_at": now,
        })
    lake.write_batch("tasks", batch_id, [{"batch_id": batch_id, "task_id": "t0", "source": "test", "environment": "math",
                                          "prompt": prompt, "reference": answer, "difficulty": 1, "metadata": "{}", "created_at": now}])
    lake.write_batch("rollouts", batch_id, rollouts)
    lake.write_batch("step_scores", batch_id, steps)
    lake.write_batch("reviews", batch_id, reviews)
    lake.write_batch("trajectories", batch_id, trajectories)
    if batch_id == "b2":
        lake.append("human_reviews", [{"rollout_id": "b2-r0", "batch_id": "b2", "reviewer": "dana", "score": 1.0,
                                       "critique": SECRET, "hint": "hint b2 0", "source": "reviews.jsonl", "line": 1, "imported_at": now}])


def test_retracting_a_review_takes_the_skills_an_llm_distilled_from_it(home):
    """An LLM-distilled skill's text is written from the critiques it came from: retracting one of
    them deletes the skill and its decisions (text copies) from disk; a template skill (a fixed
    sentence per failure type) and skills from other reviews stay."""
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    now = now_utc()
    said = "SKILL-FROM-RETRACTED-CRITIQUE always carry the tens"
    lake.write_batch("reviews", "b1", [{"batch_id": "b1", "rollout_id": f"b1-r{i}", "manager": "llm", "score": 0.0,
                                        "critique": said if i == 0 else "fine", "hint": "", "created_at": now} for i in range(2)])
    skills = [("sk-llm", said, "llm", ["b1-r0", "b1-r1"]), ("sk-tpl", "Check each step.", "template", ["b1-r0"]),
              ("sk-other", "Other lesson.", "llm", ["b1-r1"])]
    lake.append("skills", [{"skill_id": i, "text": t, "failure_type": "wrong_step", "embedding": [0.0], "source_review_ids": src,
                            "support": len(src), "source": s, "status": "verified", "created_at": now, "updated_at": now}
                           for i, t, s, src in skills])
    lake.append("skill_decisions", [{"decision_id": f"d-{i}", "skill_id": i, "text": t, "batch_id": "b1", "kind": "verify",
                                     "from_status": "candidate", "to_status": "verified", "created_at": now} for i, t, _, _ in skills])

    result = retraction.retract(lake, review="b1/b1-r0/llm", reason="withdrawn", actor="alice")
    assert result.deleted == {"reviews": 1, "skills": 1, "skill_decisions": 1}
    assert sorted(r["skill_id"] for r in lake.read("skills").to_pylist()) == ["sk-other", "sk-tpl"]
    assert sorted(r["skill_id"] for r in lake.read("skill_decisions").to_pylist()) == ["sk-other", "sk-tpl"]
    leaks = [p for p in Path(lake.root).rglob("*") if p.is_file() and said[:30].encode() in p.read_bytes()]
    assert leaks == []

"""How a task becomes a chat prompt for the policy.

A system message states the output contract and one worked example shows it: small models follow a
shown format far more often than a described one.
"""

from __future__ import annotations

from collections.abc import Sequence

SYSTEM_PROMPT = (
    "You are a careful worker who solves math problems step by step. Write each step inside "
    "<step></step> tags and put only the final number inside <answer></answer> tags."
)

EXAMPLE_QUESTION = "Mia has 4 bags with 6 apples in each bag. She eats 3 apples. How many apples are left?"
EXAMPLE_ANSWER = "<step>4 bags with 6 apples each: 4 * 6 = 24 apples.</step>\n<step>She eats 3: 24 - 3 = 21.</step>\n<answer>21</answer>"


SKILLS_HEADER = "Lessons from past reviews:"


def system_prompt(skills: Sequence[str] = ()) -> str:
    """The system message; verified skills (one sentence each) follow it as a short list."""
    if not skills:
        return SYSTEM_PROMPT
    return SYSTEM_PROMPT + "\n\n" + SKILLS_HEADER + "\n" + "\n".join(f"- {s}" for s in skills)


def chat_messages(task_prompt: str, *, worked_example: bool = True, skills: Sequence[str] = ()) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt(skills)}]
    if worked_example:
        messages += [
            {"role": "user", "content": EXAMPLE_QUESTION},
            {"role": "assistant", "content": EXAMPLE_ANSWER},
        ]
    messages.append({"role": "user", "content": task_prompt})
    return messages


def render_prompt(tokenizer, task_prompt: str, *, worked_example: bool = True, skills: Sequence[str] = ()) -> str:
    """The exact prompt text the model sees (chat template applied, generation prompt added); ``skills``
    are lesson texts added to the system message."""
    messages = chat_messages(task_prompt, worked_example=worked_example, skills=skills)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "

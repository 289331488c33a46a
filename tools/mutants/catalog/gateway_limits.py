"""Planted bugs in the gateway's defences from issue 73's hostile round: tenant-scoped reviews, the body
limit counted as bytes arrive, foreign JSON values (booleans, huge seeds, lone surrogates), the prompt cap
and the quarantine gate (``gateway/app.py``, ``gateway/landing.py``, ``gateway/quarantine.py``).

Guarded by tests/unit/test_gateway_hostile.py (pure: the gateway in-process with API keys and the
upstream replaced by a function). The limit and settings tests on a real socket and the tiny model are
tests/test_gateway_sampling.py.

No mutant here is equivalent."""

A = "tentalis_pipelines/gateway/app.py"
G = "tentalis_pipelines/gateway/landing.py"
Q = "tentalis_pipelines/gateway/quarantine.py"
T = ["tests/unit/test_gateway_hostile.py"]

MUTANTS = [
    {"id": "limits-review-foreign-tenant", "file": G, "find": "    if any(r[\"tenant\"] != row[\"tenant\"] for r in old):\n",
     "replace": "    if False:\n", "tests": T,
     "why": "a review_id another tenant holds is not refused: a second row with that id lands beside the first"},
    {"id": "limits-review-id-squat", "file": G,
     "find": "    if not review_id or review_id == default_id or not review_id.startswith(MINTED_REVIEW_PREFIXES):\n",
     "replace": "    if True:\n", "tests": T,
     "why": "a rival lands a review under acme's future derived id, and acme's own review is then refused"},
    {"id": "limits-body-chunk-unbounded", "file": A, "find": "            if size > self.max_bytes:\n",
     "replace": "            if False:\n", "tests": T,
     "why": "only Content-Length is checked: a chunked body of any size is read whole"},
    {"id": "limits-body-off-by-one", "file": A, "find": "            if size > self.max_bytes:\n",
     "replace": "            if size >= self.max_bytes:\n", "tests": T,
     "why": "a body of exactly the limit is refused"},
    {"id": "limits-booleans-accepted", "file": A,
     "find": "    if isinstance(value, bool):\n        raise ValueError(f\"a JSON boolean",
     "replace": "    if False:\n        raise ValueError(f\"a JSON boolean", "tests": T,
     "why": "true is read as 1 in every sampling field"},
    {"id": "limits-seed-unbounded", "file": A, "find": "    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)\n",
     "replace": "    seed: int | None = None\n", "tests": T,
     "why": "a seed no torch generator takes reaches the sampler (a 500 mid-request)"},
    {"id": "limits-surrogate-nested", "file": A,
     "find": "    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()\n",
     "replace": "    items = value.items() if isinstance(value, dict) else ()\n", "tests": T,
     "why": "a lone surrogate inside a list (messages, stop strings, prompts) is not found: a 500 in the tokenizer"},
    {"id": "limits-prompt-count-token-ids", "file": A,
     "find": "    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt)):\n",
     "replace": "    if isinstance(prompt, str):\n", "tests": T,
     "why": "one prompt of token ids counts as one prompt per id: a long token-id prompt is refused"},
    {"id": "limits-quarantine-not-per-tenant", "file": Q, "find": "        key = tenant or \"\"\n", "replace": "        key = \"\"\n",
     "tests": T, "why": "one tenant's flood uses up every tenant's quarantine budget"},
    {"id": "limits-quarantine-burst-unbounded", "file": Q,
     "find": "            tokens = min(float(self.per_minute), tokens + (now - last) * self.per_minute / 60.0)\n",
     "replace": "            tokens = tokens + (now - last) * self.per_minute / 60.0\n", "tests": T,
     "why": "a quiet hour saves up a burst of thousands of kept rejects"},
    {"id": "limits-quarantine-unclipped", "file": A,
     "find": "\"raw\": gate.clip(redact(raw)) if gate else redact(raw),", "replace": "\"raw\": redact(raw),", "tests": T,
     "why": "a rejected review keeps its whole body (the 0.5 MB/s growth)"},
]

"""Skills from failures: lessons distilled from low-scored reviews, embedded, verified on held-out
items and injected into the worker's prompt (MetaClaw / SkillRL style)."""

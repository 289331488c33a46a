"""Reviewers that can be trained: a process reward head and a grounding check."""

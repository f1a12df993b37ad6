"""Tasks: one package per relation-extraction task (``bag/`` so far; the sentence task moves here with issue 36)."""

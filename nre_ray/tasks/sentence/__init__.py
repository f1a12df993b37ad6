"""Sentence-level relation extraction as a task (:class:`nre_ray.tasks.base.Task`): one row, one entity pair, one
label. :mod:`.task` (``SENTENCE``, the task object the spine calls), :mod:`.classifier` (the head on an encoder),
:mod:`.metrics` (scores of a confusion matrix), :mod:`.reports` (per-class tables and confusion-matrix plots),
:mod:`.rows` (raw rows in, one prediction row out per input row)."""

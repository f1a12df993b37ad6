"""Which task: from the data a run trains on, from the name a checkpoint records, from the name itself.

The spine asks here and nowhere else: :func:`task_for` (train and tune: the task of a data folder), :func:`task_of`
(evaluate, predict, serve: the task a checkpoint's ``meta.json`` names; without the field, one written before the
task layer, the sentence task; with the command, refused in one line where that task's models are not taken yet) and
:func:`task_named`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nre_ray.run.checkpoint import CheckpointError
from nre_ray.tasks.bag.bag_task import BAG
from nre_ray.tasks.base import Task
from nre_ray.tasks.document.document_task import DOCUMENT
from nre_ray.tasks.sentence.task import SENTENCE

#: The tasks the commands know, by name, in the order :func:`task_for` asks them (the sentence task, which takes any
#: folder its readers take, last).
TASKS: dict[str, Task] = {DOCUMENT.name: DOCUMENT, BAG.name: BAG, SENTENCE.name: SENTENCE}
#: The task of a checkpoint whose meta.json names none (written before the task layer).
DEFAULT_TASK = SENTENCE.name


def task_named(name: str) -> Task:
    """The task called ``name``; ValueError naming the known ones otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}: this nre_ray knows {', '.join(TASKS)}") from None


def task_for(data_dir: str | None, bags: bool = False) -> Task:
    """The task whose format the data folder ``data_dir`` is in (None: the bundled sample, sentences): the first of
    :data:`TASKS` that recognises it. ``bags`` (``--bag-aggregator`` given): the bag task, whatever the folder (its
    sentence files are grouped into bags; None: the bundled bag sample)."""
    if bags:
        return BAG
    if data_dir is None:
        return SENTENCE
    return next(task for task in TASKS.values() if task.recognises(data_dir))


def task_of(meta: Mapping[str, Any], command: str | None = None) -> Task:
    """The task of a checkpoint, from its ``meta.json`` (``"task"``; absent: :data:`DEFAULT_TASK`). CheckpointError
    for a task this nre_ray does not know (a checkpoint of a newer one), and with ``command`` (``evaluate``,
    ``predict``, ``serve``) for a task whose models that command does not take yet (:meth:`Task.unsupported`: one
    line)."""
    try:
        task = task_named(str(meta.get("task", DEFAULT_TASK)))
    except ValueError as err:
        raise CheckpointError(f"the checkpoint was written for {err}; use the nre_ray that trained it") from None
    refused = task.unsupported(command) if command else None
    if refused:
        raise CheckpointError(refused)
    return task


def check_checkpoint_folder(folder: str | Path, command: str) -> None:
    """:func:`task_of` with ``command`` for the checkpoint folder ``folder`` (its meta.json; nothing when it has
    none: the loader says what is wrong)."""
    path = Path(folder) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(meta, dict):
        task_of(meta, command)

"""Tasks: one package per kind of relation extraction, each owning its examples, head, loss, metrics and prediction
rows (see /work/shared/notes/style.md's layout). So far only :mod:`nre_ray.tasks.document`'s building blocks are
here; the sentence task still lives in the spine and is not yet expressed through this layer (issue 36/37)."""

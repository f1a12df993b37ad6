"""Tasks: one package per kind of relation extraction, each owning its examples, head, loss, metrics and prediction
rows (docs/development.md's layout). So far the building blocks of :mod:`nre_ray.tasks.document` (documents: DocRED,
CDR) and :mod:`nre_ray.tasks.bag` (distant supervision: bags of sentences) are here, tested but not yet wired into the
commands; the sentence task still lives in the spine and moves here with the task layer (issues 36, 37, 38)."""

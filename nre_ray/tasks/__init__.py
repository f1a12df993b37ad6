"""Tasks: one package per kind of relation extraction, each owning what differs between them (its data folders and
batches, the model's head and loss, the metrics, the prediction rows) behind one interface,
:class:`nre_ray.tasks.base.Task`, whose docstring gives each task's tensor shapes. The rest is one spine (paths, Ray,
the Ray Data preprocessing and cache, the loop's distribution, MLflow, checkpoints, the console, tune, evaluate,
predict, serve) that asks the task and never branches on it; :mod:`nre_ray.tasks.lookup` says which task (from the
data, or from a checkpoint's meta.json).

* :mod:`nre_ray.tasks.sentence`: sentence-level relation classification (one row, one entity pair, one label).
* :mod:`nre_ray.tasks.document` (documents: DocRED, CDR) and :mod:`nre_ray.tasks.bag` (distant supervision: bags of
  sentences, ``--bag-aggregator``): every command (train, tune, evaluate, predict, serve, the MLflow pyfunc model,
  ``python -m nre_ray.data inspect``) runs them through the interface (issues 37, 38).
"""

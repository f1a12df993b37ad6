"""The bag task (distant supervision, issue 38): relation extraction over entity-pair bags, as OpenNRE's NYT10 setup.

What is here (pure building blocks, unit-tested in ``tests/unit/test_bag_*.py``):

* :mod:`.files`: NYT10's TSV (``head id, tail id, head, tail, relation, sentence ###END###``), detected from the
  content; the entity-pair ids of OpenNRE JSON Lines (``h.id``/``t.id``) and of CSV/TSV/JSON Lines/Parquet
  (``head_id``/``tail_id`` columns); NYT10's ``relation2id.txt`` and the check that a label file names the data's
  labels (labels come from the data).
* :mod:`.bags`: bag keys (ids, else entity texts), multi-label bag labels with NA as OpenNRE, the seeded bottom-k
  size cap, merging a bag split across inputs, and shards balanced by sentences: pure functions on pandas batches.
* :mod:`.aggregators`: ``att`` (selective attention, Lin et al. 2016), ``avg``, ``one`` over (N, H) sentence vectors
  and bag offsets; :mod:`.network`: :class:`~.network.BagClassifier`, any of ``nre_ray.models``' encoders under an
  aggregator, with OpenNRE's softmax loss over (bag, relation) instances.
* :mod:`.heldout`: OpenNRE's held-out evaluation (PR curve, AUC, P@100/200/300, max F1), micro/macro F1 at a
  threshold and the threshold chosen on validation; exact and independent of the order bags arrive in.
* :mod:`.synthetic`: an NYT10-shaped synthetic corpus (``scripts/make_bag_corpus.py``) and the bundled bag sample
  in ``sample/`` (NA + 4 relations, 640 sentences).

What is not wired yet: ``--bag-aggregator`` and ``--format nyt10`` in the commands (train, tune, evaluate, predict,
serve), the Ray Data pipeline (read -> :func:`~.bags.with_bag_keys` -> ``groupby("bag").map_groups(build_bags)``),
tokenizing a bag's sentences into the encoder's tensors plus ``scope``, the per-worker loop, checkpoints, MLflow
logging of the PR curve, and the registration of ``nyt10`` in :mod:`nre_ray.data.formats` and of the id columns in
:mod:`nre_ray.data.schema`. The task layer of issue 36 is to take these.
"""

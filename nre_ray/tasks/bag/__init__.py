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

The task (:mod:`.bag_task`, ``BAG``: what train runs with ``--bag-aggregator att|avg|one``): its preprocessing
(:mod:`.grouping`: the files, Ray Data grouping into bags and encoding, the cache), its encoded splits and batches
(:mod:`.bag_split`), its exact per-bag counts, scores and PR-curve reports (:mod:`.bag_scores`).

Evaluate, predict, the MLflow pyfunc model and serve (:mod:`.bag_rows`): a file's bags built and encoded as training
built them, scored at the checkpoint's validation threshold; one prediction row per bag (its relation, NA below that
threshold, its score, and the top k); a request's row is one bag.

The data audit (:mod:`.bag_audit`): what ``python -m nre_ray.data inspect --bag-aggregator ...`` prints and a run
logs, the numbers of the bags the preprocessing built.

Every sentence encoder works inside a bag (cnn, pcnn, bilstm, transformer, and bert: ``--model bert --pretrained
PATH``, its sentences encoded by the sentence task's subword encoder with entity markers, :mod:`.grouping`).

Training shards balance sentences, not bags (:class:`~.bag_split.BagBatchSampler` on :func:`~.bags.balance_shards`,
through ``Task.train_batches``). With a storage path in an object store, the cache is shared there as the sentence
task's is (:mod:`nre_ray.data.shared_cache`).
"""

"""Document-level relation extraction (DocRED / Re-DocRED, BioCreative V CDR).

The task (:mod:`.document_task`, ``DOCUMENT``, what train runs for a folder of DocRED JSON or PubTator files): its
preprocessing (:mod:`.prepare`: the files, Ray Data encoding, the cache), its encoded splits and batches
(:mod:`.split`), its additive counts and scores (:mod:`.counts`). Its building blocks (pure, typed, unit-tested;
tests/unit/test_document_*.py):

* :mod:`.records`: :class:`~.records.Document`, :class:`~.records.Entity`, :class:`~.records.Mention`,
  :class:`~.records.Fact`; ``Document.to_dict()`` / :func:`~.records.document_from_dict` (JSON values for rows).
* :mod:`.readers`: DocRED JSON and PubTator readers from local paths or URIs (through :mod:`nre_ray.storage`),
  :func:`~.readers.detect_document_format` (from content), :func:`~.readers.split_of_name` (CDR's file names ->
  train/valid/test), problems naming the file, the document and what is wrong, ``on_bad="skip"``.
  :mod:`.text`: the deterministic sentence splitter and tokenizer for PubTator text.
* :mod:`.validation`: relations unknown to training (validation/test files), error or skip.
* :mod:`.pairs`: candidate pairs (every ordered pair, or the training facts' entity type pairs).
* :mod:`.encoding`: ATLOP's ``*`` mention markers, token ids, mention start positions, the label matrix (TH at 0),
  a word vocabulary for from-scratch encoders. :mod:`.subwords`: the same in a pretrained tokenizer's subwords
  (``--model bert``), the tokenizer every checkpoint carries.
* :mod:`.batching`: length-bucketed batches dealt to the ranks by tokens (the training loader's), padding share,
  token-balanced shards, padding into arrays.
* :mod:`.atlop`: ATLOP (entity logsumexp pooling, localized context pooling, grouped bilinear), the
  adaptive-threshold loss, inference, overlapping windows for long documents. :mod:`.encoder`: a from-scratch
  transformer that returns attention, and any Hugging Face encoder (``output_attentions=True``).
* :mod:`.scoring`: micro P/R/F1, DocRED's Ign F1, intra/inter-sentence (CDR), per relation; additive counts, so
  exact on any number of workers.
* :mod:`.sample`: a small synthetic DocRED-format dataset the project writes itself.

:mod:`.fact_rows`: documents encoded with a checkpoint's context (evaluate), read as rows (predict, requests), and
the predicted facts as rows.

``python -m nre_ray.data inspect`` describes documents (:mod:`.describe`); training batches are by length, dealt to
the workers by tokens (:class:`~.batching.LengthBatchSampler`, through ``Task.train_batches``).

With a storage path in an object store, the cache is shared there as the sentence task's is
(:mod:`nre_ray.data.shared_cache`). What is NOT done yet: the encoders are to move beside the others in
``nre_ray/models/``; the generated sample is not committed (call :func:`.sample.write_sample`) (issue 37).
"""

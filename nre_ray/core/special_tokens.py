"""The special tokens of a vocabulary built from the training data, and their ids: written by the data side
(:class:`nre_ray.data.vocab.Vocab`), read by the models (the padding row of a word embedding), imported by both."""

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1

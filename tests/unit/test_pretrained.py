"""Pretrained word vectors: text format with or without a header, gzip, case folding, hits, clear errors."""

import gzip

import pytest
import torch
from torch import nn

from nre_ray.config import ModelConfig
from nre_ray.data.vocab import Vocab
from nre_ray.models.pretrained import check_dim, load_word_vectors, vector_dim, word_embedding
from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.sentence.classifier import build_model

VOCAB = Vocab(["<pad>", "<unk>", "the", "cat", "new york", "sat"])
LINES = [
    "the 0.1 0.2 0.3",
    "dog 9 9 9",  # not in the vocabulary
    "cat 1 2 3",
    "new york 4 5 6",  # a word with a space (GloVe has a few)
    "<pad> 7 7 7",  # padding must stay zero
]


def _write(path, lines, header=False, gz=False):
    text = "\n".join(([f"{len(lines)} 3"] if header else []) + lines) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _embedding(dim=3):
    torch.manual_seed(0)
    return nn.Embedding(len(VOCAB), dim, padding_idx=0)


@pytest.mark.parametrize(("header", "gz"), [(False, False), (True, False), (False, True), (True, True)])
def test_loads_vectors_with_or_without_header_and_gzip(tmp_path, header, gz):
    path = _write(tmp_path / ("vectors.txt.gz" if gz else "vectors.txt"), LINES, header, gz)
    emb = _embedding()
    before = emb.weight.detach().clone()
    assert load_word_vectors(path, VOCAB.index, emb) == 3
    w = emb.weight.detach()
    torch.testing.assert_close(w[2], torch.tensor([0.1, 0.2, 0.3]))
    torch.testing.assert_close(w[3], torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(w[4], torch.tensor([4.0, 5.0, 6.0]))
    torch.testing.assert_close(w[5], before[5])  # "sat" has no vector: keeps its initialisation
    assert torch.equal(w[0], torch.zeros(3))  # padding row stays zero
    assert torch.equal(w[1], before[1])
    assert vector_dim(path) == 3


def test_token_list_vocab_and_plain_text_path(tmp_path):
    path = _write(tmp_path / "v.txt", LINES)
    assert load_word_vectors(str(path), VOCAB.tokens, _embedding()) == 3


def test_case_insensitive_when_lowercased_exact_entry_wins(tmp_path):
    path = _write(tmp_path / "v.txt", ["The 1 1 1", "the 2 2 2", "The 3 3 3", "CAT 4 4 4", "Cat 5 5 5"])
    emb = _embedding()
    assert load_word_vectors(path, VOCAB.index, emb, lowercase=True) == 2
    torch.testing.assert_close(emb.weight[2].detach(), torch.tensor([2.0, 2.0, 2.0]))  # exact "the" beats "The"
    torch.testing.assert_close(emb.weight[3].detach(), torch.tensor([4.0, 4.0, 4.0]))  # first of the capitalised
    emb = _embedding()
    assert load_word_vectors(path, VOCAB.index, emb, lowercase=False) == 1  # only the exact "the"


@pytest.mark.parametrize("header", [False, True])
def test_dimension_mismatch_names_file_line_and_both_dimensions(tmp_path, header):
    path = _write(tmp_path / "v.txt", LINES, header)
    with pytest.raises(ValueError, match=r"v\.txt: line 1: the word vectors have dimension 3, but --word-dim is 5"):
        load_word_vectors(path, VOCAB.index, _embedding(5))
    with pytest.raises(ValueError, match="dimension 3, but --word-dim is 5"):
        check_dim(path, 5)
    check_dim(path, 3)


def test_malformed_lines_are_clear_errors(tmp_path):
    path = _write(tmp_path / "short.txt", ["the 1 2 3", "cat 1 2"])
    with pytest.raises(ValueError, match=r"short\.txt: line 2: 2 values where the file's vectors have dimension 3"):
        load_word_vectors(path, VOCAB.index, _embedding())
    path = _write(tmp_path / "nan.txt", ["the 1 2 3", "cat 1 x 3"])
    with pytest.raises(ValueError, match=r"nan\.txt: line 2: the vector of 'cat' has a value that is not a number"):
        load_word_vectors(path, VOCAB.index, _embedding())
    with pytest.raises(ValueError, match="word vector file not found"):
        load_word_vectors(tmp_path / "missing.txt", VOCAB.index, _embedding())
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"bad\.gz: cannot read word vectors"):
        load_word_vectors(tmp_path / "bad.gz", VOCAB.index, _embedding())
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="no word vectors"):
        vector_dim(tmp_path / "empty.txt")


@pytest.mark.parametrize("name", ["cnn", "pcnn", "bilstm", "transformer"])
def test_word_embedding_is_found_in_every_model(tmp_path, name):
    model = build_model(ModelConfig(model=name, word_dim=3, pos_dim=2, hidden_size=4),
                        ModelSpec(vocab_size=len(VOCAB), num_classes=2, num_positions=5))
    emb = word_embedding(model)
    assert emb.weight.shape == (len(VOCAB), 3)
    assert load_word_vectors(_write(tmp_path / "v.txt", LINES), VOCAB.index, emb) == 3
    with pytest.raises(ValueError, match="has no word embedding"):
        word_embedding(nn.Linear(2, 2))

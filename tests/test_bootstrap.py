"""Poisson bootstrap weights: a function of the document and the seed only, Poisson(1) distributed."""

import hashlib
import math
import struct

import pytest
import torch

from tl_geometry.errors import GeometryError
from tl_geometry.results.bootstrap import document_weights, sequence_index_weights


def docs(count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50_000, (int(torch.randint(1, 40, (), generator=gen)),), generator=gen) for _ in range(count)]


def test_shape_dtype_and_no_replicates():
    w = document_weights(docs(3), 7, seed=1)
    assert w.shape == (3, 7) and w.dtype == torch.float64
    assert (w >= 0).all() and torch.equal(w, w.round())
    assert document_weights(docs(3), 0, seed=1).shape == (3, 0)
    assert document_weights([], 5, seed=1).shape == (0, 5)


def test_weights_depend_on_the_document_and_seed_only():
    documents = docs(6)
    together = document_weights(documents, 20, seed=3)
    order = [4, 2, 0, 5, 1, 3]
    shuffled = document_weights([documents[i] for i in order], 20, seed=3)
    assert torch.equal(shuffled, together[order])
    for i, d in enumerate(documents):
        assert torch.equal(document_weights([d], 20, seed=3)[0], together[i])
        assert torch.equal(document_weights([d.to(torch.int32)], 20, seed=3)[0], together[i])  # ids, not dtype
    assert not torch.equal(document_weights(documents, 20, seed=4), together)
    # A change of one token, or of the length, is another document.
    changed = documents[0].clone()
    changed[0] += 1
    assert not torch.equal(document_weights([changed], 20, seed=3)[0], together[0])
    assert not torch.equal(document_weights([documents[0][:-1]], 20, seed=3)[0], together[0])


def test_weights_are_poisson_one():
    """Frequencies of k = 0..4 against the pmf e^-1 / k!, mean and variance 1 (200 000 draws)."""
    w = document_weights(docs(4000, seed=1), 50, seed=0).flatten()
    tolerance = 5 * math.sqrt(0.25 / len(w))  # five binomial standard errors at worst
    for k in range(5):
        assert abs((w == k).double().mean().item() - math.exp(-1) / math.factorial(k)) < tolerance
    assert abs(w.mean().item() - 1) < 0.01 and abs(w.var().item() - 1) < 0.02


def reference_weights(tokens: list[int], n_bootstrap: int, seed: int) -> list[float]:
    """From the documented scheme: SHA-256 of tag, seed and int64 little-endian ids seeds a generator;
    each uniform u becomes the smallest k with u < P(X <= k), X ~ Poisson(1)."""
    key = b"tl_geometry.bootstrap/1" + struct.pack("<q", seed) + struct.pack(f"<{len(tokens)}q", *tokens)
    generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
    out = []
    for u in torch.rand(n_bootstrap, dtype=torch.float64, generator=generator).tolist():
        k, cdf = 0, math.exp(-1)
        while u >= cdf:
            k += 1
            cdf += math.exp(-1) / math.factorial(k)
        out.append(float(k))
    return out


def test_the_scheme_matches_its_description_and_is_pinned():
    """Weights must not change between versions: results saved earlier merge with new ones."""
    for tokens, seed in (([1, 2, 3], 0), ([50_000, 7], -5), ([0], 2**40)):
        got = document_weights([torch.tensor(tokens)], 64, seed=seed)[0].tolist()
        assert got == reference_weights(tokens, 64, seed)
    assert document_weights([torch.tensor([1, 2, 3])], 8, seed=0)[0].tolist() == [2, 0, 3, 2, 0, 2, 3, 1]


def test_sequence_index_weights_are_repeatable():
    a = sequence_index_weights(5, 9, seed=0)
    assert a.shape == (5, 9) and torch.equal(a, sequence_index_weights(5, 9, seed=0))
    assert torch.equal(a[:3], sequence_index_weights(3, 9, seed=0))
    assert sequence_index_weights(0, 4, seed=0).shape == (0, 4)


def test_bad_input():
    with pytest.raises(GeometryError, match=r"documents\[1\]: expected a 1-d tensor of integer token ids"):
        document_weights([torch.tensor([1]), torch.tensor([1.0])], 3, seed=0)
    with pytest.raises(GeometryError, match=r"documents\[0\]: expected a 1-d tensor"):
        document_weights([torch.zeros(2, 3, dtype=torch.long)], 3, seed=0)
    with pytest.raises(GeometryError, match="n_bootstrap: expected an integer >= 0"):
        document_weights([torch.tensor([1])], -1, seed=0)

"""The conditioning slot: label / vector embeddings with a learned null, zero-initialised, off by default."""

from __future__ import annotations

import pytest
import torch

from policylink.adapters.capabilities import ConditioningSpec
from policylink.policies.common.conditioning import ConditioningEmbedding, drop_labels


def test_labels_and_vectors_with_null_known_values():
    emb = ConditioningEmbedding(ConditioningSpec(num_labels=2, token_dim=2), dim=3)
    assert float(emb(2).detach().abs().sum()) == 0.0  # zero init: a new slot changes nothing
    with torch.no_grad():
        emb.labels.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0]]))  # rows 0, 1, null
        emb.tokens.weight.copy_(torch.tensor([[1.0, 0], [0, 1.0], [1.0, 1.0]]))
        emb.tokens.bias.zero_()
        emb.null_token.copy_(torch.tensor([7.0, 7.0, 7.0]))
    nan = float("nan")
    out = emb(3, labels=torch.tensor([1, -1, 0]), tokens=torch.tensor([[1.0, 2.0], [nan, nan], [0.0, 0.0]]))
    expected = torch.tensor([[0, 2.0, 0], [0, 0, 3.0], [1.0, 0, 0]]) + torch.tensor(
        [[1.0, 2.0, 3.0], [7.0, 7.0, 7.0], [0, 0, 0]]
    )
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(emb(1), torch.tensor([[7.0, 7.0, 10.0]]))  # both slots null
    with pytest.raises(ValueError, match=r"conditioning.labels: expected values in \[-1, 2\), received \[2\]"):
        emb(1, labels=torch.tensor([2]))
    with pytest.raises(ValueError, match=r"conditioning.tokens: expected shape \(1, 2\), received \(1, 3\)"):
        emb(1, tokens=torch.zeros(1, 3))


def test_off_by_default_adds_no_parameter():
    emb = ConditioningEmbedding(ConditioningSpec(), dim=4)
    assert not emb.enabled and emb.state_dict() == {}
    torch.testing.assert_close(emb(2), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="no conditioning slot"):
        emb(2, labels=torch.tensor([0, 1]))


def test_label_dropout():
    labels = torch.tensor([0, 1, 1, 0, 1])
    assert drop_labels(labels, 1.0).tolist() == [-1] * 5
    assert drop_labels(labels, 0.0).tolist() == labels.tolist()
    dropped = drop_labels(torch.ones(10000, dtype=torch.long), 0.1, torch.Generator().manual_seed(0))
    assert abs(float((dropped == -1).float().mean()) - 0.1) < 0.01
    with pytest.raises(ValueError, match=r"label dropout p: expected a value in \[0, 1\], received 1.5"):
        drop_labels(labels, 1.5)

"""Dense scores in blocks BLAS runs on one thread (:func:`ctxkeep.episodic.index._base.matvec`):
the same scores as one product, and the exact index's search over many vectors never hands
BLAS a product it would thread (threads that wait for cores on a busy machine made a search
at 10,000 items several times slower)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ctxkeep.episodic.index import ExactIndex
from ctxkeep.episodic.index._base import SERIAL_ELEMENTS, matvec


@pytest.mark.parametrize(
    ("n", "dim", "q_dtype"),
    [
        (0, 8, np.float32),
        (1, 256, np.float32),
        (511, 256, np.float32),
        (10_001, 256, np.float32),
        (3_000, 1536, np.float32),
        (5_000, 384, np.float64),
    ],
)
def test_matvec_gives_the_scores_of_one_product(n: int, dim: int, q_dtype: Any) -> None:
    rng = np.random.default_rng(n + dim)
    matrix = rng.standard_normal((n, dim)).astype(np.float32)
    q = rng.standard_normal(dim).astype(q_dtype)
    got = matvec(matrix, q)
    want = matrix @ q
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_exact_search_hands_blas_only_products_it_runs_on_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(7)
    index = ExactIndex(256)
    vectors = rng.standard_normal((10_000, 256)).astype(np.float32)
    index.add(np.arange(10_000), vectors)
    expected_ids, _ = index.search(vectors[1234], 5)
    sizes: list[int] = []
    real = np.matmul

    def recording(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(int(np.asarray(a).size))
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(np, "matmul", recording)
    ids, _ = index.search(vectors[1234], 5)
    monkeypatch.undo()
    assert ids.tolist() == expected_ids.tolist() and ids[0] == 1234
    assert sizes, "the scores of 10,000 vectors were not computed in blocks"
    assert sum(sizes) == 10_000 * 256
    assert max(sizes) <= SERIAL_ELEMENTS

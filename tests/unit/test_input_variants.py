"""Input sets from other distributions and the partial-computation check
(engine.kernels.input_variants, and their use in engine.kernels.worker.Worker).

Correctness also runs on the first main input set with its floating-point data redrawn
(uniform, heavy-tailed): shapes, dtypes and sign character kept, integer and bool tensors left
alone, the same values in every worker. The degenerate-test check asks whether the reference's
output on inputs holding half their values passes: a mean over many elements does."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from engine.kernels import worker
from engine.kernels.input_variants import DISTRIBUTIONS, keep_half_, redraw_


def _set() -> list:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(64, 33, generator=g) * 3,  # mixed sign
        torch.rand(500, generator=g).double(),  # within [0, 1]
        torch.rand(40, 8, generator=g) * 5 + 0.25,  # positive, beyond 1
        -torch.rand(300, generator=g) * 7,  # nonpositive
        (torch.randn(32, 32, generator=g) * 2).half(),
        torch.randint(0, 10, (50,), generator=g),  # indices
        torch.rand(50, generator=g) > 0.5,  # a mask
        torch.randint(0, 2, (50,), generator=g).float(),  # labels stored as floats
        torch.full((20,), 1.5),  # a constant
        torch.randn((), generator=g),  # one element
        torch.randn(16, 12, generator=g).t(),  # not contiguous
        0.75,  # a Python number
    ]


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_redrawn_tensors_keep_shape_dtype_and_sign(dist):
    before = _set()
    after = [t.clone() if isinstance(t, torch.Tensor) else t for t in before]
    assert redraw_(after, dist, seed=11) == 6
    for b, a in zip(before, after):
        if not isinstance(b, torch.Tensor):
            assert a == b
            continue
        assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
        assert bool(torch.isfinite(a.double()).all()) if a.is_floating_point() else True
    mixed, unit, positive, nonpositive, half, idx, mask, labels, const, one, strided, _ = after
    for i in (5, 6, 7, 8, 9):  # indices, mask, float labels, a constant, one element: untouched
        assert torch.equal(after[i], before[i])
    for i in (0, 1, 2, 3, 4, 10):  # data: new values
        assert not torch.equal(after[i], before[i])
    assert mixed.min() < 0 < mixed.max()
    assert float(unit.min()) >= float(before[1].min()) and float(unit.max()) <= float(before[1].max())
    assert float(positive.min()) >= float(before[2].min()) > 0
    assert float(nonpositive.max()) <= float(before[3].max()) <= 0


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_rows_that_are_distributions_stay_distributions(dist):
    probs = torch.softmax(torch.randn(8, 30, generator=torch.Generator().manual_seed(4)), dim=-1)
    redrawn = probs.clone()
    redraw_([redrawn], dist, seed=2)
    assert not torch.allclose(redrawn, probs)
    assert float(redrawn.min()) >= 0 and torch.allclose(redrawn.sum(-1), torch.ones(8))


def test_the_heavy_tailed_set_has_a_heavy_tail():
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(3))
    y = x.clone()
    redraw_([y], "pareto", seed=5)
    # the mean magnitude is kept roughly, the largest values are far beyond a normal sample's
    assert 0.3 < float(y.abs().mean()) / float(x.abs().mean()) < 3
    assert float(y.abs().max()) > 50 * float(x.abs().max())
    u = x.clone()
    redraw_([u], "uniform", seed=5)
    assert float(u.min()) >= float(x.min()) and float(u.max()) <= float(x.max())


def test_redrawing_is_deterministic_for_a_seed():
    a, b, c = _set(), _set(), _set()
    redraw_(a, "pareto", 7)
    redraw_(b, "pareto", 7)
    redraw_(c, "pareto", 8)
    assert all(torch.equal(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor))
    assert not torch.equal(a[0], c[0])


def test_keep_half_pairs_elements_and_keeps_pairs_together():
    g = torch.Generator().manual_seed(1)
    p, t = torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g)
    hp, ht = p.clone(), t.clone()
    assert keep_half_([hp, ht], seed=3, stride="adjacent") == 2
    fp, fht = hp.view(-1, 2), ht.view(-1, 2)
    assert torch.equal(fp[:, 0], fp[:, 1]) and torch.equal(fht[:, 0], fht[:, 1])
    # each pair took one of its own two values, and the same one in both tensors
    took_second = fp[:, 0] == p.view(-1, 2)[:, 1]
    assert torch.equal(took_second, fht[:, 0] == t.view(-1, 2)[:, 1])
    assert 0 < int(took_second.sum()) < took_second.numel()
    # pairs half the tensor apart: every column keeps half its values, each twice
    h = p.clone()
    keep_half_([h], seed=3, stride="halves")
    assert torch.equal(h[:3], h[3:])
    assert bool(((h[:3] == p[:3]) | (h[:3] == p[3:])).all())
    ints = torch.arange(10)
    assert keep_half_([ints], seed=3, stride="adjacent") == 0 and torch.equal(ints, torch.arange(10))


def _problem(folder: Path, name: str, body: str) -> Path:
    p = folder / f"{name}.py"
    p.write_text(textwrap.dedent(body))
    return p


MSE = """
    import torch
    N = {n}
    {extra}
    class Model(torch.nn.Module):
        def forward(self, p, t):
            return torch.mean((p - t) ** 2)
    def get_inputs():
        return [torch.randn(N) * (0.5 + torch.rand(())), torch.randn(N)]
    def get_init_inputs():
        return []
"""


def _load(path: Path, folder: Path, **extra) -> worker.Worker:
    w = worker.Worker(folder)
    w.op_load({"kernel": {"module": str(path)}, "inputs": {"module": str(path)}, "seeds": [4, 5, 6], "device": "cpu",
               **extra})
    return w


def test_every_worker_makes_the_same_variant_sets(tmp_path):
    path = _problem(tmp_path, "mse", MSE.format(n=4096, extra=""))
    a, b = _load(path, tmp_path), _load(path, tmp_path)
    assert [m["distribution"] for m in a.set_meta] == ["problem"] * 3 + list(DISTRIBUTIONS)
    assert sorted(a.variants) == [3, 4]
    for i in a.variants:
        for x, y in zip(a.sets[i], b.sets[i]):
            assert torch.equal(x, y)
        assert not torch.equal(a.sets[i][0], a.sets[0][0])
    # made again from the first set's seed (as for KernelBench's sizes): the same values again
    regen = _load(path, tmp_path, keep_sets_bytes=1)
    assert regen.regen is not None and all(regen.sets[i] is None for i in regen.variants)
    for i in a.variants:
        for x, y in zip(a.sets[i], regen._pristine(i)):
            assert torch.equal(x, y)


def test_variant_sets_too_large_to_keep_are_made_for_each_request(tmp_path):
    path = _problem(tmp_path, "mse", MSE.format(n=4096, extra=""))
    one_set = 2 * 4096 * 4
    w = _load(path, tmp_path, keep_sets_bytes=3 * one_set)  # the main sets fit, with the variants they would not
    assert w.regen is None and not w.variants_kept and all(w.sets[i] is None for i in w.variants)
    cand = _load(path, tmp_path, keep_sets_bytes=3 * one_set)
    for i in range(len(w.set_meta)):
        assert w.op_run_set({"index": i, "role": "reference"})["self_check"]["passed"]
        c = cand.op_run_set({"index": i})
        assert w.op_judge({"index": i, "outputs": c["outputs"], "inputs": c["inputs"]})["passed"]
        cand.op_release({})
    assert all(w.sets[i] is None for i in w.variants) and not set(w.ref_outputs) & set(w.variants)


def test_problems_can_opt_out_and_index_only_inputs_get_none(tmp_path):
    opted = _problem(tmp_path, "opted", MSE.format(n=64, extra="INPUT_DISTRIBUTIONS = ()"))
    assert _load(opted, tmp_path).variants == {}
    gather = _problem(tmp_path, "gather", """
        import torch
        class Model(torch.nn.Module):
            def forward(self, idx):
                return (idx * 2).float()
        def get_inputs():
            return [torch.randint(0, 9, (64,))]
        def get_init_inputs():
            return []
    """)
    assert _load(gather, tmp_path).variants == {}


def _degenerate(w: worker.Worker, **tol) -> str | None:
    for i in range(len(w.set_meta)):
        w.op_run_set({"index": i, "role": "reference"})
    return w.op_degenerate(tol)["degenerate"]


def test_a_mean_over_many_normal_values_is_a_degenerate_test_without_other_distributions(tmp_path):
    """KernelBench's MSE at its 1e-2 tolerance, normal inputs only: half the elements give the
    same loss within the tolerance, so a kernel that reads half its inputs passes."""
    path = _problem(tmp_path, "mse_normal", MSE.format(n=1 << 16, extra="INPUT_DISTRIBUTIONS = ()"))
    said = _degenerate(_load(path, tmp_path), rtol=1e-2, atol=1e-2)
    assert said and "half the inputs" in said and "on all 3 input sets" in said
    # at float32's own tolerance (1e-4) the same test tells half the elements apart
    assert _degenerate(_load(path, tmp_path)) is None


def test_heavy_tailed_inputs_make_the_same_test_real(tmp_path):
    path = _problem(tmp_path, "mse", MSE.format(n=1 << 16, extra=""))
    assert _degenerate(_load(path, tmp_path), rtol=1e-2, atol=1e-2) is None


def test_outputs_that_need_every_element_are_not_called_degenerate(tmp_path):
    path = _problem(tmp_path, "softmax", """
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=-1)
        def get_inputs():
            return [torch.randn(32, 100) * 4]
        def get_init_inputs():
            return []
    """)
    assert _degenerate(_load(path, tmp_path), rtol=1e-2, atol=1e-2) is None


def test_a_variant_set_is_judged_with_atol_relative_to_its_largest_output(tmp_path):
    path = _problem(tmp_path, "mse", MSE.format(n=256, extra=""))
    w = _load(path, tmp_path)
    big = torch.tensor([1000.0, 2.0])
    assert w._tolerance(0, big, None, None) == (None, None)  # a main set: as given
    i = next(iter(w.variants))
    assert w._tolerance(i, big, None, None) == (None, pytest.approx(1e-5 * 1000))  # float32's atol, scaled
    assert w._tolerance(i, torch.tensor([0.5]), 1e-2, 1e-3) == (1e-2, 1e-3)  # outputs within 1: unscaled
    assert w._tolerance(i, (big, torch.tensor([7, 9])), None, None) == (None, None)  # indices stay exact


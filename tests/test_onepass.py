"""The one-pass CPU kernel (atlas.decode.onepass): its sums against float64, the same bits for a
row whatever rows share its pass and with or without software prefetch, the shapes torch's checks
refuse, a build that is whole or absent, and the build's prefetch choice following its own timings. Needs `make kernels` (skips, saying why, without it; fails with ATLAS_REQUIRE_KERNELS=1)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from atlas import AtlasError
from atlas.decode import onepass


@pytest.mark.parametrize(("n", "k"), [(1, 16), (3, 40), (257, 576), (1000, 577), (49, 1536)])
def test_products_match_float64_and_each_row_keeps_its_bits_in_any_pass(onepass_kernel: object, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(9, k, generator=gen)
    exact = (x.double() @ w.double().t())
    full = onepass.matmul(x, w)
    assert full.shape == (9, n)
    assert (full.double() - exact).abs().max().item() <= 1e-5 * exact.abs().max().item() * k**0.5
    for rows in range(1, 10):  # 1-4 rows share one pass over W; 5-9 take two or three
        for start in range(0, 9 - rows + 1, 3):
            assert torch.equal(onepass.matmul(x[start:start + rows], w), full[start:start + rows]), (rows, start)


@pytest.mark.parametrize(("n", "k"), [(5, 16), (300, 576), (70, 1537)])
def test_prefetch_changes_no_bits(onepass_kernel: object, n: int, k: int) -> None:
    """Prefetch only asks memory early: every row count gives the same bits with it and without,
    so the build's choice can never change an output."""
    gen = torch.Generator().manual_seed(n + k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(6, k, generator=gen)
    for rows in range(1, 7):
        assert torch.equal(onepass_kernel.onepass_mm(x[:rows], w, True), onepass_kernel.onepass_mm(x[:rows], w, False))  # type: ignore[attr-defined]


@pytest.mark.parametrize("slower", [True, False])
def test_the_build_keeps_the_faster_prefetch_choice(monkeypatch: pytest.MonkeyPatch, slower: bool) -> None:
    """calibrate() times both variants at 1 and 2 rows and keeps the one with the smaller sum: a
    stand-in kernel whose prefetch variant is made slower (or faster) must be refused (or kept)."""
    calls: list[tuple[int, bool]] = []

    def onepass_mm(x: torch.Tensor, w: torch.Tensor, prefetch: bool) -> None:
        calls.append((x.shape[0], prefetch))
        time.sleep(0.002 if prefetch == slower else 0.0002)

    monkeypatch.setattr(onepass, "CALIBRATION_BYTES", 3 * 8192 * 576 * 4)
    threads = torch.get_num_threads()
    chosen = onepass.calibrate(SimpleNamespace(onepass_mm=onepass_mm))  # type: ignore[arg-type]
    assert chosen["prefetch"] is not slower
    assert sorted(set(calls)) == [(1, False), (1, True), (2, False), (2, True)]
    assert len(calls) == onepass.CALIBRATION_ROUNDS * 4 * 3 and torch.get_num_threads() == threads
    assert set(chosen["median_ms"]) == {"none, 1 row", "none, 2 rows", "prefetch, 1 row", "prefetch, 2 rows"}  # type: ignore[arg-type]


def test_a_build_without_its_choice_is_not_taken(onepass_kernel: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library without a sound choice.json (a build cut short, a damaged file) is not loaded,
    and `make kernels` times the choice again rather than failing on the folder."""
    built = onepass.build_dir()
    monkeypatch.setattr(onepass, "CACHE", tmp_path / "cache")
    copy = onepass.build_dir()
    copy.mkdir(parents=True)
    shutil.copy(onepass._library(built), copy)  # type: ignore[arg-type]
    onepass.load.cache_clear()
    try:
        assert onepass.load() is None and "make kernels" in (onepass.missing() or "")
        for damaged in ("{", '{"prefetch": "yes"}', "[1]"):  # a file the build does not write counts as none
            (copy / onepass.CHOICE_FILE).write_text(damaged)
            onepass.load.cache_clear()
            assert onepass.load() is None
        (copy / onepass.CHOICE_FILE).write_text(json.dumps({"prefetch": False}))
        onepass.load.cache_clear()
        onepass.prefetch.cache_clear()
        assert onepass.load() is not None and onepass.describe() == "no software prefetch"
        # make kernels on such a folder times the choice again and keeps the library
        (copy / onepass.CHOICE_FILE).write_text("{")
        monkeypatch.setattr(onepass, "calibrate", lambda module: {"prefetch": True, "median_ms": {}})
        assert onepass.build() == onepass._library(copy) and onepass.load() is not None and onepass.prefetch()
    finally:
        onepass.load.cache_clear()
        onepass.prefetch.cache_clear()


def test_a_row_is_not_read_past_its_end(onepass_kernel: object) -> None:
    # x and W as views into larger buffers: the kernel must read K values per row and no more
    big = torch.randn(4, 40)
    x, w = big[:2, :33].contiguous(), torch.randn(5, 40)[:, :33].contiguous()
    assert torch.allclose(onepass.matmul(x, w), x @ w.t(), atol=1e-5)


@pytest.mark.parametrize(("x", "w", "message"), [
    (torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16), "float32 only"),
    (torch.randn(2, 8), torch.randn(4, 9), r"x \[M, K\] and W \[N, K\]"),
    (torch.randn(2, 8), torch.randn(8, 4).t(), "contiguous"),
])
def test_what_the_kernel_cannot_take_is_refused_by_name(onepass_kernel: object, x: torch.Tensor, w: torch.Tensor, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        onepass.matmul(x, w)


def test_a_failed_build_leaves_no_kernel_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if onepass.unsupported():
        pytest.skip(onepass.unsupported())
    broken = tmp_path / "onepass.cpp"
    broken.write_text("#include <torch/extension.h>\nthis is not C++;\n")
    monkeypatch.setattr(onepass, "SOURCE", broken)
    monkeypatch.setattr(onepass, "CACHE", tmp_path / "cache")
    onepass.load.cache_clear()
    try:
        assert onepass.missing() is not None and "make kernels" in onepass.missing()  # type: ignore[operator]
        with pytest.raises(AtlasError, match="did not build"):
            onepass.build()
        assert not onepass.build_dir().exists() and onepass.load() is None
    finally:
        onepass.load.cache_clear()

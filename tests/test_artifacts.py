"""The SVG pictures of unwritten / out-of-bounds output regions (`kaudit.dynamic.artifacts`):
valid XML, the right cells coloured, downsampling of large outputs, guard bands and the title's
numbers."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="pictures are drawn from torch masks (kaudit[dynamic])")

from kaudit.dynamic.artifacts import write_picture

SVG = "{http://www.w3.org/2000/svg}"


def _parse(path: str) -> ET.Element:
    return ET.parse(path).getroot()


def _cells(root: ET.Element, group: str, kind: str) -> int:
    """Cells drawn in `group` (grid, guard-before, guard-after) of class `kind`: rect widths summed,
    since each rect is one run of equal cells in one row."""
    total = 0
    for outer in root.iter(f"{SVG}g"):
        if outer.get("class") != group:
            continue
        for inner in outer.findall(f"{SVG}g"):
            if inner.get("class") == kind:
                total += sum(int(rect.get("width")) for rect in inner.findall(f"{SVG}rect"))
    return total


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def _only_row_zero_written(rows: int, columns: int) -> torch.Tensor:
    unwritten = torch.ones(rows * columns, dtype=torch.bool)
    unwritten[:columns] = False
    return unwritten


def test_only_row_zero_written(tmp_path):
    path = write_picture(str(tmp_path / "pictures"), "KD101 kernel.py/out[0]", [32, 48],
                         _only_row_zero_written(32, 48), title="kernel.py: output 0")
    assert Path(path) == tmp_path / "pictures" / "KD101_kernel.py_out_0.svg"
    root = _parse(path)
    assert _cells(root, "grid", "unwritten") == 31 * 48
    assert _cells(root, "grid", "written") == 48
    assert _cells(root, "grid", "partial") == 0
    grid = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "grid")
    written = next(g for g in grid.findall(f"{SVG}g") if g.get("class") == "written")
    assert [(r.get("x"), r.get("y"), r.get("width")) for r in written] == [("0", "0", "48")]
    unwritten = next(g for g in grid.findall(f"{SVG}g") if g.get("class") == "unwritten")
    assert len(unwritten) == 31, "one rect per row: equal cells of a row are merged"
    texts = _texts(root)
    assert texts[0] == "kernel.py: output 0"
    assert "31 of 32 rows never written (96.9 %); 1488 of 1536 elements never written (96.9 %)" \
        in texts
    assert {"row", "column", "written", "never written"} <= set(texts)
    assert not any(g.get("class", "").startswith("guard") for g in root.iter(f"{SVG}g"))


def test_output_is_deterministic_and_replaced(tmp_path):
    mask = _only_row_zero_written(32, 48)
    first = Path(write_picture(str(tmp_path), "same", [32, 48], mask)).read_bytes()
    second = Path(write_picture(str(tmp_path), "same", [32, 48], mask.clone())).read_bytes()
    assert first == second
    assert [p.name for p in tmp_path.iterdir()] == ["same.svg"]


def test_large_output_is_downsampled_and_small(tmp_path):
    unwritten = torch.zeros(4096 * 4096, dtype=torch.bool)
    unwritten[4096 * 4096 // 2:] = True
    path = write_picture(str(tmp_path), "big", [4096, 4096], unwritten)
    assert Path(path).stat().st_size < 300_000
    root = _parse(path)
    # 256 x 256 cells of 16 x 16 elements: the lower 128 cell rows unwritten, the upper written
    assert _cells(root, "grid", "unwritten") == 128 * 256
    assert _cells(root, "grid", "written") == 128 * 256
    texts = _texts(root)
    assert "2048 of 4096 rows never written (50 %); 8388608 of 16777216 elements never written " \
        "(50 %)" in texts
    assert any("one cell = 16 x 16 elements" in t for t in texts)


def test_partly_written_cells_are_in_between(tmp_path):
    unwritten = torch.zeros(1024 * 1024, dtype=torch.bool)
    unwritten[0] = True  # one element of the first 4 x 4 cell
    root = _parse(write_picture(str(tmp_path), "one", [1024, 1024], unwritten))
    assert _cells(root, "grid", "partial") == 1
    assert _cells(root, "grid", "unwritten") == 0
    assert _cells(root, "grid", "written") == 256 * 256 - 1
    assert "0 of 1024 rows never written (0 %); 1 of 1048576 elements never written (9.54e-05 %)" \
        in _texts(root)


def test_guard_bands(tmp_path):
    written_after = torch.zeros(64, dtype=torch.bool)
    written_after[:10] = True
    root = _parse(write_picture(str(tmp_path), "oob", [8, 16], torch.zeros(128, dtype=torch.bool),
                                written_before=torch.zeros(64, dtype=torch.bool),
                                written_after=written_after))
    assert _cells(root, "guard-after", "written") == 10
    assert _cells(root, "guard-after", "untouched") == 54
    assert _cells(root, "guard-before", "written") == 0
    assert _cells(root, "guard-before", "untouched") == 64
    texts = _texts(root)
    assert "10 of 64 guard elements after the end written out of bounds" in texts
    assert "0 of 64 guard elements before the start written out of bounds" in texts
    assert "written out of bounds (guard zone)" in texts
    assert _cells(root, "grid", "written") == 128 and _cells(root, "grid", "unwritten") == 0


def test_guard_band_only_without_coverage(tmp_path):
    root = _parse(write_picture(str(tmp_path), "oob", [4, 4],
                                written_after=torch.ones(3, dtype=torch.bool)))
    assert _cells(root, "grid", "not-measured") == 16
    assert _cells(root, "guard-after", "written") == 3
    assert "write coverage not measured" in _texts(root)


def test_long_vector_is_folded(tmp_path):
    unwritten = torch.zeros(10_000, dtype=torch.bool)
    unwritten[5_000:] = True
    root = _parse(write_picture(str(tmp_path), "vector", [10_000], unwritten))
    texts = _texts(root)
    assert "1-D output folded row-major into 100 rows of 100 elements" in texts
    assert "5000 of 10000 elements never written (50 %)" in texts
    assert "flat index" in texts
    assert _cells(root, "grid", "unwritten") == 5_000


def test_short_vector_is_one_row_and_ragged_fold_leaves_no_cells(tmp_path):
    root = _parse(write_picture(str(tmp_path), "short", [10], torch.ones(10, dtype=torch.bool)))
    assert _cells(root, "grid", "unwritten") == 10
    # 300 elements fold into 17 rows of 18; the last row holds 12, its other 6 cells are not drawn
    root = _parse(write_picture(str(tmp_path), "ragged", [300], torch.ones(300, dtype=torch.bool)))
    assert _cells(root, "grid", "unwritten") == 300


def test_unsafe_stem_and_bad_mask(tmp_path):
    path = write_picture(str(tmp_path), "../../etc/passwd", [2, 2],
                         torch.zeros(4, dtype=torch.bool))
    assert Path(path).parent == tmp_path and Path(path).name == "etc_passwd.svg"
    assert Path(write_picture(str(tmp_path), "...", [1], None)).name == "output.svg"
    with pytest.raises(ValueError, match="unwritten has 3 elements, shape \\[2, 2\\] has 4"):
        write_picture(str(tmp_path), "bad", [2, 2], torch.zeros(3, dtype=torch.bool))


def test_empty_output_and_title_escaping(tmp_path):
    root = _parse(write_picture(str(tmp_path), "empty", [0, 8], torch.zeros(0, dtype=torch.bool),
                                title="out <0> & more"))
    texts = _texts(root)
    assert texts[0] == "out <0> & more"
    assert "the output has no elements" in texts
    assert _cells(root, "grid", "written") == 0


@pytest.mark.parametrize("shape", [[300, 517], [3001, 5], [2, 5_000_000], [70_001]])
def test_cell_shares_match_a_direct_count(shape):
    """Downsampling in blocks (ragged edges, column blocks of very wide rows, a folded vector)
    counts the same as slicing each cell out of the grid."""
    from kaudit.dynamic.artifacts import _Grid

    numel = math.prod(shape)
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(0)) < 0.3
    grid = _Grid.of(shape)
    padded = torch.cat([mask, mask.new_zeros(grid.rows * grid.columns - numel)])
    view = padded.view(grid.rows, grid.columns)
    valid = (torch.arange(grid.rows * grid.columns) < numel).view(grid.rows, grid.columns)
    shares = grid.shares(mask)
    fr, fc = grid.row_factor, grid.column_factor
    for i in range(grid.cell_rows):
        for j in range(grid.cell_columns):
            cell = (slice(i * fr, (i + 1) * fr), slice(j * fc, (j + 1) * fc))
            size = int(valid[cell].sum())
            expected = int(view[cell].sum()) / size if size else None
            assert shares[i][j] == expected, (i, j)

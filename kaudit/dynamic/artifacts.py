"""Pictures of an output's write coverage (KD101) and of writes past its ends (KD103), as SVG.

The output is drawn as a grid: rows = prod(shape[:-1]), columns = shape[-1]. A 1-D output of more
than `MAX_CELLS` elements is folded row-major into a near-square grid instead, since one long strip
hides where a gap lies. Grids over `MAX_CELLS` x `MAX_CELLS` are downsampled; each cell's colour
shows the share of never-written elements in it. Guard zones (the memory just before and after the
allocation) are bands above and below the grid, coloured where the kernel wrote into them.

Hand-written SVG, deterministic: the same masks give the same bytes. Equal neighbouring cells of a
row are one rect, so structured gaps (rows, tails, columns) stay small files.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import torch

from kaudit.dynamic.harness.counting import count_true

#: cells per axis at most; bigger outputs are downsampled
MAX_CELLS = 256
#: the grid's size in pixels at most, per axis
GRID_PIXELS = 768
#: elements per block when counting cells (bounds the temporary copies)
CHUNK = 1 << 22
WRITTEN = (0xCF, 0xE3, 0xF5)
UNWRITTEN = (0xD7, 0x19, 0x1C)
GUARD_UNTOUCHED = (0xEE, 0xEE, 0xEE)
GUARD_WRITTEN = (0x7B, 0x32, 0x94)
NOT_MEASURED = (0xBD, 0xBD, 0xBD)
#: partial cells take colours from this range of the mix, so a single element still shows
PARTIAL_RANGE = (0.2, 0.8)
PARTIAL_STEPS = 12
BAND_HEIGHT = 14
LEFT, RIGHT, LINE = 78, 64, 16


def write_picture(directory: str, stem: str, shape: list[int], unwritten=None,
                  written_before=None, written_after=None, title: str = "") -> str:
    """Write `<directory>/<sanitised stem>.svg` and return its path (an existing file of that name
    is replaced).

    `unwritten`: flat bool tensor over the output (numel = prod(shape)), True where never written;
    None: coverage not measured (the grid is grey). `written_before` / `written_after`: flat bool
    tensors over the guard zones just before / after the allocation, True where written out of
    bounds; None: no band.
    """
    shape = [int(n) for n in shape]
    numel = math.prod(shape)
    masks = [None if m is None else m.detach().reshape(-1).to("cpu", torch.bool)
             for m in (unwritten, written_before, written_after)]
    if masks[0] is not None and masks[0].numel() != numel:
        raise ValueError(f"unwritten has {masks[0].numel()} elements, shape {shape} has {numel}")
    grid = _Grid.of(shape)
    shares = None if masks[0] is None else grid.shares(masks[0])
    svg = _svg(shape, grid, masks[0], shares, masks[1], masks[2], title)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_safe_stem(stem)}.svg"
    path.write_text(svg, encoding="utf-8")
    return str(path)


def _safe_stem(stem: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._-")[:120]
    return safe or "output"


class _Grid:
    """How flat element indices map to rows and columns, and those to cells of `row_factor` x
    `column_factor` elements (1 x 1 unless downsampled; the last cell of a row or column may be
    smaller)."""

    def __init__(self, rows: int, columns: int, numel: int, folded: bool) -> None:
        self.rows, self.columns, self.numel, self.folded = rows, columns, numel, folded
        self.row_factor = max(1, -(-rows // MAX_CELLS))
        self.column_factor = max(1, -(-columns // MAX_CELLS))
        self.cell_rows = -(-rows // self.row_factor)
        self.cell_columns = -(-columns // self.column_factor)

    @classmethod
    def of(cls, shape: list[int]) -> _Grid:
        numel = math.prod(shape)
        if len(shape) <= 1 and numel > MAX_CELLS:
            width = math.isqrt(numel - 1) + 1
            return cls(-(-numel // width), width, numel, True)
        columns = shape[-1] if shape else 1
        return cls(numel // columns if columns else 0, columns, numel, False)

    def sizes(self) -> list[list[int]]:
        """Elements per cell; a folded output's last row stops short of the grid's width."""
        missing_from = self.numel - (self.rows - 1) * self.columns
        sizes = []
        for i in range(self.cell_rows):
            height = min(self.row_factor, self.rows - i * self.row_factor)
            row = []
            for j in range(self.cell_columns):
                start = j * self.column_factor
                end = min(start + self.column_factor, self.columns)
                size = height * (end - start)
                if i == self.cell_rows - 1:
                    size -= max(0, end - max(start, missing_from))
                row.append(size)
            sizes.append(row)
        return sizes

    def shares(self, mask: torch.Tensor) -> list[list[float | None]]:
        """Per cell: the share of True elements; None for cells past a folded output's end."""
        rows, columns = self.row_factor, self.column_factor
        if mask.numel() < self.rows * self.columns:  # a folded output's last row
            mask = torch.cat([mask, mask.new_zeros(self.rows * self.columns - mask.numel())])
        grid = mask.view(self.rows, self.columns)
        hits = torch.zeros(self.cell_rows, self.cell_columns, dtype=torch.int64)
        block_rows = rows * max(1, CHUNK // (rows * self.columns))
        block_columns = columns * max(1, CHUNK // (block_rows * columns))
        for r0 in range(0, self.rows, block_rows):
            for c0 in range(0, self.columns, block_columns):
                part = grid[r0:r0 + block_rows, c0:c0 + block_columns]
                a, b = -(-part.shape[0] // rows), -(-part.shape[1] // columns)
                whole = part.new_zeros(a * rows, b * columns)
                whole[:part.shape[0], :part.shape[1]] = part
                hits[r0 // rows:r0 // rows + a, c0 // columns:c0 // columns + b] = \
                    whole.view(a, rows, b, columns).sum(dim=(1, 3))
        return [[hit / size if size else None for hit, size in zip(hit_row, size_row)]
                for hit_row, size_row in zip(hits.tolist(), self.sizes())]


def _band_shares(mask: torch.Tensor, cells: int) -> list[float]:
    """A guard zone split into `cells` equal parts: the written share of each."""
    length = mask.numel()
    edges = [-(-i * length // cells) for i in range(cells + 1)]
    counts = torch.cat([torch.zeros(1, dtype=torch.int64), mask.to(torch.int64).cumsum(0)])
    return [(int(counts[b]) - int(counts[a])) / (b - a) for a, b in itertools.pairwise(edges)]


def _mix(low: tuple[int, int, int], high: tuple[int, int, int], share: float) -> str:
    """`low` at share 0, `high` at 1, a quantised mix of the two in between."""
    if 0 < share < 1:
        span = PARTIAL_RANGE[1] - PARTIAL_RANGE[0]
        share = PARTIAL_RANGE[0] + span * round(share * PARTIAL_STEPS) / PARTIAL_STEPS
    return _blend(low, high, share)


@functools.cache
def _blend(low: tuple[int, int, int], high: tuple[int, int, int], share: float) -> str:
    return "#" + "".join(f"{round(a + (b - a) * share):02x}" for a, b in zip(low, high))


def _hex(colour: tuple[int, int, int]) -> str:
    return "#" + "".join(f"{c:02x}" for c in colour)


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.3g} %" if whole else "0 %"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _runs(row: list) -> list[tuple[int, int, object]]:
    """(start, length, value) for each run of equal values in `row`."""
    runs: list[tuple[int, int, object]] = []
    for index, value in enumerate(row):
        if runs and runs[-1][2] == value:
            start, length, _ = runs[-1]
            runs[-1] = (start, length + 1, value)
        else:
            runs.append((index, 1, value))
    return runs


def _summary(shape: list[int], grid: _Grid, unwritten: torch.Tensor | None,
             before: torch.Tensor | None, after: torch.Tensor | None) -> list[str]:
    lines = []
    if unwritten is None:
        lines.append("write coverage not measured")
    elif grid.numel:
        count = count_true(unwritten)
        words = [f"{count} of {grid.numel} elements never written ({_percent(count, grid.numel)})"]
        if len(shape) >= 2 and grid.rows > 1:
            rows = count_true(unwritten.view(grid.rows, grid.columns).all(dim=1))
            words.insert(0, f"{rows} of {grid.rows} rows never written "
                            f"({_percent(rows, grid.rows)})")
        lines.append("; ".join(words))
    for name, mask in (("before the start", before), ("after the end", after)):
        if mask is not None:
            count = count_true(mask)
            lines.append(f"{count} of {_plural(mask.numel(), 'guard element')} {name} written "
                         f"out of bounds")
    return lines


def _layout_note(shape: list[int], grid: _Grid) -> str:
    if not grid.numel:
        return "the output has no elements"
    if grid.folded:
        note = f"1-D output folded row-major into {grid.rows} rows of {grid.columns} elements"
    else:
        note = f"{grid.rows} rows x {grid.columns} columns"
        if len(shape) > 2:
            note += f" (rows flatten dims {shape[:-1]})"
    if grid.row_factor > 1 or grid.column_factor > 1:
        note += f"; downsampled: one cell = {grid.row_factor} x {grid.column_factor} elements"
    return note


def _ticks(cells: int) -> list[int]:
    """Up to five cell positions to label, always the first and the last."""
    if cells <= 0:
        return []
    return sorted({round(i * (cells - 1) / 4) for i in range(5)})


class _Canvas:
    """SVG elements in drawing order, and the running height."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.y = 8
        #: the rightmost x any text or legend entry is estimated to reach
        self.right = 0

    def text(self, x: float, y: float, content: str, **attributes: str) -> None:
        extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in attributes.items())
        self.parts.append(f'<text x="{x:g}" y="{y:g}"{extra}>{escape(content)}</text>')

    def line(self, content: str, **attributes: str) -> None:
        self.y += LINE
        self.text(8, self.y, content, **attributes)
        self.right = max(self.right, 8 + 8 * len(content))


def _cells(canvas: _Canvas, x: int, y: int, width: float, height: float, css: str,
           rows: list[list[str]], classes: dict[str, str]) -> None:
    """Rows of colours as one rect per run per row, in a group scaled to cell units; runs of a
    colour named in `classes` go into that class's group, the others carry their own fill."""
    groups: dict[str, list[str]] = {name: [] for name in (*classes.values(), "partial")}
    for row_index, row in enumerate(rows):
        for start, length, colour in _runs(row):
            if colour is None:
                continue
            rect = f'<rect x="{start}" y="{row_index}" width="{length}" height="1"'
            name = classes.get(colour, "partial")
            groups[name].append(rect + ("/>" if name != "partial" else f' fill="{colour}"/>'))
    fills = {name: colour for colour, name in classes.items()}
    canvas.parts.append(f'<g class={quoteattr(css)} transform="translate({x} {y}) '
                        f'scale({width:g} {height:g})" shape-rendering="crispEdges">')
    for name, rects in groups.items():
        if rects:
            fill = f' fill="{fills[name]}"' if name in fills else ""
            canvas.parts.append(f'<g class="{name}"{fill}>' + "".join(rects) + "</g>")
    canvas.parts.append("</g>")


def _band(canvas: _Canvas, mask: torch.Tensor, x: int, width: int, css: str, label: str) -> None:
    canvas.y += 4
    cells = min(mask.numel(), MAX_CELLS)
    if cells:
        colours = [_mix(GUARD_UNTOUCHED, GUARD_WRITTEN, s) for s in _band_shares(mask, cells)]
        _cells(canvas, x, canvas.y, width / cells, BAND_HEIGHT, css, [colours],
               {_hex(GUARD_UNTOUCHED): "untouched", _hex(GUARD_WRITTEN): "written"})
    canvas.text(x - 6, canvas.y + BAND_HEIGHT - 3, label, text_anchor="end", font_size="10")
    canvas.y += BAND_HEIGHT + 4


def _legend(canvas: _Canvas, measured: bool, guards: bool) -> None:
    entries = ([(WRITTEN, "written"), (None, "partly written"), (UNWRITTEN, "never written")]
               if measured else [(NOT_MEASURED, "coverage not measured")])
    if guards:
        entries.append((GUARD_WRITTEN, "written out of bounds (guard zone)"))
    canvas.y += 12
    x = 8
    for colour, label in entries:
        fill = _mix(WRITTEN, UNWRITTEN, 0.5) if colour is None else _hex(colour)
        canvas.parts.append(f'<rect x="{x}" y="{canvas.y - 10}" width="12" height="12" '
                            f'fill="{fill}" stroke="#555" stroke-width="0.5"/>')
        canvas.text(x + 16, canvas.y, label)
        x += 16 + 7 * len(label) + 18
    canvas.right = max(canvas.right, x)
    canvas.y += 8


def _svg(shape: list[int], grid: _Grid, unwritten: torch.Tensor | None,
         shares: list[list[float | None]] | None, before: torch.Tensor | None,
         after: torch.Tensor | None, title: str) -> str:
    canvas = _Canvas()
    canvas.line(title or f"output {shape}", font_weight="bold", font_size="14")
    for line in _summary(shape, grid, unwritten, before, after):
        canvas.line(line)
    canvas.line(_layout_note(shape, grid), fill="#555")
    cell_width = max(2, min(16, GRID_PIXELS // max(grid.cell_columns, 1)))
    cell_height = max(2, min(16, GRID_PIXELS // max(grid.cell_rows, 1)))
    grid_width = max(cell_width * grid.cell_columns, 160)
    canvas.y += 6
    if before is not None:
        _band(canvas, before, LEFT, grid_width, "guard-before", "before start")
    # column axis above the grid, so the band after the end sits right below the last row
    canvas.y += 14
    for cell in _ticks(grid.cell_columns):
        canvas.text(LEFT + (cell + 0.5) * cell_width, canvas.y, str(cell * grid.column_factor),
                    text_anchor="middle", font_size="10")
    canvas.text(LEFT + grid_width + 24, canvas.y, "column", font_size="10", fill="#555")
    canvas.y += 4
    top = canvas.y
    if grid.numel:
        if shares is None:
            rows = [[_hex(NOT_MEASURED) if size else None for size in row]
                    for row in grid.sizes()]
        else:
            rows = [[None if s is None else _mix(WRITTEN, UNWRITTEN, s) for s in row]
                    for row in shares]
        _cells(canvas, LEFT, top, cell_width, cell_height, "grid", rows,
               {_hex(WRITTEN): "written", _hex(UNWRITTEN): "unwritten",
                _hex(NOT_MEASURED): "not-measured"})
        row_label = "flat index" if grid.folded else "row"
        for cell in _ticks(grid.cell_rows):
            start = cell * grid.row_factor * (grid.columns if grid.folded else 1)
            canvas.text(LEFT - 6, top + (cell + 0.5) * cell_height + 4, str(start),
                        text_anchor="end", font_size="10")
        middle = top + cell_height * grid.cell_rows / 2
        canvas.text(14, middle, row_label, font_size="10", fill="#555", text_anchor="middle",
                    transform=f"rotate(-90 14 {middle:g})")
    canvas.y = top + cell_height * grid.cell_rows
    if after is not None:
        _band(canvas, after, LEFT, grid_width, "guard-after", "after end")
    _legend(canvas, unwritten is not None, before is not None or after is not None)
    width = max(LEFT + grid_width + RIGHT, canvas.right)
    height = canvas.y + 8
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">\n'
            f"<title>{escape(title or f'output {shape}')}</title>\n"
            f'<rect width="{width}" height="{height}" fill="#fff"/>\n'
            + "\n".join(canvas.parts) + "\n</svg>\n")

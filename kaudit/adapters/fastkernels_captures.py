"""FastKernels' capture reports: the init and forward arguments of each operator, recorded by
`fastkernels capture` from real model runs, from which `fastkernels bench` builds a problem's
module and inputs (the benchmark ships none: they are written under `~/.fastkernels/captures`).

A report is a JSON object whose `operators` maps `<package>.tasks.baseline.L<n>.<stem>:<Class>`
to `{"init": {"variants": [{"count", "args": <recipe>}]}, "forward": {"variants": [{"count",
"args": <summary>, "init_variant_ids": [...]}]}}`. An init recipe is a dict of parameter name to
value, with `$`-marked nodes for what JSON cannot hold (`$dtype`, `$tensor`, `$tuple`, `$dict`,
`$enum`, `$dataclass`, `$op_ref` to another operator's init variant, `$opaque` for a runtime
handle); a forward summary maps parameter names to values, a tensor as `{"shape", "dtype"}`
(with `stride` when not contiguous).

As the benchmark does, a case pairs a forward variant with the first init variant that built
its instances; cases are deduplicated across reports, and at most `MAX_SHAPES` are kept: the
smallest, the largest and the median by input elements, then the most frequent. Cases whose
init recipe or forward arguments hold a runtime handle cannot be built and are left out. Each
kept case becomes a `Size`: `init_kwargs` {"class", "init", "operators"} (the recipe and the
init recipes of the operators it refers to), `input_kwargs` {"forward", "elements", "dtype"}
(the case's compute dtype, as the benchmark picks it: its first fp16/bf16/fp32 tensor input,
else bfloat16); sizes are ordered by input elements, smallest first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kaudit.adapters.common import Problems, find_upwards
from kaudit.adapters.model import Size

#: `fastkernels bench --max-shapes` default
MAX_SHAPES = 5
#: the folder `fastkernels capture` writes to by default
DEFAULT_FOLDER = Path("~/.fastkernels/captures")
#: the captures folder looked for above a kernel (`fastkernels bench --captures`)
FOLDER_NAME = "captures"
#: forward-argument summaries that stand for something no input can be made from
_HANDLES = ("module", "object", "list", "dict", "$opaque", "$tensor")


def folders(kernel: Path) -> list[Path]:
    """Where capture reports are looked for: a `captures/` folder in the kernel's folder or
    one above it, then the benchmark's default folder."""
    found = find_upwards(kernel.parent, FOLDER_NAME)
    default = DEFAULT_FOLDER.expanduser()
    return [p for p in (found, default) if p is not None and p.is_dir()]


class Reports:
    """The capture reports of the folders asked for, each read once."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self._folders: dict[Path, list[tuple[Path, dict[str, Any]]]] = {}

    def of(self, folder: Path) -> list[tuple[Path, dict[str, Any]]]:
        if folder not in self._folders:
            reports = []
            for path in sorted(folder.rglob("*.json")):
                data = self.problems.read_json(path)
                if isinstance(data, dict) and isinstance(data.get("operators"), dict):
                    reports.append((path, data))
            self._folders[folder] = reports
        return self._folders[folder]


def sizes(reports: list[tuple[Path, dict[str, Any]]], level: int, stem: str,
          classes: tuple[str, ...]) -> tuple[Path | None, tuple[Size, ...], str]:
    """(the first report holding the operator, its buildable selected cases, why none when
    there are none) for the first of `classes` with captured forward calls."""
    for name in classes:
        key = re.compile(rf"\.tasks\.baseline\.L{level}\.{re.escape(stem)}:{re.escape(name)}$")
        cases, first = [], None
        seen: set[str] = set()
        for path, report in reports:
            operators = report["operators"]
            for qualname, entry in operators.items():
                if not key.search(qualname) or not isinstance(entry, dict):
                    continue
                for case in _cases(qualname, entry, operators):
                    signature = json.dumps([case["init"], case["forward"]], sort_keys=True)
                    if signature not in seen:
                        seen.add(signature)
                        cases.append(case)
                        first = first or path
        if not cases:
            continue
        chosen = _spread(cases)
        built = [c for c in chosen if c["why"] is None]
        built.sort(key=lambda c: c["elements"])
        why = "" if built else f"{len(chosen)} selected case{'s' * (len(chosen) != 1)} of " \
            f"{name}: " + "; ".join(sorted({c["why"] for c in chosen}))
        return first, tuple(Size(_describe(c["forward"]), {
            "class": name, "init": c["init"], "operators": c["operators"]},
            {"forward": c["forward"], "elements": c["elements"], "dtype": _dtype(c["forward"])})
            for c in built), why
    return None, (), ""


def _cases(qualname: str, entry: dict[str, Any], operators: dict[str, Any]
           ) -> list[dict[str, Any]]:
    init = entry.get("init") if isinstance(entry.get("init"), dict) else {}
    init_variants = [v for v in init.get("variants") or () if isinstance(v, dict)]
    forward = entry.get("forward") if isinstance(entry.get("forward"), dict) else {}
    cases = []
    for variant in forward.get("variants") or ():
        if not isinstance(variant, dict) or not isinstance(variant.get("args"), dict):
            continue
        ids = [i for i in variant.get("init_variant_ids") or ()
               if isinstance(i, int) and 0 <= i < len(init_variants)]
        vid = ids[0] if ids else (0 if init_variants else None)
        recipe = _resolve_opaque(init_variants[vid].get("args"), operators) \
            if vid is not None else None
        referred: dict[str, Any] = {}
        why = _unbuildable_init(recipe, operators, referred, set())
        why = why or _unbuildable_forward(variant["args"])
        count = variant.get("count")
        cases.append({"init": recipe, "operators": referred, "forward": variant["args"],
                      "count": count if isinstance(count, int) else 0,
                      "elements": _elements(variant["args"]), "why": why})
    return cases


def _spread(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The benchmark's choice of at most MAX_SHAPES cases: smallest, largest, median, then
    the most frequent (all of them, most frequent first, when there are few)."""
    if len(cases) <= MAX_SHAPES:
        return sorted(cases, key=lambda c: -c["count"])
    by_size = sorted(cases, key=lambda c: c["elements"])
    order = [0, len(by_size) - 1, len(by_size) // 2,
             *sorted(range(len(by_size)), key=lambda i: -by_size[i]["count"])]
    return [by_size[i] for i in dict.fromkeys(order)][:MAX_SHAPES]


def _resolve_opaque(recipe: Any, operators: dict[str, Any]) -> Any:
    """`$opaque` nodes that name a captured operator with an init variant point at its first
    variant (a stateless operator instance handed to another's constructor)."""
    if isinstance(recipe, list):
        return [_resolve_opaque(v, operators) for v in recipe]
    if isinstance(recipe, dict):
        name = recipe.get("$opaque")
        if isinstance(name, str) and _init_variants(operators, name):
            return {"$op_ref": {"op": name, "init_variant_id": 0}}
        return {k: _resolve_opaque(v, operators) for k, v in recipe.items()}
    return recipe


def _init_variants(operators: dict[str, Any], name: str) -> list:
    entry = operators.get(name)
    init = entry.get("init") if isinstance(entry, dict) else None
    variants = init.get("variants") if isinstance(init, dict) else None
    return variants if isinstance(variants, list) else []


def _unbuildable_init(recipe: Any, operators: dict[str, Any], referred: dict[str, Any],
                      visiting: set) -> str | None:
    """Why the recipe cannot be rebuilt (None when it can); the init recipes of the operators
    it refers to are gathered into `referred` ({name: {"init": {"variants": [...]}}})."""
    if isinstance(recipe, list):
        return next((w for v in recipe if (w := _unbuildable_init(v, operators, referred,
                                                                   visiting))), None)
    if not isinstance(recipe, dict):
        return None
    if "$opaque" in recipe:
        return f"its init holds a runtime handle ({recipe['$opaque']})"
    if "$op_ref" in recipe:
        ref = recipe["$op_ref"] if isinstance(recipe["$op_ref"], dict) else {}
        name, vid = ref.get("op"), ref.get("init_variant_id")
        variants = _init_variants(operators, name) if isinstance(name, str) else []
        if not isinstance(vid, int) or not 0 <= vid < len(variants):
            return f"its init refers to an operator not captured ({name})"
        referred.setdefault(name, {"init": {"variants": variants}})
        if (name, vid) in visiting:
            return None
        sub = variants[vid].get("args") if isinstance(variants[vid], dict) else None
        return _unbuildable_init(sub, operators, referred, visiting | {(name, vid)})
    return next((w for v in recipe.values() if (w := _unbuildable_init(v, operators, referred,
                                                                        visiting))), None)


def _unbuildable_forward(value: Any, name: str = "") -> str | None:
    if isinstance(value, list):
        return next((w for i, v in enumerate(value)
                     if (w := _unbuildable_forward(v, f"{name}[{i}]"))), None)
    if not isinstance(value, dict) or _is_tensor(value) or set(value) == {"dtype"} \
            or value.get("object") == "device":
        return None
    handle = next((k for k in _HANDLES if k in value), None)
    if handle is not None:
        return f"its forward argument {name or '?'} is a {handle.strip('$')} handle"
    return next((w for k, v in value.items()
                 if (w := _unbuildable_forward(v, f"{name}.{k}" if name else k))), None)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("shape"), list) \
        and isinstance(value.get("dtype"), str)


def _tensors(value: Any):
    if _is_tensor(value):
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _tensors(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _tensors(inner)


def _elements(forward: dict[str, Any]) -> int:
    total = 0
    for spec in _tensors(forward):
        count = 1
        for extent in spec["shape"]:
            count *= int(extent) if isinstance(extent, int) else 0
        total += count
    return total


def _dtype(forward: dict[str, Any]) -> str:
    return next((t["dtype"] for t in _tensors(forward)
                 if t["dtype"] in ("float16", "bfloat16", "float32")), "bfloat16")


def _describe(forward: dict[str, Any]) -> str:
    """`x=[4, 2048] float32, eps=1e-06`: the case's arguments, briefly."""
    parts = []
    for name, value in forward.items():
        if _is_tensor(value):
            parts.append(f"{name}={value['shape']} {value['dtype']}")
        elif value is None or isinstance(value, (bool, int, float, str)):
            parts.append(f"{name}={value}")
    return ", ".join(parts)[:200] or "no tensor arguments"

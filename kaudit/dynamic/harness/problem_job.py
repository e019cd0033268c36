"""The job of `problems` (benchmark problems): runs one KernelBench problem and saves its outputs.

Runs only inside a job (`child`, never in the parent process). For a problem file it:
imports the file, builds `Model(*get_init_inputs())` under the init seed, moves it to the device,
and for each seed calls `get_inputs()` under that seed and runs `forward` (under `no_grad`, the
model left in the mode its constructor chose, as the harness does); then the first seed's inputs
scaled by each factor in `scales`; then, the native model freed, a float64 copy of the model
(kept on the host until then) on the first seed's inputs, unscaled and scaled, cast to float64,
with cuDNN off (`float64_kernels`).
The first seed's inputs are made again for each of these runs (checked against their digest):
a copy kept on the device held a set of inputs, up to 6 GiB on level 1, all along.

Every output component is saved with `torch.save` as two CPU tensors, `[values, extremes]`:
- outputs of at most `max_elements` elements: the whole tensor, and an empty `extremes`;
- larger outputs (current KernelBench level 1 has 1.6e9-element outputs): the values at a fixed
  random set of `max_elements` flat positions (the same positions for every seed and scale, so
  seeds and float64 twins compare position by position), and the values at the minimum, maximum
  and largest magnitude (NaN-aware), so that max|y|, min and max stay exact.
`manifest.json` in the output folder records, after every step, the files so far with their
layout (shape, dtype, numel, sampled, NaN and Inf counts), so a run that times out or crashes late
still hands back what it finished. The float64 and scaled runs are optional: their errors are
recorded and the job goes on, except that running out of memory ends a job the parent will run
again with more (`gpu_last_try` false): the rest of it would be done twice. On CUDA,
`gpu_memory_fraction` caps the caching allocator (the share of the GPU the parent gave this job).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import time
from collections.abc import Iterator
from typing import Any

from .child import import_file, is_oom, phase, write_json
from .go import wait_for_go
from .counting import count_where
from .scaling import scale_input

MANIFEST = "manifest.json"
REQUIRED = ("Model", "get_inputs", "get_init_inputs")
#: outputs larger than this are sampled (see the module docstring)
#: 4 Mi positions: larger samples (1 << 25 before) made copying and comparing them, not the
#: problems, the time of the problems audit on KernelBench level 1 (outputs of 1.6e9 elements)
MAX_ELEMENTS = 1 << 22
SAMPLE_SEED = 20251129
#: bytes of each input tensor hashed to tell whether inputs change with the seed
DIGEST_BYTES = 1 << 22


class ProblemFormatError(Exception):
    """The file is not a KernelBench problem (a required name is missing or of the wrong kind)."""


class InputsNotReproducible(Exception):
    """get_inputs() under a seed made other inputs than the first time (the float64 and scaled
    runs make the first seed's inputs again)."""


class OutputTypeError(Exception):
    """forward returned something other than tensors or numbers."""


def run_problem(args: dict, out_dir: str) -> dict:
    import torch

    manifest: dict[str, Any] = {"phase": "start", "complete": False, "seeds": [], "scales": [],
                                "fp64_error": None, "torch": torch.__version__, "timings": {},
                                "files": {}, "gpu_step_peaks": {}}
    saver = _Saver(torch, out_dir, int(args.get("max_elements", MAX_ELEMENTS)), manifest)

    def optional_step_failed(exc: Exception) -> str:
        if is_oom(exc) and args.get("gpu_last_try") is False:
            raise exc
        return _describe(exc)

    entered = time.monotonic()

    def step(name: str) -> None:
        """Enter step `name`; the step left gets its seconds (`timings`, summed by step)."""
        nonlocal entered
        now, left, timings = time.monotonic(), manifest["phase"], manifest["timings"]
        if left != "start":
            timings[left] = round(timings.get(left, 0.0) + now - entered, 3)
        if str(manifest.get("device", "")).startswith("cuda"):  # what the GPU share held
            held, peaks = int(torch.cuda.max_memory_reserved()), manifest["gpu_step_peaks"]
            peaks[left] = max(peaks.get(left, 0), held)  # which step sets the job's peak
            torch.cuda.reset_peak_memory_stats()
        manifest["phase"], entered = name, now
        write_json(os.path.join(out_dir, MANIFEST), manifest)

    step("device")
    with phase("device"):
        device = torch.device(args.get("device", "cpu"))
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("CUDA requested but torch.cuda.is_available() is False")
            manifest["device_name"] = torch.cuda.get_device_name(device)
            manifest["gpu_total_bytes"] = int(torch.cuda.get_device_properties(device).total_memory)
            torch.cuda.synchronize(device)  # its CUDA context, made before it waits for memory
            if args.get("gpu_memory_fraction"):  # the share the parent gave this job
                torch.cuda.set_per_process_memory_fraction(float(args["gpu_memory_fraction"]))
        else:
            manifest["device_name"] = "cpu"
        manifest["device"] = str(device)
    if args.get("go"):  # its CUDA context made and no problem code run: it waits for its share
        step("go")
        _wait_for_go(str(args["go"]), device, torch)
    step("import")
    with phase("import"):
        module = _import_problem(args["path"])
    step("init")
    with phase("init"):
        torch.manual_seed(int(args.get("init_seed", 42)))
        init_inputs = module.get_init_inputs()
        model = module.Model(*init_inputs)
        # on the host until the float64 runs, which come after the native model's last call
        reference64, fp64_error = float64_copy(model, torch) if args.get("fp64", True) \
            else (None, "float64 run disabled")
        manifest["fp64_error"] = fp64_error
        model = model.to(device)
        _synchronize(torch, device)

    seeds = args["seeds"]
    for seed in seeds:
        record: dict[str, Any] = {"seed": seed, "native": None, "fp64": None}
        step("inputs")
        with phase("inputs"):
            inputs = make_inputs(module, seed, device, torch)
            record["inputs"] = _digest(inputs, torch)
        step("forward")
        on_device = to_device(inputs, device, None, torch)
        del inputs
        with phase("forward"):
            torch.manual_seed(seed)
            outputs, kind = _forward(model, on_device, device, torch)
        manifest["output_kind"] = kind
        del on_device
        step("save")
        record["native"] = saver.save(outputs, f"seed{seed}.pt")
        del outputs
        manifest["seeds"].append(record)
        step("seed-done")

    def first_inputs(scale: float, dtype: Any) -> list:
        """The first seed's inputs made again (kept, they would hold the device all along, and
        forward may have changed them), scaled, then cast, one tensor at a time."""
        values = make_inputs(module, seeds[0], device, torch)
        if _digest(values, torch) != manifest["seeds"][0]["inputs"]:
            raise InputsNotReproducible(
                "get_inputs() made other inputs when called again under the same seed")
        for index in range(len(values)):  # each value replaced, so that one is freed at once
            value, values[index] = values[index], None
            if scale != 1:
                value = scale_input(value, scale, torch)
            values[index] = to_device([value], device, dtype, torch)[0]
            del value
        if dtype is not None:  # the float32 blocks cannot hold forward's float64 tensors
            _free(torch, device)
        return values

    scales = [scale for scale in args.get("scales", []) if scale != 1]
    for scale in scales:
        record = {"scale": scale, "native": None, "fp64": None, "error": None, "fp64_error": None}
        manifest["scales"].append(record)
        step("scale")
        # what the run before cached (or held when it failed), so that this one is not cut short
        _free(torch, device)
        try:
            scaled = first_inputs(scale, None)
            torch.manual_seed(seeds[0])
            outputs, _ = _forward(model, scaled, device, torch)
            del scaled
            record["native"] = saver.save(outputs, f"scale{scale:g}.pt")
            del outputs
        except Exception as exc:  # noqa: BLE001
            record["error"] = optional_step_failed(exc)

    # the float64 runs last, the native model gone: the device holds one model at a time (each
    # run below starts by giving the allocator's cache back, the native model's with it)
    del model
    runs64 = [(1, manifest["seeds"][0], f"seed{seeds[0]}_fp64.pt", "fp64")] + [
        (record["scale"], record, f"scale{record['scale']:g}_fp64.pt", "scale-fp64")
        for record in manifest["scales"] if record["native"]]
    for index, (scale, record, name, step_name) in enumerate(runs64):
        if reference64 is None:
            break
        step(step_name)
        _free(torch, device)
        try:
            if index == 0:
                reference64 = reference64.to(device)
            scaled = first_inputs(scale, torch.float64)
            torch.manual_seed(seeds[0])
            with float64_kernels(torch):
                outputs, _ = _forward(reference64, scaled, device, torch)
            del scaled
            record["fp64"] = saver.save(outputs, name)
            del outputs
        except Exception as exc:  # noqa: BLE001 - float64 is optional
            if index == 0:  # no float64 reference at all
                manifest["fp64_error"] = optional_step_failed(exc)
                reference64 = None
            else:
                record["fp64_error"] = optional_step_failed(exc)
    if reference64 is None:
        for record in manifest["scales"]:
            if record["native"]:
                record["fp64_error"] = manifest["fp64_error"] or "no float64 reference"
    manifest["complete"] = True
    step("done")
    return manifest


class _Saver:
    """Writes outputs as `[values, extremes]` per component and records their layout."""

    def __init__(self, torch: Any, out_dir: str, max_elements: int, manifest: dict) -> None:
        self.torch, self.out_dir, self.max_elements = torch, out_dir, max_elements
        self.manifest = manifest
        self.positions: dict[int, Any] = {}
        # bound now: the problem module may rebind torch functions later on
        self.isnan, self.isinf = torch.isnan, torch.isinf
        self.argmin, self.argmax = torch.argmin, torch.argmax

    def save(self, outputs: list, name: str) -> str:
        torch = self.torch
        tensors, layout = [], []
        for output in outputs:
            numel = output.numel()
            entry = {"shape": list(output.shape), "dtype": str(output.dtype).removeprefix("torch."),
                     "numel": numel, "sampled": numel > self.max_elements}
            if entry["sampled"]:
                flat = output.detach().reshape(-1)
                positions = self._positions(numel).to(flat.device)
                if flat.is_complex():
                    extremes = self.argmax(flat.abs()).reshape(1)
                else:
                    key = flat.to(torch.uint8) if flat.dtype == torch.bool else flat
                    low, high = self.argmin(key), self.argmax(key)
                    # the largest magnitude is at the minimum or the maximum: no |output| copy
                    # (one more output-sized tensor at the float64 runs' peak); a NaN, where
                    # there is one, is at both and is the position kept
                    largest = torch.where(key[high].abs() >= key[low].abs(), high, low)
                    extremes = torch.stack([low, high, largest])
                tensors += [flat[positions].cpu(), flat[extremes].cpu()]
                floating = flat.is_floating_point()
                entry["nan"] = count_where(self.isnan, flat) if floating else 0
                entry["inf"] = count_where(self.isinf, flat) if floating else 0
                del positions, flat
            else:
                tensors += [output.detach().cpu().contiguous(), torch.zeros(0, dtype=output.dtype)]
            layout.append(entry)
        torch.save(tensors, os.path.join(self.out_dir, name))
        self.manifest["files"][name] = layout
        return name

    def _positions(self, numel: int) -> Any:
        if numel not in self.positions:
            generator = self.torch.Generator().manual_seed(SAMPLE_SEED)
            self.positions[numel] = self.torch.randint(numel, (self.max_elements,),
                                                       generator=generator)
        return self.positions[numel]


def _wait_for_go(path: str, device: Any, torch: Any) -> None:
    """Wait for the parent to grant the job its share of the GPU (`go.wait_for_go`), then cap
    the caching allocator to it."""
    granted = wait_for_go(path)
    if device.type == "cuda" and granted.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(granted["gpu_memory_fraction"]))


def _import_problem(path: str) -> Any:
    module = import_file("problem", path, ProblemFormatError)
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise ProblemFormatError(
            f"not a KernelBench problem: no {', '.join(missing)} defined at module level")
    return module


def float64_copy(model: Any, torch: Any) -> tuple[Any, str | None]:
    try:
        return copy.deepcopy(model).to(torch.float64), None
    except Exception as exc:  # noqa: BLE001
        return None, _describe(exc)


@contextlib.contextmanager
def float64_kernels(torch: Any) -> Iterator[None]:
    """torch's own kernels for a float64 run, not cuDNN's, whose float64 convolutions are slow:
    on the H200, three float64 calls of each of KernelBench level 1's 35 convolutions took
    17.5 s summed with cuDNN and 2.8 s without (a 3D transposed convolution 2.79 s a call
    against 0.24 s; four took a few milliseconds more), their outputs equal within 1.3e-15."""
    enabled = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = False
    try:
        yield
    finally:
        torch.backends.cudnn.enabled = enabled


def _forward(model: Any, inputs: list, device: Any, torch: Any) -> tuple[list, str]:
    with torch.no_grad():
        result = model(*inputs)
    _synchronize(torch, device)
    with phase("output"):
        return _as_tensors(result, torch)


def _as_tensors(result: Any, torch: Any) -> tuple[list, str]:
    if isinstance(result, torch.Tensor):
        return [result], "tensor"
    if isinstance(result, (bool, int, float)):
        return [torch.tensor(result)], "number"
    if isinstance(result, (list, tuple)) and result:
        tensors = []
        for item in result:
            if isinstance(item, torch.Tensor):
                tensors.append(item)
            elif isinstance(item, (bool, int, float)):
                tensors.append(torch.tensor(item))
            else:
                raise OutputTypeError(f"forward returned a {type(result).__name__} holding a "
                                      f"{type(item).__name__}")
        return tensors, "sequence"
    raise OutputTypeError(f"forward returned {type(result).__name__}, not a tensor")


def to_device(values: list, device: Any, dtype: Any, torch: Any) -> list:
    moved = []
    for value in values:
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
        moved.append(value)
    return moved


def make_inputs(module: Any, seed: int, device: Any, torch: Any) -> list:
    """`get_inputs()` under `seed`, made on `device`: a level-1 problem's inputs reach gigabytes,
    which the GPU's generator makes in milliseconds and the CPU's in seconds, then copied. A
    problem that cannot make them there (a NumPy round trip, say) makes them on the CPU."""
    def made() -> list:
        torch.manual_seed(seed)
        inputs = module.get_inputs()
        if not isinstance(inputs, (list, tuple)):
            raise ProblemFormatError(f"get_inputs() returned {type(inputs).__name__}, not a list")
        return list(inputs)

    if device.type != "cpu":
        try:
            with torch.device(device):
                return made()
        except ProblemFormatError:
            raise
        except Exception:  # noqa: BLE001 - made on the CPU instead, as the problem expects
            _free(torch, device)
    return made()


def _digest(values: list, torch: Any) -> str:
    """Tells whether `get_inputs()` gives different inputs for different seeds, and the same
    inputs under the same seed."""
    digest = hashlib.sha256()
    for value in values:
        if isinstance(value, torch.Tensor):
            # the first bytes, cut on the device: copying a whole input to the CPU costs seconds
            data = value.detach().flatten()[:DIGEST_BYTES].cpu().contiguous()
            digest.update(f"{tuple(value.shape)}{value.dtype}".encode())
            raw = data.view(torch.uint8) if data.numel() else data
            digest.update(_bytes(raw[:DIGEST_BYTES]) if data.numel() else b"")
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()[:16]


def _bytes(raw: Any) -> bytes:
    """A uint8 tensor's bytes: through NumPy where there is one (`tolist` took 0.1 s for 4 MiB
    on two cores, most of the time of making KernelBench level 1's inputs: 41 s summed)."""
    try:
        return raw.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch without NumPy
        return bytes(raw.tolist())


def _describe(exc: BaseException) -> str:
    kind = "out of memory: " if is_oom(exc) else ""
    return f"{kind}{type(exc).__name__}: {str(exc)[:500]}"


def _synchronize(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(torch: Any, device: Any) -> None:
    """The caching allocator's unused blocks given back: a block cached by one run (a scaled
    copy of the inputs, the float32 inputs before their float64 cast) is split to serve the next
    run's other sizes, and what the job held grew by whole input sizes from run to run (five
    times the inputs on KernelBench level 1's reductions, whose runs use about three)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()

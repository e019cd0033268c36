"""A plain benchmark run of a kernel, as any harness would make it: no poisoning, no guard zones, no
watching, a few calls. The second opinion on the candidate job: a kernel that behaves only while it
is watched gives here the answer a benchmark would get (KD406).

It imports only the standard library and torch, and is loaded by path with the rest of its package
forgotten (`child` drops them from `sys.modules` before loading a file). Arguments: `in_dir`
(`inputs_a.pt`, `init.pt`), `kernel`, `problem` (only when `init.pt` is missing), `device`,
`init_seed`, `calls`, `gpu_memory_fraction`, `build_dir` (where the kernel's extensions were
built), `own_init` (ModelNew built without Model's weights copied in). Saves each call's
outputs as `run<k>.pt`, but for a call that gave the first call's bits (named in `same_as`).
"""

import importlib.util
import os
import sys


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(args, out_dir):
    import torch

    save = torch.save
    if args.get("build_dir"):
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(args["build_dir"], "torch")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(args["build_dir"], "triton")
    device = torch.device(args.get("device", "cpu"))
    if device.type == "cuda" and args.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(args["gpu_memory_fraction"]))
    if device.type == "cuda":  # BLAS handles made, as after a benchmark's reference run
        square = torch.ones(8, 8, device=device)
        (square @ square).sum().item()
        torch.nn.functional.linear(square, square, square[0]).sum().item()
    inputs = torch.load(os.path.join(args["in_dir"], "inputs_a.pt"), map_location="cpu",
                        weights_only=True)
    init = os.path.join(args["in_dir"], "init.pt")
    if os.path.exists(init):
        data = torch.load(init, map_location="cpu", weights_only=True)
        init_inputs, state = list(data["init_inputs"]), dict(data["state"])
    else:
        problem = _load("problem", args["problem"])
        torch.manual_seed(int(args["init_seed"]))
        init_inputs = problem.get_init_inputs()
        state = problem.Model(*init_inputs).state_dict()
    kernel = _load("kernel", args["kernel"])
    model_state = _load("model_state", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "model_state.py"))
    # own_init: nothing copied, the judge found it right only so
    model = model_state.build(torch, kernel.ModelNew, init_inputs,
                              {} if args.get("own_init") else state, int(args["init_seed"]), device)
    first, same_as = None, {}
    for number in range(int(args.get("calls", 3))):
        values = [v.clone().to(device) if isinstance(v, torch.Tensor) else v for v in inputs]
        with torch.no_grad():
            result = model(*values)
        if device.type == "cuda":
            torch.cuda.synchronize()
        items = list(result) if isinstance(result, (list, tuple)) else [result]
        outputs = [t.detach().cpu().clone().as_subclass(torch.Tensor)
                   if isinstance(t, torch.Tensor) else torch.tensor(float("nan")) for t in items]
        if first is not None and _identical(torch, outputs, first):
            same_as[f"run{number}.pt"] = "run0.pt"  # the first call's bits: not written again
            continue
        first = outputs if first is None else first
        save(outputs, os.path.join(out_dir, f"run{number}.pt"))
    return {"calls": int(args.get("calls", 3)), "same_as": same_as}


def _identical(torch, outputs, others):
    """Bit for bit, as the candidate job compares its answers."""
    return len(outputs) == len(others) and all(
        o.shape == t.shape and o.dtype == t.dtype
        and torch.equal(o.reshape(-1).contiguous().view(torch.uint8),
                        t.reshape(-1).contiguous().view(torch.uint8))
        for o, t in zip(outputs, others))

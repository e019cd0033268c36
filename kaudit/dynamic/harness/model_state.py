"""Model's weights copied into a kernel's ModelNew, as every job that builds one does: the entries
of Model's state whose name and shape ModelNew's state has.

Standard library and torch only: the file jobs (plain run, timing, profile), which run with their
package forgotten, load it by path from beside themselves."""


def matching(state, own):
    """The entries of `state` that `own` (ModelNew's state) has, with the same shape."""
    return {key: value for key, value in state.items()
            if key in own and getattr(own[key], "shape", None) == getattr(value, "shape", None)}


def copy_into(torch, model, entries):
    """`model.load_state_dict(entries)`, also into tensors made under torch.inference_mode (an
    `__init__` that warms up or moves itself to the GPU there; CUDA-L1 level 3 task 24), which
    take in-place copies only in inference mode."""
    if not entries:
        return
    try:
        model.load_state_dict(entries, strict=False)
    except RuntimeError:
        with torch.inference_mode():
            model.load_state_dict(entries, strict=False)


def build(torch, cls, init_inputs, state, seed, device):
    """`cls(*init_inputs)` under `seed`, `state` copied in (nothing copied for an empty one),
    on `device`."""
    torch.manual_seed(seed)
    model = cls(*init_inputs)
    copy_into(torch, model, matching(state, model.state_dict()))
    return model.to(device)

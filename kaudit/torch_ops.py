"""Which PyTorch calls compute (a fallback when a custom kernel is claimed) and which only allocate,
reshape or configure. Shared by the Python rules; C++ lists live with the C++ rules."""

from __future__ import annotations

# torch.<name>(...) calls that do not compute the answer: allocation, shape and layout, dtype and
# device plumbing, grad modes, RNG setup. Anything else called from `torch.` is treated as compute.
TORCH_NON_COMPUTE = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "arange", "linspace", "eye", "tensor", "as_tensor", "as_strided", "from_numpy",
    "rand", "randn", "randint", "rand_like", "randn_like", "manual_seed", "seed", "Generator",
    "cat", "concat", "concatenate", "stack", "hstack", "vstack", "split", "chunk", "unbind",
    "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "permute", "movedim", "narrow",
    "broadcast_to", "broadcast_tensors", "broadcast_shapes", "t", "select", "view_as_real",
    "view_as_complex", "contiguous", "clone", "numel", "is_tensor", "is_floating_point",
    "is_complex", "result_type", "promote_types", "can_cast", "finfo", "iinfo", "device", "dtype",
    "Size", "Tensor", "no_grad", "enable_grad", "inference_mode", "set_grad_enabled",
    "get_default_dtype", "set_default_dtype", "compile", "autocast", "empty_cache",
    "_assert", "sym_int", "sym_float",
})

# Sub-namespaces of torch that are plumbing, not computation.
TORCH_NON_COMPUTE_NAMESPACES = (
    "torch.cuda.", "torch.ops.", "torch.library.", "torch.utils.", "torch.backends.",
    "torch.autograd.", "torch.distributed.", "torch.jit.", "torch.compiler.", "torch.testing.",
    "torch.nn.init.", "torch.nn.parameter.", "torch.nn.Parameter", "torch.nn.Module",
    "torch.nn.utils.", "torch.random.", "torch.profiler.", "torch.version.", "torch.hub.",
    "torch.overrides.", "torch.fx.", "torch.types.", "torch.Tensor.", "torch._dynamo.",
)

# torch.nn classes that hold or arrange modules without computing anything themselves.
NN_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
NN_NON_COMPUTE = frozenset({
    "Module", "Parameter", "ParameterList", "ParameterDict", "Buffer", "Identity", "Flatten",
    "Unflatten", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
}) | NN_CONTAINERS

# Tensor methods that compute. Kept to names no common Python object shares (no `add`, `index`).
TENSOR_COMPUTE_METHODS = frozenset({
    "matmul", "mm", "bmm", "addmm", "addmv", "baddbmm", "addbmm", "mv", "dot", "outer", "einsum",
    "conv1d", "conv2d", "conv3d", "conv_transpose2d", "softmax", "log_softmax", "relu", "relu_",
    "gelu", "silu", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "exp_", "log", "log_", "log1p",
    "sqrt", "rsqrt", "pow", "norm", "sum", "mean", "var", "std", "prod", "amax", "amin", "max",
    "min", "argmax", "argmin", "logsumexp", "clamp", "clamp_", "clamp_min", "clamp_max", "clip",
    "abs", "mul", "mul_", "div", "div_", "sub", "sub_", "cumsum", "cumprod", "erf", "hardtanh",
    "leaky_relu", "softplus", "layer_norm", "group_norm", "batch_norm", "instance_norm",
    "sin", "cos", "reciprocal", "square", "maximum", "minimum", "sort", "topk", "triu", "tril",
    "diag", "trace", "cross", "linear", "mish", "elu", "selu", "hardswish", "hardsigmoid",
})


def is_torch_compute(qualified: str) -> bool:
    """True when a fully qualified call target such as `torch.nn.functional.relu` computes."""
    if not qualified.startswith("torch."):
        return False
    if qualified.startswith(("torch.nn.functional.", "torch.linalg.", "torch.fft.",
                             "torch.special.", "torch._C._nn.", "torch.sparse.")):
        return True
    if qualified.startswith(TORCH_NON_COMPUTE_NAMESPACES):
        return False
    rest = qualified[len("torch."):]
    if rest.startswith("nn."):
        return nn_module_computes(rest[3:])
    if "." in rest:
        return False  # an attribute of something else, e.g. torch.float16.is_floating_point
    return not (rest in TORCH_NON_COMPUTE or rest.startswith(("_", "is_", "get_", "set_", "use_"))
                or rest[:1].isupper())


def nn_module_computes(class_name: str) -> bool:
    """`Linear` -> True, `ModuleList` -> False (containers are judged by their contents)."""
    return "." not in class_name and class_name[:1].isupper() and class_name not in NN_NON_COMPUTE

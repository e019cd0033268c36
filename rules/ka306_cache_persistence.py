import ast
import re
from collections.abc import Iterable, Iterator

from kaudit.cpp import CppIndex
from kaudit.findings import Finding, Level, Precision
from kaudit.integrity import ModuleFacts, enclosing_function, find_tokens
from kaudit.rule import Rule
from kaudit.source import SourceModel

# identifiers that set up L2 persistence, in the runtime API, the driver API and cuda-python
PERSISTENCE_TOKENS = (
    "accessPolicyWindow", "cudaStreamAttributeAccessPolicyWindow",
    "cudaLaunchAttributeAccessPolicyWindow", "cudaKernelNodeAttributeAccessPolicyWindow",
    "cudaLimitPersistingL2CacheSize", "cudaAccessPropertyPersisting",
    "CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW", "CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW",
    "CU_KERNEL_NODE_ATTRIBUTE_ACCESS_POLICY_WINDOW", "CU_LIMIT_PERSISTING_L2_CACHE_SIZE",
    "CU_ACCESS_PROPERTY_PERSISTING",
)
_TOKEN = re.compile(r"\b(?:" + "|".join(PERSISTENCE_TOKENS) + r")\b")
_CPP_TYPES = frozenset({"identifier", "field_identifier", "type_identifier",
                        "namespace_identifier"})
_SET = frozenset(PERSISTENCE_TOKENS)


class CachePersistence(Rule):
    """The kernel pins data in the L2 cache so that it survives between timed runs.

    ## What it does
    In C++/CUDA sources, reports L2 persistence set-up: access-policy windows
    (`accessPolicyWindow`, `cudaStreamAttributeAccessPolicyWindow` with `cudaStreamSetAttribute`,
    `cudaLaunchAttributeAccessPolicyWindow`), a persisting L2 carve-out
    (`cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, ...)`) and `hitProp =
    cudaAccessPropertyPersisting`, with their driver-API spellings (`CU_LIMIT_PERSISTING_L2_...`).
    The same names used from Python (cuda-python's `cudart`, for example) are reported too.
    Words in comments and strings are ignored. One finding per function (or per file for module
    level Python), at the first such name.

    ## Why is this bad?
    Benchmarks run the kernel many times on the same inputs. Marking the inputs or weights as
    persisting in L2 keeps them on chip between iterations, so the timed runs measure a warm
    cache no real workload would see, and the setting leaks into the reference's timing too.
    Legitimate uses exist (weights reused within one call), hence a warning.

    ## Example
    ```python
    from torch.utils.cpp_extension import load_inline

    src = '''
    torch::Tensor run(torch::Tensor w, torch::Tensor x) {
        cudaStreamAttrValue attr = {};
        attr.accessPolicyWindow.base_ptr = w.data_ptr();
        attr.accessPolicyWindow.num_bytes = w.nbytes();
        attr.accessPolicyWindow.hitRatio = 1.0f;
        attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
        cudaStreamSetAttribute(0, cudaStreamAttributeAccessPolicyWindow, &attr);
        return gemv(w, x);
    }
    '''
    ext = load_inline(name="k", cpp_sources="", cuda_sources=src, functions=["run"])

    class ModelNew(nn.Module):
        def forward(self, w, x):
            return ext.run(w, x)
    ```
    """

    code = "KA306"
    name = "cache-persistence"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ("integrity", "timing", "cache")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        yield from self._cpp(model)
        yield from self._python(model)

    def _cpp(self, model: SourceModel) -> Iterator[Finding]:
        units = [u for u in model.cuda_units if any(t in u.text for t in PERSISTENCE_TOKENS)]
        if not units:
            return
        index = CppIndex.of(model)
        for unit in units:
            groups: dict[int, list[str]] = {}
            firsts = {}
            for token, node in find_tokens(unit, _TOKEN, _CPP_TYPES):
                function = enclosing_function(index, unit, node)
                key = function.node.start_byte if function is not None else -1
                groups.setdefault(key, []).append(token)
                if key not in firsts:
                    firsts[key] = (node, function)
            for key, tokens in groups.items():
                node, function = firsts[key]
                where = f"`{function.name}`" if function is not None else "this source"
                names = ", ".join(f"`{t}`" for t in dict.fromkeys(tokens))
                yield self.report(
                    model, unit.location(node),
                    f"{where} sets up L2 cache persistence ({names}): data pinned in L2 "
                    "survives between timed iterations, so the benchmark measures a warm cache")

    def _python(self, model: SourceModel) -> Iterator[Finding]:
        if not any(t in model.text for t in PERSISTENCE_TOKENS):
            return
        facts = ModuleFacts.of(model)
        hits = [a for a in facts.attributes if a.attr in _SET]
        hits += [n for n in facts.names if n.id in _SET]
        if not hits:
            return
        hits.sort(key=lambda n: (n.lineno, n.col_offset))
        tokens = list(dict.fromkeys(n.attr if isinstance(n, ast.Attribute) else n.id
                                    for n in hits))
        yield self.report(
            model, hits[0],
            f"sets up L2 cache persistence from Python ({', '.join(f'`{t}`' for t in tokens)}): "
            "data pinned in L2 survives between timed iterations, so the benchmark measures a "
            "warm cache")

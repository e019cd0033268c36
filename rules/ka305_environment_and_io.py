import ast
import re
from collections.abc import Iterable, Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.integrity import (
    ModuleFacts,
    first_line,
    imported_names,
    literal_path_is_source,
    method_name,
    word_set,
)
from kaudit.rule import Rule
from kaudit.source import SourceModel

ENVIRON = frozenset({"os.environ", "os.environb"})
# variables that only steer building the extension; reading or setting them is not reported
BUILD_VARIABLES = frozenset({
    "TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDACXX", "MAX_JOBS",
    "TORCH_EXTENSIONS_DIR", "CC", "CXX", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS",
    "TORCH_NVCC_FLAGS", "TRITON_CACHE_DIR", "ROCM_HOME", "PYTORCH_ROCM_ARCH",
})
ENV_FUNCTIONS = {"os.getenv": "reads", "os.getenvb": "reads", "os.putenv": "sets",
                 "os.unsetenv": "unsets"}
# calls that read or write files (the path is the first argument unless said otherwise)
FILE_CALLS = frozenset({
    "io.open", "codecs.open", "os.open", "os.fdopen", "gzip.open", "bz2.open", "lzma.open",
    "shelve.open", "tarfile.open", "zipfile.ZipFile", "mmap.mmap",
    "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt", "numpy.memmap",
    "numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt",
    "torch.load", "torch.save", "torch.from_file", "torch.jit.load", "torch.jit.save",
    "pickle.load", "pickle.loads", "pickle.dump", "pickle.Unpickler", "marshal.load",
    "marshal.loads", "dill.load", "dill.loads", "dill.dump", "joblib.load", "joblib.dump",
    "json.load", "json.dump", "h5py.File", "safetensors.torch.load_file",
    "safetensors.torch.save_file", "safetensors.safe_open", "safetensors.torch.load",
    "os.listdir", "os.scandir", "os.walk", "glob.glob", "glob.iglob", "pathlib.Path.read_text",
    "pathlib.Path.read_bytes", "pathlib.Path.write_text", "pathlib.Path.write_bytes",
    "linecache.getline", "linecache.getlines", "pandas.read_csv", "pandas.read_pickle",
})
PATH_METHODS = frozenset({"read_text", "read_bytes", "write_text", "write_bytes"})
NETWORK_PREFIXES = ("socket.", "urllib.", "urllib3.", "requests.", "http.client.", "http.server.",
                    "httpx.", "aiohttp.", "ftplib.", "smtplib.", "xmlrpc.", "websocket.",
                    "websockets.", "paramiko.", "torch.hub.", "huggingface_hub.")
PROCESS_CALLS = frozenset({"os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn",
                           "os.posix_spawnp", "pty.spawn", "pty.fork", "commands.getoutput"})
PROCESS_PREFIXES = ("subprocess.", "os.exec", "os.spawn", "sh.", "plumbum.")
# A file can only reach the names above if it calls one of these words (`tl.load` excepted) or
# names one of these modules; a cheap test that spares most files the walk.
_CALLED = ({name.split(".")[-1] for name in FILE_CALLS | PROCESS_CALLS | set(ENV_FUNCTIONS)}
           | PATH_METHODS | {"open"})
_MODULES = ({prefix.rstrip(".").split(".")[0] for prefix in NETWORK_PREFIXES + PROCESS_PREFIXES}
            | {"environ", "environb", "hub"}) - {"torch", "os"}
_CALL_OF = {word: re.compile(r"(?<!tl\.)\b" + word + r"\s*\(") for word in _CALLED}


class EnvironmentAndIo(Rule):
    """The file reads the environment, files, the network, or runs other programs.

    ## What it does
    Anywhere in the file (not under `if __name__ == "__main__":`), reports:
    - environment reads and writes: `os.environ[...]`, `os.environ.get`, `"X" in os.environ`,
      `os.getenv`, `os.putenv`, passing `os.environ` along; reads and writes of variables that only
      steer the extension build (`TORCH_CUDA_ARCH_LIST`, `CUDA_HOME`, `MAX_JOBS`, `CXX`, ...) are
      not reported, nor is a variable read whose value only locates the kernel's own C++/CUDA
      sources;
    - file access: `open(...)`, `Path.read_text`/`read_bytes`/`write_*`, `Path(...).open()`,
      `np.load`, `torch.load`, `torch.save`, `pickle.load(s)`, `json.load`, directory listings
      (`os.listdir`, `glob.glob`), unless the path names the kernel's own sources (a literal
      ending in `.cu`, `.cuh`, `.cpp`, `.h`, ..., or `__file__` itself), as done for
      `load(sources=...)` builds;
    - network access (`socket`, `urllib`, `requests`, `http.client`, `torch.hub`, ...);
    - other programs: `subprocess.*`, `os.system`, `os.popen`, `os.exec*`, `os.spawn*`.

    ## Why is this bad?
    A kernel module should compute from its inputs. Reading a file or the environment can
    smuggle in a precomputed answer or harness state (where the reference output was saved,
    which trial is running), and subprocesses and network calls do work the timer never sees.
    Some uses are legitimate, so this is a warning: review what is read and why.

    ## Example
    ```python
    import torch

    EXPECTED = torch.load("/tmp/reference_output.pt")

    class ModelNew(nn.Module):
        def forward(self, x):
            return EXPECTED.to(x.device)
    ```
    """

    code = "KA305"
    name = "environment-and-io"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ("integrity", "environment", "io")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        if not _may_do_io(model):
            return
        facts = ModuleFacts.of(model)
        seen_lines: set[int] = set()
        for node, message in [*self._environment(model, facts), *self._calls(model, facts)]:
            line = model.line_of(node)
            if line not in seen_lines:
                seen_lines.add(line)
                yield self.report(model, node, message)

    # --- environment --------------------------------------------------------------------------

    def _environment(self, model: SourceModel, facts: ModuleFacts
                     ) -> Iterator[tuple[ast.AST, str]]:
        environ_nodes = [n for n in [*facts.attributes, *facts.names]
                         if model.bindings.resolve(n) in ENVIRON]
        for function_call in facts.calls:
            verb = ENV_FUNCTIONS.get(model.bindings.resolve(function_call.func) or "")
            if verb:
                key = function_call.args[0] if function_call.args else None
                finding = self._env_access(model, function_call, verb, key)
                if finding:
                    yield finding
        if not environ_nodes:
            return
        consumed: set[int] = set()
        handled: list[tuple[ast.AST, str, ast.AST | None]] = []  # (node, verb, key)
        environ_ids = {id(n) for n in environ_nodes}
        for subscript in facts.subscripts:
            if id(subscript.value) in environ_ids:
                consumed.add(id(subscript.value))
                verb = "reads" if isinstance(subscript.ctx, ast.Load) else "sets"
                handled.append((subscript, verb, subscript.slice))
        for call in facts.calls:
            func = call.func
            if isinstance(func, ast.Attribute) and id(func.value) in environ_ids:
                consumed.add(id(func.value))
                method = func.attr
                verb = {"get": "reads", "setdefault": "sets", "pop": "unsets",
                        "update": "sets", "__setitem__": "sets", "__getitem__": "reads",
                        "clear": "clears"}.get(method, "reads")
                key = call.args[0] if call.args and method != "update" else None
                if method == "update" and call.args and isinstance(call.args[0], ast.Dict):
                    keys = call.args[0].keys
                    if keys and all(_literal(k) in BUILD_VARIABLES for k in keys):
                        continue
                handled.append((call, verb, key))
        for compare in facts.compares:
            if any(id(c) in environ_ids for c in compare.comparators) \
                    and all(isinstance(op, (ast.In, ast.NotIn)) for op in compare.ops):
                consumed.update(id(c) for c in compare.comparators)
                handled.append((compare, "reads", compare.left))
        for node, verb, key in handled:
            finding = self._env_access(model, node, verb, key)
            if finding:
                yield finding
        for node in environ_nodes:
            if id(node) not in consumed:
                yield node, (f"hands the whole environment along (`{first_line(model, node)}`): "
                             "the kernel's behaviour then depends on the harness's environment")

    def _env_access(self, model: SourceModel, node: ast.AST, verb: str,
                    key: ast.AST | None) -> tuple[ast.AST, str] | None:
        name = _literal(key) if key is not None else None
        if name in BUILD_VARIABLES:
            return None
        if verb == "reads" and self._only_locates_sources(model, node):
            return None
        if key is None:
            what = "the environment"
        else:
            what = f"environment variable `{name or first_line(model, key, 30)}`"
        if verb == "reads":
            return node, (f"reads {what} (`{first_line(model, node, 50)}`): the result then "
                          "depends on the harness's environment, which can carry its state or "
                          "answers")
        return node, (f"{verb} {what} (`{first_line(model, node, 50)}`): this changes how the "
                      "harness process and its libraries behave")

    @staticmethod
    def _only_locates_sources(model: SourceModel, node: ast.AST) -> bool:
        """`KERNEL_DIR = os.environ.get(...)` whose every use builds a path to a C++/CUDA source."""
        module = model.module
        if module is None:
            return False
        bound = None
        for statement in module.body:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name) \
                    and any(n is node for n in ast.walk(statement.value)):
                bound = statement.targets[0].id
        if bound is None:
            return False
        uses = 0
        for statement in ast.walk(module):
            for child in ast.iter_child_nodes(statement):
                if not isinstance(child, ast.expr) or isinstance(statement, ast.expr):
                    continue
                names = [n for n in ast.walk(child) if isinstance(n, ast.Name) and n.id == bound
                         and isinstance(n.ctx, ast.Load)]
                for name in names:
                    uses += 1
                    if not _within_source_path(model, child, name):
                        return False
        return uses > 0

    # --- files, network, processes ------------------------------------------------------------

    def _calls(self, model: SourceModel, facts: ModuleFacts) -> Iterator[tuple[ast.AST, str]]:
        shadowed = "open" in model.functions or "open" in imported_names(model) \
            or "open" in model.bindings.assignments
        for call in facts.calls:
            func = call.func
            resolved = model.bindings.resolve(func) or ""
            path = _path_argument(call)
            if isinstance(func, ast.Name) and func.id == "open" and not shadowed:
                if path is not None and literal_path_is_source(model, path):
                    continue
                yield call, (f"opens a file (`{first_line(model, call)}`): a kernel that reads "
                             "or writes files can load a stored answer or share state with the "
                             "harness")
            elif resolved in FILE_CALLS:
                if path is not None and literal_path_is_source(model, path):
                    continue
                yield call, (f"`{resolved}` accesses files (`{first_line(model, call)}`): a "
                             "kernel that loads or saves data can replay a stored answer")
            elif method_name(call) in PATH_METHODS or (method_name(call) == "open"
                                                       and _is_path_object(model, func.value)):  # type: ignore[attr-defined]
                receiver = func.value  # type: ignore[attr-defined]
                if resolved.startswith(("io.", "gzip.", "bz2.", "lzma.", "codecs.")) \
                        or literal_path_is_source(model, receiver):
                    continue
                yield call, (f"`.{method_name(call)}()` accesses a file "
                             f"(`{first_line(model, call)}`): a kernel that reads or writes files "
                             "can load a stored answer or share state with the harness")
            elif resolved.startswith(NETWORK_PREFIXES):
                yield call, (f"`{resolved}` reaches the network (`{first_line(model, call)}`): "
                             "a kernel must not fetch data or talk to other processes")
            elif resolved in PROCESS_CALLS or resolved.startswith(PROCESS_PREFIXES):
                yield call, (f"`{resolved}` runs another program (`{first_line(model, call)}`): "
                             "its work and effects are outside what the harness measures")


def _may_do_io(model: SourceModel) -> bool:
    """Cheap test on the text: a module of interest is named, or a word of interest is called."""
    words = word_set(model)
    if _MODULES & words or any(w.startswith(("exec", "spawn")) for w in words):
        return True
    return any(_CALL_OF[word].search(model.text) for word in _CALLED & words)


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _path_argument(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    for keyword in call.keywords:
        if keyword.arg in ("file", "f", "path", "filename", "fname", "pathname", "name", "args"):
            return keyword.value
    return None


def _is_path_object(model: SourceModel, receiver: ast.AST, depth: int = 0) -> bool:
    """`Path(...)`, `HERE / "x"`, or a name bound to such, as the receiver of `.open()`."""
    for node in ast.walk(receiver):
        if isinstance(node, ast.Call) and (model.bindings.resolve(node.func) or "").startswith(
                ("pathlib.", "os.path.")):
            return True
        if isinstance(node, ast.Name) and node.id == "__file__":
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return True
    if isinstance(receiver, ast.Name) and depth < 4:
        assigned = model.bindings.assignments.get(receiver.id, [])
        return len(assigned) == 1 and _is_path_object(model, assigned[0][1], depth + 1)
    return False


def _within_source_path(model: SourceModel, expression: ast.AST, name: ast.Name) -> bool:
    """True when the smallest call around `name` inside `expression` builds a path that names a
    C++/CUDA source (`os.path.join(KERNEL_DIR, "k.cu")`)."""
    best: ast.AST | None = None
    for node in ast.walk(expression):
        if isinstance(node, (ast.Call, ast.BinOp, ast.JoinedStr)) \
                and any(n is name for n in ast.walk(node)):
            best = node  # ast.walk goes outside-in, so the last match is the innermost
    if best is None:
        return False
    return literal_path_is_source(model, best) and not (
        isinstance(best, ast.Call) and (model.bindings.resolve(best.func) or "") in FILE_CALLS)


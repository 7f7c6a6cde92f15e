"""The tree's layers (docs/design.md, "Layers"): C++ includes run one way between
the rooms of csrc/, the torch-free layers include no torch header, and the
Python package's modules import each other without circles."""
from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
PKG = os.path.join(ROOT, "torchtpu")

# room -> the rooms it may include (besides itself)
ALLOWED = {
    "runtime": set(),
    "hlo": set(),
    "ops": {"hlo"},
    "core/device": {"runtime", "hlo"},
    "core/exec": {"core/device", "runtime", "hlo", "ops"},
    "core/dist": {"core/exec", "core/device", "runtime", "hlo"},
    "core/aten": {"core/exec", "core/device", "runtime", "hlo", "ops"},
}
TORCH_FREE = {"runtime", "hlo", "ops"}
# written into the build tree at configure time (CMakeLists.txt: tools/gen_device_rules.py)
GENERATED = {"device_rules.inc"}


def _room(rel: str) -> str:
    parts = rel.split("/")
    return "/".join(parts[:2]) if parts[0] == "core" else parts[0]


def _cpp_files():
    for d, _, files in os.walk(CSRC):
        for f in files:
            if f.endswith((".h", ".cpp")):
                yield os.path.relpath(os.path.join(d, f), CSRC).replace(os.sep, "/")


def test_cpp_rooms_are_known_and_documented():
    rooms = {_room(f) for f in _cpp_files()}
    assert rooms == set(ALLOWED), rooms ^ set(ALLOWED)
    for room in rooms:
        assert os.path.exists(os.path.join(CSRC, room, "README.md")), f"csrc/{room} has no README.md"


def test_cpp_includes_run_one_way():
    bad = []
    for rel in _cpp_files():
        room = _room(rel)
        text = open(os.path.join(CSRC, rel)).read()
        for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
            if inc == "pjrt_c_api.h" or inc in GENERATED:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
            if not os.path.exists(os.path.join(CSRC, target)):
                target = inc  # from csrc's root
            assert os.path.exists(os.path.join(CSRC, target)), f"{rel}: #include \"{inc}\" not found"
            to = _room(target)
            if to != room and to not in ALLOWED[room]:
                bad.append(f"{rel} includes {target} ({room} -> {to})")
        if room in TORCH_FREE and re.search(r"^#include <(torch|ATen|c10|pybind11)/", text, re.M):
            bad.append(f"{rel} includes a torch header in a torch-free layer")
    assert not bad, "\n".join(bad)


def _modules() -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
    return out


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """Every torchtpu module `name` imports, at the top or inside functions. A
    `from X import Y` names X.Y when that is a module, else X."""
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in modules else mod)
    return {m for m in out if m in modules and m != name}


def test_python_imports_have_no_circles():
    modules = _modules()
    modules["torchtpu._C"] = ""  # the compiled extension: a leaf
    graph = {m: (_imports(m, p, modules) if p else set()) for m, p in modules.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "import circles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("public", ["torchtpu.quant", "torchtpu.generation", "torchtpu.serve",
                                    "torchtpu.testing", "torchtpu.compile"])
def test_public_import_paths(public):
    import importlib

    m = importlib.import_module(public)
    want = {"torchtpu.quant": ["quantize_mx", "mx_matmul", "BlockFP8Linear", "packed_config",
                               "load_fp8_checkpoint", "PackedMXFP4Experts"],
            "torchtpu.generation": ["StaticGenerator", "bucket", "pad_prompts"],
            "torchtpu.serve": ["main", "start", "validate"],
            "torchtpu.testing": ["DEVICE_NAME", "MANUAL_SEED_FN", "SINGLE_PROCESS_DEVICE"],
            "torchtpu.compile": ["backend", "metrics"]}[public]
    missing = [n for n in want if not hasattr(m, n)]
    assert not missing, f"{public} lacks {missing}"

"""The extension keeps to public APIs: the stable ABI of the floor its wheel is tagged for
(cp311-abi3), checked with abi3audit on the built library, and no private attribute of another
library read from its sources."""

import pathlib
import re
import subprocess
import sys

import pytest

import dlframe

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_extension_uses_only_the_stable_abi_of_3_11():
    pytest.importorskip("abi3audit", reason="abi3audit is in python/requirements-test.txt")
    library = pathlib.Path(dlframe._native.__file__)
    out = subprocess.run(
        [sys.executable, "-m", "abi3audit", "--assume-minimum-abi3", "3.11", "--summary", "--verbose", str(library)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 0, report
    assert "0 ABI version mismatches and 0 ABI violations found" in report, report


def test_the_binding_reads_no_private_attribute_and_no_pyo3_internals():
    sources = list((ROOT / "python" / "src").glob("*.rs"))
    assert sources, "python/src has no Rust sources"
    for path in sources:
        text = path.read_text()
        assert "impl_::" not in text, f"{path.name} uses pyo3's private impl_ module"
        assert "PyDescr_NewMethod" not in text, f"{path.name} makes C method descriptors"
        # A private name of another library, in any string: only the binding's own functions
        # (declared with #[pyo3(name = "_x")]) may have one.
        own = set(re.findall(r'name\s*=\s*"(_[a-z][a-z0-9_]*)"', text))
        private = set(re.findall(r'"(_[a-z][a-z0-9_]*)"', text)) - own
        assert not private, f"{path.name} names private attributes {sorted(private)}"


# Underscored names that their libraries document as public.
DOCUMENTED = {"os._exit"}


def test_the_package_and_its_tests_read_no_private_attribute_of_another_library():
    import ast

    sources = list((ROOT / "python" / "dlframe").glob("*.py")) + list((ROOT / "python" / "tests").glob("*.py"))
    assert sources, "python/dlframe has no sources"
    for path in sources:
        tree = ast.parse(path.read_text())
        # The names this file binds to other libraries' modules: import x, import x as y,
        # from x import y (a module or an object of it).
        foreign = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                foreign |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("dlframe")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("dlframe"):
                foreign |= {a.asname or a.name for a in node.names}
        private = []
        for node in ast.walk(tree):
            # An attribute chain from one of those names (pa.Array._x as well as pa._x).
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            name = ast.unparse(node)
            if isinstance(root, ast.Name) and root.id in foreign and name not in DOCUMENTED:
                private.append(f"{name} (line {node.lineno})")
        assert not private, f"{path.name} reads private attributes of other libraries: {private}"

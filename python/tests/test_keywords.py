"""The export keywords are defined once: by the binding's `to_dlpack` (its pyo3 signature, which
`inspect.signature` reads). Everything else that writes them out is checked against it here:
the `.pyi` stubs (every overload of `to_dlpack`), the Polars wrapper (`dlframe.polars.to_dlpack`,
which adds `engine` and must hand each keyword on), and the `to_dlpack` methods Polars objects
get. A keyword added to one and not the others, or a default changed in one, fails here."""

import ast
import inspect
import pathlib

import pytest

import dlframe
import dlframe.polars

PACKAGE = pathlib.Path(dlframe.__file__).parent

#: What the Polars wrapper adds: how a LazyFrame is collected.
POLARS_ONLY = {"engine"}


def native_keywords() -> dict[str, object]:
    """The binding's keywords and their defaults: the one definition."""
    params = inspect.signature(dlframe.to_dlpack).parameters
    assert list(params)[0] == "obj"
    return {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}


def literal(node: ast.expr | None) -> object:
    return ast.literal_eval(node) if node is not None else inspect.Parameter.empty


def stub_overloads() -> list[ast.FunctionDef]:
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "to_dlpack"]


def test_the_binding_defines_the_keywords():
    kw = native_keywords()
    assert {"nulls", "fill_value", "copy", "dtype", "device", "inexact"} <= set(kw), kw
    assert kw["nulls"] == "error" and kw["inexact"] == "error"


def test_every_stub_overload_has_the_binding_keywords_and_defaults():
    kw = native_keywords()
    overloads = stub_overloads()
    assert len(overloads) >= 2, "no overloads of to_dlpack in _native.pyi"
    for f in overloads:
        names = [a.arg for a in f.args.kwonlyargs]
        line = f.lineno
        assert set(names) - set(kw) == set(), f"_native.pyi line {line}: keywords the binding lacks"
        missing = set(kw) - set(names)
        # An overload may leave out only keywords its return type rules out (the ragged ones).
        assert missing <= {"pad_value", "max_len"}, f"_native.pyi line {line}: missing {missing}"
        for arg, default in zip(f.args.kwonlyargs, f.args.kw_defaults):
            if default is None:
                continue  # a keyword the overload requires (its Literal picks the overload)
            assert literal(default) == kw[arg.arg], f"_native.pyi line {line}: {arg.arg}'s default"
    # The general overload (the last) takes every keyword.
    assert {a.arg for a in overloads[-1].args.kwonlyargs} == set(kw)


def test_the_polars_wrapper_takes_and_hands_on_every_keyword():
    kw = native_keywords()
    params = inspect.signature(dlframe.polars.to_dlpack).parameters
    wrapper = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert set(wrapper) - POLARS_ONLY == set(kw)
    assert {n: wrapper[n] for n in kw} == kw, "a default differs from the binding's"
    # Each keyword is handed on to the binding under its own name.
    source = (PACKAGE / "polars.py").read_text()
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "to_dlpack")
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == "_native.to_dlpack"]
    assert len(calls) == 1, "dlframe.polars.to_dlpack calls the binding once"
    handed = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert handed == {n: n for n in kw}, handed


def test_the_polars_methods_take_the_same_keywords():
    pl = pytest.importorskip("polars", reason="polars is not installed")
    want = list(inspect.signature(dlframe.polars.to_dlpack).parameters)[1:]
    df = pl.DataFrame({"a": [1.0]})
    for method in (df.to_dlpack, df["a"].to_dlpack, df.lazy().to_dlpack, df.dlframe.to_dlpack):
        sig = inspect.signature(method)
        assert list(sig.parameters) == want, (method, sig)
        assert all(p.kind is p.KEYWORD_ONLY for p in sig.parameters.values())

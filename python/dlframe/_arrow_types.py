"""The Arrow extension types of the tensor dtypes Arrow lacks, registered in pyarrow so that
``from_dlpack`` of a bfloat16 or float8 tensor is a typed pyarrow array, and the type survives
``pa.table``, Parquet files and IPC on its way back to ``to_dlpack``.

bfloat16 is ``lance.bfloat16`` over ``fixed_size_binary(2)``, as Lance writes it; float8 is
``dlframe.float8_e4m3fn`` and ``dlframe.float8_e5m2`` over ``fixed_size_binary(1)``.

``import dlframe`` does not import pyarrow (numpy is dlframe's only requirement, and pyarrow
takes a good part of a second to import): the types are registered at once when pyarrow is
already imported, else as soon as pyarrow's own import finishes. Lance registers the same name
when it is imported, without checking whether it is taken: when Lance came first, its type
stays; when dlframe's is registered, it gives way just before Lance's module registers its own,
so ``import lance`` works in either order and Lance's arrays keep Lance's class.

Both hooks are entries on ``sys.meta_path`` (Python's documented import hooks) that find
nothing themselves.
"""

import importlib.abc
import importlib.machinery
import sys
from typing import Any

# Lance's module that registers BFLOAT16 on import.
_LANCE_BF16_MODULE = "lance._arrow.bf16"


def _register_now() -> None:
    """Registers the types that nothing has registered yet (idempotent); pyarrow is imported."""
    import pyarrow as pa

    from ._extension_dtypes import FLOAT8, BFloat16Type

    _HOOK.watch_pyarrow = False
    for float8 in FLOAT8:
        try:
            pa.register_extension_type(float8())
        except pa.ArrowKeyError:
            pass  # registered already
    try:
        pa.register_extension_type(BFloat16Type())
    except pa.ArrowKeyError:
        return  # registered already: by Lance, or earlier
    if _LANCE_BF16_MODULE not in sys.modules:
        _HOOK.watch_lance = True


class _AfterImport(importlib.abc.Loader):
    """pyarrow's own loader, with the registration run once its module has executed."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # The module is restored to its own loader, for anything that reads it later.
        module.__loader__ = module.__spec__.loader = self._loader
        _register_now()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Hook(importlib.abc.MetaPathFinder):
    """Waits for pyarrow's import (then registers), and for Lance's bfloat16 module (then gives
    the name way). Finds no module itself."""

    def __init__(self) -> None:
        self.watch_pyarrow = False
        self.watch_lance = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        # Asked until pyarrow is imported: a lookup alone (importlib.util.find_spec, as Polars
        # makes for its optional dependencies) loads nothing.
        if name == "pyarrow" and self.watch_pyarrow:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _AfterImport(spec.loader)
            return spec
        if name == _LANCE_BF16_MODULE and self.watch_lance:
            self.watch_lance = False
            import pyarrow as pa

            try:
                pa.unregister_extension_type("lance.bfloat16")
            except (KeyError, pa.ArrowKeyError):
                pass
        return None


_HOOK = _Hook()


def register() -> None:
    """Registers the types now when pyarrow is imported, else once it is (called on import)."""
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
    if "pyarrow" in sys.modules:
        _register_now()
    else:
        _HOOK.watch_pyarrow = True

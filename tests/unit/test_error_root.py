"""Every error Tidal raises derives from :class:`tidal.errors.TidalError` (DESIGN.md §4, practice 6).

The check reads the source, it does not run it: for each ``raise`` under src/tidal it works out what is
raised (a class, a function or method whose return annotation is the error, a local variable assigned
from those, or the variable of an ``except ... as`` clause being raised again) and fails on anything that
is not a TidalError subclass nor control flow, printing file:line of each.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import tidal

SRC = Path(tidal.__file__).parent
ROOT = "tidal.errors.TidalError"

# Raising these is control flow, not an error.
CONTROL_FLOW = frozenset({"typer.Exit", "SystemExit", "KeyboardInterrupt", "StopIteration"})

# Modules that run where the tidal package cannot be imported, so they cannot raise its errors: they use
# the standard library only. Their exceptions stay inside the process they run in.
STANDALONE = frozenset({
    "mechanisms/criu/rankinit.py",  # PID 1 of a rank, run as `python -I -S rankinit.py`
    "mechanisms/interpose/rankside.py",  # the interposer, loaded into the job's own Python
})



@dataclass
class Module:
    name: str  # dotted
    path: Path
    tree: ast.Module
    symbols: dict[str, str] = field(default_factory=dict)  # local name → qualified name


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _symbols(mod: Module) -> dict[str, str]:
    """Module-level names: imports (resolved to what they name) and definitions."""
    package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]
    out: dict[str, str] = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    for node in mod.tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = f"{mod.name}.{node.name}"
    return out


class Index:
    """The classes and functions of a set of modules, by qualified name."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.classes: dict[str, tuple[Module, ast.ClassDef]] = {}
        self.functions: dict[str, tuple[Module, ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for mod in modules.values():
            mod.symbols = _symbols(mod)
            for node in mod.tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[f"{mod.name}.{node.name}"] = (mod, node)
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            self.functions[f"{mod.name}.{node.name}.{item.name}"] = (mod, item)
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions[f"{mod.name}.{node.name}"] = (mod, node)
        self._errors: dict[str, bool] = {}

    def canonical(self, qualified: str) -> str:
        """Follow re-exports (``from tidal.core.spec import JobSpec`` in tidal/core/__init__.py)."""
        for _ in range(10):
            if qualified in self.classes or qualified in self.functions:
                return qualified
            mod, _, name = qualified.rpartition(".")
            target = self.modules[mod].symbols.get(name) if mod in self.modules else None
            if target is None or target == qualified:
                return qualified
            qualified = target
        return qualified

    def resolve(self, mod: Module, expr: ast.expr) -> str | None:
        """The qualified name a Name or dotted Attribute stands for at module level."""
        if isinstance(expr, ast.Name):
            return self.canonical(mod.symbols.get(expr.id, expr.id))
        if isinstance(expr, ast.Attribute):
            base = self.resolve(mod, expr.value)
            return None if base is None else self.canonical(f"{base}.{expr.attr}")
        return None

    def is_error(self, qualified: str) -> bool:
        if qualified == ROOT:
            return True
        if qualified not in self._errors:
            self._errors[qualified] = False  # cycles
            entry = self.classes.get(qualified)
            if entry is not None:
                mod, node = entry
                self._errors[qualified] = any(
                    (b := self.resolve(mod, base)) is not None and self.is_error(b) for base in node.bases)
        return self._errors[qualified]

    def method(self, cls: str, name: str, depth: int = 0) -> str | None:
        """The qualified name of method ``name`` of class ``cls``, defined there or in a base class."""
        if f"{cls}.{name}" in self.functions:
            return f"{cls}.{name}"
        entry = self.classes.get(cls)
        if entry is None or depth > 10:
            return None
        mod, node = entry
        for base in node.bases:
            b = self.resolve(mod, base)
            found = None if b is None else self.method(b, name, depth + 1)
            if found is not None:
                return found
        return None

    def returns_error(self, qualified: str) -> bool:
        mod, fn = self.functions[qualified]
        if fn.returns is None:
            return False
        ret = fn.returns
        if isinstance(ret, ast.Constant) and isinstance(ret.value, str):
            ret = ast.parse(ret.value, mode="eval").body
        target = self.resolve(mod, ret)
        return target is not None and self.is_error(target)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _enclosing(node: ast.AST, parents: dict[ast.AST, ast.AST], kinds: tuple[type, ...]) -> Iterator[ast.AST]:
    while node in parents:
        node = parents[node]
        if isinstance(node, kinds):
            yield node


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions or classes defined in it."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


class Checker:
    def __init__(self, index: Index, mod: Module) -> None:
        self.index, self.mod = index, mod
        self.parents = _parents(mod.tree)

    def offenders(self) -> Iterator[ast.Raise]:
        for node in ast.walk(self.mod.tree):
            if isinstance(node, ast.Raise) and node.exc is not None and not self.allowed(node, node.exc, called=False):
                yield node

    def allowed(self, at: ast.AST, expr: ast.expr, *, called: bool, depth: int = 0) -> bool:
        """Whether ``expr`` (called, when ``called``) is a TidalError or control flow."""
        if depth > 5:
            return False
        if isinstance(expr, ast.Call):
            return self.allowed(at, expr.func, called=True, depth=depth + 1)
        if isinstance(expr, ast.IfExp):
            return all(self.allowed(at, e, called=called, depth=depth + 1) for e in (expr.body, expr.orelse))
        if isinstance(expr, ast.Name):
            if not called and self._caught_as(at, expr.id):
                return True  # raising again what was caught
            declared = self._local_type(at, expr.id)
            if declared is not None:  # `cls: type[SomeError] = ...`
                return called and self.allowed(at, declared, called=False, depth=depth + 1)
            values = self._local_values(at, expr.id)
            if values:
                return all(self.allowed(at, v, called=called, depth=depth + 1) for v in values)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in ("self", "cls"):
            return called and self._method_returns_error(at, expr.attr)
        target = self.index.resolve(self.mod, expr)
        if target is None:
            return False
        if target in CONTROL_FLOW or self.index.is_error(target):
            return True
        return called and target in self.index.functions and self.index.returns_error(target)

    def _caught_as(self, at: ast.AST, name: str) -> bool:
        return any(h.name == name for h in _enclosing(at, self.parents, (ast.ExceptHandler,))
                   if isinstance(h, ast.ExceptHandler))

    def _local_type(self, at: ast.AST, name: str) -> ast.expr | None:
        """X where the enclosing function declares ``name: type[X]``."""
        fn = next(_enclosing(at, self.parents, (ast.FunctionDef, ast.AsyncFunctionDef)), None)
        for n in _own_nodes(fn) if fn is not None else ():
            if (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name
                    and isinstance(n.annotation, ast.Subscript) and ast.unparse(n.annotation.value) == "type"):
                return n.annotation.slice
        return None

    def _local_values(self, at: ast.AST, name: str) -> list[ast.expr]:
        fn = next(_enclosing(at, self.parents, (ast.FunctionDef, ast.AsyncFunctionDef)), None)
        if fn is None:
            return []
        return [n.value for n in _own_nodes(fn) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]

    def _method_returns_error(self, at: ast.AST, method: str) -> bool:
        cls = next(_enclosing(at, self.parents, (ast.ClassDef,)), None)
        if not isinstance(cls, ast.ClassDef):
            return False
        qualified = self.index.method(f"{self.mod.name}.{cls.name}", method)
        return qualified is not None and self.index.returns_error(qualified)


def load(root: Path = SRC) -> dict[str, Module]:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return modules


def offenders(modules: dict[str, Module], root: Path = SRC) -> list[tuple[str, int, str]]:
    """(path relative to ``root``, line, the raise statement) of each raise that is not a TidalError."""
    index = Index(modules)
    out = []
    for mod in modules.values():
        rel = mod.path.relative_to(root).as_posix()
        if rel in STANDALONE:
            continue
        out += [(rel, r.lineno, ast.unparse(r)) for r in Checker(index, mod).offenders()]
    return sorted(out)


def test_every_raise_is_a_tidal_error() -> None:
    found = offenders(load())
    bad = [f"src/tidal/{path}:{line}: {text}" for path, line, text in found]
    assert not bad, "raises of something other than a TidalError:\n" + "\n".join(bad)


def test_the_check_finds_what_it_should(tmp_path: Path) -> None:
    pkg = tmp_path / "tidal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text((SRC / "errors.py").read_text())
    sample = '''
import typer
from pydantic import ValidationError as PydanticError
from tidal import errors
from tidal.errors import Conflict, TidalError, ValidationError as Invalid


class Mine(Conflict):
    pass


class NotOurs(ValueError):
    pass


def make(e: OSError) -> errors.StorageError:
    return errors.StorageError(str(e))


def plain(e: OSError) -> Exception:
    return e


class Base:
    def _error(self) -> TidalError:
        return TidalError("x")


class Reader(Base):
    def read(self, flag: bool) -> None:
        cls = Mine if flag else errors.NotFound
        if flag:
            raise self._error()                    # fine
        raise cls("x")                             # fine


def by_status(status: int) -> None:
    cls: type[TidalError] = {404: errors.NotFound}.get(status, TidalError)
    raise cls("x")                                 # fine


def by_name(name: str) -> None:
    cls: type[Exception] = getattr(errors, name)
    raise cls("x")                                 # offends


def good(flag: bool) -> None:
    try:
        pass
    except OSError as exc:
        raise make(exc) from None                  # fine
    except KeyError as exc:
        raise exc                                  # fine: raised again
    if flag:
        raise Invalid("x", field="f")              # fine
    if flag:
        raise Mine                                 # fine
    if flag:
        raise typer.Exit(2)                        # fine
    raise SystemExit(1)                            # fine


def bad(flag: bool) -> None:
    err = ValueError("x")
    if flag:
        raise ValueError("x")                      # offends
    if flag:
        raise NotOurs("x")                         # offends
    if flag:
        raise PydanticError("x")                   # offends
    if flag:
        raise plain(OSError())                     # offends
    if flag:
        raise err                                  # offends
    raise RuntimeError                             # offends
'''
    (pkg / "sample.py").write_text(sample)
    found = offenders(load(pkg), pkg)
    expected = [i for i, line in enumerate(sample.splitlines(), 1) if line.endswith("# offends")]
    assert [line for _, line, _ in found] == expected, found

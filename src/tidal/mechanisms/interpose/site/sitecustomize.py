"""Tidal's ``sitecustomize``: put on a rank's ``PYTHONPATH`` by its agent, it loads the interposer
before the user's script runs (the script is not changed). Only the first Python process of the rank
takes the agent channel; its children neither see it nor load anything. Then any other
``sitecustomize`` further down the path runs as it would have without Tidal."""

import os
import sys


def _tidal() -> None:
    spec = os.environ.pop("TIDAL_INTERPOSE_CTL", None)
    if not spec:
        return
    rfd, wfd = (int(x) for x in spec.split(","))
    os.set_inheritable(rfd, False)
    os.set_inheritable(wfd, False)
    from importlib.machinery import SourceFileLoader

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "rankside.py")
    # The plain loader, not importlib.util: this runs at the start of every Python process of a rank.
    module = type(sys)("_tidal_interpose")
    module.__file__ = path
    sys.modules["_tidal_interpose"] = module
    SourceFileLoader("_tidal_interpose", path).exec_module(module)
    module.install(rfd, wfd)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, if any: Tidal's must not hide the system's."""
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        import importlib.util  # only when there is another sitecustomize to run

        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_tidal()
_chain()

"""The optional parts of the tool, each a pip extra of magpie-workbench (pyproject.toml), and the
one error a front end shows when the part asked for is not installed here.

    require_extra("ray", "-e ray")      # before anything of the run starts

A missing extra is a problem of this installation, like a configuration error: the command line
prints one line naming the extra and the install command, and exits with 2; nothing is run.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from engine.errors import MagpieError

DISTRIBUTION = "magpie-workbench"
# extra -> the top-level module that says it is installed
EXTRA_MODULES = {"ray": "ray", "mcp": "mcp"}


class MissingExtra(MagpieError):
    """``feature`` needs the pip extra ``extra``, which is not installed in this Python."""

    title = "missing extra"

    def __init__(self, extra: str, feature: str, detail: str = "") -> None:
        self.extra, self.feature = extra, feature
        why = f" ({detail})" if detail else ""
        super().__init__(f"{feature} needs the '{extra}' extra, not installed here{why}: "
                         f"pip install '{DISTRIBUTION}[{extra}]' (in a checkout: pip install -e '.[{extra}]'); "
                         "nothing was run")


def extra_missing(extra: str) -> Optional[str]:
    """Why the extra's module cannot be imported here, or None when it can be found. Looks the
    module up without importing it (cheap: ray takes seconds to import)."""
    module = EXTRA_MODULES.get(extra, extra)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if spec is not None else f"no module named '{module}'"


def require_extra(extra: str, feature: str) -> None:
    """Raise MissingExtra when ``extra`` is not installed."""
    why = extra_missing(extra)
    if why is not None:
        raise MissingExtra(extra, feature, why)


def missing_extra_error(exc: ImportError, extra: str, feature: str) -> Optional[MissingExtra]:
    """The MissingExtra that an ImportError raised while importing ``feature`` stands for (the
    extra's module, or a module it needs, is not there), or None when the error is something
    else (a bug of this tool: let it show)."""
    module = EXTRA_MODULES.get(extra, extra)
    name = (exc.name or "").split(".")[0]
    why = extra_missing(extra)
    if name == module or why is not None:
        return MissingExtra(extra, feature, why or f"{type(exc).__name__}: {exc}")
    return None


__all__ = ["MissingExtra", "extra_missing", "missing_extra_error", "require_extra"]

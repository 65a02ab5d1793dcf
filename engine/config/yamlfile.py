"""YAML loading that remembers where every value came from, so errors can name file and line."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from engine.errors import MagpieError


class ConfigError(MagpieError):
    """A config problem, already phrased for the user: file:line, field, what is expected."""

    title = "configuration problem"

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))

    @property
    def message(self) -> str:
        # str() stays the problem list (callers print it); the rendered form lists them as details.
        return "nothing was run"

    def details(self) -> list[str]:
        return list(self.problems)


@dataclass
class LocatedYaml:
    path: Path
    data: Any
    _lines: dict[tuple, int]

    def line_of(self, loc: Iterable[Any]) -> int | None:
        """Line (1-based) of the deepest existing node on ``loc``."""
        key = tuple(loc)
        while True:
            if key in self._lines:
                return self._lines[key]
            if not key:
                return None
            key = key[:-1]

    def where(self, loc: Iterable[Any]) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line else str(self.path)


def _index_nodes(node: yaml.Node, prefix: tuple, out: dict[tuple, int]) -> None:
    out.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[prefix + (key,)] = key_node.start_mark.line + 1
            _index_nodes(value_node, prefix + (key,), out)
            out[prefix + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_nodes(item, prefix + (i,), out)


def load_located_yaml(path: Path | str) -> LocatedYaml:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc})"]) from None
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{where}: invalid YAML: {problem}"]) from None
    lines: dict[tuple, int] = {}
    if root is not None:
        _index_nodes(root, (), lines)
    return LocatedYaml(path=path, data=data, _lines=lines)


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand_env_vars(value: Any, loc: tuple = (), undefined: list[tuple[tuple, str]] | None = None,
                    variables: Mapping[str, str] | None = None) -> Any:
    """Expand ``$VAR``/``${VAR}`` in every string, recursively. ``variables`` (e.g. the loader's
    ``MAGPIE_CONFIG_DIR``) come before the environment. Undefined variables stay as written (a
    shell command may define them) and are reported through ``undefined``."""
    if isinstance(value, str):
        def repl(m: re.Match) -> str:
            name = m.group(1) or m.group(2)
            if variables and name in variables:
                return variables[name]
            if name in os.environ:
                return os.environ[name]
            if undefined is not None:
                undefined.append((loc, name))
            return m.group(0)
        return _VAR.sub(repl, value)
    if isinstance(value, dict):
        return {k: expand_env_vars(v, loc + (k,), undefined, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env_vars(v, loc + (i,), undefined, variables) for i, v in enumerate(value)]
    return value


def unset_variables(text: str, variables: Mapping[str, str] | None = None) -> list[str]:
    """The ``$VAR`` names still in an expanded string that neither ``variables`` nor the
    environment define (they were left as written)."""
    names = [m.group(1) or m.group(2) for m in _VAR.finditer(text)]
    return [n for n in dict.fromkeys(names) if n not in os.environ and not (variables and n in variables)]


def format_loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def describe_error(err: dict, doc: LocatedYaml, unknown_hint: Callable[[tuple], str] = lambda loc: "",
                   missing_hint: Callable[[tuple], str] = lambda loc: "") -> str:
    """One pydantic error as ``file:line: field: problem (got value)``."""
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        msg = "unknown field." + unknown_hint(loc)
    elif kind == "missing":
        msg = "required field is missing" + missing_hint(loc)
    else:
        msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    got_text = "" if isinstance(got, (dict, list)) or got is None or kind in ("missing", "extra_forbidden") \
        else f" (got {got!r})"
    return f"{doc.where(loc)}: {format_loc(loc)}: {msg}{got_text}"


def validate_located(model: Any, doc: LocatedYaml, warnings: list[str] | None = None,
                     variables: Mapping[str, str] | None = None, **hints: Any) -> Any:
    """``$VAR``-expand the document (``variables`` before the environment), validate it with the
    pydantic ``model``, and turn every validation error into a file:line problem (``hints`` go to
    ``describe_error``)."""
    from pydantic import ValidationError
    undefined: list[tuple[tuple, str]] = []
    data = expand_env_vars(doc.data, (), undefined, variables)
    if warnings is not None:
        for loc, name in undefined:
            warnings.append(f"{doc.where(loc)}: {format_loc(loc)}: ${name} is not set in the environment; "
                            "left as written (a shell command may still define it)")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([describe_error(e, doc, **hints) for e in exc.errors()]) from None

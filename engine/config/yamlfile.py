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


class YamlSyntaxError(ConfigError):
    """A file that is not valid YAML, or goes over a limit of ``LimitedSafeLoader`` (``limit``);
    ``line`` (1-based) and ``problem`` are the parts of the one problem it reports."""

    def __init__(self, problem_text: str, line: int | None, problem: str, limit: bool = False) -> None:
        super().__init__([problem_text])
        self.line, self.problem, self.limit = line, problem, limit


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


# Limits of a config file. A config is a few kB; these leave room for any real one (a generated
# sweep, a corpus of kernels) and refuse what would take the machine down: a huge file, a binary,
# the "billion laughs" alias bomb (563 bytes that expand to a billion nodes), or nesting that
# overflows the parser's stack.
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB
MAX_YAML_DEPTH = 100  # nested collections
MAX_ALIAS_NODES = 100_000  # nodes that aliases stand for, counted as if each alias were copied out


class _YamlLimit(yaml.YAMLError):
    """A document over one of the limits, with the mark where it went over."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _Limits:
    """Counting while composing: nesting depth, and the nodes every alias stands for (a node's
    expanded size is computed once, bottom-up, so counting is linear in the text). Over a limit,
    or an alias to a node that contains it (a recursive structure, which no config needs),
    composing stops with a ``YAMLError`` that has the mark of the culprit."""

    _depth = 0
    _alias_nodes = 0
    _sizes: dict[int, int]  # id(node) -> its size with aliases expanded

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # Refused in the scanner too: its look-ahead over thousands of open '[' is quadratic.
        if self.flow_level >= MAX_YAML_DEPTH:
            raise _YamlLimit(f"YAML nested deeper than {MAX_YAML_DEPTH} levels, the most a config may have",
                             self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            size = self.__dict__.setdefault("_sizes", {}).get(id(node))
            if size is None:
                raise _YamlLimit(f"alias *{event.anchor} is used inside its own anchor (a recursive structure); "
                                 "not allowed in a config", event.start_mark)
            self._alias_nodes += size
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise _YamlLimit(f"YAML aliases expand past {MAX_ALIAS_NODES:,} nodes at *{event.anchor}, the most a "
                                 "config may expand to (an alias bomb?)", event.start_mark)
            return node
        if self._depth >= MAX_YAML_DEPTH and self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            raise _YamlLimit(f"YAML nested deeper than {MAX_YAML_DEPTH} levels, the most a config may have",
                             self.peek_event().start_mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        sizes = self.__dict__.setdefault("_sizes", {})
        if isinstance(node, yaml.MappingNode):
            sizes[id(node)] = 1 + sum(sizes.get(id(k), 1) + sizes.get(id(v), 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            sizes[id(node)] = 1 + sum(sizes.get(id(v), 1) for v in node.value)
        else:
            sizes[id(node)] = 1
        return node


class LimitedSafeLoader(_Limits, yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's SafeLoader (pure Python) with the limits of ``_Limits``: its error texts are the
    ones a config's problems are reported with."""


try:  # libyaml's parser under the same Python composer: the limits hold, 5x faster
    from yaml._yaml import CParser as _CParser

    class _FastLimitedLoader(_Limits, yaml.composer.Composer, _CParser, yaml.constructor.SafeConstructor,
                             yaml.resolver.Resolver):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _FastLimitedLoader = None  # type: ignore[assignment,misc]


def _index_nodes(node: yaml.Node, prefix: tuple, out: dict[tuple, int], seen: set[int] | None = None) -> None:
    """Line of every path in the composed document. A node reached again through an alias is not
    walked again (its paths under the alias fall back to the alias's own line)."""
    seen = set() if seen is None else seen
    out.setdefault(prefix, node.start_mark.line + 1)
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a complex key (a list as a key): nothing names it in a field path
            key = key_node.value
            out[prefix + (key,)] = key_node.start_mark.line + 1
            _index_nodes(value_node, prefix + (key,), out, seen)
            out[prefix + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_nodes(item, prefix + (i,), out, seen)


def read_config_text(path: Path | str, max_bytes: int = MAX_CONFIG_BYTES, what: str = "a config") -> str:
    """A config file's text, refused with a ``ConfigError`` naming the file when it is missing,
    not a regular file (a FIFO, a device, a directory), over ``max_bytes``, binary or not UTF-8."""
    from engine.safeio import FileTooLarge, NotRegularFile, read_bytes
    path = Path(path)
    try:
        raw = read_bytes(path, max_bytes, what)
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except NotRegularFile as exc:
        raise ConfigError([f"{path}: not a regular file ({exc.kind}); {what} must be a file"]) from None
    except FileTooLarge as exc:
        raise ConfigError([str(exc)]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc})"]) from None
    nul = raw.find(b"\0")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise ConfigError([f"{path}:{line}: binary content (a NUL byte at byte {nul}), not a YAML text"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}); "
                           f"{what} is a YAML text"]) from None


def _yaml_error(path: Path, exc: yaml.YAMLError) -> YamlSyntaxError:
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    line = mark.line + 1 if mark else None
    if isinstance(exc, _YamlLimit):
        return YamlSyntaxError(f"{where}: {exc.problem}", line, exc.problem, limit=True)
    if isinstance(exc, yaml.reader.ReaderError):
        problem = f"{exc.reason} (character {exc.position})"
    else:
        problem = getattr(exc, "problem", None) or str(exc)
    return YamlSyntaxError(f"{where}: invalid YAML: {problem}", line, problem)


def parse_yaml_text(text: str, path: Path | str, lines: dict[tuple, int] | None = None) -> Any:
    """The data of one YAML document, parsed once with the limits of ``_Limits``; with ``lines``,
    the line of every field path is recorded there too (from the composed nodes, before merge
    keys are folded in). A ``ConfigError`` naming ``path`` and the line for any problem, a limit
    included. libyaml parses when it is there; a document it refuses is parsed again by PyYAML's
    own parser, whose error texts are the ones reported."""
    path = Path(path)
    if _FastLimitedLoader is not None:
        try:
            return _parse_with(_FastLimitedLoader, text, path, lines)
        except YamlSyntaxError as exc:
            if exc.limit:
                raise
            if lines is not None:
                lines.clear()
    return _parse_with(LimitedSafeLoader, text, path, lines)


def _parse_with(loader_class: Any, text: str, path: Path, lines: dict[tuple, int] | None) -> Any:
    loader = loader_class(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if lines is not None:
            _index_nodes(root, (), lines)
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except RecursionError:  # the depth limit always comes first; never a traceback all the same
        raise YamlSyntaxError(f"{path}: YAML nested too deeply", None, "nested too deeply", limit=True) from None
    finally:
        loader.dispose()


def load_yaml_file(path: Path | str, max_bytes: int = MAX_CONFIG_BYTES, what: str = "a config") -> Any:
    """The data of a YAML file, through the one safe path (``read_config_text`` then
    ``parse_yaml_text``): every problem a ``ConfigError`` naming the file."""
    return parse_yaml_text(read_config_text(path, max_bytes, what), path)


def load_located_yaml(path: Path | str) -> LocatedYaml:
    path = Path(path)
    lines: dict[tuple, int] = {}
    data = parse_yaml_text(read_config_text(path), path, lines)
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

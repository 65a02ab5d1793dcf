"""An index of kernel definitions in local source trees.

Only directories the user names are read: nothing is cloned, fetched or executed, and no
network is touched (Magpie shallow-clones pytorch, rocm-libraries and others by default). A
repository's label and its GitHub link come from its `.git/config` and `.git/HEAD` files, read
as text.

One walk reads each file once (files over `MAX_FILE_BYTES` are skipped) and records:

* Triton kernels: `def name(` under `@triton.jit`, `@triton.autotune`, `@triton.heuristics`,
  `@gluon.jit`, `@libentry()`, `@jit`, a wrapper ending in `jit` (`@triton_jit`) or Inductor's
  `@triton_heuristics.*` decorators, and any function the same file launches as `name[grid](...)`;
* CUDA/HIP kernels: `__global__` functions, templated or not, with `__launch_bounds__` and
  preprocessor lines between the return type and the name;
* ATen functors and kernel functions under `ATen/native/` (a pytorch checkout's
  `aten/src/ATen/native/` or an installed torch's `include/ATen/native/`): `struct`/`class`
  definitions (`CUDAFunctor_add`, `sum_functor`) and `void` functions (`GeluCUDAKernelImpl`,
  `direct_copy_kernel_cuda`) -- the op-specific part of a generic elementwise/reduce kernel;
* launchers: the Python function that launches a Triton kernel (`kernel[grid](...)`) and the
  host function that launches a CUDA kernel (`kernel<<<...>>>`, `hipLaunchKernelGGL`);
* which test files (`test_*.py`, `*_test.py`) mention each kernel or launcher name.

Directories named in `SKIP_DIRS`, and hidden ones, are not entered; `third_party` is among
them because vendored copies (CUTLASS, NCCL, flash-attention) would duplicate definitions:
pass such a tree as a repository of its own to index it.
"""

from __future__ import annotations

import bisect
import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

SOURCE_EXTENSIONS = frozenset({".py", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".hip"})
SKIP_DIRS = frozenset({"build", "dist", "_build", "node_modules", "third_party", "3rdparty", "__pycache__",
                       "venv", "site-packages", "CMakeFiles"})
MAX_FILE_BYTES = 2 * 1024 * 1024

_PY_DEF = re.compile(r"def[ \t]+(\w+)[ \t]*\(")  # literal prefix: the regex engine skips ahead fast
# ``...jit`` also covers a project's own wrapper (``@triton_jit``, ``@tl.jit``), but not ``@torch.jit.script``.
_TRITON_DECORATOR = re.compile(
    r"@(?:triton\.autotune|triton\.heuristics|libentry|triton_heuristics\.\w+|(?:\w+\.)*\w*jit)\b(?!\.)")
_GLOBAL = re.compile(r"\b__global__\b")
_PP_LINE = re.compile(r"^[ \t]*#.*$", re.M)
_ATTRIBUTE = re.compile(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)|__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
_KERNEL_NAME = re.compile(r"\s*(?:[A-Za-z_][\w:]*(?:<[^;{}()]*?>)?[\s*&]+){0,6}?([A-Za-z_]\w*)\s*\(")
_MACRO_CALL = re.compile(r"\b[A-Z][A-Z0-9_]*\s*\([^()]*\)")
_NAMESPACE = re.compile(r"\bnamespace\s+([\w:]+)")
_ATEN_TYPE = re.compile(r"^[ \t]*(?:template\s*<[^;{]*?>\s*)?(?:struct|class)\s+(?:C10_\w+\s+)?(\w+)[^;{]*\{", re.M)
_ATEN_FUNCTION = re.compile(r"^(?:(?:static|inline|C10_\w+)\s+)*void\s+(\w+)\s*\([^;{]*\)\s*(?:const\s*)?\{", re.M)
_CXX_LAUNCH = re.compile(r"(?:\b(\w+)[\s\\]*(?:<(?:[^<>;]|<[^<>;]*>)*>)?[\s\\]*<<<)|"  # `\` continues macros
                         r"(?:hipLaunchKernelGGL\s*\(\s*\(?\s*(?:HIP_KERNEL_NAME\s*\()?\s*([\w:]+))")
_CXX_FUNCTION_HEAD = re.compile(
    r"^(?!(?:if|for|while|switch|return|namespace|struct|class|template|typedef|using|else|case|do)\b)"
    r"[A-Za-z_][\w:<>,\t *&]*?\b(\w+)[ \t]*\(", re.M)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_DEFINE = re.compile(r"[ \t]*#[ \t]*define[ \t]+(\w+)")
_TRAILING_IDENTIFIER = re.compile(r"([A-Za-z_]\w*)$")
_REMOTE_URL = re.compile(r"^\s*url\s*=\s*(\S+)", re.M)
_GITHUB = re.compile(r"github\.com[:/]([^/\s]+)/([^/\s]+?)(?:\.git)?/?$")
# Launcher names too generic to say anything about which test exercises a kernel.
_GENERIC_LAUNCHERS = frozenset({"forward", "backward", "apply", "__call__", "main", "run", "wrapper", "launch",
                                "kernel", "fn", "f", "grid", "test", "benchmark", "_"})


@dataclass(frozen=True)
class Repository:
    root: Path
    label: str       # the GitHub repository name, or the directory name
    var: str         # `$LABEL_DIR`, how paths are written in the report (Magpie's convention)
    web_base: str    # `https://github.com/<owner>/<repo>/blob/<commit>`, or '' when unknown

    def display(self, path: str) -> str:
        return f"{self.var}/{path}"

    def url(self, path: str, line: int | None = None) -> str:
        if not self.web_base:
            return ""
        return f"{self.web_base}/{path}" + (f"#L{line}" if line else "")


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str                      # 'triton', 'cuda' (a __global__ function) or 'aten' (functor / kernel function)
    repo: Repository
    path: str                      # POSIX path relative to the repository root
    line: int
    namespaces: frozenset[str] = frozenset()
    in_test: bool = False          # defined in a test file

    @property
    def location(self) -> str:
        return f"{self.repo.display(self.path)}:{self.line}"


@dataclass
class SourceIndex:
    repositories: tuple[Repository, ...]
    definitions: dict[str, list[Definition]] = field(default_factory=dict)
    launchers: dict[str, set[str]] = field(default_factory=dict)      # kernel -> functions that launch it
    test_mentions: dict[str, list[tuple[Repository, str]]] = field(default_factory=dict)
    files_read: int = 0
    seconds: float = 0.0

    def lookup(self, name: str) -> list[Definition]:
        return self.definitions.get(name, [])


def build_index(roots: Sequence[Path | str]) -> SourceIndex:
    """Index the given local directories. A path that is not a directory is an error."""
    started = time.perf_counter()
    repositories: list[Repository] = []
    seen: set[Path] = set()
    for root in roots:
        path = Path(root).expanduser().resolve()
        if not path.is_dir():
            raise NotADirectoryError(f"kernel source repository is not a directory: {root}")
        if path not in seen:
            seen.add(path)
            repositories.append(_describe(path, {r.var for r in repositories}))
    collector = _Collector()
    for repo in repositories:
        for file_path, rel in _walk(repo.root):
            collector.read(repo, file_path, rel)
    index = collector.finish(tuple(repositories))
    index.seconds = time.perf_counter() - started
    return index


def _walk(root: Path) -> Iterator[tuple[str, str]]:
    prefix = len(os.path.join(str(root), ""))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS
                       and not d.endswith(".egg-info")]
        for filename in filenames:
            if os.path.splitext(filename)[1] in SOURCE_EXTENSIONS:
                full = os.path.join(dirpath, filename)
                yield full, full[prefix:].replace(os.sep, "/")


def _is_test_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


class _Collector:
    """Accumulates what one walk finds; launches and test mentions are resolved at the end,
    once every kernel name is known."""

    def __init__(self) -> None:
        self.definitions: dict[str, list[Definition]] = defaultdict(list)
        self.launches: list[tuple[str, str]] = []           # (kernel, launching function)
        self.tests: list[tuple[Repository, str, str]] = []   # held until all names are known
        self.files_read = 0

    def read(self, repo: Repository, path: str, rel: str) -> None:
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                return
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            return  # unreadable (permissions, dangling link): nothing to index there
        self.files_read += 1
        if rel.endswith(".py"):
            self._python(repo, rel, text)
        else:
            self._cxx(repo, rel, text)

    def _python(self, repo: Repository, rel: str, text: str) -> None:
        in_test = _is_test_file(rel)
        if in_test:
            self.tests.append((repo, rel, text))
        if "triton" not in text and "libentry" not in text:
            return
        decorators = [m.end() for m in _TRITON_DECORATOR.finditer(text) if _starts_line(text, m.start())]
        launches = _python_launches(text) if "](" in text else []
        if not decorators and not launches:
            return
        defs = _python_defs(text)
        starts = [d[0] for d in defs]
        lines = _LineCounter(text)
        recorded: set[int] = set()
        for end in decorators:
            k = bisect.bisect_left(starts, end)
            if k < len(defs) and k not in recorded:
                recorded.add(k)
                self.definitions[defs[k][2]].append(
                    Definition(defs[k][2], "triton", repo, rel, lines.line(defs[k][0]), in_test=in_test))
        # A function launched as ``name[grid](...)`` in its own file is a Triton kernel, whatever
        # decorator made it one.
        by_name = {d[2]: k for k, d in enumerate(defs)}
        for kernel, _offset in launches:
            k = by_name.get(kernel)
            if k is not None and k not in recorded:
                recorded.add(k)
                self.definitions[kernel].append(
                    Definition(kernel, "triton", repo, rel, lines.line(defs[k][0]), in_test=in_test))
        for kernel, offset in launches:
            launcher = _enclosing_python_def(defs, starts, offset, text)
            if launcher:
                self.launches.append((kernel, launcher))

    def _cxx(self, repo: Repository, rel: str, text: str) -> None:
        has_global = "__global__" in text
        is_aten = "/ATen/native/" in f"/{rel}"  # a pytorch checkout or an installed torch's include/
        if not (has_global or is_aten or "<<<" in text or "hipLaunchKernelGGL" in text):
            return
        lines = _LineCounter(text)
        namespaces = frozenset(part for m in _NAMESPACE.finditer(text) for part in m.group(1).split("::"))
        if has_global:
            for match in _GLOBAL.finditer(text):
                found = _kernel_after_global(text, match.end())
                if found:
                    name, offset = found
                    self.definitions[name].append(
                        Definition(name, "cuda", repo, rel, lines.line(offset), namespaces))
        if is_aten:
            for pattern in (_ATEN_TYPE, _ATEN_FUNCTION):
                for match in pattern.finditer(text):
                    self.definitions[match.group(1)].append(
                        Definition(match.group(1), "aten", repo, rel, lines.line(match.start(1)), namespaces))
        if "<<<" in text or "hipLaunchKernelGGL" in text:
            heads = [(m.start(), m.group(1)) for m in _CXX_FUNCTION_HEAD.finditer(text)]
            starts = [h[0] for h in heads]
            for launch in _CXX_LAUNCH.finditer(text):
                kernel = (launch.group(1) or launch.group(2)).rsplit("::", 1)[-1]
                macro = _enclosing_macro(text, launch.start())
                # a launch in a #define runs in every function that expands the macro (vLLM's style)
                sites = _macro_uses(text, macro) if macro else [launch.start()]
                for site in sites:
                    k = bisect.bisect_right(starts, site) - 1
                    if k >= 0:
                        self.launches.append((kernel, heads[k][1]))

    def finish(self, repositories: tuple[Repository, ...]) -> SourceIndex:
        kernels = {name for name, defs in self.definitions.items() if any(d.kind != "aten" for d in defs)}
        launchers: dict[str, set[str]] = defaultdict(set)
        for kernel, launcher in self.launches:
            if kernel in kernels and launcher != kernel and launcher not in _GENERIC_LAUNCHERS:
                launchers[kernel].add(launcher)
        wanted = set(self.definitions) | {name for names in launchers.values() for name in names}
        mentions: dict[str, list[tuple[Repository, str]]] = defaultdict(list)
        for repo, rel, text in self.tests:
            for name in set(_IDENTIFIER.findall(text)) & wanted:
                mentions[name].append((repo, rel))
        return SourceIndex(repositories=repositories, definitions=dict(self.definitions),
                           launchers=dict(launchers), test_mentions=dict(mentions), files_read=self.files_read)


class _LineCounter:
    """Offset -> 1-based line number; offsets mostly come in increasing order, so count onwards."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.offset = 0
        self.lines = 1

    def line(self, offset: int) -> int:
        if offset < self.offset:
            self.offset, self.lines = 0, 1
        self.lines += self.text.count("\n", self.offset, offset)
        self.offset = offset
        return self.lines


def _starts_line(text: str, offset: int) -> bool:
    """Only whitespace between the start of the line and `offset`."""
    line_start = text.rfind("\n", 0, offset) + 1
    return not text[line_start:offset].strip()


def _python_defs(text: str) -> list[tuple[int, int, str]]:
    """(offset, indentation, name) of every `def` that starts a line."""
    defs = []
    for match in _PY_DEF.finditer(text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        prefix = text[line_start:match.start()]
        if not prefix.strip() or prefix.strip() == "async":
            defs.append((match.start(), len(prefix) - len(prefix.lstrip()), match.group(1)))
    return defs


def _python_launches(text: str) -> list[tuple[str, int]]:
    """(kernel, offset) of each `kernel[grid](` launch: from every `](`, back to its `[`."""
    launches = []
    position = text.find("](")
    while position >= 0:
        depth, i = 0, position
        line_start = text.rfind("\n", 0, position) + 1
        while i >= line_start:
            if text[i] == "]":
                depth += 1
            elif text[i] == "[":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        name = _TRAILING_IDENTIFIER.search(text, line_start, i) if i >= line_start else None
        if name:
            launches.append((name.group(1), name.start(1)))
        position = text.find("](", position + 2)
    return launches


def _kernel_after_global(text: str, start: int) -> tuple[str, int] | None:
    """Name and offset of the function declared after a `__global__` at `start`."""
    window = text[start:start + 600]
    cleaned = _ATTRIBUTE.sub(" ", _PP_LINE.sub(" ", window))
    for _ in range(2):
        match = _KERNEL_NAME.match(cleaned)
        if not match:
            return None
        name = match.group(1)
        if not (name.isupper() and len(name) > 1):
            break
        cleaned = _MACRO_CALL.sub(" ", cleaned, count=1)  # LAUNCH_BOUNDS(256) style macros
    else:
        return None
    if name in ("void", "static", "inline", "extern"):
        return None
    return name, start + _find_word(window, name)


def _find_word(text: str, word: str) -> int:
    """Offset of `word` as a whole identifier in `text` (0 when absent); str.find, no regex to compile."""
    position = text.find(word)
    while position >= 0:
        before = text[position - 1] if position else " "
        after = text[position + len(word):position + len(word) + 1]
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return position
        position = text.find(word, position + 1)
    return 0


def _enclosing_python_def(defs: list[tuple[int, int, str]], starts: list[int], offset: int, text: str) -> str:
    """The innermost `def` around `offset`: the nearest one above that is indented less."""
    line_start = text.rfind("\n", 0, offset) + 1
    indent = len(text[line_start:offset]) - len(text[line_start:offset].lstrip())
    k = bisect.bisect_right(starts, offset) - 1
    while k >= 0:
        if defs[k][1] < indent:
            return defs[k][2]
        k -= 1
    return ""


def _enclosing_macro(text: str, offset: int) -> str:
    """Name of the `#define` whose (backslash-continued) body holds `offset`, or ''."""
    line_start = text.rfind("\n", 0, offset) + 1
    while True:
        define = _DEFINE.match(text, line_start)
        if define:
            return define.group(1)
        if line_start == 0:
            return ""
        previous_start = text.rfind("\n", 0, line_start - 1) + 1
        if not text[previous_start:line_start - 1].rstrip().endswith("\\"):
            return ""
        line_start = previous_start


def _macro_uses(text: str, macro: str) -> list[int]:
    """Offsets where `macro(` is expanded, outside any #define."""
    return [m.start() for m in re.finditer(r"\b" + re.escape(macro) + r"\s*\(", text)
            if not _enclosing_macro(text, m.start())]


def _describe(root: Path, taken: set[str]) -> Repository:
    """Label, `$VAR` and web link of a checkout, from its git metadata files (no git command)."""
    git_dir = _git_dir(root)
    owner_repo = None
    commit = ""
    if git_dir is not None:
        config = _read(git_dir / "config") or _read(_common_dir(git_dir) / "config")
        owner_repo = _github_remote(config)
        commit = _head_commit(git_dir)
    label = owner_repo[1] if owner_repo else root.name
    var = "$" + (re.sub(r"[^A-Z0-9]+", "_", label.upper()).strip("_") or "REPO") + "_DIR"
    base, n = var, 2
    while var in taken:
        var = f"{base[:-4]}_{n}_DIR"
        n += 1
    web = f"https://github.com/{owner_repo[0]}/{owner_repo[1]}/blob/{commit}" if owner_repo and commit else ""
    return Repository(root=root, label=label, var=var, web_base=web)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _git_dir(root: Path) -> Path | None:
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git
    pointer = _read(dot_git).strip()  # worktrees and submodules: "gitdir: <path>"
    if pointer.startswith("gitdir:"):
        target = Path(pointer[len("gitdir:"):].strip())
        return target if target.is_absolute() else (root / target).resolve()
    return None


def _common_dir(git_dir: Path) -> Path:
    common = _read(git_dir / "commondir").strip()
    return (git_dir / common).resolve() if common else git_dir


def _github_remote(config: str) -> tuple[str, str] | None:
    """(owner, repo) of the `origin` remote, else of the first remote, when it is on GitHub."""
    sections = re.split(r"^\s*\[", config, flags=re.M)
    remotes = [s for s in sections if s.startswith("remote ")]
    remotes.sort(key=lambda s: not s.startswith('remote "origin"'))
    for section in remotes:
        url = _REMOTE_URL.search(section)
        github = _GITHUB.search(url.group(1)) if url else None
        if github:
            return github.group(1), github.group(2)
    return None


def _head_commit(git_dir: Path) -> str:
    head = _read(git_dir / "HEAD").strip()
    if not head.startswith("ref:"):
        return head if re.fullmatch(r"[0-9a-f]{40}", head) else ""
    ref = head[len("ref:"):].strip()
    common = _common_dir(git_dir)
    for candidate in (git_dir / ref, common / ref):
        sha = _read(candidate).strip()
        if re.fullmatch(r"[0-9a-f]{40}", sha):
            return sha
    for line in _read(common / "packed-refs").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == ref:
            return parts[0]
    return ref.rsplit("/", 1)[-1]  # a branch name still makes a working link

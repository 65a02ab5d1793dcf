"""Kernel source finder: profiler kernel names -> where their source is, and how sure we are.

`find_kernel_sources(names, repos)` parses each name (`names.py`), indexes the given local
checkouts once (`index.py`; nothing is cloned or fetched) and returns a `SourceMatch` per name
with Magpie's 15 source columns (`SOURCE_COLUMNS`, same names and order as Magpie's
`KernelSourceInfo.csv_headers()`) plus `confidence`, `confidence_reason` and `candidates`.
`to_columns` flattens a match into that column order for a CSV writer.

Status (`SourceMatch.status`) and Magpie's `source_resolution` / `source_error`:

    status          source_resolution  source_error                  source_file
    resolved        resolved           ''                            the definition
    ambiguous       unresolved         ambiguous                     '' (see candidates)
    unresolved      unresolved         not_found | substring_match_only | no_repositories
                                       | generated_kernel_not_indexed
    vendor_library  unsupported        vendor_library                ''
    unsupported     unsupported        not_a_kernel | generated_kernel  ''

A file path is only ever given for `resolved`, as in Magpie (fail-closed); every definition
that was considered is in `candidates` as `$REPO_DIR/path:line`.

Confidence (0..1): the probability we would bet that `source_file` is the code that ran.

    0.95  exact Triton function name (`@triton.jit def <name>(`), one definition
    0.90  exact `__global__` name, one definition, and the kernel's innermost namespace (if
          any) is declared in that file
    0.80  generic ATen template (vectorized_elementwise_kernel, reduce_kernel, ...): the op
          functor from its template arguments (`CUDAFunctor_add`, `sum_functor`) found once
    0.75  exact `__global__` name, one definition, but its namespace is not declared there
    0.70  Triton name found only after cutting a dtype/config suffix off the launch name
    0.60  generic template family found, op functor absent or not found: the definition is
          shared by every op that uses the template
    0.50  only a template argument of the kernel (e.g. the activation of act_and_mul) found
    -0.05 from the above when several definitions were narrowed to one (test-file definitions
          set aside, Triton-vs-C++ kind, namespace), or when the ones left are all in one file
          (#ifdef variants, overloads: the file is certain, the first line is given)
    <=0.5 several definitions remain: min(0.5, rule / n), all listed, status ambiguous
    <=0.3 no definition of the name, only of names that contain it: 0.3 / number of
          candidates, status unresolved
    0.0   nothing found; closed-source vendor kernels (cuBLAS, cuBLASLt/nvjet, cuDNN,
          Tensile/hipBLASLt, CUTLASS instances inside cuBLAS), which are not searched;
          runtime memcpy/memset; NCCL/RCCL device kernels (generated at build time)

Test columns: a test file (`test_*.py`, `*_test.py`) that names the kernel, else one that names
a function launching it; same repository first. `test_cmd` runs that file with `-k` on the
test function that mentions it. Baseline columns follow Magpie's convention in that test file
(run_torch > ref_* > torch_* > naive_* > *_native > *_ref > reference_*; a `@perftest`
decorator makes it a `perftest_wrapper`; otherwise `inline_in_test`). `triton_ref_*`: for a
non-Triton kernel, the one Triton kernel whose name holds all the significant words of the
kernel's name (or functor) with the fewest extra words; left empty on a tie.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from engine.sources.index import Definition, Repository, SourceIndex, build_index
from engine.sources.names import KernelName, parse_kernel_names

SOURCE_COLUMNS = ("kind", "category", "source_repo", "source_file", "upstream_url", "test_file", "test_cmd",
                  "baseline_ref_file", "baseline_ref_symbol", "baseline_ref_kind", "triton_ref_file",
                  "triton_ref_symbol", "notes", "source_resolution", "source_error")
EXTRA_COLUMNS = ("confidence", "confidence_reason", "candidates")
COLUMNS = SOURCE_COLUMNS + EXTRA_COLUMNS
STATUSES = ("resolved", "ambiguous", "unresolved", "vendor_library", "unsupported")
_RESOLUTION = {"resolved": "resolved", "ambiguous": "unresolved", "unresolved": "unresolved",
               "vendor_library": "unsupported", "unsupported": "unsupported"}

_VENDOR_WHAT = {
    "cublas": "cuBLAS kernel",
    "cublaslt": "cuBLASLt (nvjet) kernel",
    "cudnn": "cuDNN kernel",
    "tensile": "Tensile/hipBLASLt GEMM solution (assembly generated from logic files)",
    "cutlass": "CUTLASS library instance precompiled into cuBLAS",
}
_BASELINE_PATTERNS = (r"run_torch", r"ref_\w+", r"torch_\w+", r"naive_\w+", r"\w+_native", r"\w+_ref",
                      r"reference_\w+")
_TEST_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(test\w*)[ \t]*\(", re.M)
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_NOT_SIGNIFICANT = frozenset({"kernel", "kernels", "impl", "cuda", "hip", "vectorized", "unrolled", "generic",
                              "templated", "launch", "device", "global", "op", "ops", "func", "functor", "void",
                              "bf", "fp", "fp16", "bf16", "fp32", "fp8", "int8", "half", "float"})
_MAX_CANDIDATES = 20


@dataclass
class SourceMatch:
    kernel: KernelName
    status: str                      # one of STATUSES
    confidence: float
    confidence_reason: str
    candidates: tuple[str, ...] = ()
    source_line: int | None = None
    # Magpie's 15 columns, in SOURCE_COLUMNS order
    kind: str = ""
    category: str = ""
    source_repo: str = ""
    source_file: str = ""
    upstream_url: str = ""
    test_file: str = ""
    test_cmd: str = ""
    baseline_ref_file: str = ""
    baseline_ref_symbol: str = ""
    baseline_ref_kind: str = ""
    triton_ref_file: str = ""
    triton_ref_symbol: str = ""
    notes: str = ""
    source_resolution: str = ""
    source_error: str = ""


def find_kernel_sources(kernel_names: Sequence[str], repos: Sequence[Path | str], *,
                        index: SourceIndex | None = None, platform: str | None = None) -> dict[str, SourceMatch]:
    """`{name: SourceMatch}` for every name. `repos` are local directories (indexed here unless a
    prebuilt `index` is passed); `platform` ('cuda'/'rocm') only tells NCCL from RCCL."""
    if index is None and repos:
        index = build_index(repos)
    finder = _Finder(index)
    return {kernel.raw: finder.match(kernel) for kernel in parse_kernel_names(kernel_names, platform=platform)}


def to_columns(match: SourceMatch) -> dict[str, str | float]:
    """The 15 Magpie columns, then confidence, confidence_reason and candidates (`; `-joined)."""
    row: dict[str, str | float] = {name: getattr(match, name) for name in SOURCE_COLUMNS}
    row["confidence"] = round(match.confidence, 2)
    row["confidence_reason"] = match.confidence_reason
    row["candidates"] = "; ".join(match.candidates)
    return row


def repository_variables(index: SourceIndex) -> dict[str, str]:
    """`{'$VLLM_DIR': '/path/to/vllm', ...}`: what the `$..._DIR` prefixes in the paths stand for."""
    return {repo.var: str(repo.root) for repo in index.repositories}


class _Finder:
    def __init__(self, index: SourceIndex | None) -> None:
        self.index = index
        self._triton_words: list[tuple[Definition, frozenset[str]]] | None = None

    def match(self, kernel: KernelName) -> SourceMatch:
        result = self._locate(kernel)
        result.kind = kernel.magpie_kind
        result.category = kernel.kind
        result.source_resolution = _RESOLUTION[result.status]
        notes = list(kernel.notes)
        if self.index is not None and not kernel.vendor_library and kernel.library not in ("memcpy", "memset"):
            notes.extend(self._triton_reference(kernel, result))
        result.notes = "; ".join(notes)
        return result

    def _locate(self, kernel: KernelName) -> SourceMatch:
        if kernel.vendor_library:
            what = _VENDOR_WHAT.get(kernel.library, f"{kernel.library} kernel")
            return SourceMatch(kernel, "vendor_library", 0.0,
                               f"closed-source {what}: no source exists to find, so none was searched for",
                               source_error="vendor_library")
        if kernel.library in ("memcpy", "memset"):
            return SourceMatch(kernel, "unsupported", 0.0,
                               f"runtime {kernel.library} operation (copy engine or driver), not a kernel with source",
                               source_error="not_a_kernel")
        if self.index is None or not self.index.repositories:
            return SourceMatch(kernel, "unresolved", 0.0, "no repositories given to search",
                               source_error="no_repositories")
        for rank, term in enumerate(kernel.search_terms):
            definitions = _unique(self.index.lookup(term))
            if definitions:
                return self._from_definitions(kernel, term, rank, definitions)
        return self._not_found(kernel)

    def _from_definitions(self, kernel: KernelName, term: str, rank: int,
                          definitions: list[Definition]) -> SourceMatch:
        kept, narrowing = _narrow(definitions, kernel)
        confidence, reason = _rule(kernel, term, rank, kept[0])
        if len(kept) > 1 and len({(d.repo.var, d.path) for d in kept}) == 1:
            # #ifdef variants or overloads of one kernel: the file is certain, the line is the first
            return self._resolved(kernel, kept, confidence - 0.05,
                                  reason + f"; {len(kept)} definitions in that file (#ifdef variants or "
                                  "overloads), the first taken" + _because(narrowing))
        if len(kept) > 1:
            return SourceMatch(kernel, "ambiguous", min(0.5, confidence / len(kept)),
                               f"{len(kept)} definitions of `{term}`" + _because(narrowing)
                               + f"; a single one would have scored {confidence:.2f} ({reason})",
                               candidates=tuple(d.location for d in kept[:_MAX_CANDIDATES]),
                               source_error="ambiguous")
        if narrowing:
            confidence -= 0.05
            reason += f"; {len(definitions)} definitions narrowed to one" + _because(narrowing)
        return self._resolved(kernel, kept, confidence, reason)

    def _resolved(self, kernel: KernelName, kept: list[Definition], confidence: float, reason: str) -> SourceMatch:
        """Resolved to `kept[0]`; every definition in `kept` is listed as a candidate."""
        found = kept[0]
        match = SourceMatch(kernel, "resolved", confidence, reason,
                            candidates=tuple(d.location for d in kept[:_MAX_CANDIDATES]),
                            source_line=found.line, source_repo=found.repo.label,
                            source_file=found.repo.display(found.path),
                            upstream_url=found.repo.url(found.path, found.line))
        self._tests(match, found)
        return match

    def _not_found(self, kernel: KernelName) -> SourceMatch:
        assert self.index is not None
        labels = ", ".join(repo.label for repo in self.index.repositories)
        fragment = kernel.normalized
        if len(fragment) >= 6:
            names = sorted(n for n in self.index.definitions if fragment in n and n != fragment)
            found = [d for n in names for d in self.index.definitions[n]]
            found = [d for d in found if not d.in_test] or found
            if found:
                return SourceMatch(kernel, "unresolved", 0.3 / len(found),
                                   f"no definition named `{fragment}`; {len(found)} definition(s) of names that "
                                   f"contain it: {', '.join(names[:5])}",
                                   candidates=tuple(d.location for d in found[:_MAX_CANDIDATES]),
                                   source_error="substring_match_only")
        searched = ", ".join(f"`{t}`" for t in kernel.search_terms)
        if kernel.magpie_kind == "inductor":
            return SourceMatch(kernel, "unresolved", 0.0,
                               "torch.compile (Inductor) kernel: its source is in the Inductor cache "
                               "(TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_<user>); pass that directory "
                               f"as a repository. Searched {labels}",
                               source_error="generated_kernel_not_indexed")
        if kernel.library in ("nccl", "rccl"):
            return SourceMatch(kernel, "unsupported", 0.0,
                               f"{kernel.library.upper()} device kernels are generated from templates at build time; "
                               f"no definition of {searched} in {labels}", source_error="generated_kernel")
        return SourceMatch(kernel, "unresolved", 0.0, f"no definition of {searched} in {labels}",
                           source_error="not_found")

    def _tests(self, match: SourceMatch, found: Definition) -> None:
        """Fill the test and baseline columns from the best test file that names the kernel or its launcher."""
        assert self.index is not None
        names = [found.name] + sorted(self.index.launchers.get(found.name, ()))
        for name in names:
            hits = self.index.test_mentions.get(name, [])
            if not hits:
                continue
            words = set(_words(name))
            repo, rel = min(hits, key=lambda hit: (hit[0] != found.repo,
                                                   -len(words & set(_words(hit[1].rsplit("/", 1)[-1]))),
                                                   len(hit[1]), hit[1]))
            _fill_test_columns(match, repo, rel, name)
            return

    def _triton_reference(self, kernel: KernelName, match: SourceMatch) -> list[str]:
        """The canonical Triton implementation of the same op, when exactly one stands out."""
        if kernel.library in ("triton", "nccl", "rccl"):
            return []
        wanted = _significant(kernel.functor if kernel.generic_template else kernel.normalized)
        if not wanted or (len(wanted) == 1 and len(next(iter(wanted))) < 4):
            return []
        if self._triton_words is None:
            assert self.index is not None
            self._triton_words = [(d, _significant(d.name)) for defs in self.index.definitions.values()
                                  for d in defs if d.kind == "triton" and not d.in_test]
        scored = sorted(((len(words - wanted), d) for d, words in self._triton_words if wanted <= words),
                        key=lambda pair: (pair[0], pair[1].location))
        if not scored or (len(scored) > 1 and scored[0][0] == scored[1][0]):
            return []
        best = scored[0][1]
        match.triton_ref_file = best.repo.display(best.path)
        match.triton_ref_symbol = best.name
        return [f"triton reference: {best.location}"]


def _unique(definitions: list[Definition]) -> list[Definition]:
    seen: set[tuple[str, str, int]] = set()
    out = []
    for d in definitions:
        key = (d.repo.var, d.path, d.line)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _namespace(kernel: KernelName) -> str:
    """The innermost namespace of a C++ kernel name, when the name is the kernel itself."""
    parts = [p for p in kernel.family.split("::") if p]
    return parts[-2] if len(parts) >= 2 and parts[-1] == kernel.normalized else ""


def _narrow(definitions: list[Definition], kernel: KernelName) -> tuple[list[Definition], list[str]]:
    """Set aside definitions that are less likely the one that ran, while more than one is left."""
    triton = kernel.library == "triton"
    namespace = _namespace(kernel)
    steps: list[tuple[str, Callable[[Definition], bool]]] = [
        ("definitions in test files set aside", lambda d: not d.in_test),
        ("Triton definitions kept" if triton else "C++ definitions kept", lambda d: (d.kind == "triton") == triton)]
    if namespace:
        steps.append((f"files declaring namespace `{namespace}` kept", lambda d: namespace in d.namespaces))
    kept = definitions
    reasons: list[str] = []
    for reason, keep in steps:
        if len(kept) <= 1:
            break
        narrowed = [d for d in kept if keep(d)]
        if narrowed and len(narrowed) < len(kept):
            kept, reasons = narrowed, reasons + [reason]
    return kept, reasons


def _rule(kernel: KernelName, term: str, rank: int, found: Definition) -> tuple[float, str]:
    """(confidence, reason) of one definition found for `term`, the `rank`-th search term."""
    if kernel.generic_template:
        if term == kernel.functor:
            return 0.8, (f"op functor `{term}` of the generic template `{kernel.family}` found at {found.location}; "
                         "the template itself is shared by many ops")
        missing = f"; its functor `{kernel.functor}` was not found" if kernel.functor else ""
        return 0.6, (f"only the generic template `{term}` found at {found.location}: it runs every op that "
                     f"uses it{missing}")
    if rank == 0:
        if found.kind == "triton":
            return 0.95, f"exact Triton function name `{term}` at {found.location}"
        namespace = _namespace(kernel)
        if namespace and namespace not in found.namespaces:
            return 0.75, (f"exact kernel name `{term}` at {found.location}, but that file does not declare "
                          f"namespace `{namespace}`")
        verified = f" in namespace `{namespace}`" if namespace else ""
        return 0.9, f"exact kernel name `{term}`{verified} at {found.location}"
    if term == kernel.functor:
        return 0.5, (f"kernel `{kernel.normalized}` not found; only its template argument `{term}` "
                     f"at {found.location}")
    return 0.7, (f"Triton function `{term}` at {found.location}, after cutting the dtype/config suffix off "
                 f"`{kernel.normalized}`")


def _because(reasons: list[str]) -> str:
    return f" ({'; '.join(reasons)})" if reasons else ""


def _fill_test_columns(match: SourceMatch, repo: Repository, rel: str, name: str) -> None:
    try:
        text = (repo.root / rel).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return  # the file went away since indexing: leave the test columns empty
    test_function = _test_function_naming(text, name)
    match.test_file = repo.display(rel)
    match.test_cmd = f"cd {repo.var} && python -m pytest {rel} -q" + (f" -k {test_function}" if test_function else "")
    match.baseline_ref_file = match.test_file
    for pattern in _BASELINE_PATTERNS:
        found = re.search(rf"^[ \t]*def[ \t]+({pattern})[ \t]*\(", text, re.M)
        if found:
            before = text[:found.start()].rstrip().rsplit("\n", 1)[-1]
            match.baseline_ref_symbol = found.group(1)
            match.baseline_ref_kind = "perftest_wrapper" if "@perftest" in before else "eager_fn"
            return
    match.baseline_ref_symbol = test_function
    match.baseline_ref_kind = "inline_in_test" if test_function else "none"


def _test_function_naming(text: str, name: str) -> str:
    """The first test function whose body mentions `name` ('' when only helpers do)."""
    starts = [(m.start(), m.group(1)) for m in _TEST_DEF.finditer(text)]
    mention = re.compile(rf"\b{re.escape(name)}\b")
    for i, (start, test) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        if mention.search(text, start, end):
            return test
    return ""


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(name)]


def _significant(name: str) -> frozenset[str]:
    return frozenset(w for w in _words(name) if len(w) > 1 and not w.isdigit() and w not in _NOT_SIGNIFICANT)

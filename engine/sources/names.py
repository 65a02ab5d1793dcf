"""GPU kernel names, as a profiler reports them, turned into something to search for.

A name comes from a torch-profiler trace, an ncu report or a rocprof trace: a Triton function
name (`_attn_fwd.kd`, `_fwd_kernel_0d1d2d3de`, `triton_poi_fused_add_0`), a demangled C++
signature (`void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)`), an Itanium
symbol (`_ZN4vllm15rms_norm_kernel...`), a closed library's kernel (`nvjet_sm90_...`,
`Cijk_...`) or a runtime memory operation (`Memcpy HtoD (Pinned -> Device)`).

`parse_kernel_name` / `parse_kernel_names` return a `KernelName`: the searchable identifier,
the library and op kind, the identifiers to look for in source (most specific first) and
whether the kernel belongs to a closed-source library, in which case there is nothing to find.
`magpie_kind` is the same classification in Magpie's vocabulary (triton_jit, inductor,
aten_native, tensile_gemm, ck_tile, aiter, hip_cpp, unknown) for its `kind` CSV column;
Magpie calls every hand-written C++/CUDA/HIP kernel `hip_cpp`, on NVIDIA too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Sequence

LIBRARIES = ("triton", "aten", "cublas", "cublaslt", "cutlass", "cudnn", "flash_attn", "ck", "tensile",
             "aiter", "vllm", "sglang", "nccl", "rccl", "memcpy", "memset", "other")
KINDS = ("gemm", "attention", "elementwise", "reduction", "norm", "moe", "communication", "copy", "other")
VENDOR_LIBRARIES = frozenset({"cublas", "cublaslt", "cudnn", "tensile"})

_MAGPIE_KIND = {"aten": "aten_native", "tensile": "tensile_gemm", "ck": "ck_tile", "aiter": "aiter",
                "vllm": "hip_cpp", "sglang": "hip_cpp", "flash_attn": "hip_cpp", "cutlass": "hip_cpp",
                "nccl": "hip_cpp", "rccl": "hip_cpp"}

# Leading namespace -> library, for demangled C++ names.
_NAMESPACE_LIBRARY = {"at": "aten", "c10": "aten", "at_cuda_detail": "aten", "PyTorchMemEffAttention": "aten",
                      "pytorch_flash": "flash_attn", "flash": "flash_attn", "ck": "ck", "ck_tile": "ck",
                      "aiter": "aiter", "vllm": "vllm", "sglang": "sglang", "sgl_kernel": "sglang",
                      "sgl_hip": "sglang", "cutlass": "cutlass", "cudnn": "cudnn", "cublas": "cublas",
                      "cublasLt": "cublaslt"}

# Templates shared by many ops: the op is the functor in the template arguments.
GENERIC_TEMPLATES = frozenset({
    "vectorized_elementwise_kernel", "unrolled_elementwise_kernel", "elementwise_kernel",
    "vectorized_templated_elementwise_kernel", "elementwise_kernel_with_index", "reduce_kernel",
    "index_elementwise_kernel", "distribution_elementwise_grid_stride_kernel",
})
# Launch wrappers whose first type argument is the real kernel (CUTLASS, CK-tile).
_WRAPPER_TEMPLATES = frozenset({("cutlass", "Kernel"), ("cutlass", "Kernel2"), ("cutlass", "device_kernel"),
                                ("ck_tile", "kentry")})
_WRAPPED_ALIASES = frozenset({"GemmKernel", "Kernel", "KernelType", "Operator", "type", "Params"})

# Identifiers in template arguments that are types or plumbing, never the op.
_NOT_FUNCTORS = frozenset({
    "int", "unsigned", "char", "float", "double", "bool", "long", "short", "signed", "void", "half",
    "true", "false", "const", "volatile", "lambda", "operator", "anonymous_namespace", "_Float16",
    "ReduceOp", "TensorIteratorBase", "TensorIterator", "GeluType", "LoadWithCast", "StoreWithCast",
    "LoadWithoutCast", "StoreWithoutCast", "Array", "array", "native", "detail", "memory",
    # dtype names that the built-in demangler emits without their c10:: qualifier
    "BFloat16", "Half", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz", "complex",
})
_INFRA_NAMESPACES = frozenset({"std", "c10", "cute", "cub", "thrust", "cuda", "hip"})

_QUALIFIED = re.compile(r"(?<!\w)[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_TRITON_SIGNATURE = re.compile(r"_0[cde]+(?:\d+[cde]+)*$")      # Triton 2.x specialisation suffix
_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem|for|spl|sca|unk)_")
_DTYPE = re.compile(r"(?<![a-z])(mxfp4|fp4|fp8|e4m3|e5m2|float8|float_e4m3|float_e5m2|bf16|bfloat16|fp16|f16|float16|half|"
                    r"fp32|f32|float|int8|i8)")
_DTYPE_NAMES = {"mxfp4": "fp4", "fp4": "fp4", "fp8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "float8": "fp8",
                "float_e4m3": "fp8", "float_e5m2": "fp8",
                "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "f16": "fp16", "float16": "fp16",
                "half": "fp16", "fp32": "fp32", "f32": "fp32", "float": "fp32", "int8": "int8", "i8": "int8"}
_TRITON_CONFIG_TOKEN = re.compile(r"^(?:mxfp4|fp4|fp8|bf16|fp16|fp32|int8|[A-Z][A-Z0-9]*)$")

# Ordered: the first rule that matches wins, so the specific ones come first (all-reduce is
# communication, not reduction; reshape_and_cache_flash is a copy, not attention).
_KIND_RULES = tuple((kind, re.compile(pattern)) for kind, pattern in (
    ("communication", r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|"
                      r"sendrecv"),
    ("copy", r"memcpy|memset|copy|reshape_and_cache|concat_and_cache|gather_cache|fill_?buffer"),
    ("moe", r"moe|expert|topk_?gating|matmul_ogs"),
    ("attention", r"attn|attention|sdpa|fmha|(?<![a-z])(?:mha|mla)(?![a-z])|flash_fwd|flash_bwd|flashattn|"
                  r"paged|splitkv"),
    ("norm", r"norm(?!al)|(?<![a-z])rms"),
    ("gemm", r"gemm|gemv|matmul|cijk|nvjet|xmma|tensorop|s16816|hmma|imma|wvsplitk|"
             r"(?<![a-z0-9])(?:mm|bmm|addmm|scaled_mm|linear)(?![a-z0-9])"),
    ("reduction", r"reduc|(?<![a-z0-9])(?:sum|mean|argmax|argmin|cumsum|logsumexp)|softmax|topk"),
    ("elementwise", r"elementwise|vectorized|unrolled|act_and_mul|silu|gelu|relu|rotary|pointwise|"
                    r"(?<![a-z0-9])(?:add|mul|sub|div|neg|exp|abs|fill|cast|where|sigmoid|tanh|pow|rope)(?![a-z0-9])"),
))

_MEMCPY = re.compile(r"^(?:Memcpy\s+(\w+)|MEMORY_COPY_(\w+)|"
                     r"Copy(HostToDevice|DeviceToHost|DeviceToDevice|HostToHost|PeerToPeer)|__amd_rocclr_copy\w*)")
_MEMSET = re.compile(r"^(?:Memset\b|MEMORY_FILL|FillBuffer|__amd_rocclr_fill\w*)")
_NVJET = re.compile(r"^nvjet_")
_CUDNN = re.compile(r"^cudnn|_cudnn_")
_XMMA_OR_ARCH_GEMM = re.compile(r"^(?:sm\d+|ampere|turing|volta|maxwell|hopper|ada|blackwell)_\w*?"
                                r"(?:xmma|gemm|gemv|hmma|imma)")
_CUDNN_CONV = re.compile(r"fprop|dgrad|wgrad|conv")
_CUBLAS_HELPERS = re.compile(r"^(?:gemv2[TN]_kernel|gemvNSP_kernel|gemvx|gemmSN_\w+|gemmk1_kernel|"
                             r"splitKreduce_kernel|cublas)")
_CUTLASS_INSTANCE = re.compile(r"^cutlass(?:3x)?_(?:\d+_|sm\d+_)")
_TENSILE = re.compile(r"^Cijk_")
_TILE = re.compile(r"_(\d+x\d+(?:x\d+)?)_")


@dataclass(frozen=True)
class KernelName:
    raw: str                        # the name as the profiler reported it
    normalized: str                 # the identifier to search for, e.g. `vectorized_elementwise_kernel`
    library: str                    # one of LIBRARIES
    kind: str                       # one of KINDS
    search_terms: tuple[str, ...]   # identifiers to look for in source, most specific first
    vendor_library: bool            # closed-source library kernel: there is no source to find
    magpie_kind: str = "unknown"    # Magpie's KernelKind value for its `kind` column
    family: str = ""                # qualified C++ name without template arguments
    functor: str = ""               # op-specific template argument, e.g. `CUDAFunctor_add`
    generic_template: bool = False  # the family is shared by many ops (the functor names the op)
    dtype: str = ""
    demangled: str = ""             # demangled form of an Itanium `_Z...` name
    notes: tuple[str, ...] = ()     # parsed facts for the `notes` column (tile, MFMA, ...)


def parse_kernel_name(raw: str, *, platform: str | None = None) -> KernelName:
    """One kernel name; `platform` ('cuda' or 'rocm') only decides NCCL versus RCCL."""
    return parse_kernel_names([raw], platform=platform)[0]


def parse_kernel_names(raws: Sequence[str], *, platform: str | None = None) -> list[KernelName]:
    """Many names; mangled ones are demangled in a single c++filt run."""
    bases = [_strip_suffixes(raw.strip()) for raw in raws]
    demangled = demangle_all(bases)
    return [_parse(raw, base, demangled.get(base, ""), platform) for raw, base in zip(raws, bases)]


def demangle_all(symbols: Iterable[str]) -> dict[str, str]:
    """`{symbol: demangled}` for the Itanium (`_Z...`) symbols among `symbols` that could be read.

    c++filt (or llvm-cxxfilt) runs once for all of them when it is on PATH; the symbols it
    cannot demangle (older binutils reject `DF16b`, the bfloat16 type) and every symbol when
    no tool is installed go through `simple_demangle`.
    """
    todo = sorted({s for s in symbols if s.startswith("_Z")})
    result: dict[str, str] = {}
    tool = next((t for t in ("c++filt", "llvm-cxxfilt") if shutil.which(t)), None)
    if todo and tool:
        try:
            proc = subprocess.run([tool], input="\n".join(todo) + "\n", capture_output=True, text=True,
                                  timeout=60, check=False)
            lines = proc.stdout.splitlines()
            if proc.returncode == 0 and len(lines) == len(todo):
                result = {s: d for s, d in zip(todo, lines) if d != s}
        except (OSError, subprocess.TimeoutExpired):
            pass  # the built-in demangler below covers every symbol
    for symbol in todo:
        if symbol not in result and simple_demangle(symbol) != symbol:
            result[symbol] = simple_demangle(symbol)
    return result


_SKIP_IN_ARGS = re.compile(r"L[a-z]n?\d+E|D[FB]\d+[_b]?|Dv\d+_|A\d+_|[ST]\d*_")


def simple_demangle(symbol: str) -> str:
    """Best-effort Itanium demangling: `ns::name<A, B>` with the qualified function name and
    the class/function names found in the rest of the symbol (template arguments first).

    Only what source search needs; literals, builtin types and substitutions are dropped.
    A symbol that is not `_Z...` or cannot be read is returned unchanged.
    """
    if not symbol.startswith("_Z"):
        return symbol
    i = 3 if symbol.startswith("_ZL") else 2
    nested = symbol.startswith("N", i)
    if nested:
        i += 1
        while i < len(symbol) and symbol[i] in "rVKRO":
            i += 1
    parts: list[str] = []
    while i < len(symbol):
        if symbol.startswith("St", i):
            parts.append("std")
            i += 2
        elif symbol[i].isdigit():
            name, i = _source_name(symbol, i)
            if not name:
                break
            if not name.startswith("_GLOBAL__N"):  # anonymous namespace
                parts.append(name)
            if not nested:
                break
        else:
            break
    if not parts:
        return symbol
    args: list[str] = []
    j = i
    while j < len(symbol):
        skip = _SKIP_IN_ARGS.match(symbol, j)
        if skip:
            j = skip.end()
        elif symbol[j].isdigit():
            name, end = _source_name(symbol, j)
            if name and name not in args:
                args.append(name)
            j = end if name else j + 1
        else:
            j += 1
    qualified = "::".join(parts)
    return f"{qualified}<{', '.join(args)}>" if args else qualified


def _source_name(symbol: str, i: int) -> tuple[str, int]:
    """Read `<length><identifier>` at `i`; ('', i + 1) when it is not one."""
    j = i
    while j < len(symbol) and symbol[j].isdigit():
        j += 1
    length = int(symbol[i:j])
    name = symbol[j:j + length]
    if length == 0 or len(name) != length or not _IDENT.fullmatch(name):
        return "", i + 1
    return name, j + length


def _strip_suffixes(name: str) -> str:
    """Drop the AMD code-object suffixes (`.kd`, ` [clone .kd]`)."""
    name = re.sub(r"\s*\[clone [^\]]*\]\s*$", "", name)
    return name[:-3] if name.endswith(".kd") else name


def _parse(raw: str, base: str, demangled: str, platform: str | None) -> KernelName:
    text = raw.strip()
    memory = _parse_memory_op(raw, text)
    if memory is not None:
        return memory
    cxx = demangled or base
    notes: list[str] = []
    if base.startswith("_Z") and not demangled:
        notes.append("mangled name could not be demangled")
    components = _cxx_components(cxx)
    names = [n for n, _ in components if n != "anonymous_namespace" and not n.startswith("{")]
    if not names or not _IDENT.fullmatch(names[-1]):  # not a C++ name: an annotation or a label
        names = [re.sub(r"\W+", "_", cxx).strip("_") or cxx]
        components = [(names[0], "")]
    leaf_args = components[-1][1]
    family = "::".join(names) if len(names) > 1 or leaf_args else ""
    namespaces = names[:-1]
    normalized = names[-1]
    functor = ""

    if namespaces and (namespaces[0], normalized) in _WRAPPER_TEMPLATES:
        inner_names = _wrapped_kernel(leaf_args)
        if inner_names:  # the family stays the wrapper (`cutlass::device_kernel`)
            normalized = inner_names[-1]
            namespaces = namespaces + inner_names[:-1]
            notes.append(f"wrapped by {family}")
    elif leaf_args:
        functor = _functor(leaf_args)

    generic = normalized in GENERIC_TEMPLATES
    is_cxx = bool(namespaces or leaf_args or "(" in cxx or cxx.startswith("void "))
    library, vendor, triton_note = _library(normalized, namespaces, is_cxx, raw, base, platform)
    notes.extend(triton_note)
    magpie_kind = _MAGPIE_KIND.get(library, "hip_cpp" if is_cxx else "unknown")
    search_terms: tuple[str, ...] = ()
    kind = _kind(" ".join((normalized, functor, family)))

    if library == "triton":
        stripped = _TRITON_SIGNATURE.sub("", normalized)
        if stripped != normalized:
            notes.append(f"Triton signature suffix {normalized[len(stripped):]} stripped")
            normalized = stripped
        inductor = _INDUCTOR.match(normalized)
        if inductor:
            magpie_kind = "inductor"
            kind = _inductor_kind(inductor.group(1), normalized)
            notes.append("torch.compile (Inductor) generated")
        else:
            magpie_kind = "triton_jit"
            kind = _kind(normalized)
        search_terms = (normalized, *_triton_variants(normalized))
    elif not vendor:
        first, second = (functor, normalized) if generic else (normalized, functor)
        search_terms = tuple(t for t in (first, second) if t)

    notes.extend(_vendor_notes(library, normalized))
    if functor:
        notes.append(f"functor={functor}")
    dtype = _dtype(cxx)
    if dtype:
        notes.append(f"dtype={dtype}")
    return KernelName(raw=raw, normalized=normalized, library=library, kind=kind, search_terms=search_terms,
                      vendor_library=vendor, magpie_kind=magpie_kind, family=family,
                      functor=functor, generic_template=generic, dtype=dtype,
                      demangled=demangled, notes=tuple(notes))


def _parse_memory_op(raw: str, text: str) -> KernelName | None:
    copy = _MEMCPY.match(text)
    if copy:
        direction = next((g for g in copy.groups() if g), "")
        normalized = f"memcpy_{direction.lower()}" if direction else "memcpy"
        return KernelName(raw=raw, normalized=normalized, library="memcpy", kind="copy", search_terms=(),
                          vendor_library=False, notes=("runtime memory copy",))
    if _MEMSET.match(text):
        return KernelName(raw=raw, normalized="memset", library="memset", kind="copy", search_terms=(),
                          vendor_library=False, notes=("runtime memory set",))
    return None


def _library(name: str, namespaces: list[str], is_cxx: bool, raw: str, base: str,
             platform: str | None) -> tuple[str, bool, list[str]]:
    """(library, vendor_library, notes) from namespaces (innermost first), then name patterns."""
    if _CUTLASS_INSTANCE.match(name):
        # cutlass_library instances (cutlass_80_tensorop_...) are what cuBLAS ships precompiled.
        return "cutlass", True, ["CUTLASS library instance compiled into cuBLAS/cuBLASLt"]
    for namespace in reversed(namespaces):
        library = _NAMESPACE_LIBRARY.get(namespace)
        if library:
            return library, library in VENDOR_LIBRARIES, []
    if name.lower().startswith(("nccl", "rccl")):
        rccl = name.lower().startswith("rccl") or platform == "rocm"
        return ("rccl" if rccl else "nccl"), False, []
    if _NVJET.match(name):
        return "cublaslt", True, []
    if _CUDNN.search(name):
        return "cudnn", True, []
    if _XMMA_OR_ARCH_GEMM.match(name):
        return ("cudnn" if _CUDNN_CONV.search(name) else "cublas"), True, []
    if _CUBLAS_HELPERS.match(name):
        return "cublas", True, []
    if _TENSILE.match(name):
        return "tensile", True, []
    if name.startswith("fmha_cutlass"):
        return "aten", False, []  # PyTorch's memory-efficient attention, generated .cu files
    if name.startswith(("flash_fwd", "flash_bwd")):
        return "flash_attn", False, []
    if is_cxx or base.startswith("_Z") or not _IDENT.fullmatch(base):
        return "other", False, []
    if _INDUCTOR.match(name) or _TRITON_SIGNATURE.search(name):
        return "triton", False, []
    if raw.strip().endswith(".kd"):
        return "triton", False, ["Triton: .kd code-object suffix"]
    # Profilers print C++ kernels with their signature; a bare identifier is a Triton kernel.
    return "triton", False, ["Triton assumed: bare identifier without a C++ signature"]


def _kind(text: str) -> str:
    lowered = text.lower()
    return next((kind for kind, pattern in _KIND_RULES if pattern.search(lowered)), "other")


def _inductor_kind(prefix: str, name: str) -> str:
    fused = name.lower()
    if prefix in ("red", "per"):
        return "norm" if re.search(r"norm(?!al)|rsqrt", fused) else "reduction"
    if prefix == "tem":
        return "gemm" if re.search(r"(?<![a-z])b?mm(?![a-z])|addmm|matmul", fused) else "other"
    return "elementwise" if prefix in ("poi", "for") else "other"


def _triton_variants(name: str) -> tuple[str, ...]:
    """The function name before a dtype/config token, for kernels whose launch name carries
    its specialisation (`_gemm_kernel_bf16_BLOCK_M_128` -> `_gemm_kernel`)."""
    tokens = name.split("_")
    for i, token in enumerate(tokens):
        if i >= 1 and token and _TRITON_CONFIG_TOKEN.match(token):
            head = "_".join(tokens[:i])
            return (head,) if head.strip("_") else ()
    return ()


def _dtype(text: str) -> str:
    found = _DTYPE.search(text.lower())
    return _DTYPE_NAMES[found.group(1)] if found else ""


def _vendor_notes(library: str, name: str) -> list[str]:
    if library == "tensile":
        facts = [(label, re.search(pattern, name)) for label, pattern in
                 (("tile", r"MT(\d+x\d+x\d+)"), ("MFMA", r"MI(\d+x\d+x\d+(?:x\d+)?)"), ("WG", r"WG(\d+_\d+_\d+)"))]
        return [f"{label}={m.group(1).replace('_', 'x')}" for label, m in facts if m]
    if library in ("cublaslt", "cublas", "cutlass", "cudnn"):
        tile = _TILE.search(name + "_")
        return [f"tile={tile.group(1)}"] if tile else []
    return []


def _cxx_components(text: str) -> list[tuple[str, str]]:
    """`[(name, template_args), ...]` of the qualified function name in a demangled signature:
    the return type and the parameter list are dropped."""
    text = text.replace("(anonymous namespace)", "anonymous_namespace")
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        if ch == "(" and depth == 0:
            cut = i
            break
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth = max(depth - 1, 0)
    head = text[:cut].strip()
    qualified = _split_top(head, " ")[-1] if head else ""
    components = []
    for part in _split_top(qualified, "::"):
        lt = part.find("<")
        if lt > 0 and part.endswith(">"):
            components.append((part[:lt], part[lt + 1:-1]))
        elif part:
            components.append((part, ""))
    return components


def _split_top(text: str, sep: str) -> list[str]:
    """Split at `sep` where it is not nested in <>, (), {} or []."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _wrapped_kernel(args: str) -> list[str]:
    """Qualified name of the kernel in a launch wrapper's arguments
    (`cutlass::device_kernel<vllm::cutlass_3x_gemm<...>::GemmKernel>` -> ['vllm', 'cutlass_3x_gemm'])."""
    for arg in _split_top(args, ","):
        if re.match(r"[-\d]", arg):
            continue  # ck_tile::kentry<1, Kernel>: leading integer parameters
        names = [name for name, _ in _cxx_components(arg)]
        while names and names[-1] in _WRAPPED_ALIASES:
            names.pop()
        return names
    return []


def _functor(args: str) -> str:
    """The first identifier in template arguments that names an op rather than a type."""
    for match in _QUALIFIED.finditer(args):
        parts = match.group().split("::")
        last = parts[-1]
        if parts[0] in _INFRA_NAMESPACES or last in _NOT_FUNCTORS or last in _NAMESPACE_LIBRARY:
            continue
        if last.startswith(("__", "_GLOBAL__")):
            continue
        if args[match.start() - 1:match.start()] == "(" and args[match.end():match.end() + 1] == ")":
            continue  # the enum type of a cast literal: `(vllm::Fp8KVCacheDataType)0`
        if last.endswith(("_t", "_traits", "Traits", "Params", "Calculator")):
            continue
        return last
    return ""

"""Kernel source finder: name parsing, local indexing, matching and confidence."""

import csv
import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from engine.sources import (COLUMNS, SOURCE_COLUMNS, build_index, find_kernel_sources, parse_kernel_name,
                            parse_kernel_names, repository_variables, to_columns)
from engine.sources.names import KINDS, LIBRARIES, simple_demangle

DATA = Path(__file__).resolve().parents[1] / "data" / "sources"
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "tracelens-golden" / "h200_real" / "pytorch" / "kernel_summary.csv"
NAME_CASES = json.loads((DATA / "kernel_names.json").read_text())

# Magpie's KernelSourceInfo.csv_headers(), copied here so a change on either side is caught.
MAGPIE_COLUMNS = ["kind", "category", "source_repo", "source_file", "upstream_url", "test_file", "test_cmd",
                  "baseline_ref_file", "baseline_ref_symbol", "baseline_ref_kind", "triton_ref_file",
                  "triton_ref_symbol", "notes", "source_resolution", "source_error"]

ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_mul<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_mul<float>, std::array<char*, 3ul>)"
LAYER_NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
ACT_AND_MUL = "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>(c10::BFloat16 const&)), true>(c10::BFloat16*, c10::BFloat16 const*, int)"
RMS_NORM = "void vllm::rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16 const*, c10::BFloat16 const*, float, int, int)"
RESHAPE = "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, long)"
NVJET = "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.fixture
def repos(tmp_path):
    """Two small checkouts: `kernels` (a GitHub clone: Triton, CUDA, ATen, tests) and `extra`
    (a second `_fwd_kernel`, an `other::rms_norm_kernel`, a test-file Triton kernel)."""
    a = tmp_path / "kernels"
    b = tmp_path / "extra"
    files = {
        "attn": write(a, "ops/attention.py", '''
            import triton
            import triton.language as tl


            @triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
            @triton.jit
            def _attn_fwd(Q, K, V, Out, n, BLOCK: tl.constexpr):
                pid = tl.program_id(0)


            @triton.jit
            def _fwd_kernel(X, Y, n):
                pass


            @triton.jit
            def _add_kernel(X, Y, n):
                pass


            def attention(q, k, v):
                out = q.new_empty(q.shape)
                _attn_fwd[(q.shape[0],)](q, k, v, out, q.shape[0])
                return out
            '''),
        "cu": write(a, "csrc/layernorm_kernels.cu", '''
            #include <cuda_runtime.h>

            namespace vllm {

            template <typename scalar_t, int width>
            __global__ void rms_norm_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ input,
                                            const float epsilon, const int num_tokens, const int hidden_size) {
            }

            template <typename T>
            __device__ __forceinline__ T silu_kernel(const T& x) {
              return x;
            }

            template <typename scalar_t, scalar_t (*ACT_FN)(const scalar_t&), bool act_first>
            __global__ void
            #ifdef USE_ROCM
                __launch_bounds__(1024)
            #endif
                act_and_mul_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ input, const int d) {
            }

            }  // namespace vllm

            void rms_norm(torch::Tensor& out, torch::Tensor& input, double epsilon) {
              dim3 grid(4);
              vllm::rms_norm_kernel<float, 8><<<grid, 256, 0, 0>>>(nullptr, nullptr, 0.f, 1, 1);
            }

            #define LAUNCH_ACTIVATION_GATE_KERNEL(KERNEL, ACT_FIRST)           \\
              VLLM_DISPATCH_FLOATING_TYPES(input.scalar_type(), "act", [&] {   \\
                vllm::act_and_mul_kernel<scalar_t, KERNEL<scalar_t>, ACT_FIRST> \\
                    <<<grid, block, 0, stream>>>(out.data_ptr<scalar_t>(), d);  \\
              });

            void silu_and_mul(torch::Tensor& out,    // [..., d]
                              torch::Tensor& input)  // [..., 2 * d]
            {
              LAUNCH_ACTIVATION_GATE_KERNEL(vllm::silu_kernel, true);
            }
            '''),
        "test_act": write(a, "tests/kernels/test_activation.py", '''
            import torch
            from vllm import _custom_ops as ops


            def torch_silu_and_mul(x):
                d = x.shape[-1] // 2
                return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


            def test_silu_and_mul():
                x = torch.randn(4, 8)
                out = torch.empty(4, 4)
                ops.silu_and_mul(out, x)
                torch.testing.assert_close(out, torch_silu_and_mul(x))
            '''),
        "loops": write(a, "aten/src/ATen/native/cuda/CUDALoops.cuh", '''
            namespace at::native {

            #ifndef USE_ROCM
            template <int vec_size, typename func_t, typename array_t>
            C10_LAUNCH_BOUNDS_1(num_threads())
            __global__ void vectorized_elementwise_kernel(int N, func_t f, array_t data) {
            }
            #else
            template <int vec_size, typename func_t, typename array_t>
            C10_LAUNCH_BOUNDS_1(num_threads())
            __global__ void vectorized_elementwise_kernel(int N, func_t f, array_t data) {
              // the ROCm variant
            }
            #endif

            }  // namespace at::native
            '''),
        "binary": write(a, "aten/src/ATen/native/cuda/BinaryAddSubKernel.cu", '''
            namespace at::native {

            template <typename T>
            struct CUDAFunctor_add {
              using opmath_t = at::opmath_type<T>;
              __device__ T operator()(T a, T b) const { return a + b; }
            };

            void add_kernel_cuda(TensorIteratorBase& iter, const Scalar& alpha_scalar) {
            }

            }  // namespace at::native
            '''),
        "layer_norm": write(a, "aten/src/ATen/native/cuda/layer_norm_kernel.cu", '''
            namespace at::native {
            namespace {

            template <typename T, typename T_ACC, bool compute_rstd>
            __global__ void vectorized_layer_norm_kernel(const int N, T_ACC eps, const T* __restrict__ X) {
            }

            }  // namespace
            }  // namespace at::native
            '''),
        "test_attn": write(a, "tests/test_attention.py", '''
            import torch
            from ops.attention import attention


            def ref_attention(q, k, v):
                return torch.softmax(q @ k.T, -1) @ v


            def test_shapes():
                assert True


            def test_attention_matches_reference():
                q = torch.randn(4, 4)
                torch.testing.assert_close(attention(q, q, q), ref_attention(q, q, q))
            '''),
        "test_norm": write(a, "tests/kernels/test_layernorm.py", '''
            import torch
            from vllm import _custom_ops as ops


            def test_rms_norm():
                out = torch.empty(4)
                ops.rms_norm(out, out, 1e-6)
            '''),
        "extra_fwd": write(b, "triton_ops/prefix_prefill.py", '''
            import triton


            @triton.jit
            def _fwd_kernel(Q, K, V):
                pass
            '''),
        "extra_norm": write(b, "csrc/other_norm.cu", '''
            namespace other {
            __global__ void rms_norm_kernel(float* out) {}
            }
            '''),
        "extra_test_add": write(b, "tests/test_add.py", '''
            import triton


            @triton.jit
            def _add_kernel(X):
                pass
            '''),
    }
    # A clone's metadata, written by hand: the finder reads these files, it never runs git.
    write(a, ".git/config", '''
        [core]
        \trepositoryformatversion = 0
        [remote "origin"]
        \turl = git@github.com:acme/kernels.git
        \tfetch = +refs/heads/*:refs/remotes/origin/*
        ''')
    write(a, ".git/HEAD", "ref: refs/heads/main\n")
    write(a, ".git/refs/heads/main", "0123456789abcdef0123456789abcdef01234567\n")
    return a, b, files


@pytest.mark.parametrize("case", NAME_CASES, ids=lambda c: c["raw"][:60])
def test_name_forms_normalise(case):
    kernel = parse_kernel_name(case["raw"])
    for field in ("normalized", "library", "kind", "family", "functor", "magpie_kind", "dtype"):
        if field in case:
            assert getattr(kernel, field) == case[field], field
    assert kernel.vendor_library == case.get("vendor_library", False)
    if "search_terms" in case:
        assert list(kernel.search_terms) == case["search_terms"]
    for note in case.get("notes", []):
        assert note in kernel.notes
    assert kernel.library in LIBRARIES and kernel.kind in KINDS
    assert kernel.normalized
    # vendor and runtime operations have nothing to search; everything else has something
    assert bool(kernel.search_terms) == (not kernel.vendor_library and kernel.library not in ("memcpy", "memset"))


def test_golden_trace_names_all_classify():
    with GOLDEN.open(newline="", encoding="utf-8") as handle:
        names = [row["Kernel name"] for row in csv.DictReader(handle)]
    assert len(names) >= 7
    parsed = {k.raw: k for k in parse_kernel_names(names)}
    for name, kernel in parsed.items():
        assert kernel.normalized.strip(), name
        assert kernel.library in LIBRARIES and kernel.library != "other", name
        assert kernel.kind in KINDS, name
    by_library = {k.normalized: (k.library, k.kind, k.vendor_library) for k in parsed.values()}
    assert by_library["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"] == ("cublaslt", "gemm", True)
    assert by_library["vectorized_layer_norm_kernel"] == ("aten", "norm", False)
    assert by_library["reduce_kernel"] == ("aten", "reduction", False)
    assert by_library["unrolled_elementwise_kernel"] == ("aten", "copy", False)


def test_rccl_on_rocm_and_nccl_otherwise():
    name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert parse_kernel_name(name).library == "nccl"
    assert parse_kernel_name(name, platform="rocm").library == "rccl"


def test_builtin_demangler_without_cxxfilt(monkeypatch):
    monkeypatch.setattr("engine.sources.names.shutil.which", lambda _tool: None)
    ck = parse_kernel_name("_ZN2ck27kernel_gemm_xdl_cshuffle_v3INS_28GridwiseGemm_xdl_cshuffle_v3IiEELb1ELi1EEEvNT_8ArgumentE")
    assert (ck.normalized, ck.library, ck.kind, ck.functor) == (
        "kernel_gemm_xdl_cshuffle_v3", "ck", "gemm", "GridwiseGemm_xdl_cshuffle_v3")
    act = parse_kernel_name("_ZN4vllm18act_and_mul_kernelIN3c108BFloat16EXadL_ZNS_11silu_kernelIS2_EET_RKS4_EELb1EEEvPS4_PS5_i")
    assert (act.normalized, act.library, act.functor) == ("act_and_mul_kernel", "vllm", "silu_kernel")
    # bfloat16 (DF16b) is a type older c++filt cannot read: the built-in one still finds the name
    assert simple_demangle("_ZN5aiter37dynamic_per_group_scaled_quant_kernelIDF16bDB8_Li32EEEvPT0_PfPKT_PKfiliibPKii") \
        == "aiter::dynamic_per_group_scaled_quant_kernel"
    assert simple_demangle("_Z13add_one_floatPfi") == "add_one_float"
    assert simple_demangle("not_mangled") == "not_mangled"


def test_index_records_kernels_with_lines(repos):
    a, b, files = repos
    index = build_index([a, b])
    triton = {d.name: d for d in index.lookup("_attn_fwd")}
    assert triton["_attn_fwd"].kind == "triton"
    assert triton["_attn_fwd"].line == line_of(files["attn"], "def _attn_fwd(")
    [act] = index.lookup("act_and_mul_kernel")  # __launch_bounds__ and #ifdef between `void` and the name
    assert act.kind == "cuda" and act.line == line_of(files["cu"], "act_and_mul_kernel(")
    assert "vllm" in act.namespaces
    assert [d.kind for d in index.lookup("CUDAFunctor_add")] == ["aten"]
    assert [d.kind for d in index.lookup("add_kernel_cuda")] == ["aten"]
    assert index.lookup("silu_kernel") == []  # a __device__ function is not a kernel
    assert index.launchers["_attn_fwd"] == {"attention"}
    assert index.launchers["rms_norm_kernel"] == {"rms_norm"}
    assert index.launchers["act_and_mul_kernel"] == {"silu_and_mul"}
    assert [rel for _, rel in index.test_mentions["attention"]] == ["tests/test_attention.py"]
    assert index.repositories[0].var == "$KERNELS_DIR" and index.repositories[1].var == "$EXTRA_DIR"
    assert repository_variables(index) == {"$KERNELS_DIR": str(a.resolve()), "$EXTRA_DIR": str(b.resolve())}


def test_index_skips_build_third_party_hidden_and_large_files(tmp_path):
    kernel = "@triton.jit\ndef {name}(x):\n    pass\n"
    for folder, name in (("build", "in_build"), ("third_party/cutlass", "in_third_party"), (".cache", "hidden"),
                         ("node_modules/x", "in_node_modules"), ("src", "kept")):
        write(tmp_path, f"{folder}/k.py", "import triton\n" + kernel.format(name=name))
    write(tmp_path, "src/huge.py", "import triton\n" + kernel.format(name="huge") + "#" * (2 * 1024 * 1024))
    write(tmp_path, "src/notes.txt", "import triton\n" + kernel.format(name="not_source"))
    index = build_index([tmp_path])
    assert set(index.definitions) == {"kept"}


def test_index_rejects_missing_directory(tmp_path):
    with pytest.raises(NotADirectoryError):
        build_index([tmp_path / "absent"])


def test_finder_resolves_triton_and_cuda_to_file_and_line(repos):
    a, b, files = repos
    found = find_kernel_sources(["_attn_fwd.kd", ACT_AND_MUL], [a, b])
    attn = found["_attn_fwd.kd"]
    assert attn.status == "resolved" and attn.source_resolution == "resolved" and attn.source_error == ""
    assert attn.confidence == pytest.approx(0.95)
    assert attn.source_repo == "kernels" and attn.source_file == "$KERNELS_DIR/ops/attention.py"
    assert attn.source_line == line_of(files["attn"], "def _attn_fwd(")
    assert attn.candidates == (f"$KERNELS_DIR/ops/attention.py:{attn.source_line}",)
    assert attn.upstream_url == ("https://github.com/acme/kernels/blob/0123456789abcdef0123456789abcdef01234567/"
                                 f"ops/attention.py#L{attn.source_line}")
    assert (attn.kind, attn.category) == ("triton_jit", "attention")
    # the test that calls the launcher `attention`, with its reference function
    assert attn.test_file == "$KERNELS_DIR/tests/test_attention.py"
    assert attn.test_cmd == ("cd $KERNELS_DIR && python -m pytest tests/test_attention.py -q "
                             "-k test_attention_matches_reference")
    assert (attn.baseline_ref_symbol, attn.baseline_ref_kind) == ("ref_attention", "eager_fn")

    act = found[ACT_AND_MUL]
    assert act.status == "resolved" and act.confidence == pytest.approx(0.9)
    assert act.source_file == "$KERNELS_DIR/csrc/layernorm_kernels.cu"
    assert act.source_line == line_of(files["cu"], "act_and_mul_kernel(")
    assert "namespace `vllm`" in act.confidence_reason
    assert act.kind == "hip_cpp" and act.category == "elementwise"
    # launched from a #define that silu_and_mul() expands; the test calls silu_and_mul
    assert act.test_cmd == ("cd $KERNELS_DIR && python -m pytest tests/kernels/test_activation.py -q "
                            "-k test_silu_and_mul")
    assert (act.baseline_ref_symbol, act.baseline_ref_kind) == ("torch_silu_and_mul", "eager_fn")


def test_finder_narrows_by_namespace_and_test_files(repos):
    a, b, files = repos
    found = find_kernel_sources([RMS_NORM, "_add_kernel"], [a, b])
    rms = found[RMS_NORM]
    assert rms.status == "resolved" and rms.confidence == pytest.approx(0.85)
    assert rms.source_file == "$KERNELS_DIR/csrc/layernorm_kernels.cu"
    assert "namespace `vllm`" in rms.confidence_reason
    # launched by rms_norm(), which the layernorm test calls
    assert rms.test_cmd == "cd $KERNELS_DIR && python -m pytest tests/kernels/test_layernorm.py -q -k test_rms_norm"
    assert rms.baseline_ref_kind == "inline_in_test" and rms.baseline_ref_symbol == "test_rms_norm"
    add = found["_add_kernel"]
    assert add.status == "resolved" and add.confidence == pytest.approx(0.9)
    assert "test files set aside" in add.confidence_reason


def test_finder_lists_both_candidates_of_an_ambiguous_name(repos):
    a, b, files = repos
    match = find_kernel_sources(["_fwd_kernel_0d1d2d3de"], [a, b])["_fwd_kernel_0d1d2d3de"]
    assert match.status == "ambiguous"
    assert match.source_resolution == "unresolved" and match.source_error == "ambiguous"
    assert match.confidence <= 0.5
    assert match.source_file == "" and match.upstream_url == ""
    assert set(match.candidates) == {
        f"$KERNELS_DIR/ops/attention.py:{line_of(files['attn'], 'def _fwd_kernel(')}",
        f"$EXTRA_DIR/triton_ops/prefix_prefill.py:{line_of(files['extra_fwd'], 'def _fwd_kernel(')}",
    }


def test_finder_aten_functor_and_template_family(repos):
    a, b, files = repos
    found = find_kernel_sources([ADD, MUL, LAYER_NORM], [a, b])
    add = found[ADD]
    assert add.status == "resolved" and add.confidence == pytest.approx(0.8)
    assert add.source_file == "$KERNELS_DIR/aten/src/ATen/native/cuda/BinaryAddSubKernel.cu"
    assert add.source_line == line_of(files["binary"], "struct CUDAFunctor_add")
    assert "functor=CUDAFunctor_add" in add.notes
    mul = found[MUL]  # no CUDAFunctor_mul in the tree: only the shared template, in two #ifdef variants
    assert mul.status == "resolved" and mul.confidence == pytest.approx(0.55)
    assert mul.source_file == "$KERNELS_DIR/aten/src/ATen/native/cuda/CUDALoops.cuh"
    assert mul.source_line == line_of(files["loops"], "vectorized_elementwise_kernel(")
    assert len(mul.candidates) == 2 and "2 definitions in that file" in mul.confidence_reason
    assert "CUDAFunctor_mul" in mul.confidence_reason
    norm = found[LAYER_NORM]
    assert norm.status == "resolved" and norm.confidence == pytest.approx(0.9)
    assert norm.source_line == line_of(files["layer_norm"], "vectorized_layer_norm_kernel(")


def test_vendor_kernels_are_reported_not_searched(repos):
    a, b, _ = repos
    names = [NVJET, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_kernel",
             "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
             "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_WG32_8_1_WGM4"]
    for name, match in find_kernel_sources(names, [a, b]).items():
        assert match.status == "vendor_library", name
        assert match.confidence == 0.0 and match.confidence_reason.startswith("closed-source")
        assert match.source_resolution == "unsupported" and match.source_error == "vendor_library"
        assert match.source_file == "" and match.candidates == ()
        assert match.category == "gemm" or "sdpa" in name


def test_unresolved_generated_and_runtime_names(repos, tmp_path):
    a, b, _ = repos
    names = ["triton_poi_fused_add_0", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
             "Memcpy HtoD (Pinned -> Device)", "totally_unknown_kernel", RESHAPE]
    found = find_kernel_sources(names, [a, b])
    assert found[names[0]].source_error == "generated_kernel_not_indexed" and found[names[0]].confidence == 0.0
    assert "TORCHINDUCTOR_CACHE_DIR" in found[names[0]].confidence_reason
    assert (found[names[1]].status, found[names[1]].source_error) == ("unsupported", "generated_kernel")
    assert (found[names[2]].status, found[names[2]].source_error) == ("unsupported", "not_a_kernel")
    assert (found[names[3]].status, found[names[3]].confidence) == ("unresolved", 0.0)
    assert found[names[4]].source_error == "not_found"
    # the Inductor cache, passed as a repository, holds the generated kernel
    cache = tmp_path / "torchinductor_me"
    write(cache, "ab/cabcdef.py", '''
        import triton
        from torch._inductor.runtime import triton_heuristics

        @triton_heuristics.pointwise(size_hints=[1024], filename=__file__)
        @triton.jit
        def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
            pass
        ''')
    inductor = find_kernel_sources(names[:1], [cache])[names[0]]
    assert inductor.status == "resolved" and inductor.confidence == pytest.approx(0.95)
    assert inductor.kind == "inductor"


def test_substring_only_match_is_weak(tmp_path):
    write(tmp_path, "k.py", "import triton\n\n@triton.jit\ndef fused_rotary_embedding_kernel(x):\n    pass\n")
    match = find_kernel_sources(["rotary_embedding"], [tmp_path])["rotary_embedding"]
    assert match.status == "unresolved" and match.source_error == "substring_match_only"
    assert match.confidence == pytest.approx(0.3)
    assert len(match.candidates) == 1 and match.candidates[0].endswith("/k.py:4")
    assert match.source_file == ""


def test_no_repositories_means_unresolved():
    match = find_kernel_sources(["_attn_fwd"], [])["_attn_fwd"]
    assert (match.status, match.source_error, match.confidence) == ("unresolved", "no_repositories", 0.0)
    assert find_kernel_sources([NVJET], [])[NVJET].status == "vendor_library"


def test_to_columns_order_and_values(repos):
    a, b, _ = repos
    found = find_kernel_sources(["_attn_fwd.kd", "_fwd_kernel_0d1d2d3de"], [a, b])
    assert list(SOURCE_COLUMNS) == MAGPIE_COLUMNS
    for match in found.values():
        row = to_columns(match)
        assert list(row) == list(COLUMNS) == MAGPIE_COLUMNS + ["confidence", "confidence_reason", "candidates"]
        assert isinstance(row["confidence"], float) and 0.0 <= row["confidence"] <= 1.0
    ambiguous = to_columns(found["_fwd_kernel_0d1d2d3de"])
    assert ambiguous["candidates"].count(";") == 1 and ambiguous["source_resolution"] == "unresolved"


def test_triton_reference_for_a_cuda_kernel(repos):
    a, b, _ = repos
    write(a, "ops/rmsnorm.py", "import triton\n\n@triton.jit\ndef _rms_norm_fwd(x):\n    pass\n")
    match = find_kernel_sources([RMS_NORM], [a, b])[RMS_NORM]
    assert (match.triton_ref_file, match.triton_ref_symbol) == ("$KERNELS_DIR/ops/rmsnorm.py", "_rms_norm_fwd")


def test_nothing_is_fetched_or_cloned(repos, monkeypatch):
    """Only c++filt may be started; no socket is opened."""
    a, b, _ = repos
    started = []

    def record_run(cmd, *args, **kwargs):
        started.append(cmd[0])
        return real_run(cmd, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError(f"network or process use: {args}")

    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", record_run)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    names = [case["raw"] for case in NAME_CASES]
    found = find_kernel_sources(names, [a, b])
    assert len(found) == len(set(names))
    assert set(started) <= {"c++filt", "llvm-cxxfilt"}
    source = "".join(p.read_text() for p in (Path(__file__).resolve().parents[2] / "engine" / "sources").glob("*.py"))
    for forbidden in ("git clone", "urllib", "requests", "socket", "http.client"):
        assert forbidden not in source


def test_index_is_fast_enough(tmp_path):
    for i in range(3000):
        body = (f"import triton\n\n@triton.jit\ndef k{i}(x):\n    pass\n" if i % 3 == 0 else
                f"namespace n{i} {{\n__global__ void g{i}(float* x) {{}}\n}}\n" if i % 3 == 1 else
                "def helper():\n    return 1\n" * 20)
        write(tmp_path, f"d{i % 50}/f{i}.{'py' if i % 3 != 1 else 'cu'}", body)
    index = build_index([tmp_path])
    assert index.files_read == 3000 and len(index.definitions) == 2000
    assert index.seconds < 5.0

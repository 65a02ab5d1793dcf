"""Perf models of TraceLens's pytorch report (tracelens-reference §3.1, §4).

A model turns one op event (its name, ``args`` and the names of the kernels under it) into
FLOPs, bytes and the ``param:`` columns of its roofline sheet. ``op_metrics`` adds the common
metrics of §4.1 (GFLOPS, TFLOP/s, TB/s, Compute Spec, roofline). The formulas, the parameter
names and their order are TraceLens's, quirks included (tracelens-reference §8.5):

* SDPA bytes use 2 bytes per element whatever the dtype;
* reductions read ``dim`` only from non-string Concrete Inputs, so the output count is 1;
* LayerNorm is always "training" and ``has_bias`` is ``Input Dims[3] is not None`` (always true);
* GEMM bytes use A's dtype for every operand (``_scaled_mm``: 2-byte output for fp8 inputs);
* ``aten::copy_`` (also an H2D/D2H memcpy) is a unary elementwise op;
* convolution bias is "exactly 3 Input Dims", which real ``aten::convolution`` events never have.

Exceptions keep TraceLens's meaning: ``NotImplementedError`` means "no metrics for this op" (the
row is left out of the sheet and of ``unified_perf_summary``); any other exception means the metric
computation failed (left out of the roofline sheet, kept in ``unified_perf_summary`` without
metrics).
"""

from __future__ import annotations

import ast
import re
from math import prod
from typing import Any, Sequence

NAN = float("nan")


class OpView:
    """What a model may look at: the op's name, args, subtree kernel names and step annotation."""

    __slots__ = ("name", "args", "kernel_names", "annotation")

    def __init__(self, name: str, args: dict | None, kernel_names: Sequence[str] = (),
                 annotation: str = "NA") -> None:
        self.name = name
        self.args = args if args is not None else {}
        self.kernel_names = kernel_names
        self.annotation = annotation


# ---------------------------------------------------------------------------- dtype helpers

_BPE: dict[str, int] = {
    **{d: 8 for d in ("double", "long int")},
    **{d: 4 for d in ("float", "scalar", "int")},
    **{d: 2 for d in ("c10::half", "c10::bfloat16")},
    **{d: 1 for d in ("c10::float8_e4m3fnuz", "c10::float8_e4m3fn", "c10::float8_e5m2", "c10::float8_e5m2fnuz",
                      "unsigned char", "signed char", "fp8", "c10::float4_e2m1fn_x2")},
}

_PRECISION: dict[str, str] = {
    "float": "fp32", "double": "fp64", "c10::half": "fp16", "c10::bfloat16": "bf16",
    "c10::float8_e4m3fnuz": "fp8", "c10::float8_e4m3fn": "fp8", "unsigned char": "fp8", "fp8": "fp8",
    "c10::float4_e2m1fn_x2": "fp4",
}


def bytes_per_element(dtype: Any) -> int | None:
    """Bytes per element of a trace dtype string (``Input type`` spelling), None if unknown."""
    if not isinstance(dtype, str):
        return None
    return _BPE.get(dtype.lower())


def precision_of(dtype: Any) -> str | None:
    """Compute-spec precision (``bf16``, ``fp32`` ...) of a trace dtype string."""
    if not isinstance(dtype, str) or not dtype:
        return None
    return _PRECISION.get(dtype.lower())


def _parse_list(text: str) -> list:
    return list(ast.literal_eval(text))


# ---------------------------------------------------------------------------- kernel names

_TENSILE = re.compile(r"^.*C[a-z]{3}_A[a-z]{3}_B[a-z]{3}.*$")


def gemm_transpose(kernel_name: str) -> tuple | None:
    """(trans_a, trans_b) from a GEMM kernel name, or None when the name is not parseable.

    Only hipBLASLt/Tensile (``Cijk_Alik_Bljk...``) and cuBLAS ``nvjet_*`` names are parsed, as in
    the TraceLens that wrote the golden files (its ``sm90_xmma_gemm_*`` GEMMs have no transpose
    column)."""
    if _TENSILE.match(kernel_name):
        ta = tb = None
        if "_Ailk_" in kernel_name:
            ta = False
        elif "_Alik_" in kernel_name:
            ta = True
        if "_Bljk_" in kernel_name:
            tb = False
        elif "_Bjlk_" in kernel_name:
            tb = True
        return (ta, tb)
    if kernel_name.startswith("nvjet"):
        chars = kernel_name.split("_")[-1]
        return (chars[0] == "T", chars[1] == "T")
    return None


# ---------------------------------------------------------------------------- base class

class PerfModel:
    category: str = "other"
    bwd_category: str | None = None
    sheet: str | None = None  # roofline-sheet family; default: category without _fwd/_bwd
    maf: str | None = "vector"  # "matrix" for GEMM/conv/attention/MoE
    dtype_key: str = "dtype_in_out"  # param holding the dtype that sets the precision

    def __init__(self, op: OpView) -> None:
        self.op = op
        self.params: dict[str, Any] = self.parse(op)

    def parse(self, op: OpView) -> dict[str, Any]:
        raise NotImplementedError

    def flops(self) -> float | None:
        raise NotImplementedError

    def bytes(self) -> float | None:
        raise NotImplementedError

    def flops_bwd(self) -> float | None:
        raise NotImplementedError(f"backward pass for {self.op.name} is not defined")

    def bytes_bwd(self) -> float | None:
        raise NotImplementedError(f"backward pass for {self.op.name} is not defined")

    def precision(self) -> str | None:
        dt = self.params.get(self.dtype_key)
        if isinstance(dt, (tuple, list)):
            dt = dt[0] if dt else None
        return precision_of(dt)

    def compute_spec(self) -> str | None:
        p = self.precision()
        if self.maf is None or p is None:
            return None
        return f"{self.maf}_{p}"

    @classmethod
    def sheet_family(cls) -> str:
        if cls.sheet is not None:
            return cls.sheet
        c = cls.category
        for suffix in ("_fwd", "_bwd"):
            if c.endswith(suffix):
                return c[: -len(suffix)]
        return c


# ---------------------------------------------------------------------------- 1. GEMM

class Gemm(PerfModel):
    category = "GEMM"
    maf = "matrix"
    dtype_key = "dtype_A_B"

    def __init__(self, op: OpView) -> None:
        transpose = None
        for k in op.kernel_names:
            transpose = gemm_transpose(k)
            if transpose is not None:
                break
        super().__init__(op)
        self.params.setdefault("B", 1)
        if transpose is not None:
            self.params["transpose"] = transpose
        p = self.params
        self.Bt, self.M, self.N, self.K, self.bias = p["B"], p["M"], p["N"], p["K"], p["bias"]

    @staticmethod
    def _mnk(A: Sequence[int], Bm: Sequence[int]) -> tuple[int, int, int]:
        return A[0], Bm[1], A[1]

    @staticmethod
    def flops_func(M: int, N: int, K: int, bias: bool) -> int:
        return 2 * M * N * K + (M * N if bias else 0)

    @staticmethod
    def bytes_func(M: int, N: int, K: int, bias: bool, bpe_a: int | None, bpe_b: int | None,
                   bpe_bias: int | None, bpe_out: int | None) -> int | None:
        if None in (bpe_a, bpe_b, bpe_bias, bpe_out):
            return None
        return M * K * bpe_a + K * N * bpe_b + M * N * bpe_out + (N if bias else 0) * bpe_bias  # type: ignore[operator]

    def flops(self) -> float | None:
        return self.flops_func(self.M, self.N, self.K, self.bias)

    def bytes(self) -> float | None:
        # Every operand at A's width: the output dtype is not in the trace (TraceLens quirk).
        bpe = bytes_per_element(self.params["dtype_A_B"][0])
        return self.bytes_func(self.M, self.N, self.K, self.bias, bpe, bpe, bpe, bpe)


def _strides(args: dict, i: int, j: int) -> tuple[tuple | None, tuple | None]:
    try:
        s = args["Input Strides"]
    except KeyError:
        return None, None
    return tuple(s[i]), tuple(s[j])


class AtenMm(Gemm):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        A, Bm = a["Input Dims"][0], a["Input Dims"][1]
        sa, sb = _strides(a, 0, 1)
        return {"M": A[0], "N": Bm[1], "K": A[1], "bias": False, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][:2])}


class AtenAddmm(Gemm):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        A, Bm = a["Input Dims"][1], a["Input Dims"][2]
        sa, sb = _strides(a, 1, 2)
        return {"M": A[0], "N": Bm[1], "K": A[1], "bias": True, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][1:3])}


class AtenScaledMm(Gemm):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        A, Bm = dims[0], dims[1]
        sa, sb = _strides(a, 0, 1)
        return {"M": A[0], "N": Bm[1], "K": A[1], "bias": len(dims) == 3, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][:2])}

    def bytes(self) -> float | None:
        bpe = bytes_per_element(self.params["dtype_A_B"][0])
        if bpe is None or bytes_per_element(self.params["dtype_A_B"][1]) is None:
            raise ValueError(f"unsupported dtypes {self.params['dtype_A_B']}")
        out = 2 if bpe == 1 else (bpe if bpe in (2, 4) else None)  # fp8 GEMMs write 16-bit outputs
        return self.bytes_func(self.M, self.N, self.K, self.bias, bpe, bpe, bpe, out)


class AtenBmm(Gemm):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        A, Bm = a["Input Dims"][0], a["Input Dims"][1]
        bt, m, k = A
        n = Bm[2]
        sa, sb = _strides(a, 0, 1)
        return {"B": bt, "M": m, "N": n, "K": k, "bias": False, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][:2])}

    def flops(self) -> float | None:
        return self.Bt * super().flops()  # type: ignore[operator]

    def bytes(self) -> float | None:
        per = super().bytes()
        return None if per is None else self.Bt * per


class AtenBaddbmm(AtenBmm):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        A, Bm = a["Input Dims"][1], a["Input Dims"][2]
        bt, m, k = A
        n = Bm[2]
        sa, sb = _strides(a, 1, 2)
        return {"B": bt, "M": m, "N": n, "K": k, "bias": True, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][1:3])}


class LinearLikeGemm(Gemm):
    """``y = x @ W^T (+ b)`` custom ops (vLLM ``rocm_unquantized_gemm``): x [.., K], W [N, K]."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        x, w = dims[0], dims[1]
        sa, sb = _strides(a, 0, 1)
        return {"M": prod(x[:-1]), "N": w[0], "K": x[-1], "bias": len(dims) > 2 and bool(dims[2]),
                "stride_A": sa, "stride_B": sb, "dtype_A_B": tuple(a["Input type"][:2])}


class DynamicQuantGemm(Gemm):
    """``vllm::gemm_with_dynamic_quant``: the first two 2-D inputs are x [M, K] and W [N, K/2]."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        two_d = [d for d in a.get("Input Dims", []) if isinstance(d, list) and len(d) == 2]
        if len(two_d) < 2:
            raise ValueError("vllm::gemm_with_dynamic_quant: no 2-D A, B in Input Dims")
        A, W = two_d[0], two_d[1]
        sa, sb = _strides(a, 0, 1)
        return {"M": A[0], "N": W[0], "K": A[1], "bias": False, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][:2])}


class TePseudoGemm(Gemm):
    """TransformerEngine v2 pseudo GEMM ops (``_Linear_yfwd_mm`` ...): A [M, K] x B [K, N]; the
    output is always 16-bit."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        A, Bm = a["Input Dims"][0], a["Input Dims"][1]
        sa, sb = _strides(a, 0, 1)
        return {"M": A[0], "N": Bm[1], "K": A[1], "bias": False, "stride_A": sa, "stride_B": sb,
                "dtype_A_B": tuple(a["Input type"][:2])}

    def bytes(self) -> float | None:
        d = self.params["dtype_A_B"]
        if d[0] != d[1]:
            raise ValueError(f"A and B dtypes differ: {d}")
        bpe = bytes_per_element(d[0])
        return self.bytes_func(self.M, self.N, self.K, self.bias, bpe, bpe, bpe, 2)


# ---------------------------------------------------------------------------- 2. convolution

class Conv(PerfModel):
    category = "CONV_fwd"
    bwd_category = "CONV_bwd"
    maf = "matrix"
    dtype_key = "dtype_input_weight"
    _offset = 0  # index of the input tensor; convolution_backward has grad_output first

    def __init__(self, op: OpView) -> None:
        super().__init__(op)
        p = self.params
        self.x, self.w = p["input_shape"], p["filter_shape"]
        self.bias, self.transposed = p["bias"], p["transposed_conv"]
        n = len(self.x) - 2
        xs, ws = self.x[2:], self.w[2:]
        if not self.transposed:
            sp = tuple(int((xs[i] + 2 * p["padding"][i] - p["dilation"][i] * (ws[i] - 1) - 1) / p["stride"][i]) + 1
                       for i in range(n))
            out_c = self.w[0]
        else:
            sp = tuple((xs[i] - 1) * p["stride"][i] - 2 * p["padding"][i] + p["dilation"][i] * (ws[i] - 1)
                       + p["output_padding"][i] + 1 for i in range(n))
            out_c = self.w[1]
        self.out = (self.x[0], out_c) + sp

    @staticmethod
    def _tup(s: str) -> tuple:
        return tuple(int(x) for x in s[1:-1].split(","))

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        o = self._offset
        dims, ci = a["Input Dims"], a["Concrete Inputs"]
        x, w = tuple(dims[o]), tuple(dims[o + 1])
        n = len(x) - 2
        stride = self._tup(ci[o + 3]) if ci[o + 3] != "" else (1,) * n
        padding = self._tup(ci[o + 4]) if ci[o + 4] != "" else (0,) * n
        dilation = self._tup(ci[o + 5]) if ci[o + 5] != "" else (1,) * n
        transposed = ast.literal_eval(ci[o + 6])
        out_pad = self._tup(ci[o + 7]) if ci[o + 7] != "" else (0,) * n
        groups = int(ci[o + 8])
        stride, padding, dilation, out_pad = (t * n if len(t) == 1 else t for t in (stride, padding, dilation, out_pad))
        dtypes = tuple(a["Input type"][o:o + 2])
        if dtypes[0] != dtypes[1]:
            raise ValueError(f"input and weight dtypes differ: {dtypes}")
        si, sw = _strides(a, o, o + 1)
        nd = {3: "conv1d", 4: "conv2d", 5: "conv3d"}.get(len(x))
        if nd is None:
            raise ValueError(f"unknown convolution rank {len(x)}")
        bias = (len(dims) == 3) if o == 0 else bool(len(dims) > 3 and dims[3])
        return {"convNd": nd, "input_shape": x, "filter_shape": w, "dtype_input_weight": dtypes,
                "input_stride": si, "weight_stride": sw, "bias": bias, "stride": stride, "padding": padding,
                "dilation": dilation, "transposed_conv": transposed, "output_padding": out_pad, "groups": groups}

    @staticmethod
    def flops_func(x: tuple, w: tuple, out: tuple, bias: bool, transposed: bool = False) -> int:
        per = 2 * prod(w[1:])
        return (prod(x) if transposed else prod(out)) * per + (prod(out) if bias else 0)

    @staticmethod
    def bytes_func(x: tuple, w: tuple, out: tuple, bias: bool, bpe: int | None) -> int | None:
        if bpe is None:
            return None
        return (prod(x) + prod(w) + (out[1] if bias else 0) + prod(out)) * bpe

    @staticmethod
    def _t(s: tuple) -> tuple:
        return (s[1], s[0]) + tuple(s[2:])

    def _flops_bwd(self) -> int:
        x, w, out = self.x, self.w, self.out
        g_in = self.flops_func(out, w, x, False, not self.transposed)
        if not self.transposed:
            g_w = self.flops_func(self._t(x), self._t(out), self._t(w), False, False)
        else:
            g_w = self.flops_func(self._t(out), self._t(x), self._t(w), False, False)
        return g_in + g_w + (prod(out) if self.bias else 0)

    def _bytes_bwd(self) -> int | None:
        bpe = bytes_per_element(self.params["dtype_input_weight"][0])
        if bpe is None:
            return None
        x, w, out = self.x, self.w, self.out
        return (self.bytes_func(out, w, x, False, bpe) + self.bytes_func(out, x, w, False, bpe)  # type: ignore[operator]
                + ((prod(out) + out[1]) if self.bias else 0))

    def flops(self) -> float | None:
        return self.flops_func(self.x, self.w, self.out, self.bias, self.transposed)

    def bytes(self) -> float | None:
        return self.bytes_func(self.x, self.w, self.out, self.bias,
                               bytes_per_element(self.params["dtype_input_weight"][0]))

    def flops_bwd(self) -> float | None:
        return self._flops_bwd()

    def bytes_bwd(self) -> float | None:
        return self._bytes_bwd()


class ConvBackward(Conv):
    category = "CONV_bwd"
    bwd_category = "CONV_bwd"
    _offset = 1

    def flops(self) -> float | None:
        return self._flops_bwd()

    def bytes(self) -> float | None:
        return self._bytes_bwd()


# ---------------------------------------------------------------------------- 3. attention

def _sdpa_cfg(q: Sequence[int], k: Sequence[int], v: Sequence[int], bhnd: Sequence[int]) -> dict[str, int]:
    bq, hq, nq, dq = (q[i] for i in bhnd)
    bk, hk, nk, dk = (k[i] for i in bhnd)
    bv, hv, nv, dv = (v[i] for i in bhnd)
    if bq != bk or bq != bv:
        raise ValueError("batch sizes differ")
    if hk != hv:
        raise ValueError("K and V head counts differ")
    if nk != nv:
        raise ValueError("K and V lengths differ")
    if dq != dk:
        raise ValueError("Q and K head dims differ")
    return {"B": bq, "N_Q": nq, "H_Q": hq, "N_KV": nk, "H_KV": hk, "d_h_qk": dq, "d_h_v": dv}


def _flag(text: str, default: bool = False) -> bool:
    return text.lower() == "true" if text not in ("", "None") else default


def _dropout(text: str) -> float:
    if text in ("", "None"):
        return 0.0
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


class Sdpa(PerfModel):
    category = "SDPA_fwd"
    bwd_category = "SDPA_bwd"
    maf = "matrix"
    dtype_key = "dtype_A_B"

    def __init__(self, op: OpView) -> None:
        super().__init__(op)
        p = self.params
        self.B, self.N_Q, self.H_Q, self.N_KV, self.H_KV, self.d_qk, self.d_v = (
            p["B"], p["N_Q"], p["H_Q"], p["N_KV"], p["H_KV"], p["d_h_qk"], p["d_h_v"])

    @staticmethod
    def flops_func(B: int, N_Q: int, H_Q: int, N_KV: int, d_qk: int, d_v: int, causal: Any) -> float:
        total: float = B * H_Q * (2 * N_Q * N_KV * d_qk) + B * H_Q * (2 * N_Q * d_v * N_KV)
        if causal:
            if N_Q != N_KV:
                raise ValueError(f"causal with N_Q != N_KV: {N_Q} != {N_KV}")
            total /= 2
        return total

    def flops(self) -> float | None:
        return self.flops_func(self.B, self.N_Q, self.H_Q, self.N_KV, self.d_qk, self.d_v, self.params["causal"])

    def bytes(self, bpe: int = 2) -> float | None:
        # 2 bytes per element whatever the dtype (TraceLens quirk).
        B = self.B
        return (B * self.N_Q * self.H_Q * self.d_qk + B * self.N_KV * self.H_KV * self.d_qk
                + B * self.N_KV * self.H_KV * self.d_v + B * self.N_Q * self.H_Q * self.d_v) * bpe

    def flops_bwd(self) -> float | None:
        B, NQ, HQ, NK, HK, dq, dv = self.B, self.N_Q, self.H_Q, self.N_KV, self.H_KV, self.d_qk, self.d_v
        total = B * HQ * (2 * NQ * NK * dq) if self.params.get("flash_impl") else 0
        total += B * HQ * (2 * NK * NQ * dv) + B * NK * dv * (HQ // HK - 1)  # dV (+ GQA reduce)
        total += B * HQ * (2 * NQ * NK * dv)  # dP
        total += B * HQ * (2 * NQ * NK * dq)  # dQ
        total += B * HQ * (2 * NK * NQ * dq) + B * NK * dq * (HQ // HK - 1)  # dK (+ GQA reduce)
        if self.params.get("causal"):
            if NQ != NK:
                raise ValueError(f"causal with N_Q != N_KV: {NQ} != {NK}")
            total /= 2
        return total

    def bytes_bwd(self, bpe: int = 2) -> float | None:
        B = self.B
        q = B * self.N_Q * self.H_Q * self.d_qk
        k = B * self.N_KV * self.H_KV * self.d_qk
        v = B * self.N_KV * self.H_KV * self.d_v
        do = B * self.N_Q * self.H_Q * self.d_v
        return (q + k + v + do + q + k + v) * bpe


class _AtenSdpa(Sdpa):
    """aten::_scaled_dot_product_*_attention: layout (B, H, N, d)."""

    dropout_idx, causal_idx, flash = 5, 6, False

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, ci = a["Input Dims"], a["Concrete Inputs"]
        cfg = _sdpa_cfg(dims[0], dims[1], dims[2], (0, 1, 2, 3))
        return {**cfg, "dropout": _dropout(ci[self.dropout_idx]), "causal": _flag(ci[self.causal_idx]),
                "flash_impl": self.flash, "dtype_A_B": tuple(a["Input type"][:2])}


class AtenFlashSdpa(_AtenSdpa):
    dropout_idx, causal_idx, flash = 3, 4, True


class AtenEfficientSdpa(_AtenSdpa):
    pass


class AtenCudnnSdpa(_AtenSdpa):
    pass


class EvoformerAttention(Sdpa):
    """EvoformerAttention(Q, K, V, res_mask, pair_bias): Q/K/V [B, N_seq, N_res, H, d]; attention
    over N_res for every (B, N_seq) slice, never causal."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        b, n_seq, n_res, h, d = a["Input Dims"][0]
        types = a.get("Input type", [])
        return {"B": b * n_seq, "N_Q": n_res, "H_Q": h, "N_KV": n_res, "H_KV": h, "d_h_qk": d, "d_h_v": d,
                "causal": False, "flash_impl": False, "dtype_A_B": [types[0] if types else None]}


class FlashAttn(Sdpa):
    """flash_attn::_flash_attn_forward / FlashAttnFunc: layout (B, N, H, d)."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, ci, st = a["Input Dims"], a["Concrete Inputs"], a["Input Strides"]
        cfg = _sdpa_cfg(dims[0], dims[1], dims[2], (0, 2, 1, 3))
        return {**cfg, "q_stride": tuple(st[0]), "k_stride": tuple(st[1]), "v_stride": tuple(st[2]),
                "dropout": float(ci[3]), "causal": ast.literal_eval(ci[5]), "flash_impl": True,
                "dtype_A_B": tuple(a["Input type"][:2])}


class FlashAttnBackward(Sdpa):
    """flash_attn::_flash_attn_backward: dout, q, k, v, ...; metrics are the backward ones."""

    category = "SDPA_bwd"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, st = a["Input Dims"], a["Input Strides"]
        ci = a.get("Concrete Inputs", [])
        cfg = _sdpa_cfg(dims[1], dims[2], dims[3], (0, 2, 1, 3))
        return {**cfg, "q_stride": tuple(st[1]), "k_stride": tuple(st[2]), "v_stride": tuple(st[3]),
                "dropout": float(ci[8]) if len(ci) > 8 and ci[8] else 0.0,
                "causal": ast.literal_eval(ci[10]) if len(ci) > 10 and ci[10] else True,
                "flash_impl": True, "dtype_A_B": tuple(a["Input type"][:2])}

    def flops(self) -> float | None:
        return self.flops_bwd()

    def bytes(self, bpe: int | None = None) -> float | None:  # type: ignore[override]
        return self.bytes_bwd(bytes_per_element(self.params["dtype_A_B"][0]) or 2)


def _varlen_cfg(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> dict[str, int]:
    hq, nq, dq = q[1], q[0], q[2]
    hk, nk, dk = k[1], k[0], k[2]
    hv, nv, dv = v[1], v[0], v[2]
    if hk != hv or nk != nv or dq != dk:
        raise ValueError("inconsistent varlen q/k/v shapes")
    return {"B": 1, "N_Q": nq, "H_Q": hq, "N_KV": nk, "H_KV": hk, "d_h_qk": dq, "d_h_v": dv}


class FlashAttnVarlen(Sdpa):
    """flash_attn::_flash_attn_varlen_forward: a lower bound from num_seqs and max_seqlen."""

    _q, _cu, _ci = 0, 3, 5  # index of q, of cu_seqlens_q, of max_seqlen_q in Concrete Inputs
    _bwd = False

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, ci, st = a["Input Dims"], a["Concrete Inputs"], a["Input Strides"]
        q = self._q
        cfg = _varlen_cfg(dims[q], dims[q + 1], dims[q + 2])
        c = self._ci
        return {**cfg, "q_stride": tuple(st[q]), "k_stride": tuple(st[q + 1]), "v_stride": tuple(st[q + 2]),
                "dropout": float(ci[c + 2]), "causal": ast.literal_eval(ci[c + 4]), "flash_impl": True,
                "dtype_A_B": tuple(a["Input type"][:2]),
                "num_seqs_q": dims[self._cu][0] - 1, "num_seqs_kv": dims[self._cu + 1][0] - 1,
                "max_seqlen_q": float(ci[c]), "max_seqlen_kv": float(ci[c + 1])}

    def _one(self, nq: float, nk: float) -> Any:
        saved = (self.N_Q, self.N_KV)
        self.N_Q, self.N_KV = nq, nk  # type: ignore[assignment]
        try:
            return Sdpa.flops_bwd(self) if self._bwd else self.flops_func(
                self.B, nq, self.H_Q, nk, self.d_qk, self.d_v, self.params["causal"])  # type: ignore[arg-type]
        finally:
            self.N_Q, self.N_KV = saved

    def flops(self) -> float | None:
        p = self.params
        total = self._one(p["max_seqlen_q"], p["max_seqlen_kv"])
        if p["num_seqs_q"] > 1:
            total += (p["num_seqs_q"] - 1) * self._one((self.N_Q - p["max_seqlen_q"]) // (p["num_seqs_q"] - 1),
                                                       (self.N_KV - p["max_seqlen_kv"]) // (p["num_seqs_kv"] - 1))
        return total


class FlashAttnVarlenBackward(FlashAttnVarlen):
    category = "SDPA_bwd"
    _q, _cu, _ci = 1, 9, 11
    _bwd = True

    def bytes(self, bpe: int = 2) -> float | None:
        return self.bytes_bwd(bpe)


class _BnhdSdpa(Sdpa):
    """aiter / flash_attn_3 forward ops: q, k, v in (B, N, H, d); no dtype param (TraceLens leaves
    their Compute Spec empty)."""

    q_idx, dropout_idx, causal_idx = 0, 3, 5

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, ci = a["Input Dims"], a["Concrete Inputs"]
        i = self.q_idx
        cfg = _sdpa_cfg(dims[i], dims[i + 1], dims[i + 2], (0, 2, 1, 3))
        drop = _dropout(ci[self.dropout_idx]) if self.dropout_idx is not None else 0.0
        return {**cfg, "dropout": drop, "causal": _flag(ci[self.causal_idx]), "flash_impl": True}


class AiterFlashAttnFwd(_BnhdSdpa):
    pass


class FlashAttn3Fwd(_BnhdSdpa):
    dropout_idx, causal_idx = None, 24  # type: ignore[assignment]


class AiterFmhaV3Fwd(_BnhdSdpa):
    q_idx, dropout_idx, causal_idx = 1, 4, 6


class _BnhdSdpaBwd(_BnhdSdpa):
    category = "SDPA_bwd"

    def flops(self) -> float | None:
        return self.flops_bwd()

    def bytes(self, bpe: int = 2) -> float | None:
        return self.bytes_bwd(bpe)


class AiterFlashAttnBwd(_BnhdSdpaBwd):
    dropout_idx, causal_idx = 10, 12


class AiterMhaBwd(_BnhdSdpaBwd):
    q_idx, dropout_idx, causal_idx = 1, 6, 8


class AiterFmhaV3Bwd(_BnhdSdpaBwd):
    q_idx, dropout_idx, causal_idx = 1, 7, 9


# ---------------------------------------------------------------------------- 4. inference attention

class InferenceAttention(PerfModel):
    """Paged/varlen attention of an inference step (vLLM ``unified_attention_with_output`` ...).

    FLOPs and bytes come from the step annotation's context (``c_*``) and generation (``g_*``)
    aggregates; head counts and dims from Input Dims (q: [tokens, H_Q, d], k: [..., H_KV, d]).
    """

    category = "InferenceAttention"
    maf = "matrix"
    dtype_key = "dtype_Q"

    def parse(self, op: OpView) -> dict[str, Any]:
        try:
            c_sq, c_sk, c_sqsq, c_sqsk, g_sq, g_sk, g_sqsq, g_sqsk = parse_step_aggregates(op.annotation)
            dims, types = op.args["Input Dims"], op.args["Input type"]
            n_q, h_q, d_qk = dims[0]
            n_kv, h_kv, d_v = dims[1][-3:]
            dtype_q = types[0]
            dtype_kv = types[1] if len(types) > 1 else dtype_q
        except (NotImplementedError, ValueError, IndexError, KeyError, TypeError):
            return {"_no_perf": True}
        return {"B": 1, "N_Q": n_q, "H_Q": h_q, "H_V": h_kv, "H_K": h_kv, "N_KV": n_kv, "H_KV": h_kv,
                "d_h_qk": d_qk, "d_h_v": d_v, "dropout": 0.0, "causal": False, "flash_impl": True,
                "c_sq": c_sq, "c_sk": c_sk, "c_sqsq": c_sqsq, "c_sqsk": c_sqsk,
                "g_sq": g_sq, "g_sk": g_sk, "g_sqsq": g_sqsq, "g_sqsk": g_sqsk,
                "dtype_Q": dtype_q, "dtype_KV": dtype_kv}

    def flops(self) -> float | None:
        p = self.params
        if p.get("_no_perf"):
            return None  # no usable annotation: TraceLens's metric computation then fails
        if p["c_sq"] == 0 and p["g_sq"] == 0:
            raise NotImplementedError("attention model needs a step with context or generation tokens")
        h, dq, dv = p["H_Q"], p["d_h_qk"], p["d_h_v"]
        ctx = h * (2 * p["c_sqsk"] * dq) + h * (2 * p["c_sqsk"] * dv) - h * (p["c_sqsq"] * dq) - h * (p["c_sqsq"] * dv)
        gen = h * (2 * p["g_sqsk"] * dq) + h * (2 * p["g_sqsk"] * dv)
        return ctx + gen

    def bytes(self) -> float | None:
        p = self.params
        if p.get("_no_perf"):
            return None
        bq = bytes_per_element(p["dtype_Q"]) or 2
        bkv = bytes_per_element(p["dtype_KV"]) or 2
        hq, hkv, dq, dv = p["H_Q"], p["H_KV"], p["d_h_qk"], p["d_h_v"]
        new = (p["c_sq"] + p["g_sq"]) * (hq * dq + hq * dv + hkv * dq + hkv * dv) * bq
        past = ((p["c_sk"] - p["c_sq"]) + (p["g_sk"] - p["g_sq"])) * (hkv * dq + hkv * dv) * bkv
        return new + past


class AiterFmhaV3Varlen(InferenceAttention):
    def parse(self, op: OpView) -> dict[str, Any]:
        p = super().parse(op)
        if not p.get("_no_perf"):
            dims = op.args.get("Input Dims") or []
            if len(dims) > 2 and dims[2]:
                p["d_h_v"] = dims[2][-1]
        return p


_VLLM_DETAILED = re.compile(r"[sqk]+")


def parse_step_aggregates(annotation: str) -> tuple[int, int, int, int, int, int, int, int]:
    """(c_sq, c_sk, c_sqsq, c_sqsk, g_sq, g_sk, g_sqsq, g_sqsk) of a vLLM step annotation.

    Detailed form ``execute_<n>_context_<R>(sq..sk..sqsq..sqsk..)_generation_<R>(...)``; the native
    form ``execute_context_<R>(<sum q>)_generation_<R>(<sum q>)`` gives context sums only.
    Raises NotImplementedError when there is no usable annotation (TraceLens's "NA")."""
    text = str(annotation)
    if text == "NA":
        raise NotImplementedError("no step annotation")
    if "sq" not in text:
        parts = text.replace("(", "_").replace(")", "_").split("_")
        if len(parts) < 8:
            raise NotImplementedError("no step annotation")
        c_sq = c_sk = int(parts[3])
        c_sqsq = c_sqsk = int(parts[4])
        return c_sq, c_sk, c_sqsq, c_sqsk, 0, 0, 0, 0
    parts = _VLLM_DETAILED.sub("_", text.replace("(", "_").replace(")", "_")).split("_")
    if len(parts) < 16:
        raise NotImplementedError("no step annotation")
    return (int(parts[5]), int(parts[6]), int(parts[7]), int(parts[8]),
            int(parts[13]), int(parts[14]), int(parts[15]), int(parts[16]))


# ---------------------------------------------------------------------------- 5. elementwise

class UnaryElementwise(PerfModel):
    category = "elementwise"
    sheet = "UnaryElementwise"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        if len(dims) > 1 and dims[1]:
            dt_out, st_out = a["Input type"][1], tuple(a["Input Strides"][1])
        else:
            dt_out, st_out = None, None
        return {"op_shape": tuple(dims[0]), "dtype_in_out": (a["Input type"][0], dt_out),
                "stride_input": tuple(a["Input Strides"][0]), "stride_output": st_out}

    def flops(self) -> float | None:
        return prod(self.params["op_shape"])

    def bytes(self) -> float | None:
        n = prod(self.params["op_shape"])
        din, dout = self.params["dtype_in_out"]
        bi = bytes_per_element(din)
        bo = bytes_per_element(dout) if dout is not None else bi
        if bi is None or bo is None:
            return None
        return n * bi + n * bo


def _broadcast(s1: tuple, s2: tuple) -> tuple:
    n = max(len(s1), len(s2))
    s1 = (1,) * (n - len(s1)) + s1
    s2 = (1,) * (n - len(s2)) + s2
    out = []
    for d1, d2 in zip(s1, s2):
        if d1 != d2 and d1 != 1 and d2 != 1:
            raise ValueError(f"shapes not broadcastable: {s1} and {s2}")
        out.append(max(d1, d2))
    return tuple(out)


class BinaryElementwise(PerfModel):
    category = "elementwise"
    sheet = "BinaryElementwise"
    dtype_key = "dtype_in1_in2_out"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        if len(dims) > 2 and dims[2]:
            dt_out, st_out = a["Input type"][2], tuple(a["Input Strides"][2])
        else:
            dt_out, st_out = None, None
        return {"shape_in1": tuple(dims[0]), "shape_in2": tuple(dims[1]),
                "dtype_in1_in2_out": (a["Input type"][0], a["Input type"][1], dt_out),
                "stride_input1": tuple(a["Input Strides"][0]), "stride_input2": tuple(a["Input Strides"][1]),
                "stride_output": st_out}

    def __init__(self, op: OpView) -> None:
        super().__init__(op)
        self.out_shape = _broadcast(self.params["shape_in1"], self.params["shape_in2"])

    def flops(self) -> float | None:
        return prod(self.out_shape)

    def bytes(self) -> float | None:
        p = self.params
        d1, d2, do = p["dtype_in1_in2_out"]
        b1, b2 = bytes_per_element(d1), bytes_per_element(d2)
        if do is not None:
            bo = bytes_per_element(do)
        elif b1 and b2:
            # Two tensors: the wider one; tensor and scalar: the tensor's.
            bo = max(b1, b2) if (p["shape_in1"] != () and p["shape_in2"] != ()) else b1
        else:
            bo = None
        if None in (b1, b2, bo):
            return None
        return prod(p["shape_in1"]) * b1 + prod(p["shape_in2"]) * b2 + prod(self.out_shape) * bo  # type: ignore[operator]


class SiluAndMul(BinaryElementwise):
    """LigerSiLUMulFunction(a, b): SiLU(a) * b with a, b and the output of one shape."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, st = a["Input Dims"], a["Input Strides"]
        return {"shape_in1": tuple(dims[0]), "shape_in2": tuple(dims[1]),
                "dtype_in1_in2_out": (a["Input type"][0], a["Input type"][1], None),
                "stride_input1": tuple(st[0]), "stride_input2": tuple(st[1]), "stride_output": None}


# ---------------------------------------------------------------------------- 6. reductions

class Reduce(PerfModel):
    category = "reduce"
    sheet = "Reduce"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a.get("Input Dims", [])
        if not dims or dims[0] is None:
            return {"num_input_elems": 0, "num_output_elems": 0, "dtype_in_out": (None, None)}
        shape = tuple(dims[0])
        n_in = prod(shape)
        types = a.get("Input type", [])
        dt_in = types[0] if types else None
        dt_out = a.get("Output type", [None])
        dt_out = dt_out[0] if isinstance(dt_out, list) and dt_out else None
        dim, keepdim = None, False
        ci = a.get("Concrete Inputs", [])
        if len(ci) >= 2:
            scal = ci[1:]
            keep_idx = None
            for i in range(len(scal) - 1, -1, -1):
                if isinstance(scal[i], bool):
                    keepdim, keep_idx = scal[i], i
                    break
            for i in range(len(scal) - 1, -1, -1):
                v = scal[i]
                if i == keep_idx or v is None or isinstance(v, str):
                    continue  # the trace's Concrete Inputs are strings: dim is never read (quirk)
                if isinstance(v, (list, tuple)):
                    dim = [int(d) for d in v]
                    break
                if isinstance(v, int) and not isinstance(v, bool):
                    dim = [int(v)]
                    break
        name = op.name
        if "cumsum" in name or "cumprod" in name:
            n_out = n_in
        elif dim:
            out = list(shape)
            for d in sorted((d if d >= 0 else len(shape) + d for d in dim), reverse=True):
                if 0 <= d < len(out):
                    if keepdim:
                        out[d] = 1
                    else:
                        out.pop(d)
            n_out = prod(out) if out else 1
        else:
            n_out = 1
        rtype = "sum"
        for key in ("mean", "max", "min", "norm"):
            if key in name:
                rtype = key
                break
        return {"num_input_elems": n_in, "num_output_elems": n_out, "dtype_in_out": (dt_in, dt_out),
                "reduce_type": rtype}

    def _bpe(self) -> tuple[int | None, int | None]:
        din, dout = self.params["dtype_in_out"]
        bi = bytes_per_element(din) if isinstance(din, str) and din else None
        bo = (bytes_per_element(dout) if isinstance(dout, str) and dout else None) if dout is not None else bi
        return bi, bo

    def flops(self) -> float | None:
        return self.params["num_input_elems"]

    def bytes(self) -> float | None:
        bi, bo = self._bpe()
        if bi is None or bo is None:
            return None
        return self.params["num_input_elems"] * bi + self.params["num_output_elems"] * bo

    def flops_bwd(self) -> float | None:
        return self.params["num_input_elems"]

    def bytes_bwd(self) -> float | None:
        return self.bytes()


# ---------------------------------------------------------------------------- 7. normalization

class Normalization(PerfModel):
    category = "NORM_fwd"
    bwd_category = "NORM_bwd"
    sheet = "Normalization"

    def __init__(self, op: OpView) -> None:
        super().__init__(op)
        p = self.params
        self.N = prod(p["op_shape"])
        self.C = p["num_channels"]
        din, dout = p["dtype_in_out"]
        self.bpe_in = bytes_per_element(din)
        self.bpe_out = bytes_per_element(dout) if dout is not None else self.bpe_in

    @staticmethod
    def _common(a: dict, i: int) -> tuple[tuple, str, tuple]:
        return tuple(a["Input Dims"][i]), a["Input type"][i], tuple(a["Input Strides"][i])

    def _params(self, shape: tuple, dt: str, st: tuple, C: Any, has_bias: bool, affine: bool, training: bool,
                mask: list | None = None) -> dict[str, Any]:
        p = {"op_shape": shape, "dtype_in_out": (dt, None), "stride_input": st, "stride_output": None,
             "num_channels": C, "has_bias": has_bias, "is_affine": affine, "is_training": training}
        if mask is not None:
            p["output_mask"] = mask
        return p

    def flops(self) -> float | None:
        p = self.params
        f = self.C * 3 + (self.N * 3 if p["is_training"] else 0) + self.C * 3
        return f + 2 * self.N

    def bytes(self) -> float | None:
        p = self.params
        k = 2 + ((1 + (1 if p["has_bias"] else 0)) if p["is_affine"] else 0) + (2 if p["is_training"] else 0)
        if self.bpe_in is None or self.bpe_out is None:
            return None
        return self.N * self.bpe_in + self.N * self.bpe_out + k * self.C * self.bpe_in

    def _flops_bwd(self) -> float:
        p = self.params
        per_c = self.N / self.C
        f = (3 if not p["is_training"] else 0) + 4 * per_c
        mask = p.get("output_mask", [False])
        if mask[0]:
            if p["is_training"]:
                f += 5 * per_c
        else:
            f += 2 * per_c
        return self.C * f

    def _bytes_bwd(self) -> float | None:
        p = self.params
        if self.bpe_in is None or self.bpe_out is None:
            return None
        mask = p.get("output_mask", [False])
        b = self.N * self.bpe_out + self.N * self.bpe_in * (2 if mask[0] and p["is_training"] else 1)
        if p["is_training"]:
            b += self.C * self.bpe_in
        if p["is_affine"]:
            b += self.C * self.bpe_in
            if p["is_training"]:
                b += self.C * self.bpe_in * (2 if p["has_bias"] else 1)
        return b


class _NormBwd(Normalization):
    category = "NORM_bwd"

    def flops(self) -> float | None:
        return self._flops_bwd()

    def bytes(self) -> float | None:
        return self._bytes_bwd()


class BatchNorm(Normalization):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 0)
        # bool() of a string: 'False' is training too (TraceLens quirk).
        return self._params(shape, dt, st, a["Input Dims"][0][1], True, a["Input Dims"][2] is not None,
                            bool(a["Concrete Inputs"][5]))


class BatchNormBwd(_NormBwd):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        if op.name in ("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward"):
            i, has_out, training = 0, True, False
        else:
            i, has_out, training = 1, dims[0] is not None, bool(a["Concrete Inputs"][7])
        shape, dt, st = self._common(a, i)
        return self._params(shape, dt, st, shape[1], True, dims[2] is not None, training, [has_out])


class LayerNorm(Normalization):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 0)
        C = prod(int(x) for x in _parse_list(a["Concrete Inputs"][1]))
        dims = a["Input Dims"]
        # 'is not None' holds for [] too: LayerNorm always has bias and affine (TraceLens quirk).
        return self._params(shape, dt, st, C, dims[3] is not None, dims[2] is not None, True)


class LayerNormBwd(_NormBwd):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 1)
        C = prod(int(x) for x in _parse_list(a["Concrete Inputs"][2]))
        mask = [bool(x) for x in _parse_list(a["Concrete Inputs"][7])]
        return self._params(shape, dt, st, C, mask[2], mask[1], True, mask)


class GroupNorm(Normalization):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 0)
        return self._params(shape, dt, st, shape[1], True, a["Input Dims"][2] is not None, True)


class GroupNormBwd(_NormBwd):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 1)
        mask = [bool(x) for x in _parse_list(a["Concrete Inputs"][9])]
        return self._params(shape, dt, st, shape[1] / int(a["Concrete Inputs"][8]), True,
                            a["Input Dims"][5] is not None, True, mask)


class InstanceNorm(Normalization):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 0)
        return self._params(shape, dt, st, shape[1], True, a["Input Dims"][2] is not None,
                            bool(a["Concrete Inputs"][5]))


class InstanceNormBwd(_NormBwd):
    def parse(self, op: OpView) -> dict[str, Any]:
        raise NotImplementedError("backward pass for InstanceNorm is not defined")


class FusedRMSNorm(Normalization):
    """aten::_fused_rms_norm (a Normalization-sheet op in TraceLens)."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 0)
        C = prod(int(x) for x in _parse_list(a["Concrete Inputs"][1]))
        return self._params(shape, dt, st, C, False, a["Input Dims"][2] is not None, False)

    def flops(self) -> float | None:
        return (self.N / self.C) * (2 * self.C + 2) + self.N * (2 if self.params["is_affine"] else 1)

    def bytes(self) -> float | None:
        if self.bpe_in is None or self.bpe_out is None:
            return None
        return self.N * self.bpe_in + self.N * self.bpe_out + (self.C * self.bpe_in if self.params["is_affine"] else 0)


class FusedRMSNormBwd(_NormBwd):
    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        shape, dt, st = self._common(a, 1)
        C = prod(int(x) for x in _parse_list(a["Concrete Inputs"][2]))
        mask = [bool(x) for x in _parse_list(a["Concrete Inputs"][5])]
        return self._params(shape, dt, st, C, False, a["Input Dims"][4] is not None, False, mask)

    def flops(self) -> float | None:
        p, N = self.params, self.N
        f = (N if p["is_affine"] else 0) + N
        if p["output_mask"][0]:
            f += 6 * N
        if p["output_mask"][1] and p["is_affine"]:
            f += N + (N if N / self.C > 1 else 0)
        return f

    def bytes(self) -> float | None:
        if self.bpe_in is None or self.bpe_out is None:
            return None
        b = self.N * self.bpe_out + self.N * self.bpe_in * 2
        return b + (self.C * self.bpe_in * 2 if self.params["is_affine"] else 0)


class RMSNorm(PerfModel):
    """Custom RMSNorm ops (vLLM/aiter ``rms_norm``, ``fused_add_rms_norm``): input [.., C], weight [C].

    Same formula as ``aten::_fused_rms_norm`` with a weight; the fused-add variants also read and
    write the residual (one more read and write of the activation)."""

    category = "RMSNorm"
    sheet = "RMSNorm"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims, types = a["Input Dims"], a["Input type"]
        # vLLM _C::rms_norm(out, input, weight, eps) has the output first; aiter rms_norm(input, weight, eps).
        i = 1 if op.name.startswith("_C::") and "fused_add" not in op.name else 0
        shape = tuple(dims[i])
        return {"op_shape": shape, "dtype_in_out": (types[i], None), "num_channels": shape[-1],
                "is_affine": True, "fused_add": "add" in op.name.split("::")[-1]}

    def flops(self) -> float | None:
        p = self.params
        N, C = prod(p["op_shape"]), p["num_channels"]
        return (N / C) * (2 * C + 2) + 2 * N + (N if p["fused_add"] else 0)

    def bytes(self) -> float | None:
        p = self.params
        b = bytes_per_element(p["dtype_in_out"][0])
        if b is None:
            return None
        N, C = prod(p["op_shape"]), p["num_channels"]
        return (2 * N + C + (2 * N if p["fused_add"] else 0)) * b


# ---------------------------------------------------------------------------- 8. MoE

_MOE_BPE = {"Float8_e4m3fn": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2": 1, "Float8_e5m2fnuz": 1, "BFloat16": 2,
            "Float16": 2, "Half": 2, "Float32": 4, "Float": 4, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
            "c10::Float8_e4m3fnuz": 1, "c10::Half": 2, "c10::Float": 4, "float": 4}


def expected_active_experts(E: int, topk: int, M: int) -> float:
    """Expected number of distinct experts hit by M tokens routed uniformly to topk of E experts."""
    if E <= 0:
        return 0.0
    return E * (1 - ((E - topk) / E) ** M)


class FusedMoE(PerfModel):
    """One-launch MoE (aiter ``fmoe*`` / vLLM ``rocm_aiter_fused_moe``): hidden [M, K],
    w1 [E, N or 2N, K], w2 [E, K, N], topk_weights [M, topk]."""

    category = "MoE_fused"
    maf = "matrix"
    dtype_key = "input_dtype"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        x, w1, w2, tw = dims[0], dims[1], dims[2], dims[3]
        n = w2[2]
        return {"num_tokens": x[0], "hidden_dim": x[1], "inter_dim": n, "num_experts": w1[0], "topk": tw[1],
                "gated": w1[1] == 2 * n, "input_dtype": a["Input type"][0], "weight_dtype": a["Input type"][1]}

    def flops(self) -> float | None:
        p = self.params
        M, K, N, k = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"]
        return 2 * M * K * N * k * (2 if p["gated"] else 1) + 2 * M * K * N * k + M * K * (2 * k - 1)

    def bytes(self) -> float | None:
        p = self.params
        M, K, N, k, E = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"], p["num_experts"]
        b_in = _MOE_BPE.get(p["input_dtype"], 2)
        b_w = _MOE_BPE.get(p["weight_dtype"], 1)
        ea = expected_active_experts(E, k, M)
        return M * K * b_in + ea * N * K * b_w * (2 if p["gated"] else 1) + ea * N * K * b_w + M * K * b_in


class UnfusedMoEUp(PerfModel):
    """Up/gate projection of an unfused MoE (pseudo op carrying ``MoE topk`` / ``MoE GEMM gated``):
    hidden [M, K], w1 [E, N or 2N, K]."""

    category = "MoE_unfused"
    maf = "matrix"
    dtype_key = "input_dtype"

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        x, w = dims[0], dims[1]
        gated = bool(a["MoE GEMM gated"])
        n = w[1] // 2 if gated else w[1]
        return {"num_tokens": x[0], "hidden_dim": x[1], "inter_dim": n, "num_experts": w[0],
                "topk": a["MoE topk"], "gated": gated, "input_dtype": a["Input type"][0],
                "weight_dtype": a["Input type"][1]}

    def flops(self) -> float | None:
        p = self.params
        return 2 * p["num_tokens"] * p["hidden_dim"] * p["inter_dim"] * p["topk"] * (2 if p["gated"] else 1)

    def bytes(self) -> float | None:
        p = self.params
        M, K, N, k, E = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"], p["num_experts"]
        b_in = _MOE_BPE.get(p["input_dtype"], 2)
        b_w = _MOE_BPE.get(p["weight_dtype"], 1)
        ea = expected_active_experts(E, k, M)
        return M * K * b_in + ea * (2 if p["gated"] else 1) * K * N * b_w + M * N * k * b_in


class UnfusedMoEDown(UnfusedMoEUp):
    """Down projection of an unfused MoE: intermediate [M*topk, N], w2 [E, K, N]."""

    def parse(self, op: OpView) -> dict[str, Any]:
        a = op.args
        dims = a["Input Dims"]
        x, w = dims[0], dims[1]
        k = a["MoE topk"]
        return {"num_tokens": x[0] // k if x[0] % k == 0 else x[0], "hidden_dim": w[1], "inter_dim": w[2],
                "num_experts": w[0], "topk": k, "gated": False, "input_dtype": a["Input type"][0],
                "weight_dtype": a["Input type"][1]}

    def flops(self) -> float | None:
        p = self.params
        return 2 * p["num_tokens"] * p["inter_dim"] * p["hidden_dim"] * p["topk"]

    def bytes(self) -> float | None:
        p = self.params
        M, K, N, k, E = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"], p["num_experts"]
        b_in = _MOE_BPE.get(p["input_dtype"], 2)
        b_w = _MOE_BPE.get(p["weight_dtype"], 1)
        return M * N * k * b_in + expected_active_experts(E, k, M) * N * K * b_w + M * K * b_in


# ---------------------------------------------------------------------------- registry and categories

MODELS: dict[str, type[PerfModel]] = {
    "aten::mm": AtenMm,
    "aten::addmm": AtenAddmm,
    "aten::_scaled_mm": AtenScaledMm,
    "trtllm::cublas_scaled_mm": AtenScaledMm,
    "bitsandbytes::int8_linear_matmul": AtenScaledMm,
    "_Linear_yfwd_mm": TePseudoGemm,
    "_LinearBackward_xgrad_mm": TePseudoGemm,
    "_LinearBackward_wgrad_mm": TePseudoGemm,
    "_LayerNormLinear_yfwd_mm": TePseudoGemm,
    "_LayerNormLinearBackward_xgrad_mm": TePseudoGemm,
    "_LayerNormLinearBackward_wgrad_mm": TePseudoGemm,
    "EvoformerAttention": EvoformerAttention,
    "aten::bmm": AtenBmm,
    "aten::baddbmm": AtenBaddbmm,
    "vllm::gemm_with_dynamic_quant": DynamicQuantGemm,
    "vllm::rocm_unquantized_gemm": LinearLikeGemm,
    "FlashAttnFunc": FlashAttn,
    "flash_attn::_flash_attn_forward": FlashAttn,
    "flash_attn::_flash_attn_backward": FlashAttnBackward,
    "flash_attn::_flash_attn_varlen_forward": FlashAttnVarlen,
    "flash_attn::_flash_attn_varlen_backward": FlashAttnVarlenBackward,
    "aten::_scaled_dot_product_cudnn_attention": AtenCudnnSdpa,
    "aten::_scaled_dot_product_efficient_attention": AtenEfficientSdpa,
    "aten::_scaled_dot_product_flash_attention": AtenFlashSdpa,
    "aten::convolution": Conv,
    "aten::convolution_backward": ConvBackward,
    "aiter::_flash_attn_forward": AiterFlashAttnFwd,
    "aiter::_flash_attn_backward": AiterFlashAttnBwd,
    "aiter::wrapper_fmha_v3_fwd": AiterFmhaV3Fwd,
    "aiter::wrapper_fmha_v3_bwd": AiterFmhaV3Bwd,
    "aiter::mha_fwd": AiterFlashAttnFwd,
    "aiter::fmha_v3_fwd": AiterFlashAttnFwd,
    "aiter::mha_bwd": AiterMhaBwd,
    "flash_attn_3::fwd": FlashAttn3Fwd,
    "vllm::unified_attention_with_output": InferenceAttention,
    "vllm::unified_mla_attention_with_output": InferenceAttention,
    "aiter::mha_varlen_fwd": InferenceAttention,
    "aiter::fmha_v3_varlen_fwd": AiterFmhaV3Varlen,
    "LigerSiLUMulFunction": SiluAndMul,
    "pseudo_op::moe_aiter_fused_1stage": FusedMoE,
    "vllm::rocm_aiter_fused_moe": FusedMoE,
    "pseudo_op::moe_unfused_up": UnfusedMoEUp,
    "pseudo_op::moe_unfused_down": UnfusedMoEDown,
    "vllm::rms_norm": RMSNorm,
    "vllm::fused_add_rms_norm": RMSNorm,
    "_C::rms_norm": RMSNorm,
    "_C::fused_add_rms_norm": RMSNorm,
    "aiter::rms_norm": RMSNorm,
    "aiter::rmsnorm2d_fwd": RMSNorm,
    "aiter::rmsnorm2d_fwd_with_add": RMSNorm,
}
for _n in ("aten::copy", "aten::copy_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max", "aten::clamp_max_",
           "aten::sigmoid", "aten::rsqrt", "aten::silu", "aten::neg", "aten::pow"):
    MODELS[_n] = UnaryElementwise
for _n in ("aten::div", "aten::div_", "aten::mul", "aten::mul_", "aten::add", "aten::add_",
           "aten::sigmoid_backward", "aten::threshold_backward"):
    MODELS[_n] = BinaryElementwise
for _fam, _fwd, _bwd in (("batch_norm", BatchNorm, BatchNormBwd), ("layer_norm", LayerNorm, LayerNormBwd),
                         ("group_norm", GroupNorm, GroupNormBwd), ("instance_norm", InstanceNorm, InstanceNormBwd)):
    for _pre in ("aten::", "aten::native_", "aten::miopen_", "aten::cudnn_"):
        MODELS[f"{_pre}{_fam}"] = _fwd
        MODELS[f"{_pre}{_fam}_backward"] = _bwd
MODELS["aten::_fused_rms_norm"] = FusedRMSNorm
for _n in ("aten::rms_norm_backward", "aten::native_rms_norm_backward", "aten::miopen_rms_norm_backward",
           "aten::cudnn_rms_norm_backward", "aten::_fused_rms_norm_backward"):
    MODELS[_n] = FusedRMSNormBwd
for _n in ("aten::sum", "aten::mean", "aten::max", "aten::min", "aten::norm", "aten::linalg_norm", "aten::std",
           "aten::var", "aten::logsumexp", "aten::cumsum", "aten::cumprod", "aten::amin", "aten::amax"):
    MODELS[_n] = Reduce

# Ops with a category but no model (tracelens-reference §3.1 rule 1).
CATEGORY_ONLY: dict[str, str] = {
    "aten::miopen_convolution": "CONV_fwd",
    "aten::cudnn_convolution": "CONV_fwd",
    "FlashAttnFuncBackward": "SDPA_bwd",
    "FusedAttnFuncBackward": "SDPA_bwd",
    "aten::_scaled_dot_product_cudnn_attention_backward": "SDPA_bwd",
    "aten::_scaled_dot_product_efficient_attention_backward": "SDPA_bwd",
    "aten::_scaled_dot_product_flash_attention_backward": "SDPA_bwd",
    "aten::_efficient_attention_forward": "SDPA_fwd",
    "aten::_efficient_attention_backward": "SDPA_bwd",
    "MambaSplitConv1dScanCombinedFnBackward": "SSM_bwd",
    "DaoAILab::_causal_conv1d_bwd_cpp": "SSM_bwd",
    "TokenPermuteMaskMap": "MoE_comm_fwd",
    "_OperationFuserAutogradFunction": "MoE_comm_fwd",
    "MoEDispatchBackward": "MoE_comm_bwd",
    "MoECombineBackward": "MoE_comm_bwd",
    "TokenPermuteMaskMapBackward": "MoE_comm_bwd",
    "_OperationFuserAutogradFunctionBackward": "MoE_comm_bwd",
    "FusedRoPEFuncBackward": "RoPE_bwd",
    "CrossEntropyFunctionBackward": "CrossEntropy_bwd",
    "aiter::moe_sorting_opus_fwd": "MoE_aux",
    "aiter::moe_align_block_size": "MoE_aux",
    "_moe_C::moe_align_block_size": "MoE_aux",
    "aiter::moe_sum": "MoE_aux",
    "aiter::topk_softmax": "MoE_aux",
    "aiter::topk_softmax_asm": "MoE_aux",
    "aiter::topk_sigmoid": "MoE_aux",
    "aiter::grouped_topk": "MoE_aux",
    "aiter::moe_fused_gate": "MoE_aux",
    "_C_cache_ops::reshape_and_cache_flash": "InferenceAttention",
    # Ops TraceLens models but this module does not: their category still matches TraceLens's.
    "tex_ts::te_gemm_ts": "GEMM",
    "aiter::gemm_a4w4": "GEMM",
    "aiter::_gemm_a4w4_asm": "GEMM",
    "ConvBias_": "CONV_fwd",
    "ConvBiasReLU_": "CONV_fwd",
    "ConvBias_Backward": "CONV_bwd",
    "ConvBiasReLU_Backward": "CONV_bwd",
    "primus_turbo::grouped_gemm": "GroupedGEMM_fwd",
    "primus_turbo::grouped_gemm_impl": "GroupedGEMM_fwd",
    "primus_turbo_cpp_extension::grouped_gemm": "GroupedGEMM_fwd",
    "primus_turbo::grouped_gemm_variable_k": "GroupedGEMM_fwd",
    "primus_turbo::grouped_gemm_variable_k_impl": "GroupedGEMM_fwd",
    "primus_turbo_cpp_extension::grouped_gemm_variable_k": "GroupedGEMM_fwd",
    "primus_turbo_cpp_extension::ck_grouped_gemm": "GroupedGEMM_fwd",
    "primus_turbo_cpp_extension::ck_grouped_gemm_variable_k": "GroupedGEMM_fwd",
    "MoEDispatch": "MoE_comm_fwd",
    "MoECombine": "MoE_comm_fwd",
    "DaoAILab::_causal_conv1d_fwd_cpp": "SSM_fwd",
    "MambaSplitConv1dScanCombinedFn": "SSM_fwd",
    "FusedRoPEFunc": "RoPE_fwd",
    "CrossEntropyFunction": "CrossEntropy_fwd",
}

CATEGORY_REGISTRY: dict[str, str] = {**{n: c.category for n, c in MODELS.items()}, **CATEGORY_ONLY}

_FALLBACK_RULES = (("elementwise", "elementwise"), ("reduce", "reduce"), ("multi_tensor_apply", "multi_tensor_apply"))


def model_class(name: str) -> type[PerfModel] | None:
    return MODELS.get(name)


def categorize(name: str, first_kernel_name: str | None = None) -> str:
    """TraceLens op category (§3.1): the registry, then name patterns, then the first kernel's name."""
    cat = CATEGORY_REGISTRY.get(name)
    if cat is not None:
        return cat
    if name.startswith("triton"):
        return "triton"
    if name.startswith("record_param_comms"):
        return "record_param_comms"
    if first_kernel_name and first_kernel_name.startswith("void at::native"):
        for needle, c in _FALLBACK_RULES:
            if needle in first_kernel_name:
                return c
    return "other"


def sheet_families() -> dict[str, list[str]]:
    """Roofline-sheet family -> op names, in registry order (TraceLens's sheet iteration order)."""
    out: dict[str, list[str]] = {}
    for name, cls in MODELS.items():
        out.setdefault(cls.sheet_family(), []).append(name)
    return out


# The only ``args`` keys a model reads; the report caches a model's static results on them.
MODEL_ARG_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Output type", "MoE topk",
                  "MoE GEMM gated")


class StaticMetrics:
    """What does not depend on the op's kernel time: FLOPs, bytes, Compute Spec, roofline time and
    bound, and the ``param:`` values."""

    __slots__ = ("gflops", "nbytes", "spec", "roof", "bound", "params", "plain_params", "data_mb", "flops_per_byte")

    def __init__(self, model: PerfModel, arch: dict | None, bwd: bool = False) -> None:
        flops = model.flops_bwd() if bwd else model.flops()
        self.gflops = flops / 1e9  # type: ignore[operator]  # None: TypeError, as in TraceLens
        self.nbytes = model.bytes_bwd() if bwd else model.bytes()
        spec = model.compute_spec()
        self.spec = spec if spec else ""
        self.roof: float | None = None
        self.bound: str | None = None
        if arch is not None:
            maf = arch.get("max_achievable_tflops")
            peak = maf.get(spec) if (maf is not None and spec) else None
            bw = arch.get("mem_bw_gbps")
            if peak is not None and bw is not None and self.nbytes is not None and self.gflops > 0:
                compute_us = (self.gflops * 1e9 / (peak * 1e12)) * 1e6
                memory_us = (self.nbytes / (bw * 1e9)) * 1e6
                self.roof = max(compute_us, memory_us)
                self.bound = "COMPUTE_BOUND" if compute_us >= memory_us else "MEMORY_BOUND"
        self.plain_params = dict(model.params)
        self.params = {"param: " + k: v for k, v in model.params.items()}
        nb = self.nbytes
        self.data_mb = nb / (1024 * 1024) if nb is not None else NAN  # MiB, but TB/s is decimal (quirk)
        self.flops_per_byte = ((self.gflops * 1e9) / nb if nb > 0 else NAN) if nb is not None else NAN

    def tflops_s(self, busy_us: float) -> float:
        return (self.gflops / 1e3) / (busy_us / 1e6) if busy_us > 0 else NAN

    def tb_s(self, busy_us: float) -> float:
        nb = self.nbytes
        if nb is None:
            return NAN
        return (nb / 1e12) / (busy_us / 1e6) if busy_us > 0 else NAN

    def pct_roofline(self, busy_us: float) -> float:
        if self.roof is None:
            return NAN
        return (self.roof / busy_us) * 100 if busy_us > 0 else NAN

    def with_time(self, busy_us: float) -> dict[str, Any]:
        """The per-instance metrics of §4.1 in TraceLens's key order, then the ``param:`` keys."""
        m: dict[str, Any] = {"GFLOPS": self.gflops, "Kernel Time (µs)": busy_us, "TFLOPS/s": self.tflops_s(busy_us),
                             "Data Moved (MB)": self.data_mb, "FLOPS/Byte": self.flops_per_byte,
                             "TB/s": self.tb_s(busy_us), "Compute Spec": self.spec}
        if self.roof is not None:
            m["Roofline Time (µs)"] = self.roof
            m["Roofline Bound"] = self.bound
            m["Pct Roofline"] = self.pct_roofline(busy_us)
        m.update(self.params)
        return m


def op_metrics(model: PerfModel, busy_us: float, arch: dict | None, *, bwd: bool = False) -> dict[str, Any]:
    """The per-instance metrics of §4.1 (GFLOPS, Kernel Time, TFLOPS/s, Data Moved (MB), FLOPS/Byte,
    TB/s, Compute Spec, [Roofline Time, Roofline Bound, Pct Roofline]) and the ``param:`` keys.

    Raises whatever the model raises (NotImplementedError: no metrics; anything else: failure),
    including TypeError when a model cannot give FLOPs (TraceLens divides None by 1e9)."""
    return StaticMetrics(model, arch, bwd).with_time(busy_us)

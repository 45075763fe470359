"""cider — low-bit LLM inference: the rotated, quantized KV cache and INT8/INT4 linear layers over NumPy, and whole
models (load, generate, logits, perplexity).

Two levels (docs/python.md):

* Model level, as mlx-lm's ``load`` / ``generate``::

      model = cider.load("models/cider-tiny")                      # or a .gguf file; weights=, kv=, device=
      print(model.generate("The Python interpreter", max_tokens=32, temperature=0).text)
      for piece in model.generate([{"role": "user", "content": "Hi"}], stream=True):
          print(piece, end="")

* The seeds' objects: ``KVCache`` (update_and_fetch / trim / state / meta_state / nbytes), ``attention``,
  ``Int8Linear`` / ``W4A8Linear`` (from_float, from_mlx), ``quantize`` / ``dequantize`` / ``quantized_matmul`` with
  mlx.core's argument names and results.

Arrays are NumPy arrays: float32, float16, or bfloat16 from the ``ml_dtypes`` package. Inputs that are already
C-contiguous are read in place (no copy). Every failure inside cider raises ``cider.Error`` (``ArgumentError``, also a
``ValueError``, for a bad value or shape) with cider's message "[operation] rule; got value"; a wrong dtype raises
``TypeError``.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from . import _cider

__all__ = [
    "Error", "ArgumentError", "version", "set_threads", "threads", "max_threads",
    "quantize", "dequantize", "quantized_matmul",
    "KVCache", "KVSnapshot", "attention", "Int8Linear", "W4A8Linear", "CiderLinear",
    "load", "Model", "Session", "Tokenizer", "Generation", "Stream", "Perplexity",
]


class Error(Exception):
    """A failure inside cider. ``code`` is the cider_status number (include/cider/cider.h)."""

    def __init__(self, message: str, code: int = 8):
        super().__init__(message)
        self.code = code


class ArgumentError(Error, ValueError):
    """A value, shape or index that breaks one of cider's rules (cider_status 1, 2 or 4)."""


_cider._set_error_types(Error, ArgumentError)

__version__ = _cider.version()


def version() -> str:
    return _cider.version()


def set_threads(n: int) -> None:
    """Worker threads of the process-wide pool every kernel uses (1 <= n <= max_threads())."""
    _cider.set_threads(n)


def threads() -> int:
    return _cider.threads()


def max_threads() -> int:
    return _cider.max_threads()


# ---- dtypes -------------------------------------------------------------------------------------------------------
try:
    import ml_dtypes as _ml_dtypes

    _BF16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # bfloat16 arrays need ml_dtypes; everything else works without it
    _BF16 = None

F32, F16, BF16, U32, I8, U8, I32, BOOL = range(8)
_FLOATS = (F32, F16, BF16)


def _code_of(dtype: np.dtype) -> Optional[int]:
    dtype = np.dtype(dtype)
    if _BF16 is not None and dtype == _BF16:
        return BF16
    return {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.uint32): U32,
            np.dtype(np.int8): I8, np.dtype(np.uint8): U8, np.dtype(np.int32): I32,
            np.dtype(np.bool_): BOOL}.get(dtype)


def _dtype_of(code: int) -> np.dtype:
    if code == BF16:
        if _BF16 is None:
            raise TypeError("cider: this array is bfloat16, which needs the ml_dtypes package (pip install ml_dtypes)")
        return _BF16
    return np.dtype([np.float32, np.float16, None, np.uint32, np.int8, np.uint8, np.int32, np.bool_][code])


def _names(codes) -> str:
    return ", ".join({F32: "float32", F16: "float16", BF16: "bfloat16", U32: "uint32", I8: "int8", U8: "uint8",
                      I32: "int32", BOOL: "bool"}[c] for c in codes)


def _arg(a, op: str, what: str, codes=_FLOATS):
    """(a C-contiguous array the extension can read, its dtype code): no copy when `a` already is one."""
    a = np.asarray(a)
    code = _code_of(a.dtype)
    if code not in codes:
        raise TypeError(f"[{op}] {what} must be {_names(codes)}; got {a.dtype}")
    a = np.ascontiguousarray(a)
    if code == BF16:
        a = a.view(np.uint16)  # the extension reads the bits; NumPy's DLPack does not know bfloat16
    return a, code


def _out(shape, code: int):
    """A fresh output array of that dtype, and the view the extension writes through."""
    arr = np.empty(tuple(int(d) for d in shape), dtype=_dtype_of(code))
    return arr, (arr.view(np.uint16) if code == BF16 else arr)


def _scale_code(a_code: int, b_code: int) -> int:
    return a_code if a_code == b_code else F32


# ---- MLX-compatible affine quantization --------------------------------------------------------------------------
def quantize(w, group_size: int = 64, bits: int = 4):
    """mx.quantize(w, group_size, bits): (w_q uint32 [..., K·bits/32], scales, biases [..., K/group_size]), scales and
    biases in w's dtype; bit for bit MLX's results."""
    w, wc = _arg(w, "cider.quantize", "w")
    k = w.shape[-1] if w.ndim else 0
    lead = w.shape[:-1]
    packed, pv = _out(lead + (k * bits // 32 if bits > 0 else 0,), U32)
    scales, sv = _out(lead + (k // group_size if group_size > 0 else 0,), wc)
    biases, bv = _out(scales.shape, wc)
    _cider.affine_quantize(w, wc, group_size, bits, pv, sv, bv, wc)
    return packed, scales, biases


def dequantize(w, scales, biases, group_size: int = 64, bits: int = 4):
    """mx.dequantize(w, scales, biases, group_size, bits): [..., K] in the scales' dtype."""
    op = "cider.dequantize"
    w, _ = _arg(w, op, "w", (U32,))
    s, sc = _arg(scales, op, "scales")
    b, bc = _arg(biases, op, "biases")
    if bc != sc:
        raise TypeError(f"[{op}] biases must have the scales' dtype {_names([sc])}; got {_names([bc])}")
    out, ov = _out(w.shape[:-1] + (w.shape[-1] * 32 // bits if bits > 0 and w.ndim else 0,), sc)
    _cider.affine_dequantize(w, s, b, sc, group_size, bits, ov, sc)
    return out


def quantized_matmul(x, w, scales, biases, transpose: bool = True, group_size: int = 64, bits: int = 4):
    """mx.quantized_matmul: x [..., M, K] times the quantized w ([N, K·bits/32] with transpose, else
    [K, N·bits/32]); the result's dtype is x's when x and the scales share one, else float32."""
    op = "cider.quantized_matmul"
    x, xc = _arg(x, op, "x")
    w, _ = _arg(w, op, "w", (U32,))
    s, sc = _arg(scales, op, "scales")
    b, bc = _arg(biases, op, "biases")
    if bc != sc:
        raise TypeError(f"[{op}] biases must have the scales' dtype {_names([sc])}; got {_names([bc])}")
    if x.ndim < 1 or w.ndim < 2:
        raise ArgumentError(f"[{op}] x must have at least 1 dimension and w at least 2; got {x.shape} and {w.shape}", 2)
    n = w.shape[-2] if transpose else (w.shape[-1] * 32 // bits if bits > 0 else 0)
    if w.ndim == 2:
        shape = x.shape[:-1] + (n,)
    else:
        if x.ndim < 2:
            raise ArgumentError(f"[{op}] a batched w needs x [..., M, K]; got x {x.shape}", 2)
        try:
            batch = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
        except ValueError:
            raise ArgumentError(f"[{op}] the batch dimensions of x {x.shape} and w {w.shape} must broadcast", 2)
        shape = tuple(batch) + (x.shape[-2], n)
    out, ov = _out(shape, _scale_code(xc, sc))
    _cider.quantized_matmul(x, xc, w, s, b, sc, bool(transpose), group_size, bits, ov, _scale_code(xc, sc))
    return out


# ---- the KV cache ------------------------------------------------------------------------------------------------
_SCALE_NAMES = {F16: "float16", BF16: "bfloat16", F32: "float32"}
_SCALE_CODES = {"float16": F16, "f16": F16, "bfloat16": BF16, "bf16": BF16, "float32": F32, "f32": F32}
_PLAIN = ("bf16", "f16", "f32")


def _spec(fmt: str, rotation: Optional[str], group_size: int, layout: Optional[str], seed: int, scale_dtype: str):
    s = _cider.KVSpec()
    s.format = fmt
    s.rotation = rotation or ""
    s.group_size = int(group_size)
    s.key_layout = layout or ""
    s.seed = int(seed)
    if scale_dtype not in _SCALE_CODES:
        raise ArgumentError(f"[cider.KVCache] scale_dtype must be float16, bfloat16 or float32; got {scale_dtype!r}", 1)
    s.scale_dtype = _SCALE_CODES[scale_dtype]
    return s


def _planes(snap) -> list:
    out = []
    for i in range(snap.num_planes):
        data, code, shape = snap.plane(i)
        out.append(np.frombuffer(data, dtype=_dtype_of(code)).reshape(shape))
    return out


class KVSnapshot:
    """An immutable copy of a cache's valid state and configuration (KVCache.snapshot / restore)."""

    def __init__(self, snap):
        self._snap = snap

    @property
    def length(self) -> int:
        return self._snap.length


class KVCache:
    """One attention layer's key/value cache, as the seeds' AsymmetricQuantizedKVCache: keys and values rotated
    (``rotation``: "hadamard", "so4-full", "so4-fast" or "none") and affine-quantized in groups with independent
    widths ``k_bits`` / ``v_bits`` (2, 3, 4, 5, 6, 8); keys per position (``layout="token"``, the seeds') or per
    channel over blocks of ``group_size`` positions (``"channel"``, the newest block kept in bfloat16). Storage grows
    in steps of 256 positions. ``format="bf16"`` / ``"f16"`` / ``"f32"`` makes a plain cache instead.

    With ``rotation="none"`` the stored arrays are exactly ``quantize(keys, group_size, k_bits)`` (the seeds' cache,
    which rotates outside)."""

    step = 256

    def __init__(self, k_bits: int = 4, v_bits: int = 3, group_size: int = 64, rotation: Optional[str] = None,
                 layout: Optional[str] = None, seed: int = 0, scale_dtype: str = "float16",
                 format: Optional[str] = None, head_dim: Optional[int] = None):
        # rotation None: "hadamard" for a quantized cache, "none" for a plain one; layout None: "token".
        fmt = format if format is not None else f"k{int(k_bits)}v{int(v_bits)}"
        self._head_dim = head_dim
        self._init(_spec(fmt, rotation, 0 if fmt in _PLAIN else group_size, layout, seed, scale_dtype))

    def _init(self, spec):
        self._cache = _cider.KVCache(spec)
        self._dims = None  # (B, H, Dk, Dv) once known

    # -- the seeds' interface --
    def update_and_fetch(self, keys, values):
        """Appends keys [B, H, n, Dk] and values [B, H, n, Dv] (float32/float16/bfloat16) and returns the whole
        valid cache as the seeds do: ((key codes, key scales, key biases[, residual window]), (value codes, value
        scales, value biases)) for a quantized cache, (keys, values) for a plain one; read-only copies."""
        op = "cider.KVCache.update_and_fetch"
        k, kc = _arg(keys, op, "keys")
        v, vc = _arg(values, op, "values")
        if self._head_dim is not None and k.ndim == 4 and k.shape[-1] != self._head_dim:
            raise ArgumentError(f"[{op}] keys must have head_dim {self._head_dim} as their last dimension; "
                                f"got shape {k.shape}", 2)
        self._cache.append(k, kc, v, vc)
        if k.ndim == 4 and v.ndim == 4:
            self._dims = (k.shape[0], k.shape[1], k.shape[3], v.shape[3])
        return self.state

    @property
    def offset(self) -> int:
        return self._cache.offset

    def trim(self, n: int) -> int:
        return self._cache.trim(int(n))

    def is_trimmable(self) -> bool:
        return True

    def empty(self) -> bool:
        """Nothing appended yet (no dimensions): a trimmed-to-zero cache is not empty."""
        return self._dims is None

    @property
    def nbytes(self) -> int:
        """Bytes of storage allocated (all capacity), as mlx-lm reports."""
        return self._cache.nbytes

    @property
    def quantized(self) -> bool:
        return self._cache.quantized

    @property
    def state(self):
        """The valid data (None while empty): ((codes, scales, biases[, window]), (codes, scales, biases)) or, for a
        plain cache, (keys, values). Assigning it restores those arrays under the current meta_state."""
        p = _planes(self._cache.snapshot())
        if not p:
            return None
        if not self.quantized:
            return p[0], p[1]
        keys = (p[0], p[1], p[2], p[6]) if len(p) == 7 else (p[0], p[1], p[2])
        return keys, (p[3], p[4], p[5])

    @state.setter
    def state(self, v):
        self._cache.restore(self._snapshot_from(self._cache.spec, v))

    @property
    def meta_state(self):
        """The configuration as strings: (group_size, k_bits, v_bits, rotation, layout, seed, scale_dtype) for a
        quantized cache (the seeds' three first), (format, rotation, seed) for a plain one."""
        s = self._cache.spec
        if s.format in _PLAIN:
            return s.format, s.rotation, str(s.seed)
        kb, vb = s.format[1:].split("v")
        return (str(s.group_size), kb, vb, s.rotation, s.key_layout, str(s.seed), _SCALE_NAMES[s.scale_dtype])

    @meta_state.setter
    def meta_state(self, v):
        if self._dims is not None:
            raise ArgumentError("[cider.KVCache.meta_state] set it on an empty cache (or use KVCache.from_state): "
                                f"this one holds {self.offset} positions", 1)
        self._init(self._spec_from_meta(v))

    @classmethod
    def from_state(cls, state, meta_state) -> "KVCache":
        """A cache holding `state` under `meta_state` (what pickling and mlx-lm's prompt-cache loading do)."""
        obj = cls.__new__(cls)
        obj._head_dim = None
        obj._init(obj._spec_from_meta(meta_state))
        obj.state = state
        return obj

    def __reduce__(self):
        return (KVCache.from_state, (self.state, self.meta_state))

    # -- snapshots (prefix caching) --
    def snapshot(self) -> KVSnapshot:
        return KVSnapshot(self._cache.snapshot())

    def restore(self, snapshot: KVSnapshot) -> None:
        self._cache.restore(snapshot._snap)
        p = _planes(snapshot._snap)
        self._dims = None
        if p:
            self._dims = self._dims_of(p)

    # -- helpers --
    def _spec_from_meta(self, v):
        v = tuple(str(x) for x in v)
        cur = self._cache.spec if hasattr(self, "_cache") else _spec("k4v3", "hadamard", 64, "token", 0, "float16")
        if v and v[0] in _PLAIN:  # (format, rotation, seed)
            fmt, rot, seed = (v + ("none", "0"))[:3]
            return _spec(fmt, rot, 0, None, int(seed), "float16")
        if len(v) == 3:  # the seeds' (group_size, k_bits, v_bits): the rest stays
            fmt = f"k{v[1]}v{v[2]}"
            return _spec(fmt, cur.rotation, int(v[0]), cur.key_layout if cur.format not in _PLAIN else "token",
                         cur.seed, _SCALE_NAMES.get(cur.scale_dtype, "float16"))
        if len(v) == 7:
            return _spec(f"k{v[1]}v{v[2]}", v[3], int(v[0]), v[4], int(v[5]), v[6])
        raise ArgumentError("[cider.KVCache.meta_state] expected (group_size, k_bits, v_bits), the 7 strings "
                            f"meta_state gives, or (format, rotation, seed); got {v}", 1)

    def _snapshot_from(self, spec, v):
        op = "cider.KVCache.state"
        if v is None:
            return _cider.KVSnapshot.from_state(spec, [])
        if spec.format in _PLAIN:
            arrays = list(v)
        else:
            keys, values = v
            keys, values = list(keys), list(values)
            arrays = keys[:3] + values + keys[3:]
        planes = [_arg(a, op, f"state array {i}", (U32,) + _FLOATS) for i, a in enumerate(arrays)]
        snap = _cider.KVSnapshot.from_state(spec, planes)
        self._dims = self._dims_of([a for a, _ in planes])
        return snap

    def _dims_of(self, p):
        s = self._cache.spec
        if s.format in _PLAIN:
            return p[0].shape[0], p[0].shape[1], p[0].shape[3], p[1].shape[3]
        gs = s.group_size
        dk = p[1].shape[3] if s.key_layout == "channel" else p[1].shape[3] * gs
        return p[0].shape[0], p[0].shape[1], dk, p[4].shape[3] * gs

    def __repr__(self):
        return f"KVCache({'/'.join(self.meta_state)}, offset={self.offset}, nbytes={self.nbytes})"


def attention(queries, cache: KVCache, scale: float, mask=None, window: int = 0):
    """Scaled dot-product attention of queries [B, Hq, L, Dk] (the last L positions of the cache; Hq a multiple of
    the cache's heads: GQA) over the packed cache, the output rotated back: [B, Hq, L, Dv] float32.
    mask: None, "causal" (window > 0: each query sees its last `window` keys), a bool array (True = attend) or an
    additive float array, broadcastable to [B, Hq, L, offset]."""
    op = "cider.attention"
    q, qc = _arg(queries, op, "queries")
    if cache._dims is None:
        raise ArgumentError(f"[{op}] the cache is empty: append keys and values first", 1)
    m, mc, kind = None, F32, 0
    if isinstance(mask, str):
        if mask != "causal":
            raise ArgumentError(f"[{op}] a string mask must be \"causal\"; got {mask!r}", 1)
        kind = 1
    elif mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            m, mc = _arg(mask, op, "mask", (BOOL,))
            kind = 2
        else:
            m, mc = _arg(mask, op, "mask")
            kind = 3
    if q.ndim != 4:
        raise ArgumentError(f"[{op}] queries must be [B, Hq, L, Dk]; got shape {q.shape}", 2)
    out, ov = _out(q.shape[:3] + (cache._dims[3],), F32)
    _cider.attention(q, qc, cache._cache, float(scale), kind, int(window), m, mc, ov, F32)
    return out


# ---- linear layers -----------------------------------------------------------------------------------------------
class _Linear:
    _format = 0
    _name = ""

    def __init__(self, layer):
        self._layer = layer

    @classmethod
    def from_float(cls, w, bias=None, group_size: int = 0, clip_percentile: Optional[float] = None):
        """From a float weight [N, K] (or a layer with .weight / .bias, e.g. mlx.nn.Linear), symmetric per output
        channel (group_size 0) or per group along K; clip_percentile (per channel only) clips each row at that
        percentile of |w|."""
        if hasattr(w, "weight"):
            bias = getattr(w, "bias", None) if bias is None else bias
            w = w.weight
        op = f"cider.{cls._name}.from_float"
        w, wc = _arg(w, op, "w")
        b, bc = (None, F32) if bias is None else _arg(bias, op, "bias")
        return cls(_cider.Linear.from_float(cls._format, w, wc, b, bc, int(group_size),
                                            None if clip_percentile is None else float(clip_percentile)))

    @classmethod
    def from_mlx(cls, w_q, scales, biases, bits: int = 4, group_size: int = 64, bias=None,
                 target_group_size: Optional[int] = None, clip_percentile: Optional[float] = None):
        """From an MLX affine-quantized weight (w_q uint32 [N, K·bits/32], scales/biases [N, K/group_size]):
        dequantized and requantized (target_group_size None: per channel)."""
        op = f"cider.{cls._name}.from_mlx"
        p, _ = _arg(w_q, op, "w_q", (U32,))
        s, sc = _arg(scales, op, "scales")
        b2, bc2 = _arg(biases, op, "biases")
        if bc2 != sc:
            raise TypeError(f"[{op}] biases must have the scales' dtype {_names([sc])}; got {_names([bc2])}")
        b, bc = (None, F32) if bias is None else _arg(bias, op, "bias")
        return cls(_cider.Linear.from_mlx(cls._format, p, s, b2, sc, int(group_size), int(bits), b, bc,
                                          target_group_size, None if clip_percentile is None else float(clip_percentile)))

    def __call__(self, x):
        """y = x·Wᵀ + b for x [..., K] (float32/float16/bfloat16): [..., N] in x's dtype."""
        x, xc = _arg(x, f"cider.{self._name}", "x")
        if x.ndim < 1:
            raise ArgumentError(f"[cider.{self._name}] x must be [..., {self.input_dims}]; got a scalar", 2)
        out, ov = _out(x.shape[:-1] + (self.output_dims,), xc)
        self._layer.forward(x, xc, ov, xc)
        return out

    @property
    def input_dims(self) -> int:
        return self._layer.in_features

    @property
    def output_dims(self) -> int:
        return self._layer.out_features

    @property
    def group_size(self) -> int:
        return self._layer.group_size

    @property
    def nbytes(self) -> int:
        return self._layer.nbytes

    def __repr__(self):
        g = f"group_size={self.group_size}" if self.group_size else "per channel"
        return f"{self._name}(input_dims={self.input_dims}, output_dims={self.output_dims}, {g})"


class Int8Linear(_Linear):
    """W8A8: int8 weights (per output channel or groups of 64/128/256 along K) times int8 activations quantized per
    token; the seeds' CiderLinear."""
    _format = 0
    _name = "Int8Linear"


class W4A8Linear(_Linear):
    """W4A8: packed int4 weights (per channel or groups of 32/64/128/256) times int8 activations."""
    _format = 1
    _name = "W4A8Linear"


CiderLinear = Int8Linear  # the seeds' name


# ---- models ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Generation:
    text: str
    tokens: list
    finish_reason: str         # "eos", "stop string", "max tokens", "context full"
    prompt_tokens: int
    generation_tokens: int
    prompt_seconds: float
    generation_seconds: float

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generation_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0


@dataclasses.dataclass
class Perplexity:
    windows: int
    tokens_scored: int
    ppl: float
    ppl_stderr: float
    nll: float
    kl: Optional[float]        # mean KL(baseline ‖ model), nats/token; None without a baseline
    kl_stderr: Optional[float]
    top1: Optional[float]      # argmax agreement with the baseline
    base_ppl: Optional[float]
    report: str                # the lines `cider perplexity` prints


def _generation(d: dict) -> Generation:
    return Generation(text=d["text"], tokens=list(d["tokens"]), finish_reason=d["finish_reason"],
                      prompt_tokens=d["prompt_tokens"], generation_tokens=len(d["tokens"]),
                      prompt_seconds=d["prompt_seconds"], generation_seconds=d["generation_seconds"])


class _Cancelled(Exception):
    pass


class Stream:
    """Text pieces as they are generated (iterate); afterwards ``result`` is the Generation. Generation runs on a
    worker thread; leaving the loop early (or close()) stops it at the next token."""

    def __init__(self, run):
        self.result: Optional[Generation] = None
        self._queue: "queue.Queue" = queue.Queue()
        self._cancel = threading.Event()
        self._error: Optional[BaseException] = None
        self._done = object()

        def on_text(piece: str) -> None:
            if self._cancel.is_set():
                raise _Cancelled()
            self._queue.put(piece)

        def work() -> None:
            try:
                self.result = _generation(run(on_text))
            except _Cancelled:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                self._error = e
            finally:
                self._queue.put(self._done)

        self._thread = threading.Thread(target=work, name="cider-generate", daemon=True)
        self._thread.start()
        self._finished = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is self._done:
            self._finished = True
            self._thread.join()
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item

    def close(self) -> None:
        if not self._finished:
            self._cancel.set()
            self._thread.join()
            self._finished = True

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_Prompt = Union[str, Sequence[int], Sequence[dict]]


def _sampling(temperature, top_k, top_p, min_p, repetition_penalty, repetition_context_size, seed):
    return (float(temperature), int(top_k), float(top_p), float(min_p), float(repetition_penalty),
            int(repetition_context_size), int(seed))


class Tokenizer:
    """The model's tokenizer (equal to Hugging Face's on the supported families)."""

    def __init__(self, model: "Model"):
        self._m = model._m
        info = model.info
        self.bos_id = info["bos_id"] if info["bos_id"] >= 0 else None
        self.eos_ids = list(info["eos_ids"])
        self.vocab_size = info["vocab_size"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        return list(self._m.tokenize(text, bool(add_special_tokens)))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._m.detokenize([int(i) for i in ids], bool(skip_special_tokens))


class Session:
    """One token sequence of a model with its own KV caches: feed tokens, read logits, generate, trim."""

    def __init__(self, model: "Model"):
        self._model = model
        self._s = model._m.new_session()

    @property
    def position(self) -> int:
        return self._s.position

    @property
    def kv_bytes(self) -> int:
        return self._s.kv_bytes

    def trim(self, n: int) -> int:
        return self._s.trim(int(n))

    def decode(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Feeds the tokens; returns the logits of the last one [vocab] (all_logits: [n, vocab]), float32."""
        ids = [int(t) for t in tokens]
        vocab = self._model.info["vocab_size"]
        out = np.empty((len(ids), vocab) if all_logits else (vocab,), dtype=np.float32)
        self._s.decode(ids, out, bool(all_logits))
        return out

    def generate(self, prompt: _Prompt, max_tokens: int = 256, *, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repetition_penalty: float = 1.0,
                 repetition_context_size: int = 64, seed: int = 0, stop: Optional[Sequence[str]] = None,
                 stream: bool = False, prefill_chunk: int = 2048):
        """Continues this session from `prompt` (text, token ids, or chat messages [{"role", "content"}]).
        Returns a Generation, or with stream=True a Stream of text pieces."""
        stop_tokens: list = []
        if isinstance(prompt, str):
            ids = self._model._m.tokenize(prompt, self.position == 0)
        elif len(prompt) > 0 and isinstance(prompt[0], dict):
            msgs = [(str(m["role"]), str(m["content"])) for m in prompt]
            ids = self._model._m.tokenize(self._model._m.chat_prompt(msgs), self.position == 0)
            stop_tokens = list(self._model._m.chat_end_tokens())
        else:
            ids = [int(t) for t in prompt]
        args = (list(ids), int(max_tokens), list(stop or []), stop_tokens,
                *_sampling(temperature, top_k, top_p, min_p, repetition_penalty, repetition_context_size, seed),
                int(prefill_chunk))
        if stream:
            return Stream(lambda on_text: self._s.generate(*args, on_text))
        return _generation(self._s.generate(*args, None))


class Model:
    """A loaded model (cider.load)."""

    def __init__(self, path: str, m, load_kwargs: dict):
        self.path = path
        self._m = m
        self._load_kwargs = load_kwargs
        self.info = m.info()
        self.tokenizer = Tokenizer(self)

    @property
    def chat_format(self) -> str:
        return self._m.chat_format()

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        """The prompt text of a conversation in the model's chat format, ending with the generation prompt."""
        return self._m.chat_prompt([(str(m["role"]), str(m["content"])) for m in messages])

    def session(self) -> Session:
        return Session(self)

    def generate(self, prompt: _Prompt, max_tokens: int = 256, **kwargs):
        """Generates from `prompt` (text, token ids, or chat messages) in a fresh session; the keyword arguments of
        Session.generate (temperature, top_k, top_p, min_p, repetition_penalty, seed, stop, stream, ...)."""
        return Session(self).generate(prompt, max_tokens, **kwargs)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position of `tokens` from an empty context: [n, vocab] float32."""
        return Session(self).decode(tokens, all_logits=True)

    def perplexity(self, text: str, ctx: int = 512, stride: int = 0,
                   baseline: Union[None, "Model", dict] = None) -> Perplexity:
        """Perplexity of `text` over windows of ctx tokens (BOS first in each, when the tokenizer adds one), and with
        a baseline (another Model, or load options for this model's file, e.g. {"kv": "bf16"}) the KL divergence
        from it and the top-1 agreement: `cider perplexity`'s numbers."""
        if isinstance(baseline, dict):
            kw = dict(self._load_kwargs)
            if "kv" in baseline:  # its own cache: the tested cache's layout, rotation and groups do not carry over
                kw.update(kv_rotation=None, kv_layout=None, kv_group_size=0, kv_outliers=0, kv_values=None,
                          kv_recent=None)
            if "weights" in baseline:  # its own weights: the importance file is the tested format's
                kw.update(imatrix=None, head_weights=None)
            baseline = load(self.path, **{**kw, **baseline})
        r = self._m.perplexity(text, int(ctx), int(stride), None if baseline is None else baseline._m)
        has = r["has_baseline"]
        return Perplexity(windows=r["windows"], tokens_scored=r["tokens_scored"], ppl=r["ppl"],
                          ppl_stderr=r["ppl_stderr"], nll=r["nll"], kl=r["kl"] if has else None,
                          kl_stderr=r["kl_stderr"] if has else None, top1=r["top1"] if has else None,
                          base_ppl=r["base_ppl"] if has else None, report=r["report"])

    def __repr__(self):
        i = self.info
        return (f"Model({self.path!r}, {i['architecture']}, weights={i['weights']}, kv={i['kv']}, "
                f"device={i['device']}, ctx={i['context_length']})")


def load(path: str, weights: Optional[str] = None, kv: Optional[str] = None, kv_rotation: Optional[str] = None,
         kv_group_size: int = 0, kv_layout: Optional[str] = None, ctx: int = 0, device: str = "cpu",
         threads: int = 0, kv_outliers: Union[int, str, None] = None, kv_values: Optional[str] = None,
         kv_recent: Optional[str] = None, imatrix: Optional[str] = None, head_weights: Optional[str] = None) -> Model:
    """Loads a model: a Hugging Face / MLX / cider-converted directory or a .gguf file. weights: "bf16", "f32",
    "w8a8", "w8a8-g64/128/256", "w4a8", "native" (a GGUF file's blocks as they are; None: native for a .gguf file
    or a directory converted with --weights native or a block format, else bf16), or a GGUF block format cider
    requantizes into: "q8_0", "q6_k", "q5_1", "q5_0", "q4_k_m", "q4_k", "q4_1", "q4_0" (LM head Q8_0); kv: "k5v4", "k8v4", "k4v3", ... or
    "bf16"/"f16"/"f32" (None: the device's default, on the CPU k4v4 with per-channel keys and automatic outlier
    channels); kv_layout "channel": keys per channel, with kv_outliers > 0 (or "auto": head_dim/32) outlier key
    channels refined by 4 bits (None: the default's, "auto" for the default cache and 0 with an explicit kv;
    docs/kv_cache.md); kv_values "affine" or "symmetric" (a step per value group and no bias, CPU only; None: the
    default's, symmetric for the default cache on the CPU, else affine); kv_recent "exact" or "quantized" (per-channel
    keys: each query reads its own block of group-size positions unquantized, CPU only; None: the default's); ctx: context length (0 = the model's, capped at 8192); device: "cpu" or "cuda"; imatrix: an
    importance file from `cider imatrix` that weights the block fits of a requantizing weights format ("q4_k_m", ...);
    head_weights: the LM head's block type with such a format ("q8_0", "q6_k", "q5_1", "q5_0", "q4_k", "q4_1",
    "q4_0"; None: q8_0)."""
    kw = dict(weights=weights, kv=kv, kv_rotation=kv_rotation, kv_group_size=kv_group_size, kv_layout=kv_layout,
              ctx=ctx, device=device, threads=threads, kv_outliers=kv_outliers, kv_values=kv_values,
              kv_recent=kv_recent, imatrix=imatrix, head_weights=head_weights)
    spec = _cider.KVSpec()
    spec.format = kv or ""
    spec.rotation = kv_rotation or ""
    spec.group_size = int(kv_group_size)
    spec.key_layout = kv_layout or ""
    spec.values = kv_values or ""
    spec.recent = kv_recent or ""
    if kv_outliers == "auto":
        spec.key_outliers = -1
    elif kv_outliers is None:
        spec.key_outliers = 0
    elif isinstance(kv_outliers, int) and not isinstance(kv_outliers, bool) and kv_outliers >= 0:
        spec.key_outliers = kv_outliers
    else:
        raise ArgumentError(f'[cider.load] kv_outliers must be "auto", None or a count >= 0; got {kv_outliers!r}', 1)
    return Model(str(path), _cider.Model.load(str(path), weights or "", spec, int(ctx), device, int(threads),
                                                 str(imatrix or ""), str(head_weights or "")), kw)

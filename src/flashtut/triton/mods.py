"""From a ``score_mod``/``mask_mod`` written in PyTorch to Triton functions the kernel calls.

A mod is written once, with elementwise tensor operations, and serves two masters: PyTorch calls
it on broadcast index tensors (the dense reference, the block-mask builder), and the Triton
kernel calls it on a tile. To get the second from the first, the mod is traced once with
``torch.fx`` (placeholders for ``score, b, h, q_idx, kv_idx``; every tensor it captures becomes a
numbered input), and the graph is printed as the source of ``@triton.jit`` functions:

* ``value(s, b, h, q_idx, kv_idx, X0, X1, X2, X3)``: the mod itself (``X*``: captured tensors,
  read with ``tl.load``);
* for a score mod, ``grad(s, ..., g, X*)``: ``g * d mod / d score`` by reverse-mode
  differentiation of the same graph, which the backward applies to ``dS``;
* and ``grad_params(s, ..., g, X*, G*, VALID)``: the same, and also adds ``g * d mod / d X[i]``
  into the float32 gradient ``G*`` of every captured tensor that requires grad (summed over the
  tile first when its index depends only on ``b`` and ``h``, as a per-head bias does).

The generated functions reach the kernels as ``tl.constexpr`` arguments: each distinct mod
compiles its own kernel, and a kernel without a mod pays nothing for the mechanism.
So users supply the derivative by writing nothing more: it is derived from the one function.
Supported operations (``SUPPORTED``): arithmetic, comparisons, ``&``/``|``/``~``, ``torch.where``,
``exp``, ``log``, ``sqrt``, ``tanh``, ``sigmoid``, ``abs``, ``minimum``/``maximum``/``clamp``, casts,
and indexing a captured tensor by index expressions. Anything else is a TypeError naming it.
Traces are kept per function object; the captured tensors' values are read at every call.
"""
from __future__ import annotations

import hashlib
import linecache
import operator
import weakref
from dataclasses import dataclass

import torch
import torch.fx as fx

import triton  # noqa: F401  (the generated modules import it)

from .attention import interpreting

#: the most tensors one mod may capture (the kernels take that many pointer arguments per mod)
MAX_CAPTURED = 4

_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
           operator.floordiv: "//", operator.mod: "%", operator.and_: "&", operator.or_: "|",
           operator.xor: "^", operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=",
           operator.gt: ">", operator.ge: ">=",
           torch.add: "+", torch.sub: "-", torch.mul: "*", torch.div: "/",
           torch.eq: "==", torch.ne: "!=", torch.lt: "<", torch.le: "<=", torch.gt: ">", torch.ge: ">=",
           torch.logical_and: "&", torch.logical_or: "|", torch.bitwise_and: "&", torch.bitwise_or: "|"}
_METHOD_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "__add__": "+", "__sub__": "-",
                  "__mul__": "*", "__truediv__": "/", "__radd__": "r+", "__rsub__": "r-", "__rmul__": "r*",
                  "__rtruediv__": "r/", "__and__": "&", "__or__": "|", "__eq__": "==", "__ne__": "!=",
                  "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=", "eq": "==", "ne": "!=",
                  "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&", "logical_or": "|"}
_UNARY = {"exp": "tl.exp({})", "log": "tl.log({})", "sqrt": "tl.sqrt({})", "tanh": "_tanh({})",
          "sigmoid": "_sigmoid({})", "abs": "tl.abs({})", "neg": "(-{})", "__neg__": "(-{})",
          "__invert__": "(~{})", "logical_not": "(~{})", "bitwise_not": "(~{})",
          "float": "({}).to(tl.float32)", "__pos__": "{}"}
_UNARY_FN = {torch.exp: "exp", torch.log: "log", torch.sqrt: "sqrt", torch.tanh: "tanh",
             torch.sigmoid: "sigmoid", torch.abs: "abs", torch.neg: "neg", operator.neg: "neg",
             operator.invert: "__invert__", torch.logical_not: "logical_not", operator.pos: "__pos__",
             torch.nn.functional.tanh if hasattr(torch.nn.functional, "tanh") else torch.tanh: "tanh"}
SUPPORTED = sorted(set(_BINARY.values()) | set(_UNARY) | {"where", "minimum", "maximum", "clamp", "to",
                                                            "indexing a captured tensor"})


class ModError(TypeError):
    """A mod the Triton kernel cannot compile (the message names the operation)."""


class _Tracer(fx.Tracer):
    """fx tracing of a plain function, where every tensor the function reaches (a closure
    variable, a global, a module's parameter) becomes a numbered input ``captured<i>``."""

    def __init__(self):
        super().__init__()
        self.captured: list[torch.Tensor] = []

    def create_arg(self, a):
        if isinstance(a, torch.Tensor):
            for i, t in enumerate(self.captured):
                if t is a:
                    return self.create_node("get_attr", f"captured{i}", (), {})
            self.captured.append(a)
            return self.create_node("get_attr", f"captured{len(self.captured) - 1}", (), {})
        return super().create_arg(a)


@dataclass
class Traced:
    graph: fx.Graph
    captured: list
    kind: str          # "score" or "mask"


_TRACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def trace(fn, kind: str) -> Traced:
    """The fx graph of ``fn`` and the tensors it captures (cached per function object)."""
    try:
        hit = _TRACES.get(fn)
    except TypeError:          # not weak-referenceable: trace every time
        hit = None
    if hit is not None and hit.kind == kind:
        return hit
    name = "score_mod" if kind == "score" else "mask_mod"
    tracer = _Tracer()
    args = ["score", "b", "h", "q_idx", "kv_idx"] if kind == "score" else ["b", "h", "q_idx", "kv_idx"]
    # trace through a wrapper with fixed argument names, whatever the mod calls its own
    ns: dict = {"fn": fn}
    exec(f"def traced({', '.join(args)}):\n    return fn({', '.join(args)})\n", ns)   # noqa: S102
    try:
        graph = tracer.trace(ns["traced"])
    except fx.proxy.TraceError as exc:
        raise ModError(f"{name} must be written with elementwise tensor operations, without Python "
                       f"control flow on its arguments (use torch.where instead of if); tracing it "
                       f"failed: {exc}") from None
    if len(tracer.captured) > MAX_CAPTURED:
        raise ModError(f"{name} captures {len(tracer.captured)} tensors; the kernel takes at most "
                       f"{MAX_CAPTURED} per mod (stack them into one)")
    out = Traced(graph, tracer.captured, kind)
    try:
        _TRACES[fn] = out
    except TypeError:
        pass
    return out


# ------------------------------------------------------------------------ code generation ----

def _const(x) -> str:
    if isinstance(x, bool):
        return "True" if x else "False"
    if isinstance(x, float):
        if x != x:
            return 'float("nan")'
        if x in (float("inf"), float("-inf")):
            return 'float("inf")' if x > 0 else 'float("-inf")'
        return repr(x)
    if isinstance(x, int):
        return repr(x)
    raise ModError(f"constant {x!r} of type {type(x).__name__} is not supported in a mod")


class _Gen:
    """Prints a traced graph as Triton statements; remembers each node's expression and the
    facts differentiation needs."""

    def __init__(self, traced: Traced, name: str, inputs: dict):
        self.t, self.name = traced, name
        self.expr = dict(inputs)        # node name -> variable holding its value
        self.lines: list[str] = []
        self.uniform: dict = {}         # node name -> depends only on b, h and constants
        self.index_of: dict = {}        # getitem node -> (captured number, offset expression, uniform)
        self.nodes = list(traced.graph.nodes)
        for n in self.nodes:
            if n.op == "placeholder":
                self.uniform[n.name] = n.name in ("b", "h")

    def arg(self, a) -> str:
        if isinstance(a, fx.Node):
            if a.op == "get_attr":
                i = int(a.target[len("captured"):])
                t = self.t.captured[i]
                if t.numel() != 1:
                    raise ModError(f"{self.name} uses the captured tensor of shape {tuple(t.shape)} whole; "
                                   "index it by b, h, q_idx or kv_idx (a 1-element tensor may be used whole)")
                return self._load(i, "0")
            return self.expr[a.name]
        return _const(a)

    def _uni(self, a) -> bool:
        return self.uniform.get(a.name, False) if isinstance(a, fx.Node) else True

    def _load(self, i: int, offset: str) -> str:
        t = self.t.captured[i]
        val = f"tl.load(X{i} + ({offset}))"
        if t.dtype.is_floating_point:
            return f"{val}.to(tl.float32)"
        if t.dtype == torch.bool:
            return f"({val} != 0)"
        return val

    def emit(self):
        out = None
        for n in self.nodes:
            if n.op in ("placeholder", "get_attr"):
                self.uniform.setdefault(n.name, n.op == "get_attr")
                continue
            if n.op == "output":
                out = n.args[0]
                break
            code = self._node(n)
            var = f"v_{n.name}"
            self.lines.append(f"    {var} = {code}")
            self.expr[n.name] = var
            self.uniform[n.name] = all(self._uni(a) for a in _flat(n.args) if isinstance(a, fx.Node)) \
                and not (n.name in self.index_of and not self.index_of[n.name][2])
        if isinstance(out, (tuple, list)):
            raise ModError(f"{self.name} must return one tensor, not a {type(out).__name__}")
        return out

    def _node(self, n) -> str:
        target, args = n.target, n.args
        if n.op == "call_method" and target == "__getitem__" or target is operator.getitem:
            return self._getitem(n, args[0], args[1])
        if n.op == "call_function" and target in _BINARY or n.op == "call_method" and target in _METHOD_BINARY:
            op = _BINARY[target] if n.op == "call_function" else _METHOD_BINARY[target]
            a, b = self.arg(args[0]), self.arg(args[1])
            if op.startswith("r"):
                return f"({b} {op[1:]} {a})"
            return f"({a} {op} {b})"
        if n.op == "call_function" and target in _UNARY_FN:
            return _UNARY[_UNARY_FN[target]].format(self.arg(args[0]))
        if n.op == "call_method" and target in _UNARY:
            return _UNARY[target].format(self.arg(args[0]))
        fname = getattr(target, "__name__", str(target))
        if fname == "where" and len(args) == 3:
            return "tl.where({}, {}, {})".format(*(self.arg(a) for a in args))
        if fname in ("minimum", "maximum", "min", "max") and len(args) == 2 and not n.kwargs:
            return f"tl.{'minimum' if fname.startswith('min') else 'maximum'}({self.arg(args[0])}, {self.arg(args[1])})"
        if fname in ("clamp", "clip"):
            lo = args[1] if len(args) > 1 else n.kwargs.get("min")
            hi = args[2] if len(args) > 2 else n.kwargs.get("max")
            code = self.arg(args[0])
            if lo is not None:
                code = f"tl.maximum({code}, {self.arg(lo)})"
            if hi is not None:
                code = f"tl.minimum({code}, {self.arg(hi)})"
            return code
        if fname == "to" and n.op == "call_method":
            dtype = args[1] if len(args) > 1 else n.kwargs.get("dtype")
            if isinstance(dtype, torch.dtype):
                if dtype.is_floating_point:
                    return f"({self.arg(args[0])}).to(tl.float32)"
                if dtype == torch.bool:
                    return f"({self.arg(args[0])} != 0)"
                return f"({self.arg(args[0])}).to(tl.int64)"
        if n.op == "call_method" and target in ("long", "int"):
            return f"({self.arg(args[0])}).to(tl.int64)"
        if n.op == "call_method" and target == "bool":
            return f"({self.arg(args[0])} != 0)"
        raise ModError(f"{self.name} uses {n.op} {fname}, which the Triton kernel cannot compile; "
                       f"supported: {', '.join(SUPPORTED)}")

    def _getitem(self, n, base, index) -> str:
        if not (isinstance(base, fx.Node) and base.op == "get_attr"):
            raise ModError(f"{self.name} indexes something other than a captured tensor; only tensors it "
                           "captures can be indexed (by b, h, q_idx, kv_idx or expressions of them)")
        i = int(base.target[len("captured"):])
        t = self.t.captured[i]
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != t.dim():
            raise ModError(f"{self.name} indexes a captured tensor of shape {tuple(t.shape)} with {len(idx)} "
                           f"index(es); give one per dimension")
        if any(isinstance(a, slice) or a is None or a is Ellipsis for a in idx):
            raise ModError(f"{self.name} slices a captured tensor; index it elementwise instead")
        strides = torch.empty(t.shape).stride() if t.dim() else ()
        parts = [f"({self.arg(a)}) * {s}" if s != 1 else f"({self.arg(a)})" for a, s in zip(idx, strides)]
        offset = " + ".join(parts) if parts else "0"
        uniform = all(self._uni(a) for a in idx)
        self.index_of[n.name] = (i, offset, uniform)
        return self._load(i, offset)


def _flat(args):
    for a in args:
        if isinstance(a, (tuple, list)):
            yield from _flat(a)
        else:
            yield a


def _depends(gen: _Gen, sources: set) -> set:
    """Names of the nodes whose value depends on any of ``sources``."""
    dep = set(sources)
    for n in gen.nodes:
        if n.op in ("call_function", "call_method"):
            if any(isinstance(a, fx.Node) and a.name in dep for a in _flat(n.args)) or n.name in sources:
                dep.add(n.name)
    return dep


def _adjoint_rules(gen: _Gen, n, g: str, needs: set) -> list[tuple[str, str]]:
    """``(input node name, contribution)`` pairs of the adjoint ``g`` of node ``n``."""
    target, args = n.target, n.args
    out = gen.expr[n.name]
    fname = getattr(target, "__name__", str(target))
    op = _BINARY.get(target) if n.op == "call_function" else _METHOD_BINARY.get(target)
    if n.op == "call_function" and target in _UNARY_FN:
        fname = _UNARY_FN[target]
    pairs = []

    def add(a, code):
        if isinstance(a, fx.Node) and a.name in needs:
            pairs.append((a.name, code))

    if op is not None:
        a, b = args[0], args[1]
        if op.startswith("r"):
            a, b, op = b, a, op[1:]
        A, B = gen.arg(a), gen.arg(b)
        if op == "+":
            add(a, g), add(b, g)
        elif op == "-":
            add(a, g), add(b, f"(-{g})")
        elif op == "*":
            add(a, f"({g} * {B})"), add(b, f"({g} * {A})")
        elif op == "/":
            add(a, f"({g} / {B})"), add(b, f"(-{g} * {A} / ({B} * {B}))")
        elif op in ("==", "!=", "<", "<=", ">", ">=", "&", "|", "^", "//", "%"):
            pass
        return pairs
    x = args[0] if args else None
    X = gen.arg(x) if x is not None and not isinstance(x, (tuple, list)) else None
    rules = {"exp": f"({g} * {out})", "log": f"({g} / {X})", "sqrt": f"({g} * 0.5 / {out})",
             "tanh": f"({g} * (1.0 - {out} * {out}))", "sigmoid": f"({g} * {out} * (1.0 - {out}))",
             "abs": f"tl.where({X} >= 0, {g}, -{g})", "neg": f"(-{g})", "__neg__": f"(-{g})",
             "float": g, "to": g, "__pos__": g}
    if fname in rules:
        add(x, rules[fname])
    elif fname == "where":
        c = gen.arg(args[0])
        add(args[1], f"tl.where({c}, {g}, 0.0)")
        add(args[2], f"tl.where({c}, 0.0, {g})")
    elif fname in ("minimum", "maximum", "min", "max"):
        A, B = gen.arg(args[0]), gen.arg(args[1])
        pick = f"{A} <= {B}" if fname.startswith("min") else f"{A} >= {B}"
        add(args[0], f"tl.where({pick}, {g}, 0.0)")
        add(args[1], f"tl.where({pick}, 0.0, {g})")
    elif fname in ("clamp", "clip"):
        lo = args[1] if len(args) > 1 else n.kwargs.get("min")
        hi = args[2] if len(args) > 2 else n.kwargs.get("max")
        inside = "True"
        if lo is not None:
            inside = f"({inside}) & ({X} >= {gen.arg(lo)})"
        if hi is not None:
            inside = f"({inside}) & ({X} <= {gen.arg(hi)})"
        add(x, f"tl.where({inside}, {g}, 0.0)")
    elif n.name in gen.index_of:
        pass            # a captured tensor's element: handled by the caller
    elif fname in ("long", "int", "bool"):
        pass
    else:
        raise ModError(f"the backward cannot differentiate {fname} in the score_mod; supported: "
                       "+ - * /, exp, log, sqrt, tanh, sigmoid, abs, where, minimum, maximum, clamp")
    return pairs


_HELPERS = '''
@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))
'''
# tanh: libdevice's on a GPU (what PyTorch's compiler emits for torch.tanh, so FlexAttention pays the
# same); the interpreter has no libdevice, so there it is 1 - 2 / (exp(2x) + 1), exact at both ends
# (exp overflows to inf for large x: 1; underflows to 0: -1)
_TANH_GPU = '''
from triton.language.extra import libdevice


@triton.jit
def _tanh(x):
    return libdevice.tanh(x)
'''
_TANH_INTERPRETER = '''
@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
'''


@dataclass
class CompiledMod:
    value: object             # JITFunction
    grad: object = None
    grad_params: object = None
    captured: tuple = ()
    wants_grad: tuple = ()    # per captured tensor: the backward computes its gradient
    source: str = ""
    scatters: bool = False    # some gradient is added element by element (an index not of b, h alone)


_MODULES: dict = {}


def _load_module(source: str, tag: str) -> dict:
    """Run generated source as a module whose text ``inspect`` can find (Triton reads it)."""
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    if key not in _MODULES:
        filename = f"<flashtut-{tag}-{key}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        ns = {"__name__": f"flashtut_generated_{tag}_{key}"}
        exec(compile(source, filename, "exec"), ns)   # noqa: S102
        _MODULES[key] = ns
    return _MODULES[key]


def _header() -> str:
    tanh = _TANH_INTERPRETER if interpreting() else _TANH_GPU
    return "import triton\nimport triton.language as tl\n" + tanh + _HELPERS


_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _cached(fn, kind: str, build):
    """``build(fn)``, kept per function object (and, for a score mod, per set of captured tensors that
    require grad, since that decides which gradients the generated backward adds up)."""
    traced = trace(fn, kind)
    wants = tuple(bool(t.requires_grad and t.dtype.is_floating_point) for t in traced.captured)
    try:
        hit = _COMPILED.get(fn)
    except TypeError:
        return build(fn)
    if hit is not None and hit[0] == (kind, wants):
        return hit[1]
    out = build(fn)
    _COMPILED[fn] = ((kind, wants), out)
    return out


def compile_mask(mask_mod) -> CompiledMod:
    """``value(b, h, q_idx, kv_idx, X0..X3) -> keep``."""
    return _cached(mask_mod, "mask", _compile_mask)


def compile_score(score_mod) -> CompiledMod:
    """``value``, ``grad`` and ``grad_params`` of a score mod (see the module's docstring)."""
    return _cached(score_mod, "score", _compile_score)


def _compile_mask(mask_mod) -> CompiledMod:
    traced = trace(mask_mod, "mask")
    gen = _Gen(traced, "mask_mod", {"b": "b", "h": "h", "q_idx": "q_idx", "kv_idx": "kv_idx"})
    out = gen.emit()
    body = "\n".join(gen.lines)
    ret = gen.arg(out) if isinstance(out, fx.Node) else _const(out)
    xs = ", ".join(f"X{i}" for i in range(MAX_CAPTURED))
    source = (_header() + f"\n\n@triton.jit\ndef value(b, h, q_idx, kv_idx, {xs}):\n{body}\n    return {ret}\n")
    ns = _load_module(source, "mask")
    return CompiledMod(ns["value"], captured=tuple(traced.captured), wants_grad=(False,) * len(traced.captured),
                       source=source)


def _compile_score(score_mod) -> CompiledMod:
    traced = trace(score_mod, "score")
    inputs = {"score": "s", "b": "b", "h": "h", "q_idx": "q_idx", "kv_idx": "kv_idx"}
    gen = _Gen(traced, "score_mod", inputs)
    out = gen.emit()
    fwd = "\n".join(gen.lines)
    ret = gen.arg(out) if isinstance(out, fx.Node) else _const(out)
    xs = ", ".join(f"X{i}" for i in range(MAX_CAPTURED))
    gs = ", ".join(f"G{i}" for i in range(MAX_CAPTURED))
    wants = tuple(bool(t.requires_grad and t.dtype.is_floating_point) for t in traced.captured)
    grad_nodes = {name for name, (i, _, _) in gen.index_of.items() if wants[i]}

    def backward_body(with_params: bool) -> str:
        sources = {"score"} | (grad_nodes if with_params else set())
        needs = _depends(gen, sources)
        adj: dict[str, list[str]] = {}
        if isinstance(out, fx.Node) and out.name in needs:
            adj[out.name] = ["g"]
        lines = []
        for n in reversed(gen.nodes):
            if n.name not in adj or n.op not in ("call_function", "call_method"):
                continue
            var = f"a_{n.name}"
            lines.append(f"    {var} = " + " + ".join(adj[n.name]))
            if n.name in gen.index_of:
                i, offset, uniform = gen.index_of[n.name]
                if with_params and wants[i]:
                    if uniform:        # one address for the whole tile: sum first, one atomic
                        lines.append(f"    tl.atomic_add(G{i} + ({offset}), "
                                     f"tl.sum(tl.sum(tl.where(VALID, {var}, 0.0), 1), 0), sem='relaxed')")
                    else:
                        lines.append(f"    tl.atomic_add(G{i} + ({offset}), {var}, mask=VALID, sem='relaxed')")
                continue
            for name, code in _adjoint_rules(gen, n, var, needs):
                adj.setdefault(name, []).append(code)
        grad_s = " + ".join(adj.get("score", [])) or "g * 0.0"
        return fwd + "\n" + "\n".join(lines) + f"\n    return {grad_s}\n"

    source = (_header()
              + f"\n\n@triton.jit\ndef value(s, b, h, q_idx, kv_idx, {xs}):\n{fwd}\n    return {ret}\n"
              + f"\n\n@triton.jit\ndef grad(s, b, h, q_idx, kv_idx, g, {xs}):\n{backward_body(False)}"
              + f"\n\n@triton.jit\ndef grad_params(s, b, h, q_idx, kv_idx, g, {xs}, {gs}, VALID):\n"
              + backward_body(True))
    ns = _load_module(source, "score")
    scatters = any(wants[i] and not uniform for i, _, uniform in gen.index_of.values())
    return CompiledMod(ns["value"], ns["grad"], ns["grad_params"], tuple(traced.captured), wants, source, scatters)


__all__ = ["compile_mask", "compile_score", "trace", "CompiledMod", "ModError", "MAX_CAPTURED", "SUPPORTED"]

"""Every documented error of the PyTorch-level API: the right class and a message that names the
argument, what it got and what is accepted."""
import pytest
import torch

import flashtut as ft

HAS_CUDA = torch.cuda.is_available()


def qkv(Nq=9, Nk=11, D=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, Nq, D, generator=g, dtype=dtype),
            torch.randn(2, 3, Nk, D, generator=g, dtype=dtype),
            torch.randn(2, 3, Nk, D, generator=g, dtype=dtype))


def fwd_fns():
    return [ft.naive_attention, ft.tiled_attention]


@pytest.mark.parametrize("fn", fwd_fns())
def test_non_tensor_is_type_error(fn):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        fn(q.tolist(), k, v)
    with pytest.raises(TypeError, match="v must be a torch.Tensor, got ndarray"):
        fn(q, k, v.numpy())


@pytest.mark.parametrize("fn", fwd_fns())
def test_wrong_rank(fn):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must be a 4-D tensor \(B, H, Nq, D\), got shape \(3, 9, 8\)"):
        fn(q[0], k, v)
    with pytest.raises(ValueError, match=r"k must be a 4-D tensor \(B, H, Nk, D\)"):
        fn(q, k[None], v)


@pytest.mark.parametrize("fn", fwd_fns())
def test_mismatches(fn):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="batch and head dims must match"):
        fn(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="heads: q has H = 2 heads and k, v have Hkv = 3"):
        fn(q[:, :2], k, v)
    with pytest.raises(ValueError, match="head dim D must match: q has D = 8, k has 4"):
        fn(q, k[..., :4], v)
    with pytest.raises(ValueError, match="head dim D must match"):
        fn(q, k, v[..., :5])
    with pytest.raises(ValueError, match="same sequence length Nk"):
        fn(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="share one dtype"):
        fn(q, k.double(), v)
    with pytest.raises(ValueError, match="Nq, Nk and D must be at least 1"):
        fn(q[:, :, :0], k, v)


@pytest.mark.parametrize("fn", fwd_fns())
def test_dtype_not_accepted(fn):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q has dtype int32; accepted: float16, bfloat16, float32 or float64"):
        fn(q.int(), k.int(), v.int())


@pytest.mark.skipif(not HAS_CUDA, reason="needs a second device: a CUDA GPU")
@pytest.mark.parametrize("fn", fwd_fns())
def test_device_mismatch(fn):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        fn(q.cuda(), k, v)


@pytest.mark.parametrize("fn", fwd_fns())
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_bad_scale(fn, bad):
    with pytest.raises(ValueError, match="scale must be a positive finite float or None"):
        fn(*qkv(), scale=bad)


@pytest.mark.parametrize("fn", fwd_fns())
def test_scale_of_wrong_type(fn):
    with pytest.raises(TypeError, match="scale must be a positive float or None, got str"):
        fn(*qkv(), scale="0.5")


@pytest.mark.parametrize("fn", fwd_fns())
def test_causal_of_wrong_type(fn):
    with pytest.raises(ValueError, match="causal must be False, True, 'top-left' or 'bottom-right', got 'yes'"):
        fn(*qkv(), causal="yes")
    with pytest.raises(TypeError, match="causal must be a bool, 'top-left' or 'bottom-right', got int"):
        fn(*qkv(), causal=2)


@pytest.mark.parametrize("name", ["block_m", "block_n"])
@pytest.mark.parametrize("bad", [0, -16, 2.5, True, None])
def test_bad_block_sizes(name, bad):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {bad!r}"):
        ft.tiled_attention(q, k, v, **{name: bad})
    o, lse = ft.tiled_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        ft.tiled_attention_backward(q, k, v, o, lse, torch.randn_like(o), **{name: bad})


def test_backward_argument_checks():
    q, k, v = qkv()
    o, lse = ft.tiled_attention(q, k, v, return_lse=True)
    do = torch.randn_like(o)
    bwd = ft.tiled_attention_backward
    with pytest.raises(TypeError, match="do must be a torch.Tensor"):
        bwd(q, k, v, o, lse, None)
    with pytest.raises(TypeError, match="lse must be a torch.Tensor"):
        bwd(q, k, v, o, lse.tolist(), do)
    with pytest.raises(ValueError, match=r"o must have the shape of q, \(2, 3, 9, 8\), got \(2, 3, 8, 8\)"):
        bwd(q, k, v, o[:, :, :8], lse, do)
    with pytest.raises(ValueError, match="do must have the shape of q"):
        bwd(q, k, v, o, lse, do[..., :4])
    with pytest.raises(ValueError, match=r"lse must have shape \(B, H, Nq\) = \(2, 3, 9\), got \(2, 3, 9, 1\)"):
        bwd(q, k, v, o, lse[..., None], do)
    with pytest.raises(ValueError, match="lse has dtype float16; accepted: float32 or float64"):
        bwd(q, k, v, o, lse.half(), do)
    with pytest.raises(ValueError, match="do has dtype int64"):
        bwd(q, k, v, o, lse, do.long())
    with pytest.raises(ValueError, match="scale must be a positive finite float"):
        bwd(q, k, v, o, lse, do, scale=-2)


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given when there is no GPU")
def test_cuda_attention_without_gpu_says_what_is_missing():
    q, k, v = qkv(D=64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="(?i)cuda|cupy"):
        ft.cuda_attention(q, k, v)


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "scale": -1.0}, "scale"),
    (lambda a: {**{n: t.double() for n, t in a.items()}}, "float16 or bfloat16"),
    (lambda a: {n: t[..., :50].repeat(1, 1, 1, 2) for n, t in a.items()}, "head dim D = 100"),
])
def test_cuda_argument_errors_come_before_the_missing_gpu(change, match):
    # CPU tensors on any machine: the argument is wrong, whatever the machine lacks
    q, k, v = qkv(D=64, dtype=torch.float16)
    with pytest.raises(ValueError, match=match):
        ft.cuda_attention(**change({"q": q, "k": k, "v": v}))

"""Answers to the headline exercises, right and wrong, shared by the checker tests
(tests/exercises/test_wrong_answers.py and tests/book/test_headline_exercises.py): one tiled
forward and one tiled backward with switches for the mistakes a checker must catch, and the
helpers that read a checker's verdict."""
import torch

from flashtut.exercises import ch05, ch06

NEG_INF = float("-inf")


def flat(message):
    """The message with its wrapping undone, so phrases can be searched across line breaks."""
    return " ".join(message.split())


def fails(res, *phrases):
    """``res`` is a failing verdict whose message holds every phrase."""
    assert not res.ok, res.message
    for phrase in phrases:
        assert phrase in flat(res.message), res.message


def hidden(q0, q1, k0, k1):
    """The causal mask of the tile of query rows ``q0:q1`` and key rows ``k0:k1`` (top-left)."""
    return torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None]


def cat_copy(t, bn):
    """A whole copy of ``t``, made by a cat of its block slices (each read alone)."""
    return torch.cat([t[:, :, s:s + bn] for s in range(0, t.shape[2], bn)], dim=2)


def tiled_forward(q, k, v, causal, bm, bn, acc_t=None, skip=True, prescale_in_place=False,
                  in_place=False):
    """A tiled forward ``(o, lse)``, right with the defaults. Switches: ``acc_t`` the dtype of
    m, l and the accumulator; ``skip=False`` computes the tiles above the diagonal too;
    ``prescale_in_place`` scales the caller's q; ``in_place`` updates its own accumulators in
    place (still right)."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    acc_t = acc_t or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    if prescale_in_place:
        q.mul_(D ** -0.5)
    scale = 1.0 if prescale_in_place else D ** -0.5
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float64)
    for q0 in range(0, Nq, bm):
        q1 = min(q0 + bm, Nq)
        qi = q[:, :, q0:q1].to(acc_t, copy=True)
        qi = qi.mul_(scale) if in_place else qi * scale
        m = torch.full(qi.shape[:3], NEG_INF, dtype=acc_t)
        l, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for k0 in range(0, min(q1, Nk) if (causal and skip) else Nk, bn):
            k1 = min(k0 + bn, Nk)
            s = qi @ k[:, :, k0:k1].to(acc_t).transpose(-2, -1)
            if causal:
                s = s.masked_fill(hidden(q0, q1, k0, k1), NEG_INF)
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)     # a fully masked row so far
            alpha = torch.exp(m - m_safe)
            vj = v[:, :, k0:k1].to(acc_t)
            if in_place:
                p = s.sub_(m_safe[..., None]).exp_()
                l.mul_(alpha).add_(p.sum(-1))
                acc.mul_(alpha[..., None]).add_(p @ vj)
            else:
                p = torch.exp(s - m_safe[..., None])
                l, acc = alpha * l + p.sum(-1), alpha[..., None] * acc + p @ vj
            m = m_new
        o[:, :, q0:q1] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, q0:q1] = (m + torch.log(l)).double()
    return o, lse


def tiled_backward(q, k, v, o, lse, do, causal, bm, bn, acc_t=None, skip=True):
    """A tiled backward ``(dq, dk, dv)`` over key blocks, right with the defaults. Switches:
    ``acc_t`` the dtype of every accumulator (the inputs' own dtype is the float16 mistake);
    ``skip=False`` computes the tiles above the diagonal too."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    acc_t = acc_t or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    sc, delta = D ** -0.5, (do.to(acc_t) * o.to(acc_t)).sum(-1)
    dq = torch.zeros(q.shape, dtype=acc_t)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for k0 in range(0, Nk, bn):
        k1 = min(k0 + bn, Nk)
        kj, vj = k[:, :, k0:k1].to(acc_t), v[:, :, k0:k1].to(acc_t)
        dkj, dvj = torch.zeros_like(kj), torch.zeros_like(vj)
        for q0 in range((k0 // bm) * bm if (causal and skip) else 0, Nq, bm):
            q1 = min(q0 + bm, Nq)
            qi, doi = q[:, :, q0:q1].to(acc_t), do[:, :, q0:q1].to(acc_t)
            s = qi @ kj.transpose(-2, -1) * sc
            if causal:
                s = s.masked_fill(hidden(q0, q1, k0, k1), NEG_INF)
            p = torch.exp(s - lse[:, :, q0:q1, None].to(acc_t))
            dvj += p.transpose(-2, -1) @ doi
            ds = p * (doi @ vj.transpose(-2, -1) - delta[:, :, q0:q1, None])
            dq[:, :, q0:q1] += ds @ kj * sc
            dkj += ds.transpose(-2, -1) @ qi * sc
        dk[:, :, k0:k1], dv[:, :, k0:k1] = dkj.to(k.dtype), dvj.to(v.dtype)
    return dq.to(q.dtype), dk, dv


#: where ``keeping(..., how="global")`` leaves its extra tensor
KEPT = {}


def keeping(extra, how="saved"):
    """An autograd.Function with the worked solution's forward and backward that keeps one
    more tensor, ``extra(q, k, o, lse, causal)``: ``how`` is ``"saved"`` (save_for_backward),
    ``"ctx"`` (an attribute of ctx) or ``"global"`` (a module-level dict, a cache)."""

    class Keeps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, bm, bn):
            o, lse = ch05.solution_flash_forward(q, k, v, causal, bm, bn)
            more = extra(q, k, o, lse, causal)
            if how == "saved":
                ctx.save_for_backward(q, k, v, o, lse, more)
            else:
                ctx.save_for_backward(q, k, v, o, lse)
                if how == "ctx":
                    ctx.more = [more]
                else:
                    KEPT["more"] = more
            ctx.args = (causal, bm, bn)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors[:5]
            return (*ch06.solution_flash_backward(q, k, v, o, lse, do, *ctx.args), None, None, None)

    return Keeps

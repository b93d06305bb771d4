"""The decoder the roofline benchmark (lssim/benchmarks/roofline_gpu.py) times: a Qwen/Llama-shaped forward pass written
the way an inference engine runs it (fused QKV and gate/up projections, RoPE, a preallocated KV cache, GQA attention
over it, the LM head and vLLM's random sampling), the decode attention implementations it is timed with, and
`selftest`: on CPU, it computes what transformers' Qwen2 does.
"""

from __future__ import annotations

from lssim.benchmarks.roofline_arch import ARCH, Arch, param_count
from lssim.cost import MODELS, ModelSpec


class Decoder:
    """A Qwen2/Llama decoder as an engine runs it (fused projections, preallocated KV cache).

    Each layer is two pieces around the attention call, as in vLLM's piecewise compilation:
    ``_pre_attn`` (RMSNorm, QKV projection, RoPE) and ``_post_attn`` (output projection, residual,
    RMSNorm, gated MLP, residual). ``fuse()`` compiles both with ``torch.compile`` (Inductor fuses the
    element-wise work into a few kernels, as vLLM's compilation does); the calls take ``fused=True``
    to use them.
    """

    def __init__(self, spec: ModelSpec, arch: Arch, device, dtype, seed: int = 0) -> None:
        import torch

        self.spec, self.arch = spec, arch
        gen = torch.Generator(device=device).manual_seed(seed)
        h, d, hq, hkv, inter = spec.hidden, spec.head_dim, spec.n_heads, spec.n_kv_heads, arch.intermediate

        def w(*shape):
            return torch.randn(*shape, device=device, dtype=dtype, generator=gen).mul_(0.02)

        def ones(k):
            return torch.ones(k, device=device, dtype=dtype)

        self.embed = w(arch.vocab, h)
        self.lm_head = self.embed if arch.tied else w(arch.vocab, h)
        qkv = (hq + 2 * hkv) * d
        self.layers = [
            {"ln1": ones(h), "wqkv": w(qkv, h), "bqkv": w(qkv) if arch.qkv_bias else None, "wo": w(h, hq * d),
             "ln2": ones(h), "wgu": w(2 * inter, h), "wd": w(h, inter)}
            for _ in range(spec.n_layers)
        ]
        self.norm = ones(h)
        self.inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        self.eps = 1e-6
        self._pieces = {False: (_pre_attn, _post_attn)}

    def fuse(self) -> None:
        import torch

        self._pieces[True] = (torch.compile(_pre_attn, dynamic=True, fullgraph=True),
                              torch.compile(_post_attn, dynamic=True, fullgraph=True))

    def n_params(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.arch.tied else [self.lm_head])
        tensors += [t for layer in self.layers for t in layer.values() if t is not None]
        return sum(t.numel() for t in tensors)

    def rope_tables(self, positions):
        """cos, sin of shape positions.shape + (head_dim,), in the weights' dtype."""
        import torch

        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos().to(self.embed.dtype), emb.sin().to(self.embed.dtype)

    def decode_hidden(self, tokens, cos, sin, pos: int, kcache, vcache, attend, fused: bool = False):
        """One decode iteration: ``tokens`` [n] at position ``pos`` (cos, sin: [n, D]); caches are
        per-layer [n, Hkv, L, D] views with ``pos < L``; ``attend(q [n, Hkv, G, D], K, V)`` attends over
        all L cached tokens. Returns the final normed hidden states [n, hidden]."""
        import torch.nn.functional as F

        s = self.spec
        pre, post = self._pieces[fused]
        n, hq, hkv = tokens.shape[0], s.n_heads, s.n_kv_heads
        x = self.embed[tokens]
        for i, p in enumerate(self.layers):
            q, k, v = pre(x, p["ln1"], p["wqkv"], p["bqkv"], cos, sin, hq, hkv, self.eps)
            kcache[i][:, :, pos] = k
            vcache[i][:, :, pos] = v
            o = attend(q.view(n, hkv, hq // hkv, s.head_dim), kcache[i], vcache[i])
            x = post(x, o.reshape(n, hq * s.head_dim), p["wo"], p["ln2"], p["wgu"], p["wd"], self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)

    def prefill_hidden(self, tokens, cos, sin, kcache, vcache, fused: bool = False):
        """Prefill ``tokens`` [b, p] at positions 0..p-1 (cos, sin: [b*p, D]), writing caches
        [b, Hkv, >= p, D]; causal attention. Returns the final normed hidden state of each prompt's
        last token [b, hidden]."""
        import torch.nn.functional as F

        s = self.spec
        pre, post = self._pieces[fused]
        b, plen = tokens.shape
        d, hq, hkv = s.head_dim, s.n_heads, s.n_kv_heads
        x = self.embed[tokens.reshape(-1)]
        for i, p in enumerate(self.layers):
            q, k, v = pre(x, p["ln1"], p["wqkv"], p["bqkv"], cos, sin, hq, hkv, self.eps)
            q = q.view(b, plen, hq, d).transpose(1, 2)
            k = k.view(b, plen, hkv, d).transpose(1, 2)
            v = v.view(b, plen, hkv, d).transpose(1, 2)
            kcache[i][:, :, :plen] = k
            vcache[i][:, :, :plen] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
            x = post(x, o.transpose(1, 2).reshape(b * plen, hq * d), p["wo"], p["ln2"], p["wgu"], p["wd"], self.eps)
        last = x.view(b, plen, -1)[:, -1]
        return F.rms_norm(last, (last.shape[-1],), self.norm, self.eps)

    def logits(self, hidden):
        import torch.nn.functional as F

        return F.linear(hidden, self.lm_head)

    @staticmethod
    def sample(logits):
        """vLLM's random sampling at temperature 1: fp32 softmax, then argmax of p / Exp(1) noise."""
        import torch

        probs = torch.softmax(logits.float(), -1)
        return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)


def _rope(x, cos, sin):
    import torch

    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _pre_attn(x, ln1, wqkv, bqkv, cos, sin, hq: int, hkv: int, eps: float):
    """x [T, hidden] -> q [T, Hq, D], k, v [T, Hkv, D] (q and k rotated); cos, sin [T, D]."""
    import torch.nn.functional as F

    t = x.shape[0]
    d = cos.shape[-1]
    qkv = F.linear(F.rms_norm(x, (x.shape[-1],), ln1, eps), wqkv, bqkv)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    c, s = cos[:, None], sin[:, None]
    return _rope(q.reshape(t, hq, d), c, s), _rope(k.reshape(t, hkv, d), c, s), v.reshape(t, hkv, d)


def _post_attn(x, o, wo, ln2, wgu, wd, eps: float):
    """Residual after attention, then the gated MLP with its residual."""
    import torch.nn.functional as F

    x = x + F.linear(o, wo)
    g, u = F.linear(F.rms_norm(x, (x.shape[-1],), ln2, eps), wgu).chunk(2, -1)
    return x + F.linear(F.silu(g) * u, wd)


def attention(kind: str):
    """``attend(q, K, V)`` for decode: q [n, Hkv, G, D] (the G query heads of a KV head as G rows),
    K, V [n, Hkv, L, D]; no mask (the new token sees its whole context)."""
    import torch
    import torch.nn.functional as F

    if kind == "bmm":
        def attend(q, k, v):
            scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
            return torch.matmul(torch.softmax(scores, -1).to(q.dtype), v)
        return attend
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[kind]

    def attend(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v)
    return attend


def first_line(exc: Exception) -> str:
    """An exception as one short line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def selftest() -> None:
    """The decoder's prefill and one cached decode step give transformers' Qwen2 logits (fp32, CPU),
    with every decode attention implementation that runs on CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    arch = Arch(vocab=97, intermediate=96, tied=True, qkv_bias=True, rope_theta=1e6)
    cfg = Qwen2Config(vocab_size=arch.vocab, hidden_size=64, intermediate_size=arch.intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=arch.rope_theta,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64)
    hf = Qwen2ForCausalLM(cfg).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.2)
    shape = (2, 64, 4, 2, 16, 4)  # layers, hidden, heads, KV heads, head_dim, fp32
    spec = ModelSpec(param_count(ModelSpec(1, *shape), arch), *shape, "selftest")
    if sum(p.numel() for p in hf.parameters()) != spec.params:
        raise AssertionError("param_count disagrees with transformers")
    dec = Decoder(spec, arch, torch.device("cpu"), torch.float32)
    sd = hf.state_dict()
    dec.embed = dec.lm_head = sd["model.embed_tokens.weight"]
    dec.norm = sd["model.norm.weight"]
    for i, layer in enumerate(dec.layers):
        g = lambda k: sd[f"model.layers.{i}.{k}"]  # noqa: E731
        layer.update(ln1=g("input_layernorm.weight"), ln2=g("post_attention_layernorm.weight"), wo=g("self_attn.o_proj.weight"),
                     wqkv=torch.cat([g(f"self_attn.{x}_proj.weight") for x in "qkv"]),
                     bqkv=torch.cat([g(f"self_attn.{x}_proj.bias") for x in "qkv"]),
                     wgu=torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]), wd=g("mlp.down_proj.weight"))
    b, plen = 3, 9
    ids = torch.randint(0, arch.vocab, (b, plen + 1))
    with torch.no_grad():
        ref = hf(ids).logits  # [b, plen+1, V]
        ks = [torch.zeros(b, 2, plen + 1, 16) for _ in range(2)]
        vs = [torch.zeros(b, 2, plen + 1, 16) for _ in range(2)]
        cos, sin = dec.rope_tables(torch.arange(plen).repeat(b))
        got = dec.logits(dec.prefill_hidden(ids[:, :plen], cos, sin, ks, vs))
        err = (got - ref[:, plen - 1]).abs().max().item()
        print(f"prefill logits vs transformers: max abs diff {err:.2e}")
        assert err < 1e-4, err
        cos, sin = dec.rope_tables(torch.full((b,), plen))
        for kind in ("bmm", "math"):
            got = dec.logits(dec.decode_hidden(ids[:, plen], cos, sin, plen, ks, vs, attention(kind)))
            err = (got - ref[:, plen]).abs().max().item()
            print(f"decode ({kind}) logits vs transformers: max abs diff {err:.2e}")
            assert err < 1e-4, err
        try:
            dec.fuse()
            got = dec.logits(dec.decode_hidden(ids[:, plen], cos, sin, plen, ks, vs, attention("bmm"), fused=True))
        except Exception as exc:  # noqa: BLE001 - torch.compile needs a C compiler on CPU
            print(f"fused (torch.compile) decode not checked: {first_line(exc)}")
        else:
            err = (got - ref[:, plen]).abs().max().item()
            print(f"decode (bmm, fused) logits vs transformers: max abs diff {err:.2e}")
            assert err < 1e-4, err
    for name, arch_ in ARCH.items():
        assert param_count(MODELS[name], arch_) == MODELS[name].params, name
    print("selftest passed; ARCH parameter counts match MODELS")

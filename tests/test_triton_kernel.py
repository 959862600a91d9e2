"""The Triton column-sum kernel (extra `gpu`) on CPU through Triton's interpreter, against a float64
softmax, and the "triton" route in a model against eager attention. Skipped without triton."""
import pytest
import torch

pytest.importorskip("triton")  # TRITON_INTERPRET=1 is set in conftest.py: kernels run on the CPU
from sinklens.attention.fused import fused_sdpa_with_lse  # noqa: E402
from sinklens.attention.triton_kernel import column_sums  # noqa: E402

B, H, H_KV = 2, 4, 2


def reference(q, k, scale, causal, weight, groups, num_groups):
    """(lse (B, H, S_q), received (B, H, S_k), groups (B, G, H, S_k)) of a float64 softmax."""
    s_q, s_k = q.shape[2], k.shape[2]
    kk = k.double().repeat_interleave(H // H_KV, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), kk) * scale
    if causal:  # lower-right aligned
        s = s.masked_fill(torch.arange(s_k)[None, :] > torch.arange(s_k - s_q, s_k)[:, None], float("-inf"))
    p = s.softmax(-1)
    received = torch.einsum("bhqk,bq->bhk", p, weight.double())
    onehot = torch.nn.functional.one_hot(groups + 1, num_groups + 1)[..., 1:].double() * weight.double()[..., None]
    return s.logsumexp(-1), received, torch.einsum("bhqk,bqg->bghk", p, onehot)


@pytest.mark.parametrize("causal,s_q,s_k,d,num_groups", [(True, 40, 40, 16, 2), (False, 40, 40, 16, 3),
                                                         (True, 5, 37, 24, 1), (False, 1, 37, 16, 0),
                                                         (True, 70, 70, 32, 2)])
def test_column_sums_equal_a_float64_softmax(causal, s_q, s_k, d, num_groups):
    """Tiles that cut the keys and queries unevenly, a head size that is no power of two, a causal
    call over more keys than queries (a cache), GQA, weighted rows and query groups."""
    g = torch.Generator().manual_seed(s_q + s_k + d)
    q = torch.randn(B, H, s_q, d, generator=g)
    k = torch.randn(B, H_KV, s_k, d, generator=g)
    weight = torch.rand(B, s_q, generator=g).round()
    groups = torch.randint(-1, num_groups, (B, s_q), generator=g) if num_groups else torch.full((B, s_q), -1)
    lse, ref_r, ref_g = reference(q, k, 0.25, causal, weight, groups, num_groups)
    received, rg, _ = column_sums(q, k, lse.float(), 0.25, causal, query_weight=weight,
                               query_groups=groups if num_groups else None, num_groups=num_groups,
                               block_m=16, block_n=16)
    assert (received - ref_r).abs().max() < 1e-5
    if num_groups:
        assert rg.shape == (B, num_groups, H, s_k)
        assert (rg - ref_g).abs().max() < 1e-5
    else:
        assert rg is None


@pytest.mark.parametrize("causal,keep_self", [(True, False), (True, True), (False, False), (False, True)])
def test_blocked_keys_sums_after_and_before_blocking(causal, keep_self):
    """Blocked keys per head: the sums after blocking (a row whose every visible key is blocked keeps
    them, as masks.apply_blocking) and what each key would have received, against float64."""
    from sinklens.attention.masks import apply_blocking

    s, d = 40, 16
    g = torch.Generator().manual_seed(11)
    q, k = torch.randn(B, H, s, d, generator=g), torch.randn(B, H_KV, s, d, generator=g)
    blocked = torch.zeros(B, H, s, dtype=torch.bool)
    blocked[0, 0, 0] = True  # causal query 0 sees only key 0: its row keeps it (without keep_self)
    blocked[0, 1, [3, 17, 39]] = True
    blocked[1, 2] = True  # every key of a head
    blocked[1, 3, 5:30] = True
    weight = torch.rand(B, s, generator=g).round()
    groups = torch.randint(-1, 2, (B, s), generator=g)
    allowed = torch.ones(1, 1, s, s, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    after = apply_blocking(allowed, blocked, keep_self, s, s)  # (B, H, S, S)
    kk = k.double().repeat_interleave(H // H_KV, 1)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.double(), kk) * 0.25
    p_free = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    p_after = scores.masked_fill(~after, float("-inf")).softmax(-1)
    lse_after = scores.masked_fill(~after, float("-inf")).logsumexp(-1).float()
    lse_free = scores.masked_fill(~allowed, float("-inf")).logsumexp(-1).float()
    received, rg, unblocked = column_sums(q, k, lse_after, 0.25, causal, query_weight=weight, query_groups=groups,
                                          num_groups=2, blocked=blocked, lse_free=lse_free, keep_self=keep_self,
                                          block_m=16, block_n=16)
    w = weight.double()
    assert (received - torch.einsum("bhqk,bq->bhk", p_after, w)).abs().max() < 1e-5
    assert (unblocked - torch.einsum("bhqk,bq->bhk", p_free, w)).abs().max() < 1e-5
    onehot = torch.nn.functional.one_hot(groups + 1, 3)[..., 1:].double() * w[..., None]
    assert (rg - torch.einsum("bhqk,bqg->bghk", p_after, onehot)).abs().max() < 1e-5
    # the fully blocked head: without keep_self every row keeps its keys, so nothing changes there
    assert torch.allclose(received[1, 2], unblocked[1, 2], atol=1e-5) == (not keep_self)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_column_sums_from_sdpas_lse_sum_to_the_weighted_rows(dtype, tol):
    """With sdpa's own lse (as the route runs it), every counted row's probabilities sum to one: the
    column sums add up to the number of counted rows, per head, in float32 and bfloat16."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, 48, 16, generator=g).to(dtype), torch.randn(1, H_KV, 48, 16, generator=g).to(dtype),
               torch.randn(1, H_KV, 48, 16, generator=g).to(dtype))
    _, lse = fused_sdpa_with_lse(q, k, v, None, 0.25, True)
    weight = torch.ones(1, 48)
    weight[0, :7] = 0
    received, _, _ = column_sums(q, k, lse, 0.25, True, query_weight=weight, block_m=16, block_n=32)
    assert torch.allclose(received.sum(-1), torch.full((1, H), 41.0), atol=41 * tol)
    _, ref, _ = reference(q.float(), k.float(), 0.25, True, weight, torch.full((1, 48), -1), 0)
    assert (received - ref).abs().max() < tol


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sdpa_lse", [True, False], ids=["sdpa-lse", "no-lse"])
def test_triton_route_in_a_model_equals_eager_column_sums(causal, sdpa_lse, monkeypatch):
    """Through the attention function (route="triton"), in a tiny GQA Llama: the column sums are eager's
    and the logits are plain mode's, bit for bit (the output is sdpa's), also where sdpa's kernel
    gives no log-sum-exp."""
    from sinklens.attention import ATTENTION_NAME, AttentionRequest
    from sinklens.attention.routes import BY_NAME
    from test_attention import B as B_, S, V, run, tiny_model
    import sinklens.attention.routes.triton as triton_route
    if not sdpa_lse:  # the kernel F.sdpa picks keeps no lse (CUDA's math kernel): the chunked softmax records
        real = triton_route.fused_sdpa_with_lse
        monkeypatch.setattr(triton_route, "fused_sdpa_with_lse", lambda *a: (real(*a)[0], None))
    model = tiny_model("llama", causal, 2)
    ids = torch.randint(0, V, (B_, S), generator=torch.Generator().manual_seed(5))
    eager = run(model, "eager", ids, None, output_attentions=True)
    plain = run(model, ATTENTION_NAME, ids, None).logits
    route, ran = BY_NAME["triton"], []
    route.run = lambda call, _run=route.run: ran.append(out := _run(call)) or out
    try:
        req = AttentionRequest(capture=True, route="triton")
        logits = run(model, ATTENTION_NAME, ids, None, sinklens=req).logits
    finally:
        del route.run
    assert ran and all(out is not None for out in ran)  # the triton route, not its fallback, took every layer
    assert torch.equal(logits, plain)
    assert (req.received - torch.stack([a.sum(2) for a in eager.attentions])).abs().max() < 1e-5


COMPILE = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sinklens.attention.triton_kernel import _colsum_kernel
dtype, blocking, masked = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
ptr = "*" + dtype
sig = dict(Q=ptr, K=ptr, LSE="*fp32", R="*fp32", RG="*fp32", QW="*fp32", QG="*i32", BLOCKED="*u8", FIRST_FREE="*i32",
           LSE_FREE="*fp32", RU="*fp32", MASK="*u8", M_SB="i32", M_SH="i32", MASK_B="*u8", MB_SB="i64", MB_SH="i32",
           H="i32", REP="i32", S_Q="i32", S_K="i32", scale="fp32")
consts = dict(D=128, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64, NUM_GROUPS=2, GROUPS_P2=2, CAUSAL=True, HAS_R=True, HAS_W=dtype != "fp16",
              HAS_BLOCKED=blocking, KEEP_SELF=False, HAS_MASK=masked, UPCAST=False, IEEE=dtype == "fp32")
src = ASTSource(fn=_colsum_kernel, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
try:
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
except RuntimeError as e:
    if "ptxas" in str(e) and "not found" in str(e).lower():
        print("SKIP", e)
        sys.exit(0)
    raise
assert compiled.asm["cubin"]
print("OK")
"""


@pytest.mark.slow
def test_kernel_compiles_for_a_hopper_gpu():
    """The interpreter runs the kernel's Python, not Triton's compiler: a kernel the compiler refuses
    (a global it may not read, a dot shape Hopper lacks) passes every test above. Compiling it for
    sm_90 to machine code (ptxas ships with triton) needs no GPU. One process per variant, without
    the interpreter: one process compiling a second variant of the same function has failed spuriously."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = {case: subprocess.Popen([sys.executable, "-c", COMPILE, *case], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            for case in (("bf16", "0", "0"), ("fp16", "0", "0"), ("fp32", "0", "0"), ("bf16", "1", "0"),
                         ("bf16", "1", "1"))}
    for case, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (case, err[-2000:])
        if out.startswith("SKIP"):
            pytest.skip(f"no ptxas here: {out}")
        assert out.strip().endswith("OK"), (case, out, err[-500:])


@pytest.mark.slow
def test_masked_traced_generation_through_triton_equals_lse(tmp_path, monkeypatch):
    """A sink-masked, traced tiny-dlm generation: the triton route (blocked keys, would-be sums in its
    kernel) gives the lse route's tokens and the same record of what was blocked."""
    import sinklens
    from sinklens.attention.routes import BY_NAME
    from sinklens.experiments.twins import LOAD, dlm_sampler, heldout_prompt
    from sinklens.masking.config import MaskingConfig
    from sinklens.masking.policy import SinkMaskingPolicy
    from sinklens.samplers import CaptureOptions

    m = sinklens.load("tiny-dlm", **LOAD)
    ids = torch.tensor([m.apply_chat_template(heldout_prompt(0))])
    settings = {**dlm_sampler(), "steps": 8, "gen_length": 8, "block_length": 8}
    triton_route, blocked_taken = BY_NAME["triton"], []
    real_run = type(triton_route).run

    def spy(self, call):
        out = real_run(self, call)
        if call.blocked is not None and out is not None:
            blocked_taken.append(call.module.layer_idx)
        return out

    monkeypatch.setattr(type(triton_route), "run", spy)
    runs = {}
    for route in ("lse", "triton"):
        hook = SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers, is_diffusion=True, model=m)
        out = m.generate(ids, hook=hook, capture=CaptureOptions(route=route), trace=str(tmp_path / f"{route}.arrow"),
                         **settings)
        runs[route] = (out.sequences, hook.summary())
    assert blocked_taken  # the triton route itself took calls with blocked keys
    assert torch.equal(runs["lse"][0], runs["triton"][0])
    assert runs["lse"][1] == runs["triton"][1]

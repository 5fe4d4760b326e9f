"""attn_implementation="ioattn" in Hugging Face transformers: tiny randomly initialised models
(built from configs, nothing downloaded) give the same greedy tokens as "sdpa" / "eager"."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import ioattn  # noqa: E402
import ioattn.transformers as iotf  # noqa: E402
from ioattn import ops  # noqa: E402

NEW_TOKENS = 20


@pytest.fixture
def calls(monkeypatch):
    """Counts the kernel entry points the attention function uses."""
    counts = {"attention": 0, "attention_varlen": 0}
    for name in counts:
        fn = getattr(ops, name)

        def spy(*a, _fn=fn, _name=name, **kw):
            counts[_name] += 1
            return _fn(*a, **kw)

        monkeypatch.setattr(ops, name, spy)
    return counts


def llama_config(**kw):
    args = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256, eos_token_id=None, bos_token_id=1, pad_token_id=0,
    )
    args.update(kw)
    return transformers.LlamaConfig(**args)


def build(model_cls, config, impl, seed=0):
    torch.manual_seed(seed)
    model = model_cls._from_config(copy.deepcopy(config), attn_implementation=impl, torch_dtype=torch.float32)
    assert model.config._attn_implementation == impl
    return model.eval()


def generate(model, ids, mask=None):
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
            pad_token_id=0,
        )


def test_registered():
    from transformers import AttentionInterface

    assert AttentionInterface._global_mapping["ioattn"] is iotf.ioattn_attention_forward


def test_llama_greedy_matches_sdpa(calls):
    config = llama_config()
    ids = torch.randint(2, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    ours = generate(build(transformers.LlamaForCausalLM, config, "ioattn"), ids)
    assert calls["attention"] == config.num_hidden_layers * NEW_TOKENS  # prefill + 19 decode steps
    theirs = generate(build(transformers.LlamaForCausalLM, config, "sdpa"), ids)
    assert ours.shape == (1, 9 + NEW_TOKENS)
    assert torch.equal(ours, theirs)


def test_llama_logits_close_to_sdpa():
    config = llama_config()
    ids = torch.randint(2, 128, (2, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = build(transformers.LlamaForCausalLM, config, "ioattn")(ids).logits
        b = build(transformers.LlamaForCausalLM, config, "sdpa")(ids).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _padded_batch(side):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 128, (3, 11), generator=gen)
    mask = torch.ones_like(ids)
    for row, n in enumerate((4, 0, 7)):  # pad tokens per row
        if n:
            if side == "left":
                mask[row, :n] = 0
            else:
                mask[row, -n:] = 0
    ids[mask == 0] = 0
    return ids, mask


def test_llama_left_padded_batch_matches_sdpa(calls):
    config = llama_config()
    ids, mask = _padded_batch("left")
    ours = generate(build(transformers.LlamaForCausalLM, config, "ioattn"), ids, mask)
    assert calls["attention_varlen"] > 0, "a padded batch runs as varlen"
    theirs = generate(build(transformers.LlamaForCausalLM, config, "sdpa"), ids, mask)
    assert torch.equal(ours, theirs)
    # each row alone, unpadded, gives the same continuation
    model = build(transformers.LlamaForCausalLM, config, "ioattn")
    for row in range(ids.shape[0]):
        alone = generate(model, ids[row : row + 1, mask[row].bool()])
        assert torch.equal(alone[0, -NEW_TOKENS:], ours[row, -NEW_TOKENS:])


def test_llama_static_cache_matches_sdpa(calls):
    """A static cache has more key slots than tokens: transformers passes the short 2-D mask and
    the unused slots must not be attended to."""
    config = llama_config()
    ids, mask = _padded_batch("left")
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        ours = build(transformers.LlamaForCausalLM, config, "ioattn").generate(ids, attention_mask=mask, **kw)
        theirs = build(transformers.LlamaForCausalLM, config, "sdpa").generate(ids, attention_mask=mask, **kw)
    assert calls["attention_varlen"] > 0
    assert torch.equal(ours, theirs)


def test_llama_static_cache_without_mask_matches_sdpa(calls):
    """No padding mask: the cache's unused slots past the tokens must stay invisible (the mask
    function passes the keys in use; the attention runs over that many through the kvcache op)."""
    config = llama_config()
    ids = torch.randint(2, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    models = {impl: build(transformers.LlamaForCausalLM, config, impl) for impl in ("ioattn", "sdpa")}
    with torch.no_grad():
        logits = {
            impl: m(input_ids=ids, past_key_values=transformers.StaticCache(config=m.config, max_cache_len=16)).logits
            for impl, m in models.items()
        }
        torch.testing.assert_close(logits["ioattn"], logits["sdpa"], rtol=1e-5, atol=1e-5)
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, cache_implementation="static")
        ours, theirs = (models[impl].generate(ids[:1], **kw) for impl in ("ioattn", "sdpa"))
    assert torch.equal(ours, theirs)


def test_llama_compiles_fullgraph():
    """torch.compile(fullgraph=True) traces the model through the custom ops: no graph break from
    the attention function (aot_eager: the tracing is what is tested, not inductor's code)."""
    config = llama_config()
    ids = torch.randint(2, 128, (2, 9), generator=torch.Generator().manual_seed(5))
    model = build(transformers.LlamaForCausalLM, config, "ioattn")
    with torch.no_grad():
        eager = model(input_ids=ids).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids=ids).logits
        sdpa = build(transformers.LlamaForCausalLM, config, "sdpa")(input_ids=ids).logits
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch.testing.assert_close(compiled, sdpa, rtol=1e-5, atol=1e-5)
    # A static cache without a mask: the keys in use travel as a tensor, so this compiles too.
    with torch.no_grad():
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        static = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids=ids, past_key_values=cache).logits
    torch.testing.assert_close(static, sdpa, rtol=1e-5, atol=1e-5)


def test_llama_right_padded_forward_matches_sdpa(calls):
    config = llama_config()
    ids, mask = _padded_batch("right")
    with torch.no_grad():
        a = build(transformers.LlamaForCausalLM, config, "ioattn")(ids, attention_mask=mask).logits
        b = build(transformers.LlamaForCausalLM, config, "sdpa")(ids, attention_mask=mask).logits
    assert calls["attention_varlen"] == config.num_hidden_layers
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], rtol=1e-5, atol=1e-5)


def test_packed_sequences_by_position_ids_match_sdpa(calls):
    """Training-style packing: no mask, positions restarting inside the row."""
    config = llama_config()
    ids = torch.randint(2, 128, (1, 20), generator=torch.Generator().manual_seed(4))
    pos = torch.cat([torch.arange(7), torch.arange(9), torch.arange(4)])[None]
    with torch.no_grad():
        a = build(transformers.LlamaForCausalLM, config, "ioattn")(ids, position_ids=pos).logits
        # sdpa builds the packed (block-diagonal) mask only without a cache
        b = build(transformers.LlamaForCausalLM, config, "sdpa")(ids, position_ids=pos, use_cache=False).logits
        cu = torch.tensor([0, 7, 16, 20], dtype=torch.int32)
        c = build(transformers.LlamaForCausalLM, config, "ioattn")(
            ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9
        ).logits
    assert calls["attention_varlen"] == 2 * config.num_hidden_layers
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, a, rtol=0, atol=0)
    # each segment alone gives the same logits
    model = build(transformers.LlamaForCausalLM, config, "sdpa")
    with torch.no_grad():
        for lo, hi in ((0, 7), (7, 16), (16, 20)):
            alone = model(ids[:, lo:hi]).logits
            torch.testing.assert_close(a[:, lo:hi], alone, rtol=1e-5, atol=1e-5)


def test_mistral_sliding_window_matches_sdpa(calls):
    config = transformers.MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        vocab_size=128, max_position_embeddings=256, sliding_window=6, eos_token_id=None, pad_token_id=0,
    )
    ids = torch.randint(2, 128, (2, 13), generator=torch.Generator().manual_seed(5))
    ours = generate(build(transformers.MistralForCausalLM, config, "ioattn"), ids)
    theirs = generate(build(transformers.MistralForCausalLM, config, "sdpa"), ids)
    assert torch.equal(ours, theirs)
    # the window matters: the same weights without it continue differently
    with torch.no_grad():
        a = build(transformers.MistralForCausalLM, config, "ioattn")(ids).logits
        nowin = copy.deepcopy(config)
        nowin.sliding_window = None
        b = build(transformers.MistralForCausalLM, nowin, "ioattn")(ids).logits
    assert not torch.allclose(a, b)


def test_gemma2_softcap_and_sliding_window_match_eager(calls):
    if not hasattr(transformers, "Gemma2Config"):
        pytest.skip("this transformers has no Gemma2")
    config = transformers.Gemma2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=128, max_position_embeddings=256, sliding_window=5, attn_logit_softcapping=2.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=16, eos_token_id=None, pad_token_id=0,
    )
    ids, mask = _padded_batch("left")
    ours = generate(build(transformers.Gemma2ForCausalLM, config, "ioattn"), ids, mask)
    theirs = generate(build(transformers.Gemma2ForCausalLM, config, "eager"), ids, mask)
    assert torch.equal(ours, theirs)
    with torch.no_grad():
        a = build(transformers.Gemma2ForCausalLM, config, "ioattn")(ids, attention_mask=mask).logits
        b = build(transformers.Gemma2ForCausalLM, config, "eager")(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# The attention function on its own
# ----------------------------------------------------------------------------------------------


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(B=2, Hq=4, Hkv=2, S=10, D=16, seed=6):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, h, S, D, generator=gen) for h in (Hq, Hkv, Hkv))


def _sdpa(q, k, v, mask4d):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask4d, enable_gqa=True).transpose(1, 2)


def test_returns_bshd_and_none():
    q, k, v = _qkv()
    out, weights = iotf.ioattn_attention_forward(_Module(), q, k, v, None, scaling=0.25)
    assert weights is None and out.shape == (2, 10, 4, 16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_4d_padding_mask_is_unpadded():
    q, k, v = _qkv()
    S = q.shape[2]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    keep = torch.ones(2, S, dtype=torch.bool)
    keep[0, :3] = False  # left padding
    keep[1, -2:] = False  # right padding
    mask = (causal[None] & keep[:, None, :])[:, None]  # (B, 1, S, S)
    out, _ = iotf.ioattn_attention_forward(_Module(), q, k, v, mask)
    ref = _sdpa(q, k, v, mask)
    torch.testing.assert_close(out[keep], ref[keep], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))
    # the same as an additive float mask
    fmask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out2, _ = iotf.ioattn_attention_forward(_Module(), q, k, v, fmask)
    torch.testing.assert_close(out2, out, rtol=0, atol=0)


def test_4d_causal_only_mask_is_plain_attention(calls):
    q, k, v = _qkv()
    mask = torch.ones(10, 10, dtype=torch.bool).tril()[None, None].expand(2, 1, 10, 10)
    out, _ = iotf.ioattn_attention_forward(_Module(), q, k, v, mask)
    assert calls == {"attention": 1, "attention_varlen": 0}
    torch.testing.assert_close(out, _sdpa(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_unsupported_masks_raise():
    q, k, v = _qkv()
    doc = torch.zeros(10, 10, dtype=torch.bool)
    doc[:5, :5] = True
    doc[5:, 5:] = True
    mask = (doc & torch.ones(10, 10, dtype=torch.bool).tril())[None, None].expand(2, 1, 10, 10)
    with pytest.raises(NotImplementedError, match="padding mask"):
        iotf.ioattn_attention_forward(_Module(), q, k, v, mask)
    bias = torch.randn(2, 1, 10, 10)
    with pytest.raises(NotImplementedError, match="bias"):
        iotf.ioattn_attention_forward(_Module(), q, k, v, bias)


def test_dropout_and_sinks_rejected():
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="dropout"):
        iotf.ioattn_attention_forward(_Module(), q, k, v, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="sinks"):
        iotf.ioattn_attention_forward(_Module(), q, k, v, None, s_aux=torch.zeros(4))


def test_ioattn_public_api_still_reachable():
    assert callable(ioattn.attention)

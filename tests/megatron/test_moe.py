"""Mixtures of experts on megatron-core in one process (world of one, gloo): Qwen3-MoE (dense and routed layers,
renormalised or not) and Mixtral give HF's log-probs and gradient, convert HF -> mcore -> HF bit for bit, and
what megatron's dropless MoE layer cannot compute as HF does is refused by config key."""

from __future__ import annotations

import types

import pytest
import safetensors.torch
import torch
from transformers import AutoConfig

from tests.support.engines import gloo_world_one  # noqa: F401
from tests.support.megatron_workers import (
    LOGPROB_ATOL,
    check_recorded_routes,
    grouped_batch,
    hf_model,
    hf_routes,
    parity_batch,
    random_model_dir,
    response_log_probs,
)
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.protocol import DataProto
from verl_megatron.convert import PipelineSplit, plan
from verl_megatron.hf_config import check_supported
from verl_megatron.moe import moe_config_kwargs

LAYOUT = types.SimpleNamespace(tp=1, pp=1, vpp=None, cp=1, ep=1, dp=None)
MODELS = {  # name -> (model_type, config overrides)
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe_softmax_topk": ("qwen3_moe", {"norm_topk_prob": False}),  # top-k of the full softmax
    "mixtral": ("mixtral", {}),
}


@pytest.fixture
def engine(gloo_world_one):  # noqa: F811
    from verl_megatron.engine import MegatronEngine
    from verl_megatron.parallel import destroy_model_parallel

    made = []

    def make(path: str, optim: bool = False, aux: float = 0.0, shared_prefix: bool = True):
        opt = OptimConfig(lr=1e-2, weight_decay=0.0, eps=1e-8) if optim else None
        cfg = EngineConfig(
            model_path=path,
            optim=opt,
            total_steps=10,
            parallel=LAYOUT,
            moe_aux_loss_coeff=aux,
            shared_prefix=shared_prefix,
        )
        made.append(MegatronEngine(cfg))
        return made[-1]

    yield make
    made.clear()
    destroy_model_parallel()


@pytest.fixture(scope="module", params=sorted(MODELS))
def moe_dir(request, tmp_path_factory) -> str:
    model_type, overrides = MODELS[request.param]
    return random_model_dir(str(tmp_path_factory.mktemp(request.param)), model_type, tie=False, **overrides)


def _nll(out, mb):
    mask = mb.batch["response_mask"]
    loss = -(out["log_probs"] * mask).sum() / mask.sum()
    return loss, {"nll": float(loss)}


_nll.weight_by = "tokens"


def test_log_probs_and_gradient_match_hf(engine, moe_dir):
    batch = parity_batch(37)
    valid = batch.batch["response_mask"].bool()
    model = hf_model(moe_dir)
    want = response_log_probs(model, batch)
    eng = engine(moe_dir, optim=True)
    got = eng.infer(batch, micro_batch_size=2).batch["log_probs"]
    assert (got - want).abs()[valid].max().item() <= LOGPROB_ATOL

    mask = batch.batch["response_mask"]
    (-(want * mask).sum() / mask.sum()).backward()
    hf_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    metrics = eng.train_step(batch, _nll, micro_batch_size=2)
    assert metrics["grad_norm"] == pytest.approx(float(hf_norm), rel=1e-5)


def test_the_fsdp_engine_gives_the_same_mixture_of_experts_the_megatron_log_probs_and_step(engine, moe_dir):
    """FSDP runs transformers' own MoE (fused experts), megatron its dropless layer: one model, one answer."""
    from verl_fsdp.engine import FSDPEngine

    batch = parity_batch(37)
    valid = batch.batch["response_mask"].bool()
    optim = OptimConfig(lr=1e-2, weight_decay=0.0, eps=1e-8)
    fsdp = FSDPEngine(EngineConfig(model_path=moe_dir, optim=optim, total_steps=10))
    saved = safetensors.torch.load_file(f"{moe_dir}/model.safetensors")
    streamed = dict(fsdp.weights())  # transformers' fused experts stream one by one: the megatron engine's names
    assert streamed.keys() == saved.keys() and all(torch.equal(streamed[k], saved[k]) for k in saved)
    mega = engine(moe_dir, optim=True)
    want = mega.infer(batch, micro_batch_size=2).batch["log_probs"]
    got = fsdp.infer(batch, micro_batch_size=2).batch["log_probs"]
    assert (got - want).abs()[valid].max().item() <= LOGPROB_ATOL
    m_fsdp = fsdp.train_step(batch, _nll, micro_batch_size=2)
    m_mega = mega.train_step(batch, _nll, micro_batch_size=2)
    assert m_fsdp["nll"] == pytest.approx(m_mega["nll"], rel=1e-6)
    assert m_fsdp["grad_norm"] == pytest.approx(m_mega["grad_norm"], rel=1e-5)


def _watch_routers(eng) -> list:
    """(layer, tokens per expert, megatron's load-balancing term by hand) of every training forward of a router,
    caught beside the engine's own counting."""
    from megatron.core.transformer.moe.router import Router

    seen = []

    def hook(router, inputs, output):
        if not router.training:
            return
        with torch.no_grad():  # megatron's term: E / (k T^2) * sum_e P_e count_e, P_e its softmax mass over tokens
            logits = router.gating(inputs[0]).view(-1, router.config.num_moe_experts).float()
            e, k, t = logits.shape[1], router.topk, logits.shape[0]
            scores = torch.softmax(logits, dim=-1)
            chosen = torch.zeros_like(scores).scatter(1, scores.topk(k, dim=-1).indices, 1.0)
            term = e / (k * t * t) * (scores.sum(0) * chosen.sum(0)).sum()
        seen.append((router.layer_number, output[1].sum(0).double(), float(term)))

    for chunk in eng.chunks:
        for module in chunk.modules():
            if isinstance(module, Router):
                module.register_forward_hook(hook)
    return seen


@pytest.mark.parametrize("aux", [0.0, 0.01], ids=["aux-off", "aux-on"])
def test_router_metrics_are_the_training_step_tokens_per_expert(engine, moe_dir, aux):
    eng = engine(moe_dir, optim=True, aux=aux)
    seen = _watch_routers(eng)
    batch = parity_batch(37)
    eng.infer(batch, micro_batch_size=2)  # a log-prob pass (eval mode) is not counted
    metrics = eng.train_step(batch, _nll, micro_batch_size=2)
    assert seen, "no router ran in training mode"
    per_layer: dict = {}
    for layer, counts, _ in seen:
        per_layer[layer] = per_layer.get(layer, 0) + counts
    load = torch.stack([c / c.mean() for c in per_layer.values()])
    assert metrics["moe/load_max"] == pytest.approx(float(load.max()), rel=1e-9)
    assert metrics["moe/load_min"] == pytest.approx(float(load.min()), rel=1e-9)
    assert metrics["moe/load_max"] > 1.0  # a random router is not balanced: the metric is not a constant
    if aux:
        want = sum(term for _, _, term in seen) / len(seen)  # averaged over layers and micro-batches
        assert metrics["moe/balance_loss"] == pytest.approx(want, rel=1e-5)
    else:
        assert "moe/balance_loss" not in metrics
    again = eng.train_step(batch, _nll, micro_batch_size=2)  # counting starts over with every step
    assert again["moe/load_max"] != metrics["moe/load_max"] or again["moe/load_min"] != metrics["moe/load_min"]


def test_hf_to_mcore_to_hf_is_bitwise_and_exports_a_loadable_folder(engine, moe_dir, tmp_path):
    saved = safetensors.torch.load_file(f"{moe_dir}/model.safetensors")
    eng = engine(moe_dir)
    streamed = dict(eng.weights())
    assert streamed.keys() == saved.keys()  # per-expert names, as save_pretrained writes them
    assert all(torch.equal(streamed[k], saved[k]) for k in saved)
    eng.export_hf(str(tmp_path / "export"))
    batch = parity_batch(37)
    with torch.no_grad():
        exported = response_log_probs(hf_model(str(tmp_path / "export")), batch)
        assert torch.equal(exported, response_log_probs(hf_model(moe_dir), batch))


def _qwen3_moe(**kw):
    from transformers import Qwen3MoeConfig

    base = dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1], vocab_size=37)
    return Qwen3MoeConfig(**{**base, **kw})


def test_plan_routes_the_moe_layers_and_places_experts_by_ep_rank():
    cfg = _qwen3_moe()
    placements = plan(cfg, PipelineSplit(4, 1, 1), ep=2)
    routers = [p.layer for p in placements if p.local_name.endswith("mlp.router.weight")]
    dense = [p.layer for p in placements if p.local_name.endswith("mlp.linear_fc1.weight")]
    assert routers == [0, 2, 3] and dense == [1]
    experts = [(p.expert, p.ep_rank, p.local_name) for p in placements if p.layer == 0 and p.expert is not None]
    assert [(e, r) for e, r, _ in experts[::2]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert experts[4][2] == "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"  # expert 2: local 0
    assert placements[[p.expert for p in placements].index(2)].hf_names == (
        "model.layers.0.mlp.experts.2.gate_proj.weight",
        "model.layers.0.mlp.experts.2.up_proj.weight",
    )
    te = {p.local_name for p in plan(cfg, PipelineSplit(4, 1, 1), te=True)}
    assert "decoder.layers.0.mlp.experts.linear_fc1.weight3" in te  # TransformerEngine's grouped GEMM
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in te  # a routed layer's norm stays apart
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in te  # a dense layer's is fused
    with pytest.raises(ValueError, match="4 experts do not split over parallel.ep=3"):
        plan(cfg, PipelineSplit(4, 1, 1), ep=3)


def test_router_settings_follow_the_family():
    assert moe_config_kwargs(_qwen3_moe(norm_topk_prob=True))["moe_router_pre_softmax"] is False
    assert moe_config_kwargs(_qwen3_moe(norm_topk_prob=False))["moe_router_pre_softmax"] is True
    qwen = moe_config_kwargs(_qwen3_moe(decoder_sparse_step=2, mlp_only_layers=[]))
    assert qwen["moe_layer_freq"] == [0, 1, 0, 1] and qwen["moe_router_load_balancing_type"] == "none"
    assert moe_config_kwargs(_qwen3_moe(), aux_loss_coeff=1e-3)["moe_router_load_balancing_type"] == "aux_loss"


@pytest.mark.parametrize(
    "cfg, message",
    [
        (_qwen3_moe(num_experts_per_tok=5), "num_experts_per_tok=5 > num_experts=4"),
        (_qwen3_moe(num_experts_per_tok=1, norm_topk_prob=True), "num_experts_per_tok=1 with a renormalised"),
        (_qwen3_moe(shared_expert_intermediate_size=64), "shared_expert_intermediate_size=64"),
    ],
)
def test_what_megatron_computes_differently_is_refused_by_key(cfg, message):
    with pytest.raises(ValueError, match=message):
        check_supported(cfg)


@pytest.mark.parametrize(
    "change, message", [({"router_jitter_noise": 0.1}, "router_jitter_noise=0.1"), ({"sliding_window": 64}, "=64")]
)
def test_mixtral_noise_and_sliding_windows_are_refused(change, message):
    from transformers import MixtralConfig

    with pytest.raises(ValueError, match=message):
        check_supported(MixtralConfig(**{"sliding_window": None, **change}))


def test_tensor_parallel_moe_without_sequence_parallelism_is_refused_at_build():
    from verl_megatron.model import transformer_config
    from verl_megatron.parallel import Layout

    tp2 = Layout(tp=2, pp=1, vpp=None, cp=1, ep=1, dp=1, tp_rank=0, pp_rank=0, cp_rank=0, dp_rank=0, etp=2)
    with pytest.raises(ValueError, match="sequence_parallel=false with tp=2"):
        transformer_config(_qwen3_moe(), tp2, dtype=torch.float32, device="cpu", sequence_parallel=False)


def test_the_hf_rollout_loads_the_streamed_experts_into_its_fused_parameters(engine, moe_dir, tmp_path):
    from transformers import AutoConfig

    from verl.config.schema import RolloutConfig
    from verl.engine_protocol import RolloutSettings
    from verl_rollout.hf import HFRollout

    # Another random model of the same shapes: every value the rollout ends with came through the sync.
    other = random_model_dir(str(tmp_path / "other"), AutoConfig.from_pretrained(moe_dir).model_type, tie=False, seed=7)
    settings = RolloutSettings(max_new_tokens=4, eos_ids=(2,), pad_id=0)
    rollout = HFRollout(RolloutConfig(), model_path=other, settings=settings)
    rollout.sleep()  # after a sleep every parameter must arrive: the fused experts count once each
    actor = engine(moe_dir)
    assert rollout.update_weights(actor.weights()) == sum(p.numel() * 4 for p in rollout.module.parameters())
    want = dict(hf_model(moe_dir).named_parameters())
    assert all(torch.equal(p, want[n]) for n, p in rollout.module.named_parameters())


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_routing_replay_records_hf_routes_and_replaying_them_changes_nothing(engine, moe_dir, packed):
    """R2 at the engine, in padded rows and in shared-prefix packs: a log-prob pass returns the experts every token
    went to (HF's choice); an update given those routes is the update without them, bit for bit, and one given
    other routes is another update."""
    batch = grouped_batch()
    eng = engine(moe_dir, optim=True, shared_prefix=packed)
    out = eng.infer(batch, micro_batch_size=2, routes=True)
    routes = out.batch["routed_experts"]
    check_recorded_routes(routes, moe_dir, batch, "packed" if packed else "padded")
    plain = engine(moe_dir, optim=True, shared_prefix=packed)
    replayed = engine(moe_dir, optim=True, shared_prefix=packed)
    shifted = engine(moe_dir, optim=True, shared_prefix=packed)
    with_routes = batch.union(DataProto.from_dict({"routed_experts": routes}))
    e = AutoConfig.from_pretrained(moe_dir).num_experts
    other = batch.union(DataProto.from_dict({"routed_experts": torch.where(routes >= 0, (routes + 1) % e, routes)}))
    a = plain.train_step(batch, _nll, micro_batch_size=2)
    b = replayed.train_step(with_routes, _nll, micro_batch_size=2)
    c = shifted.train_step(other, _nll, micro_batch_size=2)
    assert (a["nll"], a["grad_norm"]) == (b["nll"], b["grad_norm"])
    assert b["moe/routing_agreement"] == 1.0 and c["moe/routing_agreement"] < 0.9  # (the router's own choice)
    assert "moe/routing_agreement" not in a
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(plain.weights(), replayed.weights()))
    assert abs(c["nll"] - a["nll"]) > 1e-5  # other experts, another loss (measured 4.7e-4; equal routes: bitwise)
    after = plain.train_step(batch, _nll, micro_batch_size=2)  # replay is off again after a replayed step
    assert after["nll"] == replayed.train_step(batch, _nll, micro_batch_size=2)["nll"]


def _near_ties(path: str, out: str) -> str:
    """`path`'s model with every router's rows nearly one row (that row plus 1e-6 of its scale in noise): a token's
    experts are then decided by differences near float32 rounding, where two ways of computing the same forward
    (the rollout's cached decoding, the trainer's whole sequences) choose differently."""
    model = hf_model(path)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(p[:1].expand_as(p) + 1e-6 * p.abs().mean() * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize("ties", [False, True], ids=["routers", "near_ties"])
def test_r3_the_trainer_replays_the_routes_the_rollout_took(engine, moe_dir, tmp_path, ties):
    """R3: the hf rollout returns the experts every token went to while it generated (with a shared prefill of n
    samples; HF's own top-k at every position it computed, -1 at the last token, never fed back), and the megatron
    actor routed to them gives the rollout's log-probs. Where routers nearly tie, the two compute paths route some
    tokens apart: without replay the log-probs part, with it they agree, and the routing agreement says how often."""
    from verl.config.schema import RolloutConfig
    from verl.engine_protocol import RolloutSettings
    from verl_rollout.hf import HFRollout

    path = _near_ties(moe_dir, str(tmp_path / "ties")) if ties else moe_dir
    rollout = HFRollout(
        RolloutConfig(), model_path=path, settings=RolloutSettings(max_new_tokens=5, eos_ids=(), pad_id=0, routes=True)
    )
    b, p = parity_batch(37).batch, 6
    prompts = DataProto.from_dict({k: b[k][:, :p] for k in ("input_ids", "attention_mask", "position_ids")})
    torch.manual_seed(0)
    batch = rollout.generate(prompts, n=2, temperature=1.0)
    routes = batch.batch["routed_experts"]
    assert routes.shape[:2] == batch.batch["input_ids"].shape and routes.dtype == torch.int16
    assert bool((routes[:, : p + 4] >= 0).all()) and bool((routes[:, p + 4 :] == -1).all())
    real = batch.batch["attention_mask"].bool()
    real[:, p + 4 :] = False
    if not ties:  # (near ties, HF's whole-sequence forward may choose otherwise: that is the point of R3)
        assert torch.equal(routes.sort(dim=-1).values.long()[real], hf_routes(path, batch)[real])

    actor = engine(path, optim=True)
    mask = batch.batch["response_mask"].bool()

    def gap(out: DataProto) -> float:
        return float((out.batch["log_probs"] - batch.batch["rollout_log_probs"]).abs()[mask].max())

    native, replayed = (
        gap(actor.infer(batch, micro_batch_size=4)),
        gap(actor.infer(batch, micro_batch_size=4, replay=True)),
    )
    agreement = actor.train_step(batch, _nll, micro_batch_size=4)["moe/routing_agreement"]  # (column: replayed)
    print(
        f"ties={ties}: |trainer - rollout| log-prob {native:.2e} routed natively, {replayed:.2e} replayed; "
        f"routing agreement {agreement:.4f}"
    )
    assert replayed <= 1e-6
    if ties:
        assert native > 1e-4 and agreement < 0.99  # (measured 6.6e-4 to 5.3e-3 apart, agreement 0.81-0.87)
    else:
        assert agreement == 1.0

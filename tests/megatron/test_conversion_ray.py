"""Megatron engines in Ray worker processes (gloo): HF -> mcore -> HF is exact, and log-probs match HF's.

Layouts: TP=2 with and without sequence parallelism, PP=2, CP=2, TP=2 x CP=2 and PP=2 x CP=2 (4 workers, half a
CPU each; the latter with a critic), and TP=2 x PP=2 with 2 virtual stages each (4 workers). Models: the
embedded tiny Llama (untied), a random Qwen2 (qkv bias, tied embeddings) and a random Qwen3 (qk-norm, head_dim
apart from hidden/heads). Log-probs are compared with the HF model's in float32 on
rows with left-padded prompts and right-padded responses, on the response tokens.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import pytest
import ray
import torch

from tests.support.engines import grouped_batch
from tests.support.megatron_workers import (
    EngineWorker,
    check_log_probs,
    hf_grad_norm,
    hf_model,
    parity_batch,
    random_model_dir,
)
from verl.config.schema import OptimConfig
from verl.controller import ResourcePool, make_worker_group

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

# Test modules are not installed in the worker processes: ship these by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(sys.modules["tests.support.megatron_workers"])


@pytest.fixture(scope="module")
def models(tmp_path_factory, embedded_cache):
    from verl.embedded.models import materialize_embedded_model

    root = tmp_path_factory.mktemp("models")
    return {
        "llama": materialize_embedded_model("tiny-llama", embedded_cache),
        "qwen2": random_model_dir(str(root / "qwen2"), "qwen2", tie=True, seed=1),
        "qwen3": random_model_dir(str(root / "qwen3"), "qwen3", tie=False, seed=2),
    }


@pytest.fixture(scope="module")
def workers(ray_two_cpus):
    """`with workers(parallel) as group:` EngineWorkers in that layout. Starting workers (each imports torch and
    megatron) dominates this file, so one group serves every layout of its world size in turn (the tests are
    ordered by world size); a test that fails drops it (its workers may be stuck mid-collective)."""
    live: dict = {}

    def close() -> None:
        if live:
            live["group"].shutdown()
            live["pool"].remove()
            live.clear()

    @contextlib.contextmanager
    def layout(parallel: dict):
        world = parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("cp", 1)
        if live.get("world") != world:
            close()
            pool = ResourcePool("megatron", nnodes=1, devices_per_node=world, cpus_per_device=2 / world)
            group = make_worker_group("ray", pool, EngineWorker, {}, role="megatron", env={"OMP_NUM_THREADS": "1"})
            live.update(world=world, pool=pool, group=group)
        try:
            live["group"].call("relayout", parallel)
            yield live["group"]
        except BaseException:
            close()
            raise

    yield layout
    close()


def _hf_state(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(f"{path}/model.safetensors")


def test_generation_shards_for_a_smaller_rollout_tp(workers, models):
    """TP_train=2 -> TP_gen=2 (micro-DP groups of one rank, nothing gathered) and TP_gen=1 (full tensors)."""
    with workers({"tp": 2}) as group:
        group.call("load", "qwen2", models["qwen2"])
        full = _hf_state(models["qwen2"])
        shards = group.call("hf_weights", "qwen2", 2)
        stats = group.call("sync_stats", "qwen2")
        assert [s["received_bytes"] for s in stats] == [0, 0]  # each rank already holds its generation shard
        for rank, weights in enumerate(shards):
            q = full["model.layers.0.self_attn.q_proj.weight"]  # 4 heads of 4 dims -> 2 heads per rank
            assert torch.equal(weights["model.layers.0.self_attn.q_proj.weight"], q.chunk(2, 0)[rank])
            k = full["model.layers.2.self_attn.k_proj.bias"]
            assert torch.equal(weights["model.layers.2.self_attn.k_proj.bias"], k.chunk(2, 0)[rank])
            o = full["model.layers.3.self_attn.o_proj.weight"]
            assert torch.equal(weights["model.layers.3.self_attn.o_proj.weight"], o.chunk(2, 1)[rank])
            up = full["model.layers.1.mlp.up_proj.weight"]
            assert torch.equal(weights["model.layers.1.mlp.up_proj.weight"], up.chunk(2, 0)[rank])
            emb = full["model.embed_tokens.weight"]  # 37 rows -> 19 + 18
            assert torch.equal(weights["model.embed_tokens.weight"], emb[:19] if rank == 0 else emb[19:])
            assert torch.equal(weights["model.norm.weight"], full["model.norm.weight"])
        whole = group.call("hf_weights", "qwen2", 1)
        stats = group.call("sync_stats", "qwen2")
        # TP_gen=1: each rank receives the other rank's shard of every split tensor, in float32: half of each
        # projection, and 19 of the 38 padded embedding rows of 16; norms are replicated and not sent.
        halves = sum(t.numel() for k, t in full.items() if "norm" not in k and "embed" not in k) // 2
        assert [s["received_bytes"] for s in stats] == [(halves + 19 * 16) * 4] * 2
        assert all(torch.equal(whole[0][k], full[k]) for k in full)


@pytest.mark.parametrize(
    "name, parallel",
    [
        ("llama", {"tp": 2, "sequence_parallel": False}),
        ("llama", {"tp": 2}),  # sequence parallelism is on by default with tp > 1
        ("qwen3", {"tp": 2}),  # qk-norm weights: their gradients are summed over TP
        ("llama", {"pp": 2}),
        ("llama", {"cp": 2}),
        ("qwen3", {"cp": 2}),
        ("llama", {"tp": 2, "cp": 2}),
    ],
    ids=["tp2", "tp2-sp", "tp2-sp-qwen3", "pp2", "cp2", "cp2-qwen3", "tp2-sp-cp2"],
)
def test_log_probs_and_gradient_match_hf(workers, models, name, parallel):
    world = parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("cp", 1)
    with workers(parallel) as group:
        infos = group.call("load", name, models[name])
        # TP and CP: one replica, collected on rank 0; PP=2: one replica, collected on the last stage.
        assert infos == (
            [(0, 1, False), (0, 1, True)] if "pp" in parallel else [(0, 1, True)] + [(0, 1, False)] * (world - 1)
        )
        vocab = hf_model(models[name]).config.vocab_size
        batch = parity_batch(vocab=vocab)
        worst = check_log_probs(group.call("infer", name, batch), models[name], batch)
        # The gradient of the mean response NLL, against HF's. Under CP=2 this batch's 7 tokens pad to 8, in 4
        # chunks of 2: cp rank 0 holds positions 0, 1, 6, 7 and rank 1 holds 2-5, so every response token
        # (predicted from positions 3-5) is rank 1's; rank 0 must still take part in backward.
        short = parity_batch(vocab=vocab, prompt=4, response=3, padded=False)
        check_log_probs(group.call("infer", name, short), models[name], short)
        group.call("load", "trained", models[name], OptimConfig(lr=1e-3))
        norms = [m["grad_norm"] for m in group.call("train", "trained", short)]
        want = hf_grad_norm(models[name], short)
        assert all(n == norms[0] for n in norms) and norms[0] == pytest.approx(want, rel=1e-5)
        print(f"{name} {parallel}: max |log-prob - HF| = {worst:.2e}, grad norm {norms[0]:.6f} vs HF {want:.6f}")


@pytest.mark.parametrize(
    "parallel, thd",
    [({"tp": 2}, False), ({"pp": 2}, False), ({"cp": 2}, False), ({"tp": 2}, True), ({"pp": 2}, True)],
    ids=["tp2_sp", "pp2", "cp2", "tp2_sp_thd", "pp2_thd"],
)
def test_packed_rows_give_the_padded_rows_outputs_and_step(workers, models, parallel, thd):
    """model.shared_prefix on megatron across ranks: a GRPO-shaped batch (3 prompts x 4 samples, two micro-batches
    of 6 rows) packed by shared prompt, or in the THD layout TransformerEngine takes (one stream of real tokens,
    cu_seqlens; under SP rounded up to a multiple of tp), gives the padded rows' log-probs (1e-5) and one step's
    weights (1e-6; Adam's eps=1 makes its first step ~ lr * gradient)."""
    batch = grouped_batch(prompts=3, n=4, vocab=83)
    valid = batch.batch["response_mask"].bool()
    with workers(parallel) as group:
        outs, weights, ratios = {}, {}, {}
        for packed in (False, True):
            name = f"packed={packed}"
            optim = OptimConfig(lr=1e-2, eps=1.0)
            group.call("load", name, models["llama"], optim, shared_prefix=packed, thd=thd and packed)
            outs[packed] = group.call("infer", name, batch, micro_batch_size=6)
            ratios[packed] = group.call("train", name, batch, micro_batch_size=6)[0]["computed_tokens_ratio"]
            weights[packed] = group.call("hf_weights", name)[0]
    assert ratios[True] < 0.8 * ratios[False]  # (padded rows under SP or CP: lengths rounded up to a multiple)
    for padded, packed in zip(outs[False], outs[True]):
        for key in ("log_probs", "entropy"):
            torch.testing.assert_close(packed[key][valid], padded[key][valid], rtol=0, atol=1e-5, msg=key)
    for key, tensor in weights[False].items():
        torch.testing.assert_close(weights[True][key], tensor, rtol=0, atol=1e-6, msg=key)


def test_pp2_token_budget_micro_batches_take_the_whole_batchs_step(workers, models):
    """Token-budget micro-batches through the pipeline schedule: 12 GRPO rows cut by 24 tokens into micro-batches
    of unequal row counts, each grown to the largest's shape (packed rows, and padded rows), give the log-probs
    (1e-5) and one step's weights (1e-6, Adam eps=1) of the whole batch as one micro-batch."""
    batch = grouped_batch(prompts=3, n=4, vocab=83)
    valid = batch.batch["response_mask"].bool()
    with workers({"pp": 2}) as group:
        for packed in (True, False):
            outs, weights, counts = [], [], []
            for cut in ({"micro_batch_size": 12}, {"micro_batch_size": 1, "max_tokens": 24}):
                name = f"packed={packed} {cut}"
                group.call("load", name, models["llama"], OptimConfig(lr=1e-2, eps=1.0), shared_prefix=packed)
                outs.append(group.call("infer", name, batch, **cut)[0])
                counts.append(group.call("train", name, batch, **cut)[0]["micro_batches"])
                weights.append(group.call("hf_weights", name)[0])
            assert counts[0] == 1 and counts[1] >= 4, counts
            for key in ("log_probs", "entropy"):
                torch.testing.assert_close(outs[1][key][valid], outs[0][key][valid], rtol=0, atol=1e-5, msg=key)
            for key, tensor in weights[0].items():
                torch.testing.assert_close(weights[1][key], tensor, rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize("parallel", [{"pp": 2}, {"pp": 2, "vpp": 2}], ids=["pp2", "pp2-vpp2"])
def test_a_pipeline_tied_embedding_holds_what_the_memory_model_estimates(workers, models, parallel):
    """The tied embedding / output weight is on both end stages, each in a DDP bucket of its own (megatron's
    shared_embedding): every stage holds its estimated parameters, gradients and optimizer state to the byte."""
    from transformers import AutoConfig

    from verl_megatron.memory_model import state_bytes

    estimate = state_bytes(AutoConfig.from_pretrained(models["qwen2"]), parallel, dtype=torch.float32)
    with workers(parallel) as group:
        group.call("load", "qwen2", models["qwen2"], OptimConfig(lr=1e-3))
        group.call("train", "qwen2", parity_batch(vocab=37))
        assert group.call("held_bytes", "qwen2") == [e.as_dict() for e in estimate]


def test_pp2_cp2_log_probs_and_critic_values_match_hf(workers, models, tmp_path):
    """Context parallelism across pipeline stages: the actor's log-probs and a critic's values (its fresh head
    exported with the model) equal the HF model's."""
    from transformers import AutoModelForTokenClassification

    with workers({"pp": 2, "cp": 2}) as group:
        # Megatron's rank order is tp, cp, dp, pp: ranks 2 and 3 are the last stage, rank 2 its cp rank 0.
        assert group.call("load", "llama", models["llama"]) == [
            (0, 1, False),
            (0, 1, False),
            (0, 1, True),
            (0, 1, False),
        ]
        batch = parity_batch(vocab=83)
        worst = check_log_probs(group.call("infer", "llama", batch), models["llama"], batch)
        print(f"pp2 cp2: max |log-prob - HF| = {worst:.2e}")
        group.call("load", "critic", models["llama"], kind="value")
        values = group.call("infer", "critic", batch)
        group.call("export", "critic", str(tmp_path / "critic"))
        hf = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "critic"), dtype=torch.float32).eval()
        b = batch.batch
        with torch.no_grad():
            out = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
        r = b["responses"].shape[1]
        want = out.logits.squeeze(-1)[:, -r - 1 : -1]  # the state before each response token
        valid = b["response_mask"].bool()
        for v in values:
            torch.testing.assert_close(v["values"][valid], want[valid], rtol=0, atol=1e-5)


def _receive(port: int, member: int, world: int, senders: int, out: dict) -> None:
    """One rollout rank's side of a sync: every tensor, whole (a TP=2 rollout's ranks take the same bytes)."""
    from verl.workers.weight_transfer import TransferStats, join_transfer_group, receive_weights

    group = join_transfer_group("127.0.0.1", port, member, world, "gloo", timeout_s=300)
    stats = TransferStats()
    got = {n: t.clone() for n, t in receive_weights(group, torch.device("cpu"), stats, senders=senders)}
    out[member] = (got, stats.bytes)


def test_tp2_pp2_vpp2_ranks_each_send_their_own_pieces(workers, models):
    """Every actor rank sends its tensor-parallel piece of its stage's tensors (nothing gathered); two receivers
    (a TP=2 rollout replica's ranks) rebuild every tensor bitwise, and the busiest sender sends about a quarter."""
    from verl.controller.worker import free_port

    with workers({"tp": 2, "pp": 2, "vpp": 2}) as group:
        for name, path in models.items():
            group.call("load", name, path)
            want = group.call("hf_weights", name)[0]  # the gathered stream (bitwise the HF folder: the next test)
            port, world, out = free_port(), 4 + 2, {}
            sent = group.submit("send_shards", name, port=port, host="127.0.0.1", world=world, bucket_bytes=4096)
            threads = [threading.Thread(target=_receive, args=(port, m, world, 4, out)) for m in (4, 5)]
            for t in threads:
                t.start()
            sent_bytes = sent.result()
            for t in threads:
                t.join(timeout=120)
            total = sum(t.numel() * t.element_size() for t in want.values())
            assert sum(sent_bytes) == total, (name, sent_bytes)
            # embeddings and norms sit on one stage (and norms on tp rank 0 alone): a quarter each, give or take
            assert max(sent_bytes) < 0.4 * total, (name, sent_bytes)
            assert [s["received_bytes"] for s in group.call("sync_stats", name)] == [0] * 4
            for member in (4, 5):
                got, nbytes = out[member]
                assert nbytes == total and list(got) == list(want), name
                for key, tensor in want.items():
                    assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), (name, member, key)
            print(f"{name} tp2 pp2 vpp2: each rank sent {[round(b / total, 3) for b in sent_bytes]} of the model")


def test_round_trip_and_parity_tp2_pp2_vpp2(workers, models, tmp_path):
    with workers({"tp": 2, "pp": 2, "vpp": 2}) as group:
        for name, path in models.items():
            group.call("load", name, path)
            hf = _hf_state(path)
            if name == "qwen2":
                hf.pop("lm_head.weight", None)  # tied: HF may store the shared tensor under either name
            for rank, weights in enumerate(group.call("hf_weights", name)):
                assert weights.keys() == hf.keys(), (name, rank)
                for key, tensor in hf.items():
                    assert torch.equal(weights[key], tensor), (name, rank, key)  # bitwise
            vocab = hf_model(path).config.vocab_size
            batch = parity_batch(vocab=vocab)
            worst = check_log_probs(group.call("infer", name, batch), path, batch)
            print(f"{name} tp2 pp2 vpp2: max |log-prob - HF| = {worst:.2e}")
        # The exported folder is the same model, bitwise.
        group.call("export", "qwen3", str(tmp_path / "qwen3-export"))
        exported, original = _hf_state(str(tmp_path / "qwen3-export")), _hf_state(models["qwen3"])
        assert exported.keys() == original.keys()
        assert all(torch.equal(exported[k], original[k]) for k in original)

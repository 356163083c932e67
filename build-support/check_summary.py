"""Check a training run's closing summary line: `verl NAME: held-out greedy accuracy A% -> B% (+G pts); ...`.

python3 build-support/check_summary.py NAME MIN_GAIN_POINTS LOG_FILE
"""

import re
import sys


def main() -> int:
    name, min_gain, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    text = open(log, errors="replace").read()
    m = re.search(
        rf"^verl {re.escape(name)}: held-out greedy accuracy ([\d.]+)% -> ([\d.]+)% \(([+-][\d.]+) pts\)", text, re.M
    )
    if m is None:
        print(f"check_summary: no summary line for {name} in the run's output", file=sys.stderr)
        return 1
    before, after, gain = (float(g) for g in m.groups())
    ok = gain >= min_gain
    print(
        f"check_summary: {name} {before:.1f}% -> {after:.1f}% ({gain:+.1f} pts; need >= {min_gain:+.1f}): {'ok' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

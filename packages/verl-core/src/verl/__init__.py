"""verl: reinforcement-learning post-training for large language models.

The core holds the data protocol, the run configuration, backend discovery and (as they land) the
controller, algorithms and trainer. Training and rollout engines live in separate packages.
"""

__version__ = "0.1.0"

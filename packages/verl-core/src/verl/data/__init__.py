"""The data layer: RL prompt and SFT data sets from parquet, collation into batches, resumable sampling."""

from verl.data.build import make_rl_dataloaders, make_rl_dataset
from verl.data.loader import DataLoader
from verl.data.rl_dataset import RLDataset, collate_rl
from verl.data.sampler import ResumableSampler
from verl.data.sft_dataset import SFTDataset, collate_sft

__all__ = [
    "DataLoader",
    "RLDataset",
    "ResumableSampler",
    "SFTDataset",
    "collate_rl",
    "collate_sft",
    "make_rl_dataloaders",
    "make_rl_dataset",
]

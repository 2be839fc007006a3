"""The concat backend (runtime/backends/concat.py): the contract's decoder_step, its cache fed back as arrays. Each
decoder call is recorded: one new token per row per step, the prefix never run again, finished rows gone from the
batch, as many steps as the longest output."""

from __future__ import annotations

from support.backends import recording_translator

from tfm_export import DecodeOptions


def test_decoder_runs_once_per_generated_token_and_never_reruns_the_prefix(demo_onnx):
    translator, backend = recording_translator(demo_onnx)
    [result] = translator.translate(["nine hundred and ninety-nine thousand, nine hundred and ninety-nine"])
    generated = len(result.ids) + 1  # + </s>
    assert [past for _, past, _ in backend.calls] == list(range(generated))  # the cache grows by one each step
    assert all(new == 1 and rows == 1 for rows, _, new in backend.calls)  # one new token, never the prefix
    assert backend.counts.runs == generated


def test_finished_sentences_leave_the_batch(demo_onnx):
    translator, backend = recording_translator(demo_onnx)
    texts = ["one", "forty-two", "nine hundred and ninety-nine thousand, nine hundred and ninety-nine"]
    results = translator.translate(texts, DecodeOptions(batch_size=3))
    rows = [n for n, _, _ in backend.calls]
    assert rows[0] == 3 and rows == sorted(rows, reverse=True) and rows[-1] == 1
    assert len(rows) == max(len(r.ids) for r in results) + 1  # the longest output sets the step count
    assert sum(rows) == sum(len(r.ids) + 1 for r in results)  # no step is spent on a finished row


def test_step_count_is_linear_in_output_length(demo_onnx):
    long_sentence = "nine hundred and ninety-nine thousand, nine hundred and ninety-nine"  # 15 output tokens
    for max_length in (4, 8, 12):
        translator, backend = recording_translator(demo_onnx)
        [result] = translator.translate([long_sentence], DecodeOptions(max_length=max_length))
        assert len(result.ids) == max_length
        assert backend.counts.runs == max_length
        assert [past for _, past, _ in backend.calls] == list(range(max_length))

"""The GGUF conversion takes bos/eos from the GGUF file, whatever the installed transformers reads."""

from __future__ import annotations

import copy

from gguf import GGUFWriter

from eyas.assets import _special_tokens_from_gguf


def test_special_tokens_come_from_the_gguf_metadata(tokenizer, tmp_path):
    path = tmp_path / "ids.gguf"
    writer = GGUFWriter(str(path), arch="llama")
    writer.add_bos_token_id(1)  # SmolLM2's file: bos <|im_start|> (1), eos <|im_end|> (2)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    wrong = copy.deepcopy(tokenizer)
    wrong.eos_token = "<|im_start|>"  # what transformers 5.12.1 reads from SmolLM2's GGUF
    _special_tokens_from_gguf(path, wrong)
    assert (wrong.eos_token, wrong.eos_token_id) == ("<|im_end|>", 2)
    assert (wrong.bos_token, wrong.bos_token_id) == ("<|im_start|>", 1)


def test_gguf_parsed_once_shares_one_reader_and_name_map_then_restores_gguf(tmp_path):
    import gguf

    from eyas.assets import gguf_parsed_once

    path = tmp_path / "ids.gguf"
    writer = GGUFWriter(str(path), arch="llama")
    writer.add_bos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(path)  # as transformers calls it: the package attribute
        assert gguf.GGUFReader(str(path)) is first
        assert "tokenizer.ggml.bos_token_id" in first.fields
        llama = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(llama, 2) is gguf.get_tensor_name_map(llama, 2)
        assert gguf.get_tensor_name_map(llama, 3) is not gguf.get_tensor_name_map(llama, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)

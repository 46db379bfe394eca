"""The SGLang engines eyas starts (`sglang`): for extraction, generation and served evaluation."""

"""GGUF files served as they are: metadata mapped to a transformers config, the tokenizer and
chat template rebuilt from the file, tensors read (and dequantized once) from the file itself.

``prepare_gguf_dir(path)`` makes the small directory beside the hermes cache that the rest of
the package loads like any Hugging Face directory (config.json, tokenizer, generation config)
and whose manifest points back at the GGUF for the weights; :class:`GGUFTensors` gives the
loader the file's tensors under the Hugging Face names of the family. ``write_gguf`` writes a
Hugging Face directory as a GGUF the way llama.cpp's converter lays it out (tests and
benchmarks: the same weights for llama.cpp and for hermes).
"""

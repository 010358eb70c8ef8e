"""Helpers of make_model_fixtures.py: tokenizer training, tiny HF models, the GGUF twin, references."""

"""The model the encoder benchmark runs: ``vit.py`` (a MoonViT-shaped vision encoder
with every RoPE variant pluggable, random weights), ``config.py`` (its geometry) and
``prefill.py`` (the language model's prefill, modelled, for time to first token)."""

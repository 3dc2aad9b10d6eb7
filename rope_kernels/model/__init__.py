"""The model the encoder benchmark runs: ``vit.py`` (a MoonViT-shaped vision encoder
with every RoPE variant pluggable, random weights) and ``config.py`` (its geometry)."""

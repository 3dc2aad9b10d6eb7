"""The model the encoder benchmark runs: ``vit.py`` (a MoonViT-shaped vision encoder
with every RoPE variant pluggable, random weights). Its geometry (``encoder_config``) and
the language model's prefill, modelled for time to first token (``prefill``), import no
torch and sit in the bottom layer (``rope_kernels/encoder_config.py``, ``prefill.py``)."""

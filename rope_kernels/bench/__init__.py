"""Measurement: timing (eager, CUDA graphs), correctness checks, profiling and
launch counts, the microbenchmark, the MoonViT-shaped encoder and its benchmark."""

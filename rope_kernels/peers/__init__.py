"""Other people's code the study compares against, run from their own packages:
torch.compile, Liger-Kernel, and the serving engines' kernels at pinned versions."""

"""Plumbing around the study, not the study itself: a Slurm submission of the notebooks
(``submit``), bundles for an air-gapped GPU node (``carry``) and wheels for offline nodes
(``wheelhouse``). The command line (``python -m rope_kernels submit|carry|wheelhouse``) is its
caller; nothing in kernels/, peers/, bench/, model/ or study/ imports it (the ``pip download``
line the wheelhouse shares with ``peers.cache`` is the bottom-layer ``rope_kernels.wheels``)."""

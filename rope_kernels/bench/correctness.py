"""Old path of the correctness harness, now ``rope_kernels.correctness`` (below the
peers, which vet an installed CUDA peer with it). Kept only so branches written
against the old path still import (the same module object); new code imports
``rope_kernels.correctness``."""

import sys

from rope_kernels import correctness as _correctness

sys.modules[__name__] = _correctness

"""Old path of ``rope_kernels.wheelhouse`` (now below the peers, whose cache downloads
its pinned wheels with the same command). Kept only so branches written against the
old path still import (the same module object); new code imports
``rope_kernels.wheelhouse``."""

import sys

from rope_kernels import wheelhouse as _wheelhouse

sys.modules[__name__] = _wheelhouse

"""Old path of the encoder model, now ``rope_kernels.model.vit`` (its geometry in
``rope_kernels.model.config``). Kept only so branches written against the old path
still import (the same module object); new code imports ``rope_kernels.model.vit``."""

import sys

from rope_kernels.model import vit as _vit

sys.modules[__name__] = _vit

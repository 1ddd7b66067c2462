"""Launch configurations and budgets of the CUDA kernels, for every GPU architecture.

Everything here is arithmetic on the kernels' tile shapes and the GPUs' published limits: no GPU,
no CuPy. The runtime (``flashtut.cuda.attention``) asks these functions what to build and launch
on the GPU it runs on; the CI compile test asks them what the runtime would build on a T4 (sm_75),
an A100 (sm_80) and an H100/H200 (sm_90), and compiles exactly that; chapter 08 does its register
and shared-memory budgets with them. One module per concern:

* :mod:`.plan`: which kernels run for a GPU, dtype and head dim (:func:`kernel_plan`), and its table;
* :mod:`.ladder`: the mma.sync forward ladder (:data:`VARIANTS`, :func:`launch_config`);
* :mod:`.backward`: the backward (:class:`BackwardConfig`, :func:`pick_config`, :func:`kernel_builds`);
* :mod:`.hopper`: the Hopper forward (:func:`hopper_config`, the shipped :data:`HOPPER_OPTIONS`);
* :mod:`.limits`: dtypes, head dims and the GPUs' shared memory, which all of them use.
"""
from .backward import *  # noqa: F401,F403
from .backward import __all__ as _backward
from .hopper import *  # noqa: F401,F403
from .hopper import __all__ as _hopper
from .ladder import *  # noqa: F401,F403
from .ladder import __all__ as _ladder
from .limits import *  # noqa: F401,F403
from .limits import __all__ as _limits
from .plan import *  # noqa: F401,F403
from .plan import __all__ as _plan

__all__ = [*_limits, *_ladder, *_backward, *_hopper, *_plan]
